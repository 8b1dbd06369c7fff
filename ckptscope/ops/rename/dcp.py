"""Renaming PyTorch DCP directories and Megatron-Core torch_dist iteration dirs: metadata only.

A DCP chunk is addressed by (key, offset) in ``.metadata`` and stored as a byte range of a
``__{rank}_{k}.distcp`` file; with the default ``torch_save`` serialisation no name is written into
the data files. So a rename regenerates ``.metadata`` (``formats/dcp/metadata_rename.py``) and reuses every
data file as it is: a hard link where the filesystem allows it, else a copy. Megatron's
``metadata.json`` and ``common.pt`` (and any other file of the directory) are copied verbatim.

What gets renamed, and why:

* Names are the STORED keys. For torch_dist that is the stacked ``decoder.layers.<suffix>`` tensor
  (axis 0 = layer); the per-layer views ckptscope shows (``decoder.layers.3.…``) are not stored and
  cannot be renamed one by one. A ``--sub`` on ``layers\\.`` therefore sees the stacked keys.
* Non-tensor entries (DCP bytes items: Megatron ShardedObjects such as
  ``<module>._extra_state/shard_0_2``, optimizer ``param_groups`` leaves) *follow their module*:
  the deepest dotted prefix of the entry's key (before any ``/shard_…`` suffix) under which
  tensors are stored decides. When every kept tensor under it moves to one new prefix, the entry
  moves with them; when every tensor under it is dropped, the entry is dropped; otherwise (no
  tensor under it, tensors untouched, or tensors moved apart) it keeps its key. This is what makes
  ``--sub linear_qkv qkv`` keep a layer's ``_extra_state`` next to its weight (Megatron loads both
  under the module's new key) and what keeps ``optim.param_groups`` beside ``optim.state`` when the
  ``optim`` prefix is renamed. The rule works alike for ``--sub``, ``--map`` and ``--drop``; the
  "pattern matches nothing" check is about tensors only, and the printed plan lists tensors.
* torch's *flattened* optimizer state (``get_state_dict(..., flatten_optimizer_state_dict=True)``,
  torchtitan's layout) keeps each parameter's settings as bytes leaves
  ``<opt>.param_groups.<param>.<setting>`` beside its tensors ``<opt>.state.<param>.<name>``; no tensor
  lies under the settings' prefix, so the module rule would leave them under the old parameter name
  and ``set_optimizer_state_dict`` would miss them on resume. They follow that parameter's state
  tensors instead (or, for a parameter without state, the model tensor ``<param>``): moved with them,
  dropped with them (``_param_group_leaf``).
* ``planner_data`` (nested paths) is re-derived for the new keys; renames whose keys would nest
  inside each other are refused before anything is written.
* A Megatron save root (``latest_checkpointed_iteration.txt`` + ``iter_*/``) is not a checkpoint
  ckptscope opens; rename one iteration dir (and copy the tracker yourself if needed).
* DCP saved with ``SerializationFormat.SAFETENSORS`` stores the keys inside the data files too,
  so it is refused rather than half renamed; tensors Megatron keeps in ``common.pt`` cannot be
  renamed either (the file is copied as it is).

Dropping a tensor removes it from ``.metadata``; its bytes stay in the (shared) data files, and a
data file no kept entry points into is left out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex
from ckptscope.formats.dcp.metadata import DcpMetadata, load_dcp_metadata
from ckptscope.formats.dcp.metadata_rename import (
    check_nesting,
    load_metadata_record,
    nested_path,
    planner_paths,
    write_renamed_metadata,
)
from ckptscope.formats.dcp.reader import METADATA_FILE, DcpReader
from ckptscope.ops.rename.files import FileAction, RenamePlan
from ckptscope.ops.rename.plan import NameChanges, RenamePlanError

_SHOW = 5


def _module_moves(tensors: Mapping[str, str | None]) -> dict[str, tuple[str, str | None]]:
    """For every dotted prefix that has tensors under it: ("drop", None), ("move", new prefix) or
    ("stay", None), from the tensors' old -> new names (None: dropped)."""
    outcomes: dict[str, set[str | None]] = {}
    dropped_only: dict[str, bool] = {}
    for old, new in tensors.items():
        parts = old.split(".")
        for cut in range(1, len(parts)):
            prefix = ".".join(parts[:cut])
            rest = old[len(prefix):]
            seen = outcomes.setdefault(prefix, set())
            if new is None:
                dropped_only.setdefault(prefix, True)
                continue
            dropped_only[prefix] = False
            if new.endswith(rest) and len(new) > len(rest):
                seen.add(new[: -len(rest)])
            else:
                seen.add("\0")  # this tensor left the prefix's subtree in another way
    moves: dict[str, tuple[str, str | None]] = {}
    for prefix, seen in outcomes.items():
        if dropped_only[prefix]:
            moves[prefix] = ("drop", None)
        elif len(seen) == 1 and (target := next(iter(seen))) not in ("\0", prefix):
            moves[prefix] = ("move", target)
        else:
            moves[prefix] = ("stay", None)
    return moves


