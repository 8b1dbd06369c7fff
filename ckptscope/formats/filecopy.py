"""Copy byte ranges file to file, in the kernel (``copy_file_range``), as ``cp`` does.

For outputs appended in order whose size is not planned up front: the torch-format rename and
writer, and the LoRA merge. Outputs of a planned size (convert, merge, the safetensors rename) go
through ``filefill`` instead, which reserves them and lets several threads write one file.
The kernel moves the bytes without a round trip through user memory. Where source and
destination offsets differ within a page it copies each page in two pieces, about a third slower
on a fresh machine; copying through a user buffer instead looked faster in isolation but was up to
3x slower here under memory pressure (its page-cache writes stalled on compaction), so the kernel
copy is used whatever the alignment. A filesystem without ``copy_file_range`` falls back to the
buffer.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.formats.checksum import crc32

BUFFER = 8 << 20
_local = threading.local()


def copy_range(src: Path, dst_handle, offset: int, length: int, crc: int | None = None) -> int | None:
    """Copy ``length`` bytes of ``src`` from ``offset`` to the current position of the open binary
    file ``dst_handle``, and leave its position after them. With ``crc`` (a running CRC-32), return
    it updated with the copied bytes (see ``_copy_at``)."""
    dst_handle.flush()
    start = dst_handle.tell()
    crc = _copy_at(src, dst_handle.fileno(), offset, start, length, crc)
    dst_handle.seek(start + length)
    return crc


def _copy_at(src: Path, dst_fd: int, offset: int, dst_offset: int, length: int,
                  crc: int | None = None) -> int | None:
    """Copy ``length`` bytes of ``src`` from ``offset`` to ``dst_offset`` of the open file ``dst_fd``.

    With ``crc`` (a running CRC-32), return it updated with the copied bytes: computed on the buffer
    the bytes pass through, or, after a kernel copy, from the source pages it just read (hot)."""
    with open(src, "rb") as source:
        in_fd = source.fileno()
        done = 0
        kernel = hasattr(os, "copy_file_range")
        while done < length:
            if kernel:
                try:
                    n = os.copy_file_range(in_fd, dst_fd, length - done, offset + done, dst_offset + done)
                except OSError:  # another filesystem, or no support: copy through memory
                    kernel = False
                    continue
                if crc is not None and n:
                    crc = _crc_of(in_fd, offset + done, n, crc)
            else:
                n, crc = _copy_through_buffer(in_fd, dst_fd, offset + done, dst_offset + done, length - done, crc)
            if n == 0:
                raise CkptError(f"unexpected end of file at byte {offset + done}", src)
            done += n
    return crc


def _buffer() -> memoryview:
    buffer = getattr(_local, "buffer", None)
    if buffer is None:
        buffer = _local.buffer = memoryview(bytearray(BUFFER))
    return buffer


def _copy_through_buffer(in_fd: int, dst_fd: int, offset: int, dst_offset: int, length: int,
                         crc: int | None) -> tuple[int, int | None]:
    """One buffer's worth (at most ``BUFFER`` bytes): the bytes copied (0 at end of file), the CRC."""
    buffer = _buffer()
    n = os.preadv(in_fd, [buffer[:min(length, BUFFER)]], offset)
    written = 0
    while written < n:
        written += os.pwrite(dst_fd, buffer[written:n], dst_offset + written)
    if crc is not None:
        crc = crc32(buffer[:n], crc)
    return n, crc


def _crc_of(in_fd: int, offset: int, length: int, crc: int) -> int:
    buffer = _buffer()
    done = 0
    while done < length:
        n = os.preadv(in_fd, [buffer[:min(length - done, BUFFER)]], offset + done)
        if n == 0:
            break
        crc = crc32(buffer[:n], crc)
        done += n
    return crc


def read_exact(path: Path, offset: int, view: memoryview) -> None:
    """Fill ``view`` with the bytes of ``path`` from ``offset``; a file that ends first is one
    clear error (a truncated checkpoint), never a short buffer."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise CkptError(f"cannot read: {exc.strerror}", path) from None
    try:
        read_exact_fd(fd, path, offset, view)
    finally:
        os.close(fd)


def read_exact_fd(fd: int, path: Path | str, offset: int, view: memoryview) -> None:
    """``read_exact`` on a file already open as ``fd`` (``path`` names it in the error)."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise CkptError(f"file ends before byte {offset + len(view)}; it is truncated", path)
        done += n
