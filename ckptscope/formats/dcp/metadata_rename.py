"""Writing a renamed DCP ``.metadata`` (FORMATS.md §4.2, §5.2) without torch and without unpickling the source.

Renaming a DCP or Megatron torch_dist checkpoint changes only ``.metadata``: every chunk keeps
its file and byte range, so the data files are reused as they are. The source is parsed with every
global it names turned into an inert stub (``pickles.safe.PickleStub``: module, name, constructor
arguments, BUILD state); the keys are renamed inside that tree, and the tree is written back by
``pickles.repickle.repickle`` with the same globals and opcodes. Torch's ``FileSystemReader`` and
Megatron's loader then read the result with their ordinary ``pickle.load``, exactly as they read
the source. Nothing from the source pickle is executed and torch is never imported: importing
``torch.distributed.checkpoint`` costs seconds, far more than the whole rename of the metadata.

Why stubs for *everything* (even ``torch.Size`` and dtypes, which the reader's allowlist turns
into plain values): a stub is written back as the very global it was read from, so each object
is re-created by the same constructor with the same state, whatever torch version wrote it
(``TensorProperties`` pickles a version-specific tuple through ``__getstate__``; it is carried,
never re-encoded).

What is changed and why:

* ``state_dict_metadata`` re-keyed, dropped keys left out; each ``storage_data`` key
  (``MetadataIndex``) gets the new ``fqn``, its offset/index and the ``_StorageInfo`` (file /
  offset / length / transforms) untouched;
* ``planner_data`` (flat key -> nested path, used by torch to rebuild nested state dicts) with
  paths re-derived for the new keys (``nested_path``), list indices kept as ints;
* ``storage_meta.checkpoint_id`` points at the new location (torch records where a checkpoint was
  written; ``save_id`` stays: the data is that save's);
* Megatron's ``mcore_data`` (per-key reformulation info, pre-0.16) re-keyed and kept on the base
  ``Metadata`` as older Megatron releases did; megatron-core reads it with ``getattr`` so the base
  class serves every version (0.15's ``MCoreMetadata`` is only kept as an empty dummy by later
  releases), and the written pickle names no Megatron class. ``all_local_plans`` is dropped: it
  is Megatron's save-side cache of the old save plans, keyed by the old names, and only consulted
  to reuse a plan on the next save. Other extra attributes are carried when they are plain data
  (they cannot be renamed, so anything else is refused rather than guessed at).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.formats.dcp.metadata import MetadataRecord, field_of, load_metadata_record, unpickle_metadata_file
from ckptscope.formats.pickles.repickle import repickle
from ckptscope.formats.pickles.safe import PickleStub, SafeUnpickler, stub_class

__all__ = ["check_nesting", "load_metadata_record", "nested_path", "planner_paths", "renamed_metadata_bytes",
           "write_renamed_metadata"]

PathPart = str | int
_PLAIN = (str, int, float, bool, type(None))
_DROPPED_EXTRAS = {"all_local_plans"}
_FIELDS = set(MetadataRecord.FIELDS)

_DCP_META = "torch.distributed.checkpoint.metadata"
_MCORE = "megatron.core.dist_checkpointing.strategies.torch"
_METADATA_CLASSES = {(_DCP_META, "Metadata"), (_MCORE, "MCoreMetadata")}
_ENTRY_CLASSES = {(_DCP_META, "TensorStorageMetadata"), (_DCP_META, "BytesStorageMetadata")}
_METADATA_PROTOCOL = 4
"""What ``pickle.dump`` writes by default on the Pythons torch supports, as torch's writer does."""


def planner_paths(raw: MetadataRecord) -> dict[str, tuple[PathPart, ...]] | None:
    """``planner_data`` with its original part types (ints are list indices), or None."""
    return _paths(field_of(raw, "planner_data"))


def _paths(planner: Any) -> dict[str, tuple[PathPart, ...]] | None:
    """The one reading of a ``planner_data`` value, shared by the planner and the writer so the
    nesting checked at plan time is the nesting written."""
    if not isinstance(planner, dict):
        return None
    return {str(k): tuple(p if isinstance(p, int) and not isinstance(p, bool) else str(p) for p in v)
            for k, v in planner.items() if isinstance(v, (tuple, list))}