def follow_module(name: str, moves: Mapping[str, tuple[str, str | None]]) -> str | None:
    """New name of a non-tensor entry under the module rule (module docstring); None: dropped."""
    base = name.split("/", 1)[0]
    parts = base.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in moves:
            kind, target = moves[prefix]
            if kind == "drop":
                return None
            if kind == "move" and target is not None:
                return target + name[len(prefix):]
            return name
    return name


_PARAM_GROUP_LEAF = re.compile(r"(?P<opt>(?:.+\.)?)param_groups\.(?P<param>.+)\.(?P<leaf>[^./]+)")


def _param_group_leaf(name: str, tensors: Mapping[str, str | None],
                      state_of: Mapping[tuple[str, str], list[str]]) -> tuple[bool, str | None]:
    """(applies, new name) of a flattened optimizer setting ``<opt>.param_groups.<param>.<leaf>``
    (module docstring): where the state tensors of ``<param>`` under ``<opt>.state.`` went, or the
    model tensor ``<param>`` when it has no state. (False, None) for anything else."""
    m = _PARAM_GROUP_LEAF.fullmatch(name)
    if m is None:
        return False, None
    opt, param, leaf = m["opt"], m["param"], m["leaf"]
    if param.split(".", 1)[0].isdigit():
        # ``param_groups.0.lr``: a group of ``optimizer.state_dict()``'s list (its state keyed by
        # parameter ids), not a parameter's name. The module rule decides.
        return False, None
    olds = state_of.get((opt, param))
    if olds:
        targets = set()
        for old in olds:
            new = tensors[old]
            if new is None:
                targets.add(None)
                continue
            tail = old[len(f"{opt}state.{param}"):]  # ".exp_avg"
            if not new.endswith(tail):
                return False, None  # the state moved apart from its parameter's name: no rule applies
            head = new[: -len(tail)]
            at = next(_state_starts(head), None)
            if at is None:
                return False, None
            targets.add(f"{head[:at]}param_groups.{head[at + len('state.'):]}.{leaf}")
        if len(targets) != 1:
            return False, None
        return True, targets.pop()
    if param in tensors:  # a parameter with no optimizer state yet: its settings follow the parameter
        new = tensors[param]
        return True, None if new is None else f"{opt}param_groups.{new}.{leaf}"
    return False, None


def _state_starts(name: str) -> Iterator[int]:
    """Where a ``state.`` component starts in a dotted name (the optimizer prefix ends just before)."""
    at = name.find("state.")
    while at >= 0:
        if at == 0 or name[at - 1] == ".":
            yield at
        at = name.find("state.", at + 1)


def _state_tensors(tensors: Mapping[str, str | None]) -> dict[tuple[str, str], list[str]]:
    """(optimizer prefix, parameter) -> its flattened state tensors ``<opt>.state.<param>.<name>``."""
    out: dict[tuple[str, str], list[str]] = {}
    for name in tensors:
        for at in _state_starts(name):
            param, dot, _ = name[at + len("state."):].rpartition(".")
            if dot and param:
                out.setdefault((name[:at], param), []).append(name)
    return out


def _listing(items: list[str]) -> str:
    shown = ", ".join(repr(i) for i in items[:_SHOW])
    return shown + (f" and {len(items) - _SHOW} more" if len(items) > _SHOW else "")


