"""PyTorch DCP's ``HuggingFaceStorageWriter`` saving distributed: safetensors files of local pieces.

``torch.distributed.checkpoint.HuggingFaceStorageWriter(save_distributed=True)`` has every rank
write its own shard of every tensor to ``shard-<rank+1>-model-<file>-of-<files>.safetensors``
(``_hf_utils.SHARDED_FILE_NAME``): the header holds the local shape, and ``__metadata__`` has
``DCP_SHARDING_INFO``, a JSON object ``{fqn: {"saved_offsets": [...]}}`` with each piece's offsets
in the global tensor. Without consolidation that directory is the checkpoint (with it, the pieces
stay in ``sharded/`` beside the consolidated ``model-*.safetensors``). torch's own
``HuggingFaceStorageReader.read_metadata`` rebuilds the global tensor from the pieces: its shape is
the largest ``offset + local size`` on each axis. This reader does the same, from the headers only,
so each tensor is one ``TensorMeta`` with a chunk per piece.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.core.index import INFERRED_SHAPES, CheckpointIndex, mark_config_tie
from ckptscope.core.names import natural_key
from ckptscope.core.tensor import Chunk, TensorMeta
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.hf.side_files import add_side_files
from ckptscope.formats.registry import register_reader
from ckptscope.formats.safetensors.reader import note_header, parse_safetensors_header

SHARD_FILE = re.compile(r"shard-\d+-model-\d+-of-\d+\.safetensors\Z")
SHARDING_INFO = "DCP_SHARDING_INFO"
SAVED_OFFSETS = "saved_offsets"


def _shard_files(path: Path) -> list[Path]:
    return sorted((p for p in path.iterdir() if SHARD_FILE.match(p.name) and p.is_file()),
                  key=lambda p: natural_key(p.name))


@register_reader
class DcpSafetensorsShardsReader(CheckpointReader):
    """A directory of ``HuggingFaceStorageWriter`` shard files (``DCP_SHARDING_INFO`` in each header)."""

    format_name = "dcp_safetensors_shards"
    priority = 55

    @classmethod
    def supports(cls, path: Path) -> bool:
        try:
            if not path.is_dir():
                return False
            files = _shard_files(path)
            if not files:
                return False
            return SHARDING_INFO in parse_safetensors_header(files[0], files[0].name).metadata
        except (OSError, CkptError):
            return False

    def _build_index(self) -> CheckpointIndex:
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        pieces: dict[str, list[TensorMeta]] = {}
        for path in _shard_files(self.path):
            header = parse_safetensors_header(path, path.name, allow_truncated=True)
            note_header(index, header, path.name)
            if header.truncated:
                index.add_issue("truncated", f"the file has {header.file_size} bytes, its header places data "
                                "beyond that", file=path.name, tensors=header.truncated)
            offsets = self._saved_offsets(path, header.metadata)
            for name, meta in header.tensors.items():
                where = offsets.get(name)
                if where is None or len(where) != len(meta.shape):
                    raise CkptError(f"{SHARDING_INFO} gives no saved_offsets of rank {len(meta.shape)} for {name!r}",
                                    path)
                chunk = replace(meta.chunks[0], offsets=tuple(where))
                pieces.setdefault(name, []).append(replace(meta, chunks=(chunk,)))
        for name, metas in pieces.items():
            dtypes = {m.dtype for m in metas}
            if len(dtypes) != 1:
                raise CkptError(f"the pieces of {name!r} have different dtypes ({', '.join(sorted(dtypes))})",
                                self.path)
            chunks: list[Chunk] = sorted((m.chunks[0] for m in metas), key=lambda c: c.offsets)
            shape = tuple(max(c.offsets[d] + c.shape[d] for c in chunks) for d in range(len(chunks[0].shape)))
            index.tensors[name] = TensorMeta(name, metas[0].dtype, shape, tuple(chunks))
        # The files beside the pieces as an HF dir has them: config.json (the writer's caller saves it
        # there; convert and check read it as the model's config), tokenizer, index.
        add_side_files(index, self.path)
        index.metadata[INFERRED_SHAPES] = "the largest offset + size of the pieces found (the writer stores none)"
        config = index.saved_config
        mark_config_tie(index, config)
        return index

    @staticmethod
    def _saved_offsets(path: Path, metadata: dict[str, str]) -> dict[str, list[int]]:
        text = metadata.get(SHARDING_INFO)
        if text is None:
            raise CkptError(f"no {SHARDING_INFO} in __metadata__, unlike the other shard files", path)
        try:
            info = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CkptError(f"{SHARDING_INFO} is not JSON: {exc}", path) from None
        if not isinstance(info, dict):
            raise CkptError(f"{SHARDING_INFO} is not a JSON object", path)
        out = {}
        for name, entry in info.items():
            saved = entry.get(SAVED_OFFSETS) if isinstance(entry, dict) else None
            if isinstance(saved, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                               for v in saved):
                out[name] = saved
        return out
