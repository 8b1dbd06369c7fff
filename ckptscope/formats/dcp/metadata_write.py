"""Writing a new PyTorch DCP ``.metadata`` (Megatron-Core torch_dist flavour) without importing torch.

``.metadata`` is a plain ``pickle.dump`` (protocol 4) of ``torch.distributed.checkpoint`` dataclasses
(FORMATS.md §4.2, §5.2). Importing ``torch.distributed.checkpoint`` only to build and pickle those
objects costs about two seconds, and building them costs more for a big MoE model (tens of thousands
of chunks). The pickle only names its classes by module and qualname and fills them with data, so it
is emitted here opcode by opcode: the same opcodes torch's pickle has (checked with
``pickletools.dis``), so ``pickle.load`` under torch gives objects equal to the ones torch saved.
Python's own picklers cannot do it without torch: they import every class they name to check it.

What torch 2.x pickles, and so what is written here:

* every dataclass: ``STACK_GLOBAL`` class, ``EMPTY_TUPLE NEWOBJ``, its ``__dict__`` then ``BUILD``
  (``BytesStorageMetadata`` has an empty dict, so no ``BUILD``);
* ``TensorProperties``: its ``__getstate__`` 5-tuple (dtype, layout, requires_grad, memory-format
  enum, pin_memory), because ``torch.memory_format`` itself cannot be pickled;
* ``torch.Size(dims)``, ``torch.serialization._get_layout("torch.strided")`` and enum members
  (``_MEM_FORMAT_ENCODING(0)``, ``WriteItemType(n)``) as ``REDUCE`` calls; dtypes as the global
  ``torch.<name>``;
* ``MetadataIndex`` state ``{fqn, index, offset}``, without ``offset`` for a bytes item (its
  ``__init__`` only sets it for tensors); ``_StorageInfo`` state without its ``None`` fields;
* Megatron's extra ``all_local_plans`` attribute: one ``SavePlan`` (a one-rank save) of the
  ``WriteItem`` list in write order, ``planner_data={}``.

Objects torch shares are shared through the memo too (an item's ``MetadataIndex`` is both a
``storage_data`` key and its ``WriteItem.index``; a chunk's ``ChunkStorageMetadata`` sits in the tensor
entry and in its ``TensorWriteData``; a tensor entry's ``TensorProperties`` is its first chunk's), so the
unpickled graph has torch's shape, not only equal values. The bytes differ from torch's only in
bookkeeping a loader does not see: objects nobody refers to again are not memoised, equal strings share
one memo entry, and each container is filled by one ``APPENDS``/``SETITEMS`` (pickle batches 1000 and
uses ``APPEND`` for one). Writing 23k chunks takes about 0.5 s; torch's import, build and dump about 4 s.
"""

from __future__ import annotations

import hashlib
import pickle as op  # its opcode constants: op.MARK, op.BUILD ...
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from ckptscope.core.dtypes import DType, dtype_by_name
from ckptscope.core.errors import CkptError

__all__ = ["DCP_VERSION", "BytesItem", "ChunkItem", "content_save_id", "metadata_bytes"]

DCP_VERSION = "1.0.0"
"""torch's ``CURRENT_DCP_VERSION``, which ``FileSystemWriter.finish`` stamps on ``.metadata``."""
PROTOCOL = 4
"""``pickle.dump``'s default on the Pythons torch supports (3.10-3.13), which torch's writer uses."""


@dataclass(frozen=True)
class ChunkItem:
    """One tensor chunk stored in a ``.distcp`` file (a ``WriteItemType.SHARD`` write)."""

    key: str
    """State-dict key (FQN), e.g. ``decoder.layers.self_attention.linear_qkv.weight``."""
    offsets: tuple[int, ...]
    """Global offsets of the chunk."""
    sizes: tuple[int, ...]
    """Chunk shape."""
    global_shape: tuple[int, ...]
    dtype: str
    """ckptscope canonical dtype name (``bfloat16``); torch's dtype of the same name is written."""
    file: str
    """Relative data file name, e.g. ``__0_0.distcp``."""
    offset: int
    """Byte offset of the item in the file."""
    length: int
    """Byte length of the item."""