def stored_key_changes(meta: DcpMetadata, changes: NameChanges, where: Path) -> dict[str, str | None]:
    """Every ``.metadata`` key -> its new key (None: dropped), tensors from the plan and bytes
    entries by the module rule; collisions and empty names are refused."""
    names = DcpReader._display_names(meta)  # the names the reader showed, which the plan is about
    tensors: dict[str, str | None] = {}
    keys: dict[str, str | None] = {}
    for key in meta.tensors:
        shown = names[key]
        new = changes.new_name(shown)
        tensors[shown] = new
        keys[key] = key if new == shown else new
    moves = _module_moves(tensors)
    state_of = _state_tensors(tensors) if any("param_groups." in names[k] for k in meta.bytes_entries) else {}
    for key in meta.bytes_entries:
        applies, new_shown = _param_group_leaf(names[key], tensors, state_of)
        if not applies:
            new_shown = follow_module(names[key], moves)
        keys[key] = None if new_shown is None else key if new_shown == names[key] else new_shown
    empty = [k for k, v in keys.items() if v is not None and not v.strip()]
    if empty:
        raise RenamePlanError(f"renaming would leave an empty name for: {_listing(empty)}")
    owners: dict[str, list[str]] = {}
    for old, new in keys.items():
        if new is not None:
            owners.setdefault(new, []).append(old)
    clashes = [f"{', '.join(repr(o) for o in olds)} -> {new!r}" for new, olds in owners.items() if len(olds) > 1]
    if clashes:
        raise RenamePlanError(f"names would collide (objects follow their module's tensors): "
                              f"{'; '.join(clashes[:_SHOW])}")
    return keys


def new_planner_paths(src_meta: Path, keys: Mapping[str, str | None]) -> dict[str, tuple[str | int, ...]] | None:
    """The nested paths the regenerated ``.metadata`` will record (None: the source has none)."""
    paths = planner_paths(load_metadata_record(src_meta))
    if paths is None:
        return None
    out = {}
    for key, path in paths.items():
        new = keys.get(key, key)
        if new is not None:
            out[new] = path if new == key else nested_path(path, new)
    return out


class DcpRenameWriter:
    """``RenameWriter`` for plain DCP dirs and Megatron torch_dist / torch_dcp iteration dirs."""

    formats = ("dcp", "megatron_dist", "megatron_dcp")

    def check(self, index: CheckpointIndex, src: Path) -> None:
        if any(meta.attr("stored_as") for meta in index.tensors.values()):
            raise CkptError("rename does not support this fsdp_dtensor save: its SwiGLU fc1 tensors are shown "
                            "fused from two stored halves, which rename cannot address", src)
        serialization = (index.metadata.get("dcp") or {}).get("serialization")
        if serialization != "torch_save":
            raise CkptError(f"rename supports DCP saved with the default torch_save serialisation only "
                            f"(this one: {serialization}; its data files hold the tensor names too)", src)

    def plan_files(self, index: CheckpointIndex, changes: NameChanges) -> list[FileAction]:
        root = Path(index.path)
        meta = load_dcp_metadata(root / METADATA_FILE)
        outside = [n for n in (*changes.renamed, *changes.dropped)
                   if n not in DcpReader._display_names(meta).values()]
        if outside:
            raise RenamePlanError(f"these tensors live in common.pt, which rename copies as it is: "
                                  f"{_listing(outside)}")
        keys = stored_key_changes(meta, changes, root)
        paths = new_planner_paths(root / METADATA_FILE, keys)
        if paths:
            check_nesting(paths, root)
        used: dict[str, set[str]] = {}
        for key, tensor in meta.tensors.items():
            if keys[key] is not None:
                for chunk in tensor.chunks:
                    if chunk.storage is not None:
                        used.setdefault(chunk.storage.file, set()).add(key)
        for key, info in meta.bytes_entries.items():
            if keys[key] is not None and info is not None:
                used.setdefault(info.file, set())
        referenced = {c.storage.file for t in meta.tensors.values() for c in t.chunks if c.storage is not None}
        referenced |= {i.file for i in meta.bytes_entries.values() if i is not None}
        actions = [FileAction(METADATA_FILE, "regenerate")]
        for entry in sorted(os.scandir(root), key=lambda e: e.name):
            if entry.name == METADATA_FILE:
                continue
            size = entry.stat().st_size if entry.is_file() else _tree_size(Path(entry.path))
            if entry.name in referenced:
                if entry.name in used:
                    actions.append(FileAction(entry.name, "link", len(used[entry.name]), size))
                else:
                    actions.append(FileAction(entry.name, "omit", 0, 0))
            else:
                actions.append(FileAction(entry.name, "copy", 0, size))
        return actions

    def write_file(self, plan: RenamePlan, action: FileAction, src: Path, out: Path,
                   advance: Callable[[int], None]) -> dict[str, str]:
        raise CkptError("DCP rename rewrites no data file", src)  # plan_files never asks for one

    def regenerate(self, plan: RenamePlan, action: FileAction, src: Path, out: Path,
                   written: Mapping[str, str]) -> None:
        """Write the renamed ``.metadata``; the key map is recomputed from the checked plan."""
        keys = stored_key_changes(load_dcp_metadata(src), plan.changes, plan.src)
        write_renamed_metadata(src, out, keys, checkpoint_id=str(plan.dst.resolve()))


def _tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
