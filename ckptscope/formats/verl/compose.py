"""A reader made of other readers, each opened on a subdirectory: one logical checkpoint on disk as
several self-contained ones.

verl's Megatron manager saves the model, the optimizer and the RNG state as separate torch_dist
trees (``model/dist_ckpt/``, ``optimizer/dist_ckpt/``, ``extra/dist_ckpt/``), or the model as an HF
dir (``model/huggingface/``). Each part is already a format ckptscope reads; this class puts their
indexes side by side under one root, with every chunk's file relative to that root, and hands each
chunk read back to the reader that owns it. Nothing is re-parsed and no bytes are copied.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ckptscope.core.index import CheckpointIndex, FileInfo
from ckptscope.core.tensor import Chunk, TensorMeta
from ckptscope.formats.base import CheckpointReader


class ComposedReader(CheckpointReader):
    """Base for readers whose index is the union of inner readers' indexes (see the module docstring)."""

    def __init__(self, path: Any, *, trust_pickle: bool = False) -> None:
        super().__init__(path, trust_pickle=trust_pickle)
        self._parts: dict[str, CheckpointReader] = {}
        """``"model/dist_ckpt/"`` -> the reader opened on that subdirectory."""

    def _adopt(self, index: CheckpointIndex, inner: CheckpointReader, rel: str) -> CheckpointIndex:
        """Add ``inner``'s tensors, views, objects, files and findings to ``index`` (paths made relative
        to this reader's root); returns the inner index. A tensor name another part already holds is
        kept from the first part, with a warning."""
        prefix = rel.rstrip("/") + "/"
        self._parts[prefix] = inner
        sub = inner.index()
        for name, meta in sub.tensors.items():
            if name in index.tensors:
                index.warnings.append(f"{prefix}: {name} is also in an earlier part; that one is shown")
                continue
            index.tensors[name] = replace(meta, chunks=tuple(replace(c, file=prefix + c.file) for c in meta.chunks))
        for name, target in sub.views.items():
            index.views.setdefault(name, target)
        taken = {o.name for o in index.objects}
        index.objects.extend(o if o.name not in taken else replace(o, name=f"{prefix}{o.name}") for o in sub.objects)
        index.files.extend(FileInfo(prefix + f.path, f.size, f.role) for f in sub.files)
        index.warnings.extend(f"{prefix}: {w}" for w in sub.warnings)
        index.issues.extend(replace(i, file=prefix + i.file if i.file else prefix.rstrip("/")) for i in sub.issues)
        return sub

    def _owner(self, chunk: Chunk) -> tuple[CheckpointReader, str, Chunk]:
        for prefix, reader in self._parts.items():
            if chunk.file.startswith(prefix):
                return reader, prefix, replace(chunk, file=chunk.file[len(prefix):])
        raise AssertionError(f"no part holds {chunk.file}")  # index() made every chunk file

    def _read_chunk(self, meta: TensorMeta, chunk: Chunk, local: tuple[tuple[int, int], ...]) -> Any:
        reader, _, inner = self._owner(chunk)
        return reader._read_chunk(meta, inner, local)

    def _raw_chunk(self, meta: TensorMeta, chunk: Chunk) -> Chunk:
        reader, prefix, inner = self._owner(chunk)
        raw = reader._raw_chunk(meta, inner)
        return replace(raw, file=prefix + raw.file)

    def close(self) -> None:
        for reader in self._parts.values():
            reader.close()
        super().close()
