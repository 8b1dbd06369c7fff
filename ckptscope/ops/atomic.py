"""Write to a temporary sibling, then rename into place: a crash never leaves a half-written DST."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ckptscope.core.errors import CkptError


def check_destination(src: Path, dst: Path, *, overwrite: bool) -> None:
    """Refuse to write onto the source, inside it, or onto an existing path without ``overwrite``."""
    src_r, dst_r = src.resolve(), dst.resolve()
    if src_r == dst_r or src_r in dst_r.parents:
        raise CkptError("the destination must not be the source or lie inside it", dst)
    if dst_r in src_r.parents:
        raise CkptError("the destination must not contain the source", dst)
    if (dst.exists() or dst.is_symlink()) and not overwrite:
        raise CkptError("destination exists (use --overwrite to replace it)", dst)
    if not dst.parent.is_dir():
        raise CkptError("the destination's parent directory does not exist", dst)


@contextmanager
def atomic_output(dst: Path, *, directory: bool, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``dst``; on success it replaces ``dst`` in one rename."""
    parent = dst.parent
    tmp_root = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".tmp", dir=parent))
    staging = tmp_root / dst.name
    if directory:
        staging.mkdir()
    try:
        yield staging
        if dst.exists() or dst.is_symlink():
            if not overwrite:
                raise CkptError("destination appeared while writing; left untouched", dst)
            old = tmp_root / f"{dst.name}.old"
            os.replace(dst, old)
        os.replace(staging, dst)
    except BaseException:
        shutil.rmtree(tmp_root, ignore_errors=True)
        raise
    shutil.rmtree(tmp_root, ignore_errors=True)


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


def link_or_copy(src: Path, dst: Path) -> str:
    """Hard-link when the filesystem allows it (data files that do not change), else copy."""
    try:
        os.link(src, dst)
        return "link"
    except OSError:
        shutil.copy2(src, dst)
        return "copy"
