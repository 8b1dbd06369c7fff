"""Renaming safetensors files and HF safetensors directories: header-only rewrites.

Each data file gets a new header (``__metadata__`` kept) and its tensor bytes copied verbatim;
``model.safetensors.index.json`` is regenerated from what was written; every other file of an HF
directory (config, tokenizer, ...) is copied as it is.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex
from ckptscope.formats.safetensors.reader import parse_safetensors_header
from ckptscope.formats.safetensors.writer import write_renamed
from ckptscope.ops.rename.files import FileAction, RenamePlan
from ckptscope.ops.rename.plan import NameChanges


class SafetensorsRenameWriter:
    formats = ("safetensors", "hf")

    def check(self, index: CheckpointIndex, src: Path) -> None:
        if index.format == "hf" and index.metadata.get("weights") != "safetensors":
            raise CkptError("rename does not support HF pytorch_model*.bin directories yet "
                            "(safetensors files and directories are supported)", src)

    def plan_files(self, index: CheckpointIndex, changes: NameChanges) -> list[FileAction]:
        dropped = set(changes.dropped)
        by_file: dict[str, list[str]] = {}
        for meta in index.tensors.values():
            by_file.setdefault(meta.chunks[0].file, []).append(meta.name)
        actions = []
        for file, names in by_file.items():
            kept = [n for n in names if n not in dropped]
            nbytes = sum(index.tensors[n].nbytes for n in kept)
            actions.append(FileAction(file, "rewrite-header" if kept else "omit", len(kept), nbytes))
        if index.format == "hf":
            actions += hf_side_files(index, set(by_file))
        return actions

    def write_file(self, plan: RenamePlan, action: FileAction, src: Path, out: Path,
                   advance: Callable[[int], None]) -> dict[str, str]:
        header = parse_safetensors_header(src, action.path)
        new_names = plan.new_names()
        write_renamed(src, header, new_names, out, advance)
        return {new_names[old]: action.path for old in header.tensors if old in new_names}

    def regenerate(self, plan: RenamePlan, action: FileAction, src: Path, out: Path,
                   written: Mapping[str, str]) -> None:
        regenerate_hf_index(plan, src, out, written)


def hf_side_files(index: CheckpointIndex, data_files: set[str]) -> list[FileAction]:
    """Every non-weight file of an HF directory: the index is regenerated, the rest copied."""
    actions = []
    for info in index.files:
        if info.path not in data_files:
            action = "regenerate" if info.role == "index" else "copy"
            actions.append(FileAction(info.path, action, 0, 0 if action == "regenerate" else info.size))
    return actions


def regenerate_hf_index(plan: RenamePlan, src: Path, out: Path, written: Mapping[str, str]) -> None:
    """Regenerate ``weight_map`` from what was written; keep the rest of the index metadata."""
    data = json.loads(src.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or "weight_map" not in data:
        shutil.copy2(src, out)
        return
    metadata = dict(data.get("metadata") or {})
    if "total_size" in metadata:
        metadata["total_size"] = sum(plan.nbytes[old] for old in plan.new_names())
    data["metadata"] = metadata
    data["weight_map"] = dict(sorted(written.items()))
    out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
