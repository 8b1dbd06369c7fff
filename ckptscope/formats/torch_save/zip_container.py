"""Write ``torch.save``'s zip container without torch.

``import torch`` costs about two seconds here, more than converting a small model, and a writer
needs nothing from torch but the container: a stored (uncompressed) zip whose records are
``data.pkl`` (protocol-2 pickle, see ``pickles.repickle.repickle``), a few small version records and
one ``data/<key>`` record per storage, each record's data aligned to 64 bytes. The layout mirrors
what torch's own writer (miniz, streaming) produces, record for record:

* local header with general-purpose flags 0x0808 (UTF-8 names, sizes and CRC in a data
  descriptor after the data), padded with an ``FB`` extra field so the data starts on a 64-byte
  boundary counted from the start of the container;
* the data, then the data descriptor (CRC-32 and sizes; 64-bit sizes for records of 4 GiB+);
* the central directory, a zip64 end record and locator, and the classic end record.

Because CRC and sizes follow the data, record bytes are streamed straight from the caller's
buffer (a numpy array, a memory map) and their CRC may be computed elsewhere, e.g. on the thread
that produced the buffer. Offsets count from the container's first byte, whatever precedes it in
the file, as with the stream torch's DCP writer hands to ``torch.save``.

The last record, ``.data/serialization_id``, is not random: torch derives it from the record names
and CRC-32s, and ``serialization_id.py`` does the same, so a container is ``torch.save``'s byte for
byte and the same records always give the same bytes.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptscope.formats.checksum import crc32 as _crc32
from ckptscope.formats.torch_save.serialization_id import SERIALIZATION_ID, descriptor_values, serialization_id

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.core.dtypes import DType

ALIGNMENT = 64
_LOCAL = 0x04034B50
_DESCRIPTOR = 0x08074B50
_CENTRAL = 0x02014B50
_ZIP64_END = 0x06064B50
_ZIP64_LOCATOR = 0x07064B50
_END = 0x06054B50
_FLAGS = 0x0808
_ZIP64_EXTRA = 0x0001
_PAD_EXTRA = 0x4246  # "FB", the padding field torch's writer uses
_U32 = 0xFFFFFFFF

Write = Callable[[Any], Any]
"""``write(bytes_like)``: a file's ``write``; must write everything it is given."""


@dataclass(frozen=True)
class _Entry:
    name: bytes
    offset: int
    size: int
    crc: int


@dataclass(frozen=True)
class Copied:
    """Record data the caller writes straight into the file (``copy_file_range``), not through
    ``write``: ``copy()`` must write exactly ``size`` bytes at the file's current position;
    ``crc()`` returns their CRC-32 once they are written (it may be computed concurrently)."""

    size: int
    copy: Callable[[], None]
    crc: Callable[[], int]
    head: bytes = b""
    """The data's first 8 bytes (or all of it when shorter): the serialization id may need them."""


def crc32(data: Any) -> int:
    """CRC-32 of a bytes-like object (zlib releases the GIL on large buffers)."""
    view = memoryview(data)
    if view.nbytes == 0:
        return 0
    return _crc32(view.cast("B") if view.format != "B" or view.ndim != 1 else view) & _U32


