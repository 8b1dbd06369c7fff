"""Parsing a PyTorch DCP ``.metadata`` pickle without torch.distributed (FORMATS.md §4.2, §5.2).

``.metadata`` is a plain pickle of ``torch.distributed.checkpoint.metadata.Metadata`` (or, from
some Megatron-Core releases, its subclass ``MCoreMetadata``). Loading it with ``pickle`` would
import torch.distributed and whichever Megatron version wrote it, and would run any code the
pickle names. Instead the safe unpickler maps every DCP/Megatron metadata class to the data-only
``Record`` below, and everything else to an inert stub. The result is normalised into small
frozen dataclasses (``DcpMetadata``) so readers never touch pickle objects again.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ckptscope.core.dtypes import DType
from ckptscope.core.errors import CkptError
from ckptscope.formats.pickles.safe import PickleStub, safe_load


class Record:
    """A data-only stand-in for a pickled dataclass: it stores the fields it is given, nothing else.

    Pickles build dataclasses with ``cls.__new__(cls)`` + ``BUILD(state)``, or ``cls(*args)``;
    both end up as entries of ``__dict__``. Fields are read back with ``field_of``, never as
    attributes, so a pickle cannot shadow a method.
    """

    FIELDS: tuple[str, ...] = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> "Record":
        obj = object.__new__(cls)
        obj.__dict__.update(zip(cls.FIELDS, args))
        if len(args) > len(cls.FIELDS):
            obj.__dict__["__args__"] = args[len(cls.FIELDS):]
        obj.__dict__.update({str(k): v for k, v in kwargs.items()})
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and (state[0] is None or isinstance(state[0], dict)) \
                and isinstance(state[1], dict):
            state = {**(state[0] or {}), **state[1]}  # (dict state, slot state)
        if isinstance(state, dict):
            self.__dict__.update({str(k): v for k, v in state.items()})
        elif isinstance(state, tuple):
            self.__dict__.update(zip(self.FIELDS, state))
        else:
            self.__dict__["__state__"] = state

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


def field_of(obj: Any, name: str, default: Any = None) -> Any:
    """A field of a ``Record`` (or ``default`` when absent or when ``obj`` is not a Record)."""
    if isinstance(obj, Record):
        return obj.__dict__.get(name, default)
    return default


class MetadataRecord(Record):
    FIELDS = ("state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version")


class TensorStorageRecord(Record):
    FIELDS = ("properties", "size", "chunks")


class ChunkRecord(Record):
    FIELDS = ("offsets", "sizes")


class TensorPropertiesRecord(Record):
    # Pickled through a custom __getstate__ as a 5- or 6-tuple (FORMATS.md §5.2).
    FIELDS = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory", "strides")


class BytesStorageRecord(Record):
    pass


class MetadataIndexRecord(Record):
    FIELDS = ("fqn", "offset", "index")


class StorageInfoRecord(Record):
    FIELDS = ("relative_path", "offset", "length", "transform_descriptors")


class StorageMetaRecord(Record):
    FIELDS = ("checkpoint_id", "save_id", "load_id", "modules")


class PlanRecord(Record):
    """Save plans and write items (``all_local_plans``): kept as data, never interpreted."""


_DCP = "torch.distributed.checkpoint"
_MCORE = "megatron.core.dist_checkpointing.strategies.torch"
DCP_GLOBALS: dict[tuple[str, str], Any] = {
    (f"{_DCP}.metadata", "Metadata"): MetadataRecord,
    (f"{_DCP}.metadata", "TensorStorageMetadata"): TensorStorageRecord,
    (f"{_DCP}.metadata", "ChunkStorageMetadata"): ChunkRecord,
    (f"{_DCP}.metadata", "TensorProperties"): TensorPropertiesRecord,
    (f"{_DCP}.metadata", "BytesStorageMetadata"): BytesStorageRecord,
    (f"{_DCP}.metadata", "MetadataIndex"): MetadataIndexRecord,
    (f"{_DCP}.metadata", "StorageMeta"): StorageMetaRecord,
    (f"{_DCP}.filesystem", "_StorageInfo"): StorageInfoRecord,
    (f"{_DCP}.planner", "SavePlan"): PlanRecord,
    (f"{_DCP}.planner", "WriteItem"): PlanRecord,
    (f"{_DCP}.planner", "TensorWriteData"): PlanRecord,
    # Megatron-Core 0.15 pickles its own subclasses; older/newer ones keep dummies with these names.
    (_MCORE, "MCoreMetadata"): MetadataRecord,
    (_MCORE, "MCoreSavePlan"): PlanRecord,
}


# --- the normalised result -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StorageInfo:
    """Where one saved item lives: a byte range of one data file."""

    file: str
    offset: int
    length: int
    transforms: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DcpChunk:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    storage: StorageInfo | None


@dataclass(frozen=True, slots=True)
class DcpTensor:
    key: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[DcpChunk, ...]


@dataclass(slots=True)
class DcpMetadata:
    tensors: dict[str, DcpTensor] = field(default_factory=dict)
    bytes_entries: dict[str, StorageInfo | None] = field(default_factory=dict)
    """Key of every ``BytesStorageMetadata`` entry -> its byte range (None when not recorded)."""
    planner_data: dict[str, tuple[str, ...]] | None = None
    version: str | None = None
    storage_meta: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    """Other attributes of the pickled object (Megatron: ``mcore_data``, ``all_local_plans``)."""
    class_name: str = "Metadata"


def _ints(value: Any, what: str, path: Path) -> tuple[int, ...]:
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    raise CkptError(f"bad DCP metadata: {what} is not a list of integers", path)


def _storage(info: Any, path: Path) -> StorageInfo:
    rel = field_of(info, "relative_path")
    offset, length = field_of(info, "offset"), field_of(info, "length")
    if not isinstance(rel, str) or not isinstance(offset, int) or not isinstance(length, int) \
            or offset < 0 or length < 0:
        raise CkptError("bad DCP metadata: a storage entry lacks relative_path/offset/length", path)
    if rel.startswith("/") or ".." in Path(rel).parts:
        raise CkptError(f"bad DCP metadata: storage path {rel!r} leaves the checkpoint directory", path)
    transforms = field_of(info, "transform_descriptors") or ()
    return StorageInfo(rel, offset, length, tuple(str(t) for t in transforms) if isinstance(transforms, (list, tuple)) else ())


def unpickle_metadata_file(path: Path, load: Callable[[IO[bytes]], Any]) -> Any:
    """Run one of our safe unpicklers on a ``.metadata`` file; every failure is one ``CkptError``."""
    try:
        with open(path, "rb") as handle:
            return load(io.BufferedReader(handle))
    except CkptError:
        raise
    except OSError as exc:
        raise CkptError(f"cannot read: {exc.strerror or exc}", path) from None
    except Exception as exc:  # any malformed pickle: report it, never execute it
        raise CkptError(f"not a DCP .metadata pickle: {type(exc).__name__}: {exc}", path) from None


def load_metadata_record(path: Path) -> MetadataRecord:
    """The safely unpickled ``.metadata`` as records (no torch, nothing executed)."""
    raw = unpickle_metadata_file(path, lambda handle: safe_load(handle, DCP_GLOBALS))
    if not isinstance(raw, MetadataRecord):
        kind = type(raw).qualname() if isinstance(raw, PickleStub) else type(raw).__name__
        raise CkptError(f"not a DCP .metadata pickle: it holds {kind}, not Metadata", path)
    return raw


def load_dcp_metadata(path: Path) -> DcpMetadata:
    """Unpickle and validate ``path`` (a ``.metadata`` file). Raises ``CkptError`` on anything odd."""
    raw = load_metadata_record(path)
    state = field_of(raw, "state_dict_metadata")
    if not isinstance(state, dict):
        raise CkptError("bad DCP metadata: state_dict_metadata is missing", path)
    storage: dict[tuple[str, tuple[int, ...] | None], StorageInfo] = {}
    storage_data = field_of(raw, "storage_data")
    if isinstance(storage_data, dict):
        for index, info in storage_data.items():
            fqn, offset = field_of(index, "fqn"), field_of(index, "offset")
            if not isinstance(fqn, str):
                raise CkptError("bad DCP metadata: a storage_data key has no fqn", path)
            storage[(fqn, None if offset is None else _ints(offset, f"offset of {fqn!r}", path))] = \
                _storage(info, path)
    elif storage_data is not None:
        raise CkptError("bad DCP metadata: storage_data is not a mapping (not a FileSystemWriter checkpoint?)", path)

    meta = DcpMetadata(class_name=type(raw).__name__)
    for key, entry in state.items():
        if not isinstance(key, str):
            raise CkptError("bad DCP metadata: a state_dict_metadata key is not a string", path)
        if isinstance(entry, BytesStorageRecord):
            meta.bytes_entries[key] = storage.get((key, None))
        elif isinstance(entry, TensorStorageRecord):
            meta.tensors[key] = _tensor(key, entry, storage, path)
        else:
            raise CkptError(f"bad DCP metadata: entry {key!r} is neither a tensor nor bytes", path)
    planner = field_of(raw, "planner_data")
    if isinstance(planner, dict):
        meta.planner_data = {str(k): tuple(str(p) for p in v) for k, v in planner.items()
                             if isinstance(v, (tuple, list))}
    version = field_of(raw, "version")
    meta.version = version if isinstance(version, str) else None
    storage_meta = field_of(raw, "storage_meta")
    if isinstance(storage_meta, StorageMetaRecord):
        meta.storage_meta = {k: _path_text(v) for k in ("checkpoint_id", "save_id")
                             if (v := field_of(storage_meta, k)) is not None}
    meta.extra = {k: v for k, v in raw.__dict__.items() if k not in MetadataRecord.FIELDS}
    return meta


def _path_text(value: Any) -> str:
    """``checkpoint_id`` may be a pickled ``PosixPath``: show its parts joined, not a stub."""
    if isinstance(value, PickleStub) and value.args and all(isinstance(a, str) for a in value.args):
        return "/".join(value.args).replace("//", "/")
    return str(value)


def _tensor(key: str, entry: Record, storage: dict[tuple[str, tuple[int, ...] | None], StorageInfo],
            path: Path) -> DcpTensor:
    dtype = field_of(field_of(entry, "properties"), "dtype")
    if not isinstance(dtype, DType):
        raise CkptError(f"bad DCP metadata: tensor {key!r} has no known dtype", path)
    shape = _ints(field_of(entry, "size"), f"size of {key!r}", path)
    chunks = []
    for chunk in field_of(entry, "chunks") or ():
        offsets = _ints(field_of(chunk, "offsets"), f"chunk offsets of {key!r}", path)
        sizes = _ints(field_of(chunk, "sizes"), f"chunk sizes of {key!r}", path)
        if len(offsets) != len(shape) or len(sizes) != len(shape) or any(
                o < 0 or s < 0 or o + s > n for o, s, n in zip(offsets, sizes, shape)):
            raise CkptError(f"bad DCP metadata: a chunk of {key!r} lies outside its shape {list(shape)}", path)
        chunks.append(DcpChunk(offsets, sizes, storage.get((key, offsets))))
    return DcpTensor(key, dtype.name, shape, tuple(chunks))
