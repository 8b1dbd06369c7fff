"""The members of a ``.nemo`` archive, and one member read in place as a file of its own.

``SaveRestoreConnector._make_nemo_file_from_folder`` (``nemo/core/connectors/save_restore_connector.py``)
writes the archive with ``tarfile.open(path, "w:")`` and ``tar.add(folder, arcname=".")``: an
uncompressed tar (NeMo 1.7 and later; before, ``"w:gz"``) whose member names start with ``./``. An
uncompressed member's bytes lie whole at ``TarInfo.offset_data``, so a ``torch.save`` zip inside it is read
where it is: ``member_file`` shows that byte range to ``zipfile`` as if it were the file.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from ckptscope.core.errors import CkptError
from ckptscope.formats.base import starts_with
from ckptscope.formats.rangeio import RangeIO

GZIP_MAGIC = b"\x1f\x8b"
USTAR_OFFSET, USTAR_MAGIC = 257, b"ustar"


class Member(NamedTuple):  # (not a dataclass: detection imports this module, and making one costs ~1 ms)
    name: str
    """The path inside the archive without NeMo's leading ``./``."""
    offset: int
    """Where its bytes start in the archive."""
    size: int
    is_dir: bool = False


def looks_like_tar(path: Path) -> bool:
    """A POSIX/GNU tar header at the start of ``path`` (``ustar`` at byte 257). Never raises."""
    return starts_with(path, USTAR_MAGIC, USTAR_OFFSET)


def is_gzip(path: Path) -> bool:
    return starts_with(path, GZIP_MAGIC)


def members(path: Path) -> list[Member]:
    """Every member of the uncompressed tar at ``path`` (headers only; no member's bytes are read)."""
    import tarfile  # here: detection imports this module for every checkpoint past the torch readers

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


@contextmanager
def member_file(path: Path, member: Member) -> Iterator[RangeIO]:
    """``member``'s bytes as a read-only, seekable file of their own, over a map of the archive (no copy)."""
    with open(path, "rb") as handle:
        if member.size == 0:
            yield RangeIO(b"", 0, 0)
            return
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            if member.offset + member.size > len(mapped):
                raise CkptError(f"member {member.name} runs past the end of the archive (truncated?)", path)
            view = RangeIO(mapped, member.offset, member.size)
            try:
                yield view
            finally:
                view.close()
        finally:
            mapped.close()
