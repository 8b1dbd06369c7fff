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
