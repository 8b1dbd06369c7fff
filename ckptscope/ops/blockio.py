"""Reading blocks of tensors as raw bytes, shared by ``diff`` and ``timeline``.

Both engines read stored bytes with ``preadv`` into per-thread buffers (no page-cache mapping
kept, no fresh allocations) from files opened once per run, in blocks of whole first-axis rows;
``diff``'s byte-equality test maps each range for its compare instead (``ByteReader.same_range``).
Kept apart from either engine so a command imports only what it runs (``timeline`` starts without
the diff engine).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from math import prod

from ckptscope.core.errors import CkptError
from ckptscope.formats.filecopy import read_exact_fd
from ckptscope.mappings.links import Box, box_shape
from ckptscope.ops.blockmath import buffer_address, map_range, memcmp, unmap_range

BYTE_CHUNK = 1 << 20
"""Bytes per read on the byte path: large enough that syscalls are few, small enough to stay in cache."""
RELEASE_EVERY = 64 * 1024 * 1024
"""Release mapped pages after this many bytes read, so RSS tracks the working set."""


def split_box(box: Box, max_elems: int) -> Iterator[Box]:
    """Cut ``box`` along its first axis into boxes of at most ``max_elems`` elements (>= one row)."""
    if not box:
        yield box
        return
    shape = box_shape(box)
    row = prod(shape[1:]) or 1
    step = max(1, max_elems // row)
    start, stop = box[0]
    for lo in range(start, stop, step):
        yield ((lo, min(stop, lo + step)),) + box[1:]


class ByteReader:
    """``preadv`` into per-thread reused buffers: no page-cache mapping kept, no fresh allocations."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def fd(self, path: str) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                try:
                    fd = self._fds[path] = os.open(path, os.O_RDONLY)
                except OSError as exc:
                    raise CkptError(f"cannot read: {exc.strerror}", path) from None
            return fd

    def buffers(self) -> tuple[tuple[bytearray, bytearray], tuple[int, int]]:
        """Two ``BYTE_CHUNK`` buffers per thread and their addresses, for ``blockmath.memcmp`` (which
        releases the GIL, where ``bytearray == bytearray`` holds it: two threads comparing would take
        turns). At this size both stay in the core's cache between the read and the compare, so a
        compare costs little more than the copy out of the page cache that ``cat`` pays too."""
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            pair = (bytearray(BYTE_CHUNK), bytearray(BYTE_CHUNK))
            bufs = self._local.bufs = (pair, (buffer_address(pair[0]), buffer_address(pair[1])))
        return bufs

    def read_into(self, path: str, offset: int, view: memoryview) -> None:
        read_exact_fd(self.fd(path), path, offset, view)

    def same_range(self, path_a: str, off_a: int, path_b: str, off_b: int, length: int) -> bool:
        """Do ``length`` bytes of ``path_a`` from ``off_a`` equal those of ``path_b`` from ``off_b``?
        Compared where they lie in the page cache (``map_range``), or read into this thread's
        buffers ``BYTE_CHUNK`` at a time where a file cannot be mapped; a file shorter than the
        range is the same one clear error either way."""
        fd_a, fd_b = self.fd(path_a), self.fd(path_b)
        if self._long_enough(fd_a, path_a, off_a + length) and self._long_enough(fd_b, path_b, off_b + length):
            mapped_a = map_range(fd_a, off_a, length)
            if mapped_a is not None:
                try:
                    mapped_b = map_range(fd_b, off_b, length)
                    if mapped_b is not None:
                        try:
                            return memcmp(mapped_a[2], mapped_b[2], length) == 0
                        finally:
                            unmap_range(mapped_b)
                finally:
                    unmap_range(mapped_a)
        (buf_a, buf_b), (addr_a, addr_b) = self.buffers()
        view_a, view_b = memoryview(buf_a), memoryview(buf_b)
        for pos in range(0, length, BYTE_CHUNK):
            n = min(BYTE_CHUNK, length - pos)
            self.read_into(path_a, off_a + pos, view_a[:n])
            self.read_into(path_b, off_b + pos, view_b[:n])
            if memcmp(addr_a, addr_b, n):
                return False
        return True

    @staticmethod
    def _long_enough(fd: int, path: str, end: int) -> bool:
        """True when the file holds byte ``end - 1``; False sends the caller to ``preadv``, which
        names the truncated file (a mapped page past the end would kill the process with SIGBUS)."""
        return os.fstat(fd).st_size >= end

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
