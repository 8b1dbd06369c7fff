"""Copy byte ranges file to file, in the kernel where it can (``copy_file_range``).

Shared by the writers (formats) and the ops that copy unchanged data (rename, convert): moving
bytes this way skips the round trip through user memory, which is what makes ``cp`` fast.
"""

from __future__ import annotations

import os
from pathlib import Path

from ckptscope.core.errors import CkptError


def copy_range(src: Path, dst_handle, offset: int, length: int) -> None:
    """Copy ``length`` bytes of ``src`` from ``offset`` into ``dst_handle`` (kernel-side when possible)."""
    with open(src, "rb") as source:
        remaining = length
        pos = offset
        out_fd = dst_handle.fileno()
        dst_handle.flush()
        use_kernel = hasattr(os, "copy_file_range")
        while remaining > 0:
            if use_kernel:
                try:
                    done = os.copy_file_range(source.fileno(), out_fd, remaining, pos)
                except OSError:
                    use_kernel = False
                    continue
                if done == 0:
                    raise CkptError(f"unexpected end of file at byte {pos}", src)
            else:
                source.seek(pos)
                block = source.read(min(remaining, 64 << 20))
                if not block:
                    raise CkptError(f"unexpected end of file at byte {pos}", src)
                dst_handle.write(block)
                dst_handle.flush()
                done = len(block)
            pos += done
            remaining -= done


def copy_range_at(src: Path, dst_fd: int, offset: int, dst_offset: int, length: int) -> None:
    """Copy ``length`` bytes of ``src`` from ``offset`` to ``dst_offset`` of the open file ``dst_fd``,
    leaving its file position alone: several threads can fill disjoint parts of one file at once."""
    with open(src, "rb") as source:
        in_fd = source.fileno()
        done = 0
        use_kernel = hasattr(os, "copy_file_range")
        while done < length:
            if use_kernel:
                try:
                    n = os.copy_file_range(in_fd, dst_fd, length - done, offset + done, dst_offset + done)
                except OSError:
                    use_kernel = False
                    continue
            else:
                block = os.pread(in_fd, min(length - done, 64 << 20), offset + done)
                n = os.pwrite(dst_fd, block, dst_offset + done) if block else 0
            if n == 0:
                raise CkptError(f"unexpected end of file at byte {offset + done}", src)
            done += n