class TorchZipWriter:
    """Streams one ``torch.save`` container: ``record()`` each record in order, then ``finish()``."""

    zip64_from = _U32
    """Records this large, or starting this far in, get zip64 sizes (tests lower it)."""

    def __init__(self, write: Write, archive: str = "archive") -> None:
        self._write = write
        self._archive = archive
        self._entries: list[_Entry] = []
        self._names: list[str] = []
        self._descriptor_values: list[int] = []
        self.size = 0
        """Bytes written so far."""

    def _emit(self, data: Any) -> None:
        self._write(data)
        self.size += memoryview(data).nbytes

    def record(self, name: str, data: Any, crc: int | None = None) -> None:
        """Write one record; ``crc`` may be given when already known (it is not checked).
        ``data`` is bytes-like, or ``Copied`` for data the caller copies into the file itself."""
        copied = data if isinstance(data, Copied) else None
        view = b"" if copied or not memoryview(data).nbytes else memoryview(data).cast("B")
        full = f"{self._archive}/{name}".encode()
        offset, size = self.size, copied.size if copied else len(view)
        zip64 = size >= self.zip64_from or offset >= self.zip64_from
        extra = struct.pack("<HHQQ", _ZIP64_EXTRA, 16, 0, 0) if zip64 else b""
        header_end = offset + 30 + len(full) + len(extra)
        pad = -(header_end + 4) % ALIGNMENT  # the padding field's own 4-byte header counts too
        extra += struct.pack("<HH", _PAD_EXTRA, pad) + b"Z" * pad
        self._emit(struct.pack("<IHHHHHIIIHH", _LOCAL, 45 if zip64 else 0, _FLAGS, 0, 0, 0, 0, 0, 0,
                               len(full), len(extra)) + full + extra)
        if copied:
            copied.copy()
            self.size += size
            value = copied.crc()
            head = copied.head
        else:
            if size:
                self._emit(view)
            value = crc32(view) if crc is None else crc
            head = bytes(view[:8])
        if zip64:
            self._emit(struct.pack("<IIQQ", _DESCRIPTOR, value, size, size))
        else:
            self._emit(struct.pack("<IIII", _DESCRIPTOR, value, size, size))
        self._entries.append(_Entry(full, offset, size, value))
        self._names.append(name)
        self._descriptor_values += descriptor_values(head, size, value)

    def record_serialization_id(self) -> str:
        """Write ``.data/serialization_id`` from the records so far, as torch does last; returns it."""
        value = serialization_id(self._names, self._descriptor_values)
        self.record(SERIALIZATION_ID, value.encode())
        return value

    def finish(self) -> None:
        """Central directory and end records (zip64 ones always, as torch writes them)."""
        start = self.size
        for entry in self._entries:
            big = entry.size >= self.zip64_from or entry.offset >= self.zip64_from
            extra = b""
            if big:
                fields = struct.pack("<QQQ", entry.size, entry.size, entry.offset)
                extra = struct.pack("<HH", _ZIP64_EXTRA, len(fields)) + fields
            size32 = _U32 if big else entry.size
            offset32 = _U32 if big else entry.offset
            self._emit(struct.pack("<IHHHHHHIIIHHHHHII", _CENTRAL, 0, 45 if big else 0, _FLAGS, 0, 0, 0,
                                   entry.crc, size32, size32, len(entry.name), len(extra), 0, 0, 0, 0, offset32)
                       + entry.name + extra)
        directory = self.size - start
        count = len(self._entries)
        zip64_end = self.size
        self._emit(struct.pack("<IQHHIIQQQQ", _ZIP64_END, 44, 0x031E, 45, 0, 0, count, count, directory, start))
        self._emit(struct.pack("<IIQI", _ZIP64_LOCATOR, 0, zip64_end, 1))
        self._emit(struct.pack("<IHHHHIIH", _END, 0, 0, min(count, 0xFFFF), min(count, 0xFFFF),
                               min(directory, _U32), min(start, _U32), 0))


def tensor_pickle(dtype: DType, shape: tuple[int, ...]) -> bytes:
    """``data.pkl`` for one contiguous tensor stored whole in storage ``"0"``, as torch pickles it:
    typed legacy storage classes where torch has one (``torch.BFloat16Storage``), else an
    untyped storage and ``_rebuild_tensor_v3`` with the dtype (float8 and friends)."""
    from ckptscope.core.dtypes import dtype_by_name
    from ckptscope.formats.pickles.repickle import repickle
    from ckptscope.formats.pickles.safe import StorageRef, TensorRef

    numel = math.prod(shape)
    if dtype.storage_class:
        storage = StorageRef("0", dtype, "cpu", numel, f"torch.{dtype.storage_class}")
    else:
        storage = StorageRef("0", dtype_by_name("uint8"), "cpu", dtype.nbytes(numel), "torch.storage.UntypedStorage")
    stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    pickled, _ = repickle(TensorRef(storage, 0, tuple(shape), stride, dtype))
    return pickled


def write_torch_save(write: Write, pickled: bytes, storages: list[tuple[str, Any, int | None]]) -> int:
    """One ``torch.save`` container: ``pickled`` is the ``data.pkl`` (protocol 2, from
    ``pickles.repickle.repickle``), ``storages`` are ``(key, bytes_like, crc or None)`` in the order
    torch writes them. Returns the container's length in bytes."""
    writer = TorchZipWriter(write)
    writer.record("data.pkl", pickled)
    writer.record(".format_version", b"1")
    writer.record(".storage_alignment", str(ALIGNMENT).encode())
    writer.record("byteorder", b"little")
    for key, data, crc in storages:
        writer.record(f"data/{key}", data, crc)
    writer.record("version", b"3\n")
    writer.record_serialization_id()
    writer.finish()
    return writer.size
