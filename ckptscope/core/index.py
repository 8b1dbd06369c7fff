"""``CheckpointIndex``: everything known about a checkpoint from its metadata alone."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ckptscope.core.tensor import TensorMeta


@dataclass(frozen=True, slots=True)
class FileInfo:
    path: str
    """Relative to the checkpoint root (the file name itself for single-file checkpoints)."""
    size: int
    role: str = "data"
    """What the file is for: ``data``, ``index``, ``config``, ``metadata``, ``tokenizer``, ..."""


@dataclass(frozen=True, slots=True)
class ObjectEntry:
    """A non-tensor item: args, iteration, rng state, optimizer scalars, config.

    ``value`` is already made safe: pickled objects arrive as stubs rendered into plain dicts
    (``{"__class__": "argparse.Namespace", ...}``) so they can be browsed without importing
    their classes.
    """

    name: str
    type: str
    value: Any = None


@dataclass(slots=True)
class CheckpointIndex:
    """The metadata view of one checkpoint. Built by a reader's ``index()``; never holds tensor data."""

    path: str
    format: str
    tensors: dict[str, TensorMeta] = field(default_factory=dict)
    objects: list[ObjectEntry] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    """Format metadata: safetensors ``__metadata__``, index metadata, iteration, ..."""
    files: list[FileInfo] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[TensorMeta]:
        return iter(self.tensors.values())

    def __len__(self) -> int:
        return len(self.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    @property
    def num_params(self) -> int:
        return sum(t.numel for t in self.tensors.values())

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def bytes_per_dtype(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for t in self.tensors.values():
            counts[t.dtype] += t.nbytes
        return dict(counts.most_common())

    @property
    def iteration(self) -> int | None:
        value = self.metadata.get("iteration")
        return value if isinstance(value, int) else None
