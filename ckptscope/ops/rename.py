"""``rename``: new names for stored tensors, data copied bit for bit, written atomically.

Plan first (``plan_rename``: names checked, files listed, nothing written; what ``--dry-run``
prints and the TUI previews), then execute (``execute_rename``). Only headers and indices are
rebuilt; tensor bytes are copied verbatim, never decoded.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.formats import open_checkpoint
from ckptscope.formats.safetensors_file import parse_safetensors_header
from ckptscope.formats.safetensors_write import write_renamed
from ckptscope.ops.atomic import atomic_output, check_destination, copy_range
from ckptscope.ops.rename_plan import NameChanges, compute_name_changes

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes total)."""

SUPPORTED = ("safetensors", "hf")


@dataclass(frozen=True, slots=True)
class FileAction:
    path: str
    """Relative to the destination root (the file name for single-file checkpoints)."""
    action: str
    """``rewrite-header`` (tensor bytes copied verbatim), ``copy``, ``regenerate`` (an index), ``omit``."""
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
    weights: str | None = None
    nbytes: dict[str, int] = field(default_factory=dict)
    """Bytes of every stored tensor, by old name (for regenerated index totals)."""

    @property
    def total_bytes(self) -> int:
        return sum(f.nbytes for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "src": str(self.src), "dst": str(self.dst), "format": self.format,
            "renamed": [{"old": o, "new": n} for o, n in self.changes.renamed.items()],
            "dropped": list(self.changes.dropped),
            "untouched": len(self.changes.untouched),
            "files": [{"path": f.path, "action": f.action, "tensors": f.tensors, "nbytes": f.nbytes}
                      for f in self.files],
        }


def plan_rename(src: str | Path, dst: str | Path, *, subs: Sequence[tuple[str, str]] = (),
                drops: Sequence[str] = (), mapping: Mapping[str, str] | None = None,
                overwrite: bool = False) -> RenamePlan:
    """Check the request against the checkpoint's names and list what will be written."""
    src, dst = Path(src), Path(dst)
    if not (subs or drops or mapping):
        raise CkptError("nothing to do: give --sub, --drop or --map")
    with open_checkpoint(src) as reader:
        index = reader.index()
    if index.format not in SUPPORTED or (index.format == "hf" and index.metadata.get("weights") != "safetensors"):
        kind = index.format if index.format != "hf" else f"hf ({index.metadata.get('weights')})"
        raise CkptError(f"rename does not support {kind} checkpoints yet (supported: safetensors files and HF "
                        "safetensors directories)", src)
    check_destination(src, dst, overwrite=overwrite)
    changes = compute_name_changes(list(index.tensors), subs=subs, drops=drops, mapping=mapping)
    plan = RenamePlan(src=src, dst=dst, format=index.format, changes=changes, overwrite=overwrite,
                      weights=index.metadata.get("weights"),
                      nbytes={name: meta.nbytes for name, meta in index.tensors.items()})
    dropped = set(changes.dropped)
    by_file: dict[str, list[str]] = {}
    for meta in index.tensors.values():
        by_file.setdefault(meta.chunks[0].file, []).append(meta.name)
    for file in by_file:
        kept = [n for n in by_file[file] if n not in dropped]
        nbytes = sum(index.tensors[n].nbytes for n in kept)
        plan.files.append(FileAction(file, "rewrite-header" if kept else "omit", len(kept), nbytes))
    if index.format == "hf":
        for info in index.files:
            if info.path in by_file:
                continue
            action = "regenerate" if info.role == "index" else "copy"
            plan.files.append(FileAction(info.path, action, 0, 0 if action == "regenerate" else info.size))
    return plan


def execute_rename(plan: RenamePlan, progress: Progress | None = None, *, workers: int | None = None) -> None:
    """Write the destination atomically. The source is only ever read.

    Files are written in parallel (the range copies release the GIL and run in the kernel), which
    is how a rename of a sharded checkpoint keeps up with ``cp``.
    """
    check_destination(plan.src, plan.dst, overwrite=plan.overwrite)
    total, done = plan.total_bytes, 0
    lock = threading.Lock()

    def advance(n: int) -> None:
        nonlocal done
        with lock:
            done += n
            if progress:
                progress(done, total)

    new_names = {old: new for old in _all_names(plan) if (new := plan.changes.new_name(old)) is not None}
    directory = plan.format == "hf"
    with atomic_output(plan.dst, directory=directory, overwrite=plan.overwrite) as staging:
        weight_map: dict[str, str] = {}

        def write_one(action: FileAction) -> None:
            src_file = plan.src / action.path if directory else plan.src
            out_file = staging / action.path if directory else staging
            if action.action == "rewrite-header":
                header = parse_safetensors_header(src_file, action.path)
                write_renamed(src_file, header, new_names, out_file, copy_range, advance)
                with lock:
                    weight_map.update({new_names[o]: action.path for o in header.tensors if o in new_names})
            elif action.action == "copy":
                if src_file.is_dir():
                    shutil.copytree(src_file, out_file)
                else:
                    shutil.copy2(src_file, out_file)
                advance(action.nbytes)

        jobs = [a for a in plan.files if a.action in ("rewrite-header", "copy")]
        with ThreadPoolExecutor(max_workers=workers or min(4, len(jobs) or 1)) as pool:
            for future in [pool.submit(write_one, a) for a in jobs]:
                future.result()
        for action in plan.files:
            if action.action == "regenerate":
                _write_index(plan.src / action.path, staging / action.path, weight_map, plan, new_names)


def _all_names(plan: RenamePlan) -> list[str]:
    return [*plan.changes.renamed, *plan.changes.dropped, *plan.changes.untouched]


def _write_index(src_index: Path, dst_index: Path, weight_map: dict[str, str], plan: RenamePlan,
                 new_names: Mapping[str, str]) -> None:
    """Regenerate ``weight_map`` from what was written; keep the rest of the index metadata."""
    data = json.loads(src_index.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or "weight_map" not in data:
        shutil.copy2(src_index, dst_index)
        return
    metadata = dict(data.get("metadata") or {})
    if "total_size" in metadata:
        metadata["total_size"] = sum(plan.nbytes[old] for old in new_names)
    data["metadata"] = metadata
    data["weight_map"] = dict(sorted(weight_map.items()))
    dst_index.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
