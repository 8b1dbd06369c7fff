"""Renaming ``torch.save`` files (zip and legacy) and HF ``pytorch_model*.bin`` directories.

The file is parsed with the safe unpickler, the renamed tensors get new keys inside the dict that
holds them (key order kept), dropped tensors leave it, and the tree is pickled again by
``formats.torch_save.writer`` with every storage record copied verbatim; storages no tensor refers to
any more are left out. Nothing from the file is ever executed.

A rename must keep a tensor in the same container: in ``{"model": {...state dict...}}`` the new
name of ``model.x`` must start with ``model.`` (the key inside the ``model`` dict changes). Moving
a tensor to another dict, or renaming an item of a list or of a pickled object, is refused with
an error naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex
from ckptscope.formats.filecopy import copy_range
from ckptscope.formats.pickles.safe import TensorRef
from ckptscope.formats.pickles.torch_file import StoragePlacement, flatten_paths, is_torch_zip, read_torch_zip
from ckptscope.formats.torch_save.legacy_reader import read_legacy_stream
from ckptscope.formats.torch_save.writer import write_torch_legacy, write_torch_zip
from ckptscope.ops.rename.files import FileAction, RenamePlan
from ckptscope.ops.rename.plan import NameChanges
from ckptscope.ops.rename.safetensors import hf_side_files, regenerate_hf_index


def needs_torch(plan: RenamePlan) -> bool:
    """Whether writing ``plan`` needs PyTorch: a torch.save zip is rewritten by torch's own zip writer
    (legacy pre-1.6 files and every other format are written without it). Asked before the plan is
    printed, so a machine without torch gets the one-line reason first, not a plan and then the error."""
    for action in plan.files:
        if action.action == "rewrite-pickle":
            source = plan.src / action.path if plan.directory else plan.src
            if is_torch_zip(source):
                return True
    return False


@dataclass
class _Edit:
    container: dict
    renames: dict[Any, str]
    drops: set[Any]


def _child_key(container: Any, element: str, name: str) -> Any:
    """The real key (int keys of optimizer state stay ints) behind one path element."""
    if isinstance(container, dict):
        for key in container:
            if str(key) == element:
                return key
    raise CkptError(f"tensor {name!r} is not inside a dict; only dict keys can be renamed")


def _move_problem(name: str, new: str, prefix: str) -> str | None:
    """Why renaming ``name`` (held in the dict at dotted path ``prefix``) to ``new`` cannot be written."""
    if prefix and not new.startswith(prefix + "."):
        return (f"renaming {name!r} to {new!r} would move it out of {prefix!r}; in torch files a rename must keep "
                f"the {prefix!r} prefix")
    return None


def container_paths(index: CheckpointIndex) -> dict[str, str]:
    """Each tensor's enclosing dict as a dotted path (``model`` in ``{"model": {...}}``, "" at the top):
    what a rename must keep (``rename_in_tree``). Reads each file's pickle once, no tensor bytes."""
    root = Path(index.path)
    paths: dict[str, str] = {}
    for file in dict.fromkeys(meta.chunks[0].file for meta in index.tensors.values()):
        for path, leaf in flatten_paths(_parse(root / file if root.is_dir() else root).obj):
            if isinstance(leaf, TensorRef):
                paths[".".join(path)] = ".".join(path[:-1])
    return paths


def container_problem(changes: NameChanges, paths: Mapping[str, str]) -> str | None:
    """The first rename in ``changes`` that would move a tensor out of its dict (``container_paths``), as
    ``plan_files`` refuses it; None when every one stays."""
    for name, new in changes.renamed.items():
        problem = _move_problem(name, new, paths.get(name, ""))
        if problem:
            return problem
    return None


def rename_in_tree(obj: Any, changes: NameChanges) -> Any:
    """Apply ``changes`` to the tensors of an unpickled torch object, in place; returns ``obj``."""
    edits: dict[int, _Edit] = {}
    for path, leaf in flatten_paths(obj):
        if not isinstance(leaf, TensorRef):
            continue
        name = ".".join(path)
        new = changes.new_name(name)
        if new == name:
            continue
        container = obj
        for element in path[:-1]:
            container = container[_child_key(container, element, name)]
        key = _child_key(container, path[-1], name)
        edit = edits.setdefault(id(container), _Edit(container, {}, set()))
        if new is None:
            edit.drops.add(key)
            continue
        prefix = ".".join(path[:-1])
        problem = _move_problem(name, new, prefix)
        if problem:
            raise CkptError(problem)
        edit.renames[key] = new[len(prefix) + 1:] if prefix else new
    for edit in edits.values():
        items = list(edit.container.items())
        edit.container.clear()
        for key, value in items:
            if key in edit.drops:
                continue
            new_key = edit.renames.get(key, key)
            if new_key in edit.container:
                raise CkptError(f"renamed key {new_key!r} collides with another entry of the same dict")
            edit.container[new_key] = value
        if len(edit.container) != len(items) - len(edit.drops):
            raise CkptError("renamed keys collide with other entries of the same dict")
    return obj