def nested_path(old_path: tuple[PathPart, ...], new_key: str) -> tuple[PathPart, ...]:
    """A nested path for ``new_key`` that keeps as much of ``old_path``'s structure as possible.

    Leading and trailing parts that still spell the same text are kept (with their types, so a
    list index stays an int); whatever changed in between becomes one string part, so a rename
    never makes the nesting deeper. The parts always join with ``.`` to ``new_key``, the
    invariant torch's flattening relies on.
    """
    texts = [str(p) for p in old_path]
    n, i, j, rest = len(old_path), 0, 0, new_key
    while i < n - 1 and rest.startswith(texts[i] + "."):
        rest = rest[len(texts[i]) + 1:]
        i += 1
    while i + j < n and len(rest) > len(texts[n - 1 - j]) + 1 and rest.endswith("." + texts[n - 1 - j]):
        rest = rest[: -len(texts[n - 1 - j]) - 1]
        j += 1
    if i + j == n and j:  # keep the depth: the changed text joins the first kept tail part
        rest = f"{rest}.{texts[n - j]}"
        j -= 1
    middle: PathPart = rest
    if i + j == n - 1 and texts[i] == rest:
        middle = old_path[i]  # unchanged: keep its type
    elif i + j == n - 1 and isinstance(old_path[i], int) and rest.isdigit():
        middle = int(rest)  # a list index renumbered stays a list index
    return (*old_path[:i], middle, *old_path[n - j:])


def check_nesting(paths: Mapping[str, tuple[PathPart, ...]], where: Path) -> None:
    """Refuse paths torch could not rebuild a nested state dict from: one path inside another
    (a leaf that is also a container) or a container indexed by both ints and strings."""
    leaves = {path: key for key, path in paths.items()}
    kinds: dict[tuple[PathPart, ...], set[type]] = {}
    for key, path in paths.items():
        for i in range(1, len(path)):
            prefix = path[:i]
            if prefix in leaves:
                raise CkptError(f"renamed keys nest inside each other: {leaves[prefix]!r} would be both a value "
                                f"and the container of {key!r}", where)
            kinds.setdefault(prefix, set()).add(type(path[i]))
        kinds.setdefault((), set()).add(type(path[0]))
    mixed = [".".join(map(str, p)) or "<root>" for p, k in kinds.items() if len(k) > 1]
    if mixed:
        raise CkptError(f"renamed keys mix list indices and names under {mixed[0]!r}", where)


# --- the stub tree -------------------------------------------------------------------------------


class _StubUnpickler(SafeUnpickler):
    """Every global becomes a stub, even those the reader's allowlist turns into plain values.

    The reader wants ``torch.Size`` as a tuple and ``torch.bfloat16`` as a ``DType``; a writer
    wants them back as the very globals they were, so nothing is normalised here. Persistent ids
    (tensor storages) are still refused by ``SafeUnpickler``: a ``.metadata`` has none.
    """

    def find_class(self, module: str, name: str) -> Any:
        return stub_class(module, name)


def _is(obj: Any, names: set[tuple[str, str]]) -> bool:
    return isinstance(obj, PickleStub) and (type(obj).stub_module, type(obj).stub_name) in names


def _state(obj: Any, what: str, where: Path) -> dict[str, Any]:
    """The BUILD dict of a dataclass stub (how torch pickles its metadata dataclasses:
    ``NEWOBJ`` of no arguments, then ``BUILD`` with ``__dict__``)."""
    if not isinstance(obj, PickleStub) or obj.args or obj.kwargs or obj.items or obj.dict_items \
            or not isinstance(obj.state, dict):
        kind = type(obj).qualname() if isinstance(obj, PickleStub) else type(obj).__name__
        raise CkptError(f"cannot rename: {what} is not pickled as a plain dataclass ({kind})", where)
    return obj.state


def _rebuilt(like: PickleStub, state: dict[str, Any], cls: type[PickleStub] | None = None) -> PickleStub:
    """A new dataclass stub built like ``like`` (same opcodes), with ``state`` for BUILD."""
    cls = cls or type(like)
    new = cls(*like.args) if like.called else cls.__new__(cls, *like.args)
    object.__setattr__(new, "state", state)  # PickleStub routes attribute writes to dict_items
    return new


def _path_stub(old: PickleStub, checkpoint_id: str) -> PickleStub:
    """``checkpoint_id`` as the ``pathlib`` class the source used (``PosixPath(*parts)``, what
    ``Path.__reduce__`` writes), or as this platform's ``Path`` class when the source held some
    other object."""
    cls = type(old)
    if not cls.stub_module.startswith("pathlib"):
        local = type(Path(checkpoint_id))
        cls = stub_class(local.__module__, local.__name__)
    return cls(*Path(checkpoint_id).parts)


