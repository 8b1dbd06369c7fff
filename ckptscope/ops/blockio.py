"""Reading blocks of tensors as raw bytes, shared by ``diff`` and ``timeline``.

Both engines read stored bytes with ``preadv`` into per-thread buffers (no page-cache mapping
kept, no fresh allocations) from files opened once per run, in blocks of whole first-axis rows.
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
from ckptscope.ops.blockmath import buffer_address

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

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