class TorchRenameWriter:
    formats = ("torch", "torch-legacy", "hf")

    def check(self, index: CheckpointIndex, src: Path) -> None:
        if index.format == "hf" and index.metadata.get("weights") != "pytorch_model.bin":
            raise CkptError("not an HF pytorch_model*.bin directory", src)
        odd = [m for m in index.tensors.values() if m.attr("kind") not in (None, "Parameter")]
        if odd:
            raise CkptError(f"rename cannot re-write tensor subclasses yet ({odd[0].name!r} is a "
                            f"{odd[0].attr('kind')})", src)

    def changes_checker(self, index: CheckpointIndex) -> Callable[[NameChanges], str | None]:
        """``container_problem`` of a set of changes, the files read on the first call (TUI previews)."""
        paths: dict[str, str] | None = None

        def check(changes: NameChanges) -> str | None:
            nonlocal paths
            if paths is None:
                paths = container_paths(index)
            return container_problem(changes, paths)
        return check

    def plan_files(self, index: CheckpointIndex, changes: NameChanges) -> list[FileAction]:
        dropped = set(changes.dropped)
        by_file: dict[str, list[str]] = {}
        for meta in index.tensors.values():
            by_file.setdefault(meta.chunks[0].file, []).append(meta.name)
        root = Path(index.path)
        actions = []
        for file, names in by_file.items():
            # Apply the rename to a parse of the file now, so a rename that cannot be expressed
            # in the file's nesting is refused before anything is written.
            rename_in_tree(_parse(root / file if root.is_dir() else root).obj, _restrict(changes, set(names)))
            kept = [n for n in names if n not in dropped]
            actions.append(FileAction(file, "rewrite-pickle", len(kept), sum(index.tensors[n].nbytes for n in kept)))
        if index.format == "hf":
            actions += hf_side_files(index, set(by_file))
        return actions

    def write_file(self, plan: RenamePlan, action: FileAction, src: Path, out: Path,
                   advance: Callable[[int], None]) -> dict[str, str]:
        parsed = _parse(src)
        before = _tensor_refs(parsed.obj)  # rename_in_tree edits the tree in place
        tree = rename_in_tree(parsed.obj, _restrict(plan.changes, _tensor_names(parsed.obj)))
        blank = dropped_bytes(before, _tensor_refs(tree))
        if parsed.sys_info is None:
            copied = write_torch_zip(tree, src, parsed.placements, out, blank=blank)
        else:
            if blank:
                raise CkptError("--drop of a tensor that shares its storage with kept tensors in a legacy "
                                "(pre-1.6) torch file: its bytes would stay in the file; convert it first", src)
            copied = write_torch_legacy(tree, src, parsed.placements, out, parsed.sys_info, copy_range)
        advance(min(copied, action.nbytes))
        return {name: action.path for name in _tensor_names(tree)}

    def regenerate(self, plan: RenamePlan, action: FileAction, src: Path, out: Path,
                   written: Mapping[str, str]) -> None:
        regenerate_hf_index(plan, src, out, written)


@dataclass
class _Parsed:
    obj: Any
    placements: dict[str, StoragePlacement]
    sys_info: Any
    """The legacy stream's sys-info record; None for zip files."""


def _parse(path: Path) -> _Parsed:
    if is_torch_zip(path):
        zipped = read_torch_zip(path)
        big_endian, parsed = zipped.big_endian, _Parsed(zipped.obj, zipped.storages, None)
    else:
        obj, placements, big_endian, sys_info = read_legacy_stream(path)
        parsed = _Parsed(obj, placements, sys_info)
    if big_endian:
        raise CkptError("rename of big-endian torch files is not supported", path)
    return parsed


def _byte_span(ref: TensorRef) -> tuple[int, int]:
    """Bytes of its storage a tensor reads: from its first element to one past its last."""
    start = ref.storage_offset * ref.dtype.itemsize
    return start, start + ref.span_elements * ref.dtype.itemsize


def _tensor_refs(obj: Any) -> list[TensorRef]:
    return [leaf for _, leaf in flatten_paths(obj) if isinstance(leaf, TensorRef) and leaf.storage is not None]


def dropped_bytes(before: list[TensorRef], after: list[TensorRef]) -> dict[str, list[tuple[int, int]]]:
    """Per storage key, the byte ranges only dropped tensors read, in storages that kept tensors
    still use: a storage is copied whole, and without blanking them the dropped weights would stay
    in the file (a DeepSpeed ``zero_to_fp32`` ``.bin`` keeps every tensor in one flat storage).
    Ranges a kept tensor also reads (a tied alias) are left alone."""
    kept: dict[str, list[tuple[int, int]]] = {}
    for ref in after:
        kept.setdefault(ref.storage.key, []).append(_byte_span(ref))
    kept_ids = {id(ref) for ref in after}
    blank: dict[str, list[tuple[int, int]]] = {}
    for ref in before:
        if id(ref) in kept_ids or ref.storage.key not in kept:
            continue  # kept, or its whole storage goes (not written at all)
        start, end = _byte_span(ref)
        if end > start and not any(s < end and start < e for s, e in kept[ref.storage.key]):
            blank.setdefault(ref.storage.key, []).append((start, end))
    return blank


def _tensor_names(obj: Any) -> set[str]:
    return {".".join(path) for path, leaf in flatten_paths(obj) if isinstance(leaf, TensorRef)}


def _restrict(changes: NameChanges, names: set[str]) -> NameChanges:
    """The plan restricted to the tensors of one file (shards of an HF dir each hold a part)."""
    return NameChanges(
        renamed={o: n for o, n in changes.renamed.items() if o in names},
        dropped=tuple(o for o in changes.dropped if o in names),
        untouched=tuple(o for o in changes.untouched if o in names),
    )