def _check_plain(value: Any, what: str, where: Path) -> None:
    """Refuse anything but json-like data: a renamed checkpoint cannot know whether an unknown
    object holds the old key names, so it is not carried blindly."""
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_plain(item, what, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_plain(key, what, where)
            _check_plain(item, what, where)
    elif _is(value, {("collections", "OrderedDict")}) and not value.args and not value.items:
        _check_plain(value.dict_items, what, where)
    else:
        kind = type(value).qualname() if isinstance(value, PickleStub) else type(value).__name__
        raise CkptError(f"cannot carry over {what}: it holds {kind}", where)


def load_metadata_tree(path: Path) -> PickleStub:
    """``path`` unpickled into stubs only (nothing imported, nothing executed); its root must be
    torch's ``Metadata`` (or Megatron 0.15's ``MCoreMetadata``)."""
    root = unpickle_metadata_file(path, lambda handle: _StubUnpickler(handle).load())
    if not _is(root, _METADATA_CLASSES):
        kind = type(root).qualname() if isinstance(root, PickleStub) else type(root).__name__
        raise CkptError(f"not a DCP .metadata pickle: it holds {kind}, not Metadata", path)
    return root


def renamed_tree(root: PickleStub, new_keys: Mapping[str, str | None], *, checkpoint_id: str,
                 where: Path) -> PickleStub:
    """A stub ``Metadata`` equal to ``root`` with every key renamed by ``new_keys`` (None: dropped;
    absent: unchanged). Everything not named here is the source's own object, carried as read."""

    def new(key: Any) -> Any:
        if not isinstance(key, str):
            return key
        target = new_keys.get(key, key)
        # An unchanged key stays the tree's own string object: pickle shares one memo entry between
        # the key, its MetadataIndex fqn and its planner_data entry, as in the source.
        return key if target == key else target

    old = _state(root, "the metadata", where)
    state: dict[str, Any] = {}
    for name, value in old.items():
        if name in _DROPPED_EXTRAS:
            continue
        if name not in _FIELDS:
            if name == "mcore_data" and isinstance(value, dict):
                value = {new(k): v for k, v in value.items() if not isinstance(k, str) or new(k) is not None}
            _check_plain(value, f"metadata attribute {name!r}", where)
        state[name] = value

    entries = old.get("state_dict_metadata")
    if not isinstance(entries, dict):
        raise CkptError("bad DCP metadata: state_dict_metadata is missing", where)
    state["state_dict_metadata"] = renamed = {}
    for key, entry in entries.items():
        if not _is(entry, _ENTRY_CLASSES):
            raise CkptError(f"entry {key!r} is neither a tensor nor bytes", where)
        if (target := new(key)) is not None:
            renamed[target] = entry

    storage = old.get("storage_data")
    if isinstance(storage, dict):
        state["storage_data"] = moved = {}
        for index, info in storage.items():
            fields = _state(index, "a storage_data key", where)
            fqn = fields.get("fqn")
            if not isinstance(fqn, str):
                raise CkptError("bad DCP metadata: a storage_data key has no fqn", where)
            if (target := new(fqn)) is not None:
                moved[index if target == fqn else _rebuilt(index, {**fields, "fqn": target})] = info
    elif storage is not None:
        raise CkptError("storage_data is not a mapping (not a FileSystemWriter checkpoint?)", where)

    planner = old.get("planner_data")
    old_paths = _paths(planner)
    if old_paths is not None:
        paths = {}
        for key, path in old_paths.items():
            if (target := new(key)) is not None:
                paths[target] = path if target == key else nested_path(path, target)
        state["planner_data"] = paths
    elif planner is not None:
        raise CkptError("planner_data is not the default planner's mapping; cannot rename it", where)

    if "version" in state and not isinstance(state["version"], str):
        state["version"] = None
    meta = old.get("storage_meta")
    if _is(meta, {(_DCP_META, "StorageMeta")}) and isinstance(meta.state, dict) and not meta.args:
        old_id = meta.state.get("checkpoint_id")
        new_id = _path_stub(old_id, checkpoint_id) if isinstance(old_id, PickleStub) else checkpoint_id
        state["storage_meta"] = _rebuilt(meta, {**meta.state, "checkpoint_id": new_id})
    elif "storage_meta" in state:
        state["storage_meta"] = None  # not torch's StorageMeta: nothing a reader relies on
    return _rebuilt(root, state, stub_class(_DCP_META, "Metadata"))


def renamed_metadata_bytes(src: Path, new_keys: Mapping[str, str | None], *, checkpoint_id: str) -> bytes:
    """The pickled ``.metadata`` at ``src`` with its keys renamed (see ``renamed_tree``)."""
    tree = renamed_tree(load_metadata_tree(src), new_keys, checkpoint_id=checkpoint_id, where=src)
    try:
        data, storages = repickle(tree, protocol=_METADATA_PROTOCOL)
    except CkptError as exc:
        raise CkptError(f"cannot rename: {exc.problem}", src) from None
    if storages:  # unreachable: the unpickler refuses persistent ids
        raise CkptError("cannot rename: the metadata refers to tensor storages", src)
    return data


def write_renamed_metadata(src: Path, out: Path, new_keys: Mapping[str, str | None], *, checkpoint_id: str) -> None:
    """Write ``out``: the ``.metadata`` at ``src`` with its keys renamed. Every check runs before
    ``out`` is opened, so a refused rename leaves nothing half written."""
    data = renamed_metadata_bytes(src, new_keys, checkpoint_id=checkpoint_id)
    with open(out, "wb") as handle:
        handle.write(data)
