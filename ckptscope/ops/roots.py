"""Save directories that hold many iterations: find them so a user can pick one.

Trainers write one directory per save under a root: Megatron ``iter_0000100/`` next to a
``latest_checkpointed_iteration.txt`` tracker, verl ``global_step_100/actor/``. Opening the
root itself should offer the iterations (newest first) instead of failing, and say which ones
are incomplete (a save that crashed half-way is the usual reason to open a checkpoint at all).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.formats import detect_format

TRACKER = "latest_checkpointed_iteration.txt"
_MEGATRON = re.compile(r"^iter_(\d+)$")
_VERL = re.compile(r"^global_step_(\d+)$")
_MARKERS = ("metadata.json", ".metadata")


@dataclass(frozen=True, slots=True)
class IterationInfo:
    path: str
    """Directory to open for this iteration (``iter_0000100`` or ``global_step_100/actor``)."""
    iteration: int
    size: int
    """Bytes of every file below ``path``."""
    complete: bool
    """A checkpoint is readable there (a reader recognises it, or Megatron's markers are present)."""
    latest: bool = False
    """The tracker file names this iteration."""


def _dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _is_complete(path: Path) -> bool:
    try:
        entries = [e.name for e in path.iterdir()]
    except OSError:
        return False
    if any(m in entries for m in _MARKERS) or any(e.startswith("mp_rank_") for e in entries):
        return True
    try:
        detect_format(path)
    except CkptError:
        return False
    return True


def read_tracker(root: Path) -> int | None:
    """The iteration in Megatron's tracker file, or None (missing, or ``release``)."""
    try:
        text = (root / TRACKER).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def discover_iterations(path: str | Path) -> list[IterationInfo] | None:
    """Iterations saved under ``path``, newest first; ``None`` when ``path`` is not a save root."""
    root = Path(path)
    if not root.is_dir():
        return None
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return None
    latest = read_tracker(root)
    found: list[IterationInfo] = []
    for entry in entries:
        if not entry.is_dir():
            continue
        target = None
        if m := _MEGATRON.match(entry.name):
            target = entry
        elif (m := _VERL.match(entry.name)) is not None:
            target = entry / "actor" if (entry / "actor").is_dir() else entry
        if target is None or m is None:
            continue
        iteration = int(m.group(1))
        found.append(IterationInfo(path=str(target), iteration=iteration, size=_dir_size(target),
                                   complete=_is_complete(target), latest=iteration == latest))
    if not found and not (root / TRACKER).is_file():
        return None
    found.sort(key=lambda info: info.iteration, reverse=True)
    return found
