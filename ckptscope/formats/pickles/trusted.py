"""``--trust-pickle``: the explicit opt-in to a real ``torch.load(weights_only=False)``.

Only reached when the user asked for it. It can open pickles the safe unpickler cannot describe
(custom tensor subclasses, objects whose meaning depends on their code) at the price of running
whatever the file contains. Tensors are then served from the loaded (memory-mapped) objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptscope.core.dtypes import dtype_by_name
from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, ObjectEntry
from ckptscope.core.tensor import Chunk, Encoding, TensorMeta


class TrustedTorchFile:
    """A torch file loaded with torch itself; holds the tensors for ``read``."""

    def __init__(self, path: Path, *, mmap: bool) -> None:
        import torch

        try:
            self.obj = torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
        except Exception as exc:  # the user trusted it, but it can still be broken
            raise CkptError(f"torch.load failed: {type(exc).__name__}: {exc}", path) from None
        self.path = path
        self.tensors: dict[str, Any] = {}

    def fill_index(self, index: CheckpointIndex, file: str) -> None:
        import torch

        for name, leaf in _flatten_real(self.obj, ""):
            if isinstance(leaf, torch.Tensor):
                self.tensors[name] = leaf
                dtype = dtype_by_name(str(leaf.dtype))
                shape = tuple(leaf.shape)
                chunk = Chunk((0,) * len(shape), shape, file, 0, dtype.nbytes(leaf.numel()), Encoding.LOADED)
                index.tensors[name] = TensorMeta(name, dtype.name, shape, (chunk,), (("kind", type(leaf).__name__),))
            else:
                index.objects.append(ObjectEntry(name or "<root>", _qualname(leaf), _plain(leaf)))
        if isinstance(self.obj, dict) and isinstance(self.obj.get("iteration"), int):
            index.metadata["iteration"] = self.obj["iteration"]
        index.warnings.append("opened with --trust-pickle: the file's pickled code was allowed to run")

    def read(self, name: str, bounds: tuple[tuple[int, int], ...]) -> Any:
        import numpy as np
        import torch

        tensor = self.tensors[name].detach()
        if type(tensor) is not torch.Tensor and hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        part = tensor[tuple(slice(lo, hi) for lo, hi in bounds)].contiguous().cpu()
        dtype = dtype_by_name(str(part.dtype))
        if part.dtype in (torch.bfloat16,) or str(part.dtype).startswith("torch.float8"):
            raw = part.view(torch.uint8 if dtype.itemsize == 1 else torch.int16).numpy()
            return raw.view(dtype.numpy()).copy()
        return np.array(part.numpy(), copy=True)


class TrustedReadMixin:
    """For torch-file readers: serve ``Encoding.LOADED`` chunks from a trusted ``torch.load``."""

    _trusted: TrustedTorchFile | None = None

    def _read_chunk(self, meta: TensorMeta, chunk: Chunk, local: tuple[tuple[int, int], ...]) -> Any:
        if chunk.encoding is Encoding.LOADED and self._trusted is not None:
            return self._trusted.read(meta.name, local)
        return super()._read_chunk(meta, chunk, local)  # type: ignore[misc]


def _flatten_real(value: Any, prefix: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        yield prefix, value
        return
    children = None
    if isinstance(value, dict) and _has_tensor(value):
        children = {str(k): v for k, v in value.items()}
    elif isinstance(value, (list, tuple)) and _has_tensor(value):
        children = {str(i): v for i, v in enumerate(value)}
    if children is None:
        yield prefix, value
        return
    for key, child in children.items():
        yield from _flatten_real(child, f"{prefix}.{key}" if prefix else key)


def _has_tensor(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_has_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_tensor(v) for v in value)
    return False


def _qualname(value: Any) -> str:
    cls = type(value)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _plain(value: Any, depth: int = 0) -> Any:
    if depth > 50:
        return "..."
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {"__class__": _qualname(value), **{k: _plain(v, depth + 1) for k, v in vars(value).items()}}
    return repr(value)