@dataclass(frozen=True)
class BytesItem:
    """One ``BYTE_IO`` item (a Megatron ShardedObject), stored raw."""

    key: str
    file: str
    offset: int
    length: int


_SAVE_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/ckptscope/ckptscope#dcp-save-id")


def content_save_id(items: Sequence[ChunkItem | BytesItem], contents: bytes) -> str:
    """``storage_meta.save_id`` derived from what was saved, not drawn at random.

    torch's ``FileSystemWriter`` stamps a fresh ``uuid4`` on every save, so two saves of the same
    state differ in ``.metadata``; nothing reads the id back (loaders ignore it; it tells saves
    apart in logs). Here it is a name-based uuid (version 5) of the items' layout (keys, offsets,
    shapes, dtypes, files, byte ranges) and ``contents``, a digest of the saved bytes the caller
    collected (each chunk's CRC-32, each object's payload): the same save gives the same id, and a
    save that differs in any of those gets another one."""
    digest = hashlib.blake2b(digest_size=32)
    for item in items:
        digest.update(repr(item).encode())
    digest.update(contents)
    return str(uuid.uuid5(_SAVE_ID_NAMESPACE, digest.hexdigest()))


_DCP = "torch.distributed.checkpoint"
_METADATA = (f"{_DCP}.metadata", "Metadata")
_TENSOR = (f"{_DCP}.metadata", "TensorStorageMetadata")
_CHUNK = (f"{_DCP}.metadata", "ChunkStorageMetadata")
_PROPERTIES = (f"{_DCP}.metadata", "TensorProperties")
_BYTES = (f"{_DCP}.metadata", "BytesStorageMetadata")
_INDEX = (f"{_DCP}.metadata", "MetadataIndex")
_STORAGE_META = (f"{_DCP}.metadata", "StorageMeta")
_MEM_FORMAT = (f"{_DCP}.metadata", "_MEM_FORMAT_ENCODING")
_STORAGE_INFO = (f"{_DCP}.filesystem", "_StorageInfo")
_SAVE_PLAN = (f"{_DCP}.planner", "SavePlan")
_WRITE_ITEM = (f"{_DCP}.planner", "WriteItem")
_WRITE_ITEM_TYPE = (f"{_DCP}.planner", "WriteItemType")
_TENSOR_WRITE = (f"{_DCP}.planner", "TensorWriteData")
_SIZE = ("torch", "Size")
_GET_LAYOUT = ("torch.serialization", "_get_layout")
_SHARD, _BYTE_IO = 2, 3
"""``WriteItemType`` values (``auto()``: TENSOR=1, SHARD=2, BYTE_IO=3); a member pickles as ``cls(value)``."""
_CONTIGUOUS = 0
"""``_MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT``: what torch pickles for ``torch.contiguous_format``."""
_FRAME_SIZE = 64 * 1024
"""Where pickle closes a protocol-4 frame (its ``_FRAME_SIZE_TARGET``); frames only speed up loading."""

_SMALL_TUPLES = (op.EMPTY_TUPLE, op.TUPLE1, op.TUPLE2, op.TUPLE3)


