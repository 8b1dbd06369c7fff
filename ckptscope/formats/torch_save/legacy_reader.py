"""Legacy (non-zip) ``torch.save`` files: torch < 1.6 or ``_use_new_zipfile_serialization=False``.

FORMATS.md §2.6: a stream of pickles (magic number, protocol version, sys info, the object, the
sorted storage keys) followed by one record per storage: an 8-byte little-endian element count,
then the raw bytes. We read the pickles safely and record where each record's bytes start.
"""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path
from typing import IO, Any

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.pickles.safe import SafeUnpickler, StorageRef
from ckptscope.formats.pickles.torch_file import StoragePlacement, build_torch_index
from ckptscope.formats.pickles.trusted import TrustedReadMixin, TrustedTorchFile
from ckptscope.formats.registry import register_reader

MAGIC_PREFIX = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"
MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001


class _RecordingUnpickler(SafeUnpickler):
    """Remembers every storage the object refers to (we need their element sizes)."""

    def __init__(self, file: IO[bytes], seen: dict[str, StorageRef]) -> None:
        super().__init__(file)
        self._seen = seen

    def persistent_load(self, pid: Any) -> Any:
        ref = super().persistent_load(pid)
        self._seen.setdefault(ref.key, ref)
        return ref


def read_legacy(path: Path) -> tuple[Any, dict[str, StoragePlacement], bool]:
    """Return (object, storage placements, big_endian) for a legacy torch file."""
    obj, placements, big_endian, _ = read_legacy_stream(path)
    return obj, placements, big_endian


def read_legacy_stream(path: Path) -> tuple[Any, dict[str, StoragePlacement], bool, Any]:
    """Like ``read_legacy``, plus the sys-info record (needed to write the stream back)."""
    seen: dict[str, StorageRef] = {}
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as handle:
            magic = SafeUnpickler(handle).load()
            if magic != MAGIC_NUMBER:
                raise CkptError("not a legacy torch file (bad magic number)", path)
            protocol = SafeUnpickler(handle).load()
            if protocol != PROTOCOL_VERSION:
                raise CkptError(f"unsupported legacy torch protocol version {protocol!r}", path)
            sys_info = SafeUnpickler(handle).load()
            big_endian = isinstance(sys_info, dict) and sys_info.get("little_endian") is False
            obj = _RecordingUnpickler(handle, seen).load()
            keys = SafeUnpickler(handle).load()
            placements: dict[str, StoragePlacement] = {}
            for key in keys:
                header = handle.read(8)
                if len(header) < 8:
                    raise CkptError(f"truncated legacy torch file: storage {key} is missing", path)
                (numel,) = struct.unpack(">q" if big_endian else "<q", header)
                ref = seen.get(str(key))
                itemsize = ref.dtype.itemsize if ref else 1
                start = handle.tell()
                length = numel * itemsize
                if start + length > size:
                    raise CkptError(f"truncated legacy torch file: storage {key} ends beyond the file", path)
                placements[str(key)] = StoragePlacement(start, length)
                handle.seek(length, os.SEEK_CUR)
    except CkptError:
        raise
    except OSError as exc:
        raise CkptError(f"cannot read: {exc.strerror or exc}", path) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError) as exc:
        raise CkptError(f"corrupt legacy torch file: {type(exc).__name__}: {exc}", path) from None
    return obj, placements, big_endian, sys_info


@register_reader
class TorchLegacyReader(TrustedReadMixin, CheckpointReader):
    format_name = "torch-legacy"
    priority = 40

    @classmethod
    def supports(cls, path: Path) -> bool:
        if not path.is_file():
            return False
        try:
            with open(path, "rb") as handle:
                return handle.read(len(MAGIC_PREFIX)) == MAGIC_PREFIX
        except OSError:
            return False

    def _build_index(self) -> CheckpointIndex:
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        index.files.append(FileInfo(self.path.name, self.path.stat().st_size, "data"))
        if self.trust_pickle:
            self._trusted = TrustedTorchFile(self.path, mmap=False)
            self._trusted.fill_index(index, self.path.name)
            return index
        obj, placements, big_endian = read_legacy(self.path)
        build_torch_index(index, obj, self.path.name, placements, big_endian=big_endian, path=self.path)
        return index

