"""Writing a renamed DCP ``.metadata`` (FORMATS.md §4.2, §5.2) without ever unpickling the source.

Renaming a DCP or Megatron torch_dist checkpoint changes only ``.metadata``: every chunk keeps
its file and byte range, so the data files are reused as they are. The source is parsed by the
safe unpickler into data-only records (``dcp_metadata.py``); this module rebuilds the metadata
from those records with torch's real classes (``Metadata``, ``TensorStorageMetadata`` ...) so that
torch's ``FileSystemReader`` and Megatron's loader read the result with their ordinary
``pickle.load``. Nothing from the source pickle is ever executed, and torch is imported only here,
inside the write functions (writing is never on a metadata-reading path).

What is carried over and why:

* every tensor (properties, global size, chunks) and bytes entry under its new key, dropped keys
  left out; ``storage_data`` re-keyed with the same file / offset / length / transforms;
* ``planner_data`` (flat key -> nested path, used by torch to rebuild nested state dicts) with
  paths re-derived for the new keys (``nested_path``), list indices kept as ints;
* ``version`` and ``storage_meta`` (``save_id``: the data is that save's; ``checkpoint_id`` points
  at the new location, as torch records where a checkpoint was written);
* Megatron's ``mcore_data`` (per-key reformulation info, pre-0.16) re-keyed and attached to the
  base ``Metadata`` as older Megatron releases did; megatron-core reads it with ``getattr`` so
  the base class serves every version (0.15's ``MCoreMetadata`` is only kept as an empty dummy by
  later releases). ``all_local_plans`` is dropped: it is Megatron's save-side cache of the old
  save plans, keyed by the old names, and only consulted to reuse a plan on the next save.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckptscope.core.dtypes import DType
from ckptscope.core.errors import CkptError
from ckptscope.formats.dcp_metadata import (
    BytesStorageRecord,
    MetadataRecord,
    StorageMetaRecord,
    TensorStorageRecord,
    field_of,
    load_metadata_record,
)
from ckptscope.formats.safe_pickle import PickleStub

PathPart = str | int
_PLAIN = (str, int, float, bool, type(None))
_DROPPED_EXTRAS = {"all_local_plans"}


def planner_paths(raw: MetadataRecord) -> dict[str, tuple[PathPart, ...]] | None:
    """``planner_data`` with its original part types (ints are list indices), or None."""
    planner = field_of(raw, "planner_data")
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


# --- building torch objects from the records ---------------------------------------------------


def _torch_dtype(value: Any, key: str, where: Path) -> Any:
    import torch

    dtype = getattr(torch, value.name, None) if isinstance(value, DType) else None
    if not isinstance(dtype, torch.dtype):
        raise CkptError(f"cannot rebuild the dtype of {key!r} ({value!r})", where)
    return dtype


def _properties(record: Any, key: str, where: Path) -> Any:
    import torch
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING, TensorProperties

    layout = torch.strided
    stub = field_of(record, "layout")
    if isinstance(stub, PickleStub) and stub.args and isinstance(stub.args[0], str):
        candidate = getattr(torch, stub.args[0].rsplit(".", 1)[-1], None)
        if not isinstance(candidate, torch.layout):
            raise CkptError(f"unknown tensor layout {stub.args[0]!r} for {key!r}", where)
        layout = candidate
    memory_format = torch.contiguous_format
    stub = field_of(record, "memory_format")
    if isinstance(stub, PickleStub) and stub.args:
        try:
            encoding = _MEM_FORMAT_ENCODING(stub.args[0])
        except ValueError:
            raise CkptError(f"unknown memory format {stub.args[0]!r} for {key!r}", where) from None
        memory_format = {_MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST: torch.channels_last,
                         _MEM_FORMAT_ENCODING.TORCH_PRESERVE_FORMAT: torch.preserve_format}.get(
            encoding, torch.contiguous_format)
    return TensorProperties(dtype=_torch_dtype(field_of(record, "dtype"), key, where), layout=layout,
                            requires_grad=bool(field_of(record, "requires_grad", False)),
                            memory_format=memory_format, pin_memory=bool(field_of(record, "pin_memory", False)))


def _tensor_entry(record: TensorStorageRecord, key: str, where: Path) -> Any:
    import torch
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata

    chunks = [ChunkStorageMetadata(offsets=torch.Size(field_of(c, "offsets")), sizes=torch.Size(field_of(c, "sizes")))
              for c in field_of(record, "chunks") or ()]
    return TensorStorageMetadata(properties=_properties(field_of(record, "properties"), key, where),
                                 size=torch.Size(field_of(record, "size")), chunks=chunks)


def _plain(value: Any, what: str, where: Path) -> Any:
    """Copy json-like data (dicts, lists, tuples, scalars); anything else cannot be re-pickled faithfully."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        items = [_plain(v, what, where) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {_plain(k, what, where): _plain(v, what, where) for k, v in value.items()}
    raise CkptError(f"cannot carry over {what}: it holds {type(value).__name__}", where)