class _Stream:
    """A protocol-4 opcode stream with just the opcodes torch's ``.metadata`` pickle uses.

    ``memo`` maps strings (by value), globals (by ``(module, name)``) and singletons (by a tag) to
    their memo index. Other objects are memoised only when they are referred to again (``obj``'s
    ``keep``): an unpickler does not need a memo entry for anything else.
    """

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.buf = bytearray()
        self.memo: dict[object, int] = {}
        self.count = 0

    def memoize(self) -> int:
        self.buf += op.MEMOIZE
        self.count += 1
        return self.count - 1

    def get(self, index: int) -> None:
        self.buf += op.BINGET + bytes((index,)) if index < 256 else op.LONG_BINGET + struct.pack("<I", index)

    def text(self, value: str) -> None:
        index = self.memo.get(value)
        if index is not None:
            return self.get(index)
        raw = value.encode("utf-8", "surrogatepass")  # what pickle does for str
        if len(raw) < 256:
            self.buf += op.SHORT_BINUNICODE + bytes((len(raw),)) + raw
        else:
            self.buf += op.BINUNICODE + struct.pack("<I", len(raw)) + raw
        self.memo[value] = self.memoize()

    def int(self, value: int) -> None:
        if 0 <= value < 256:
            self.buf += op.BININT1 + bytes((value,))
        elif 0 <= value < 65536:
            self.buf += op.BININT2 + struct.pack("<H", value)
        elif -2 ** 31 <= value < 2 ** 31:
            self.buf += op.BININT + struct.pack("<i", value)
        else:  # little-endian two's complement (byte offsets past 2 GiB)
            raw = value.to_bytes((value.bit_length() >> 3) + 1, "little", signed=True)
            self.buf += op.LONG1 + bytes((len(raw),)) + raw

    def global_(self, cls: tuple[str, str]) -> None:
        index = self.memo.get(cls)
        if index is not None:
            return self.get(index)
        self.text(cls[0])
        self.text(cls[1])
        self.buf += op.STACK_GLOBAL
        self.memo[cls] = self.memoize()

    def call(self, cls: tuple[str, str], arg: str | int) -> None:
        """``cls(arg)`` for a torch singleton (layout, enum member): built once, then a memo get."""
        key = ("call", cls, arg)
        index = self.memo.get(key)
        if index is not None:
            return self.get(index)
        self.global_(cls)
        if isinstance(arg, str):
            self.text(arg)
        else:
            self.int(arg)
        self.buf += op.TUPLE1 + op.REDUCE
        self.memo[key] = self.memoize()

    def size(self, dims: tuple[int, ...]) -> None:
        """``torch.Size(dims)``, as ``torch.Size.__reduce__`` gives it."""
        self.global_(_SIZE)
        if len(dims) > 3:
            self.buf += op.MARK
        for dim in dims:
            self.int(dim)
        self.buf += _SMALL_TUPLES[len(dims)] if len(dims) <= 3 else op.TUPLE
        self.buf += op.TUPLE1 + op.REDUCE

    def obj(self, cls: tuple[str, str], *, keep: bool = False) -> int:
        """Start a dataclass ``cls.__new__(cls)`` and its state dict; ``end()`` closes it.

        Returns its memo index when ``keep`` (-1 otherwise)."""
        self.global_(cls)
        self.buf += op.EMPTY_TUPLE + op.NEWOBJ
        index = self.memoize() if keep else -1
        self.buf += op.EMPTY_DICT + op.MARK
        return index

    def end(self) -> None:
        self.buf += op.SETITEMS + op.BUILD

    def field(self, name: str, value: str | int | bool | None | list | dict) -> None:
        """One plain entry of a state dict (containers only empty)."""
        self.text(name)
        if value is None or isinstance(value, bool):
            self.buf += op.NONE if value is None else op.NEWTRUE if value else op.NEWFALSE
        elif isinstance(value, str):
            self.text(value)
        elif isinstance(value, int):
            self.int(value)
        elif value:
            raise ValueError("only empty containers are written as plain fields")
        else:
            self.buf += op.EMPTY_LIST if isinstance(value, list) else op.EMPTY_DICT

    def properties(self, dtype: DType, *, keep: bool = False) -> int:
        """A ``TensorProperties``: its ``__getstate__`` tuple, with the defaults torch records."""
        self.global_(_PROPERTIES)
        self.buf += op.EMPTY_TUPLE + op.NEWOBJ
        index = self.memoize() if keep else -1
        self.buf += op.MARK
        self.global_(("torch", dtype.name))  # a torch.dtype pickles as the global torch.<name>
        self.call(_GET_LAYOUT, "torch.strided")
        self.buf += op.NEWFALSE  # requires_grad
        self.call(_MEM_FORMAT, _CONTIGUOUS)
        self.buf += op.NEWFALSE + op.TUPLE + op.BUILD  # pin_memory
        return index

    def commit(self) -> None:
        """Close the current frame once it is big enough (only ever between whole opcodes)."""
        if len(self.buf) >= _FRAME_SIZE:
            self.frames.append(op.FRAME + struct.pack("<Q", len(self.buf)) + self.buf)
            self.buf = bytearray()

    def getvalue(self) -> bytes:
        self.buf += op.STOP
        self.frames.append(op.FRAME + struct.pack("<Q", len(self.buf)) + self.buf)
        return op.PROTO + bytes((PROTOCOL,)) + b"".join(self.frames)


