"""The members of a ``.nemo`` archive, and one member read in place as a file of its own.

``SaveRestoreConnector._make_nemo_file_from_folder`` (``nemo/core/connectors/save_restore_connector.py``)
writes the archive with ``tarfile.open(path, "w:")`` and ``tar.add(folder, arcname=".")``: an
uncompressed tar (NeMo 1.7 and later; before, ``"w:gz"``) whose member names start with ``./``. An
uncompressed member's bytes lie whole at ``TarInfo.offset_data``, so a ``torch.save`` zip inside it is read
where it is: ``MemberFile`` shows that byte range to ``zipfile`` as if it were the file.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ckptscope.core.errors import CkptError

GZIP_MAGIC = b"\x1f\x8b"
USTAR_OFFSET, USTAR_MAGIC = 257, b"ustar"


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    """The path inside the archive without NeMo's leading ``./``."""
    offset: int
    """Where its bytes start in the archive."""
    size: int
    is_dir: bool = False


def looks_like_tar(path: Path) -> bool:
    """A POSIX/GNU tar header at the start of ``path`` (``ustar`` at byte 257). Never raises."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(USTAR_OFFSET + len(USTAR_MAGIC))
    except OSError:
        return False
    return head[USTAR_OFFSET:USTAR_OFFSET + len(USTAR_MAGIC)] == USTAR_MAGIC


def is_gzip(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == GZIP_MAGIC
    except OSError:
        return False


def members(path: Path) -> list[Member]:
    """Every member of the uncompressed tar at ``path`` (headers only; no member's bytes are read)."""
    try:
        with tarfile.open(path, "r:") as archive:
            found = []
            for info in archive:
                name = info.name[2:] if info.name.startswith("./") else info.name
                if name in ("", "."):
                    continue
                if info.issparse():
                    raise CkptError(f"member {name} is a sparse file; cannot read it in place", path)
                found.append(Member(name, info.offset_data, info.size, info.isdir()))
            return found
    except tarfile.TarError as exc:
        raise CkptError(f"corrupt .nemo archive (not a readable tar): {exc}", path) from None
    except OSError as exc:
        raise CkptError(f"cannot read: {exc.strerror or exc}", path) from None


class MemberFile(io.RawIOBase):
    """Bytes ``[start, start + size)`` of ``path`` as a read-only, seekable file of ``size`` bytes."""

    def __init__(self, path: Path, start: int, size: int) -> None:
        super().__init__()
        self._handle = open(path, "rb")
        self._start, self._size, self._pos = start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        view = memoryview(buffer).cast("B")
        want = min(len(view), self._size - self._pos)
        if want <= 0:
            return 0
        self._handle.seek(self._start + self._pos)
        got = self._handle.readinto(view[:want]) or 0
        self._pos += got
        return got

    def close(self) -> None:
        if not self.closed:
            self._handle.close()
        super().close()
