"""Save directories that hold many iterations: find them so a user can pick one.

Trainers write one directory per save under a root: Megatron ``iter_0000100/`` next to a
``latest_checkpointed_iteration.txt`` tracker, verl ``global_step_100/actor/`` (and ``critic/``)
next to the same tracker, torchtitan ``checkpoint/step-100/`` (no tracker: the newest complete
step is the latest, FORMATS.md §5.7). Opening the root itself should offer the iterations (newest
first) instead of failing, and say which ones are incomplete (a save that crashed half-way is the
usual reason to open a checkpoint at all). ``pick_iteration`` is what the CLI opens by default.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.formats import detect_format

TRACKER = "latest_checkpointed_iteration.txt"
_MEGATRON = re.compile(r"^iter_(\d+)$")
_VERL = re.compile(r"^global_step_(\d+)$")
_TORCHTITAN = re.compile(r"^step-(\d+)$")
VERL_ROLES = ("actor", "critic")
"""The role dirs of a verl step, in the order opening prefers them."""


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
    """The tracker file names this iteration (torchtitan, which has none: the newest complete step)."""
    kind: str = ""
    """``megatron``, ``verl`` or ``torchtitan``: which trainer's layout the root has."""
    roles: tuple[str, ...] = ()
    """verl: the role dirs saved at this step (``actor``, ``critic``); ``path`` is the first."""


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
    from ckptscope.formats.megatron.legacy_reader import is_complete_save
    from ckptscope.formats.verl.reader import verl_complete

    verl = verl_complete(path)  # every rank file / the torch_dist marker, not just "a reader sniffs it"
    if verl is not None:
        return verl
    if any(e.startswith("mp_rank_") for e in entries):  # Megatron legacy: every rank file finished
        return is_complete_save(path)
    if "metadata.json" in entries:  # Megatron dist: its marker is written after everything else (§4.1)
        return True
    if ".metadata" in entries or any(e.endswith(".distcp") for e in entries):
        # DCP renames .metadata into place once all data is written (§5.1); a torch_dist save that has
        # it but still lacks Megatron's marker (common.pt present) crashed before finalising.
        return ".metadata" in entries and "common.pt" not in entries
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
        target, kind, roles = None, "", ()
        if m := _MEGATRON.match(entry.name):
            target, kind = entry, "megatron"
        elif (m := _VERL.match(entry.name)) is not None:
            roles = tuple(r for r in VERL_ROLES if (entry / r).is_dir())
            target, kind = (entry / roles[0] if roles else entry), "verl"
        elif (m := _TORCHTITAN.match(entry.name)) is not None:
            target, kind = entry, "torchtitan"
        if target is None or m is None:
            continue
        iteration = int(m.group(1))
        found.append(IterationInfo(path=str(target), iteration=iteration, size=_dir_size(target),
                                   complete=_is_complete(target), latest=iteration == latest, kind=kind,
                                   roles=roles))
    if not found and not (root / TRACKER).is_file():
        return None
    found.sort(key=lambda info: info.iteration, reverse=True)
    if latest is None and not (root / TRACKER).is_file():  # torchtitan: the newest complete step
        newest = next((i for i in found if i.complete and i.kind == "torchtitan"), None)
        if newest is not None:
            found = [replace(i, latest=True) if i is newest else i for i in found]
    return found


def _label(info: IterationInfo) -> str:
    notes = [note for note, on in (("latest", info.latest), ("incomplete", not info.complete)) if on]
    return f"{info.iteration} ({', '.join(notes)})" if notes else str(info.iteration)


def describe_iterations(found: list[IterationInfo]) -> str:
    """One line naming every iteration, e.g. ``30 (incomplete), 20 (latest), 10``."""
    return ", ".join(_label(i) for i in found) or "none"


def default_iteration(found: list[IterationInfo]) -> IterationInfo | None:
    """What opening a save root picks: the latest (tracker) iteration when it is complete, else the
    newest complete one; None when no iteration is complete."""
    latest = next((i for i in found if i.latest and i.complete), None)
    return latest or next((i for i in found if i.complete), None)


def pick_iteration(root: str | Path, found: list[IterationInfo], iteration: int | None = None) -> IterationInfo:
    """Iteration ``iteration`` of the root (any, even incomplete: the user asked for it), or the
    default one. Raises ``CkptError`` listing what is there when there is no such iteration."""
    if iteration is not None:
        chosen = next((i for i in found if i.iteration == iteration), None)
        if chosen is None:
            raise CkptError(f"no iteration {iteration}; available: {describe_iterations(found)}", root)
        return chosen
    chosen = default_iteration(found)
    if chosen is None:
        raise CkptError(f"save directory without a complete iteration; found: {describe_iterations(found)}", root)
    return chosen


def resolve_root(path: str | Path) -> str:
    """A save root (Megatron tracker, verl/torchtitan step dirs) stands for its default iteration:
    the tracker's when complete, else the newest complete one (``roots.pick_iteration``)."""
    found = discover_iterations(path)
    if not found:
        return str(path)
    return pick_iteration(path, found).path
