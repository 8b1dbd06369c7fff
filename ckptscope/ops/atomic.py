"""Write to a temporary sibling, then rename into place: a crash never leaves a half-written DST."""

from __future__ import annotations

import os
import secrets
import stat
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ckptscope.core.errors import CkptError


def _resolved(path: Path) -> Path:
    """``path.resolve()``, with a symbolic link loop said as such (``resolve`` raises RuntimeError)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:
        raise CkptError("a symbolic link loop (the link leads back to itself)", path) from exc


def check_destination(src: Path, dst: Path, *, overwrite: bool, inputs: Iterable[Path] = ()) -> None:
    """Refuse to write onto the source, inside it, or onto an existing path without ``overwrite``.

    ``inputs``: other paths the command reads (the save root the user named when ``src`` is one of its
    iterations, a ``--map`` file): the destination may not be, hold or lie inside any of them either.
    Whatever ``overwrite`` says, only a file, a directory or a symlink is ever replaced: never a device,
    a FIFO or a socket (``--overwrite`` onto ``/dev/null`` would have replaced the device node)."""
    dst_r = _resolved(dst)
    for given in (src, *inputs):
        src_r = _resolved(Path(given))
        if src_r == dst_r or src_r in dst_r.parents:
            raise CkptError("the destination must not be the source or lie inside it", dst)
        if dst_r in src_r.parents:
            raise CkptError("the destination must not contain the source", dst)
    if (dst.exists() or dst.is_symlink()) and not overwrite:
        raise CkptError("destination exists (--overwrite, or the overwrite box in the TUI, replaces it)", dst)
    try:
        mode = dst.lstat().st_mode
    except OSError:
        mode = None
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        raise CkptError("the destination is a device, FIFO or socket, not a file or directory: never replaced", dst)
    parent = dst.parent
    if not parent.is_dir():
        what = "is a file, not a directory" if parent.exists() else "does not exist"
        raise CkptError(f"the destination's parent directory {what}", dst)
    if not os.access(parent, os.W_OK | os.X_OK):
        # A read-only filesystem or a directory the user may not write: say so before any planning
        # (free-space checks there would report 0 bytes free, and a writer would fail half way).
        raise CkptError(f"cannot write in {parent}: read-only or no permission", dst)


def owned_temp_dir(parent: Path, prefix: str) -> Path:
    """A fresh temp dir ``<prefix><pid>.<random>.tmp`` in ``parent``, after removing the ones a process
    that no longer runs left there (killed by SIGKILL, or by a signal before it could unwind: a probe found
    600 MB of them beside a destination after one kill and one rerun). The pid in the name tells whose
    it is; a live process's dir, or anything not named this way, is never touched."""
    for path in _make_owned(parent, prefix):
        pass
    return path


def _make_owned(parent: Path, prefix: str) -> Iterator[Path]:
    """``owned_temp_dir`` in two steps, so a caller can stand inside its ``try`` before the dir exists:
    yields each name it is about to create, then creates it (a name taken is passed over). A stopping signal
    that lands between the creation and the caller's ``try`` left the dir behind (a CI run: SIGQUIT sent the
    moment the dir appeared); the caller removes the last name yielded, which only this process uses."""
    _remove_stale(parent, prefix)
    while True:
        path = parent / f"{prefix}{os.getpid()}.{secrets.token_hex(4)}.tmp"
        yield path
        try:
            os.mkdir(path, 0o700)
            return
        except FileExistsError:
            continue


def _remove_stale(parent: Path, prefix: str) -> None:
    try:
        names = [e.name for e in os.scandir(parent) if e.name.startswith(prefix) and e.name.endswith(".tmp")]
    except OSError:
        return
    for name in names:
        pid_text = name[len(prefix):].split(".", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or _running(int(pid_text)):
            continue
        path = parent / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive, and not ours to judge
        return True
    return True


@contextmanager
def atomic_output(dst: Path, *, directory: bool, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``dst``; on success it replaces ``dst`` in one rename."""
    parent = dst.parent
    tmp_root: Path | None = None
    # inside the try from here: a stopping signal landing while the temp dir or the staging dir is made left
    # the temp dir behind (two CI runs)
    try:
        for tmp_root in _make_owned(parent, f".{dst.name}."):
            pass
        assert tmp_root is not None
        staging = tmp_root / dst.name
        if directory:
            staging.mkdir()
        yield staging
        if dst.exists() or dst.is_symlink():
            if not overwrite:
                raise CkptError("destination appeared while writing; left untouched", dst)
            old = tmp_root / f"{dst.name}.old"
            os.replace(dst, old)
        os.replace(staging, dst)
    except BaseException:
        if tmp_root is not None:
            shutil.rmtree(tmp_root, ignore_errors=True)
        raise
    shutil.rmtree(tmp_root, ignore_errors=True)


def check_space(parent: Path, nbytes: int) -> None:
    """Refuse up front when the filesystem of ``parent`` has less than ``nbytes`` free: a writer
    that runs out of space half way has cost the user the time of the half (and some writers,
    such as torch's own zip writer, report it only as an obscure error)."""
    try:
        usage = shutil.disk_usage(parent)
    except OSError:
        return  # cannot tell: the writers still fail cleanly on the first write that does not fit
    free = usage.free
    if usage.total == 0:  # /sys, /proc: a kernel's pseudo filesystem, not storage
        raise CkptError("not a filesystem that stores files (it reports no size at all)", parent)
    if free < nbytes:
        raise CkptError(f"not enough space: the output needs about {_size(nbytes)}, "
                        f"{_size(free)} is free there", parent)


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def link_or_copy(src: Path, dst: Path) -> str:
    """Hard-link when the filesystem allows it (data files that do not change), else copy."""
    try:
        os.link(src, dst)
        return "link"
    except OSError:
        shutil.copy2(src, dst)
        return "copy"