def _storage_meta(record: Any, checkpoint_id: str) -> Any:
    from torch.distributed.checkpoint.metadata import StorageMeta

    if not isinstance(record, StorageMetaRecord):
        return None
    old_id = field_of(record, "checkpoint_id")
    new_id: str | os.PathLike[str] = Path(checkpoint_id) if isinstance(old_id, PickleStub) else checkpoint_id
    modules = field_of(record, "modules") or []
    return StorageMeta(checkpoint_id=new_id, save_id=field_of(record, "save_id"),
                       load_id=field_of(record, "load_id"),
                       modules=[str(m) for m in modules] if isinstance(modules, (list, tuple)) else [])


def renamed_metadata(raw: MetadataRecord, new_keys: Mapping[str, str | None], *, checkpoint_id: str,
                     where: Path) -> Any:
    """A torch ``Metadata`` equal to ``raw`` with every key renamed by ``new_keys`` (None: dropped;
    absent: unchanged)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, MetadataIndex

    def new(key: str) -> str | None:
        return new_keys.get(key, key)

    state: dict[str, Any] = {}
    for key, entry in field_of(raw, "state_dict_metadata").items():
        target = new(key)
        if target is None:
            continue
        if isinstance(entry, TensorStorageRecord):
            state[target] = _tensor_entry(entry, key, where)
        elif isinstance(entry, BytesStorageRecord):
            state[target] = BytesStorageMetadata()
        else:
            raise CkptError(f"entry {key!r} is neither a tensor nor bytes", where)

    storage: dict[Any, Any] | None = None
    old_storage = field_of(raw, "storage_data")
    if isinstance(old_storage, dict):
        storage = {}
        for index, info in old_storage.items():
            target = new(field_of(index, "fqn"))
            if target is None:
                continue
            offset = field_of(index, "offset")
            transforms = field_of(info, "transform_descriptors")
            storage[MetadataIndex(target, offset, field_of(index, "index"))] = _StorageInfo(
                relative_path=field_of(info, "relative_path"), offset=field_of(info, "offset"),
                length=field_of(info, "length"),
                transform_descriptors=list(transforms) if isinstance(transforms, (list, tuple)) else None)
    elif old_storage is not None:
        raise CkptError("storage_data is not a mapping (not a FileSystemWriter checkpoint?)", where)

    planner_data: dict[str, tuple[PathPart, ...]] | None = None
    old_paths = planner_paths(raw)
    if old_paths is not None:
        planner_data = {}
        for key, path in old_paths.items():
            target = new(key)
            if target is not None:
                planner_data[target] = path if target == key else nested_path(path, target)
    elif field_of(raw, "planner_data") is not None:
        raise CkptError("planner_data is not the default planner's mapping; cannot rename it", where)

    version = field_of(raw, "version")
    metadata = Metadata(state_dict_metadata=state, planner_data=planner_data, storage_data=storage,
                        storage_meta=_storage_meta(field_of(raw, "storage_meta"), checkpoint_id),
                        version=version if isinstance(version, str) else None)
    for name, value in raw.__dict__.items():
        if name in MetadataRecord.FIELDS or name in _DROPPED_EXTRAS:
            continue
        if name == "mcore_data" and isinstance(value, dict):
            value = {new(k): v for k, v in value.items() if not isinstance(k, str) or new(k) is not None}
        setattr(metadata, name, _plain(value, f"metadata attribute {name!r}", where))
    return metadata


def write_renamed_metadata(src: Path, out: Path, new_keys: Mapping[str, str | None], *, checkpoint_id: str) -> None:
    """Write ``out``: the ``.metadata`` at ``src`` with its keys renamed (see ``renamed_metadata``)."""
    raw = load_metadata_record(src)
    metadata = renamed_metadata(raw, new_keys, checkpoint_id=checkpoint_id, where=src)
    with open(out, "wb") as handle:
        pickle.dump(metadata, handle)