def _torch_dtype(item: ChunkItem) -> DType:
    dtype = dtype_by_name(item.dtype)
    if dtype.bits % 8:  # fp4 / fp6: safetensors codes with no torch dtype (torch packs fp4 as *_x2)
        raise CkptError(f"cannot write {item.key!r} to DCP metadata: torch has no dtype {dtype.name}")
    return dtype


def _check(item: ChunkItem | BytesItem) -> None:
    if not item.file or item.file.startswith("/") or ".." in item.file.split("/") \
            or item.offset < 0 or item.length < 0:
        raise CkptError(f"bad DCP storage for {item.key!r}: {item.file!r} at {item.offset}+{item.length}")
    if not isinstance(item, ChunkItem):
        return
    if not len(item.offsets) == len(item.sizes) == len(item.global_shape) or any(
            o < 0 or s < 0 or o + s > n for o, s, n in zip(item.offsets, item.sizes, item.global_shape)):
        raise CkptError(f"DCP chunk of {item.key!r} at {list(item.offsets)} size {list(item.sizes)} "
                        f"does not fit its shape {list(item.global_shape)}")


_Chunks = list[tuple[int, ChunkItem, DType]]
"""A tensor key's chunks in write order: (position in ``items``, item, its dtype)."""


def _group(items: Sequence[ChunkItem | BytesItem]) -> dict[str, _Chunks | None]:
    """Check the items; returns key -> its chunks (None: a bytes item), keys in first-write order
    as ``state_dict_metadata`` lists them."""
    entries: dict[str, _Chunks | None] = {}
    seen: set[tuple[str, tuple[int, ...]]] = set()
    for position, item in enumerate(items):
        _check(item)
        if isinstance(item, BytesItem):
            if item.key in entries:
                raise CkptError(f"DCP key {item.key!r} is written twice")
            entries[item.key] = None
            continue
        dtype = _torch_dtype(item)
        chunks = entries.setdefault(item.key, [])
        if chunks is None or (chunks and (chunks[0][2], tuple(chunks[0][1].global_shape))
                              != (dtype, tuple(item.global_shape))):
            raise CkptError(f"DCP chunks of {item.key!r} disagree on dtype or shape, or it is also a bytes item")
        if (item.key, tuple(item.offsets)) in seen:
            raise CkptError(f"DCP chunk of {item.key!r} at {list(item.offsets)} is written twice")
        seen.add((item.key, tuple(item.offsets)))
        chunks.append((position, item, dtype))
    return entries


def metadata_bytes(items: Sequence[ChunkItem | BytesItem], *, checkpoint_id: str, save_id: str,
                   version: str = DCP_VERSION) -> bytes:
    """The ``.metadata`` pickle of a one-rank save whose items were written in ``items`` order.

    Chunks sharing a key form one ``TensorStorageMetadata`` (chunks in item order; dtype and global
    shape must agree). ``checkpoint_id`` is recorded as a string (what Megatron's save passes);
    ``save_id`` is the save's uuid (``content_save_id``). Raises ``CkptError`` on inconsistent items.
    """
    entries = _group(items)
    out = _Stream()
    out.obj(_METADATA)
    out.text("state_dict_metadata")
    chunks = _state_dict_metadata(out, entries)
    out.field("planner_data", None)
    out.text("storage_data")
    indexes = _storage_data(out, items)
    out.text("storage_meta")
    out.obj(_STORAGE_META)
    for name, value in (("checkpoint_id", str(checkpoint_id)), ("save_id", save_id), ("load_id", None),
                        ("modules", [])):
        out.field(name, value)
    out.end()
    out.field("version", version)
    # megatron-core caches its local plans here, to reuse them on a later save of the same structure.
    out.text("all_local_plans")
    out.buf += op.EMPTY_LIST
    _save_plan(out, items, indexes, chunks)
    out.buf += op.APPEND
    out.end()
    return out.getvalue()


