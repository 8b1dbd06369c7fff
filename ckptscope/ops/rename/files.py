"""What a rename writes, file by file: the plan the engine executes and the protocol each
checkpoint format's writer implements.

Kept apart from the engine so that the per-format writers (safetensors.py, torch.py, dcp.py)
depend on these types only, and the engine depends on the writers: no import circle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ckptscope.core.index import CheckpointIndex
from ckptscope.ops.rename.plan import NameChanges

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes total)."""


@dataclass(frozen=True, slots=True)
class FileAction:
    path: str
    """Relative to the destination root (the file name for single-file checkpoints)."""
    action: str
    """``rewrite-header`` / ``rewrite-pickle`` (a new header or pickle, tensor bytes copied
    verbatim), ``copy``, ``link`` (hard link, else copy),
    ``regenerate`` (an index or metadata file rebuilt from the new names), ``omit``."""
    tensors: int = 0
    nbytes: int = 0


@dataclass(slots=True)
class RenamePlan:
    src: Path
    dst: Path
    format: str
    changes: NameChanges
    files: list[FileAction] = field(default_factory=list)
    overwrite: bool = False
    directory: bool = False
    """Whether the checkpoint is a directory (else a single file)."""
    nbytes: dict[str, int] = field(default_factory=dict)
    """Bytes of every stored tensor, by old name (for regenerated index totals)."""

    @property
    def total_bytes(self) -> int:
        return sum(f.nbytes for f in self.files)

    def new_names(self) -> dict[str, str]:
        """old -> new for every kept tensor (unchanged names map to themselves)."""
        names = [*self.changes.renamed, *self.changes.dropped, *self.changes.untouched]
        return {old: new for old in names if (new := self.changes.new_name(old)) is not None}

    def to_json(self) -> dict[str, Any]:
        return {
            "src": str(self.src), "dst": str(self.dst), "format": self.format,
            "renamed": [{"old": o, "new": n} for o, n in self.changes.renamed.items()],
            "dropped": list(self.changes.dropped),
            "untouched": len(self.changes.untouched),
            "files": [{"path": f.path, "action": f.action, "tensors": f.tensors, "nbytes": f.nbytes}
                      for f in self.files],
        }


class RenameWriter(Protocol):
    """How one checkpoint format is renamed."""

    formats: tuple[str, ...]
    """``CheckpointIndex.format`` values this writer handles."""

    def check(self, index: CheckpointIndex, src: Path) -> None:
        """Raise ``CkptError`` when this particular checkpoint cannot be renamed."""

    def plan_files(self, index: CheckpointIndex, changes: NameChanges) -> list[FileAction]:
        """Every file of the destination and what happens to it."""

    def write_file(self, plan: RenamePlan, action: FileAction, src: Path, out: Path,
                   advance: Callable[[int], None]) -> dict[str, str]:
        """Write one ``rewrite-*`` file; return {new name: file} for the tensors it holds."""

    def regenerate(self, plan: RenamePlan, action: FileAction, src: Path, out: Path,
                   written: Mapping[str, str]) -> None:
        """Write one ``regenerate`` file once every data file is written."""
