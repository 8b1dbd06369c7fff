"""Copy byte ranges file to file, in the kernel (``copy_file_range``), as ``cp`` does.

For outputs appended in order whose size is not planned up front: the torch-format rename and
writer, and the LoRA merge. Outputs of a planned size (convert, merge, the safetensors rename) go
through ``filefill`` instead, which reserves them and lets several threads write one file (measured
faster there). A filesystem without ``copy_file_range`` falls back to a buffer.
"""

from __future__ import annotations

import os
from pathlib import Path

from ckptscope.core.errors import CkptError

BUFFER = 8 << 20


def copy_range(src: Path, dst_handle, offset: int, length: int) -> None:
    """Copy ``length`` bytes of ``src`` from ``offset`` to the current position of the open binary
    file ``dst_handle``, and leave its position after them."""
    dst_handle.flush()
    start = dst_handle.tell()
    dst_fd = dst_handle.fileno()
    with open(src, "rb") as source:
        in_fd = source.fileno()
        done = 0
        kernel = hasattr(os, "copy_file_range")
        while done < length:
            if kernel:
                try:
                    n = os.copy_file_range(in_fd, dst_fd, length - done, offset + done, start + done)
                except OSError:  # another filesystem, or no support: copy through memory
                    kernel = False
                    continue
            else:
                block = os.pread(in_fd, min(length - done, BUFFER), offset + done)
                n = os.pwrite(dst_fd, block, start + done) if block else 0
            if n == 0:
                raise CkptError(f"unexpected end of file at byte {offset + done}", src)
            done += n
    dst_handle.seek(start + length)


def read_exact_fd(fd: int, path: Path | str, offset: int, view: memoryview) -> None:
    """Fill ``view`` with the bytes of the open file ``fd`` from ``offset``; a file that ends first
    is one clear error naming ``path`` (a truncated checkpoint), never a short buffer."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise CkptError(f"file ends before byte {offset + len(view)}; it is truncated", path)
        done += n