_Shared = dict[int, tuple[int, int, DType]]
"""Position of a chunk in ``items`` -> memo indexes of its ``ChunkStorageMetadata`` and (first chunk of
a key only, else -1) ``TensorProperties``, and its dtype: what its ``WriteItem`` refers to again."""


def _state_dict_metadata(out: _Stream, entries: dict[str, _Chunks | None]) -> _Shared:
    shared: _Shared = {}
    out.buf += op.EMPTY_DICT + op.MARK
    for key, chunks in entries.items():
        out.text(key)
        if chunks is None:
            out.global_(_BYTES)
            out.buf += op.EMPTY_TUPLE + op.NEWOBJ  # no fields: no BUILD
            continue
        _, first, dtype = chunks[0]
        out.obj(_TENSOR)
        out.text("properties")
        properties = out.properties(dtype, keep=True)  # torch's entry holds its first chunk's properties
        out.text("size")
        out.size(first.global_shape)
        out.text("chunks")
        out.buf += op.EMPTY_LIST + op.MARK
        for position, chunk, dtype in chunks:
            shared[position] = (out.obj(_CHUNK, keep=True), properties, dtype)
            properties = -1
            out.text("offsets")
            out.size(chunk.offsets)
            out.text("sizes")
            out.size(chunk.sizes)
            out.end()
            out.commit()
        out.buf += op.APPENDS
        out.end()
    out.buf += op.SETITEMS
    return shared


def _storage_data(out: _Stream, items: Sequence[ChunkItem | BytesItem]) -> list[int]:
    """``MetadataIndex -> _StorageInfo``; returns each item's ``MetadataIndex`` memo index."""
    indexes = []
    out.buf += op.EMPTY_DICT + op.MARK
    for item in items:
        indexes.append(out.obj(_INDEX, keep=True))
        out.field("fqn", item.key)
        out.field("index", None)
        if isinstance(item, ChunkItem):
            out.text("offset")
            out.size(item.offsets)
        out.end()
        out.obj(_STORAGE_INFO)
        out.field("relative_path", item.file)
        out.field("offset", item.offset)
        out.field("length", item.length)
        out.end()
        out.commit()
    out.buf += op.SETITEMS
    return indexes


def _save_plan(out: _Stream, items: Sequence[ChunkItem | BytesItem], indexes: list[int], shared: _Shared) -> None:
    """The one ``SavePlan`` of a one-rank save: a ``WriteItem`` per item, sharing its index and chunk."""
    out.obj(_SAVE_PLAN)
    out.text("items")
    out.buf += op.EMPTY_LIST + op.MARK
    for position, item in enumerate(items):
        out.obj(_WRITE_ITEM)
        out.text("index")
        out.get(indexes[position])
        out.text("type")
        out.call(_WRITE_ITEM_TYPE, _SHARD if isinstance(item, ChunkItem) else _BYTE_IO)
        out.field("bytes_io_data", None)
        if isinstance(item, ChunkItem):
            chunk, properties, dtype = shared[position]
            out.text("tensor_data")
            out.obj(_TENSOR_WRITE)
            out.text("chunk")
            out.get(chunk)
            out.text("properties")
            if properties >= 0:
                out.get(properties)
            else:
                out.properties(dtype)
            out.text("size")
            out.size(item.global_shape)
            out.end()
        else:
            out.field("tensor_data", None)
        out.end()
        out.commit()
    out.buf += op.APPENDS
    for name, value in (("storage_data", None), ("planner_data", {}), ("usable", True)):
        out.field(name, value)
    out.end()
