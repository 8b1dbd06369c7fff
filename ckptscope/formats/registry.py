"""Which reader opens a path: each format sniffs, in the detection order of FORMATS.md §0."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from ckptscope.core.errors import CkptError, UnknownFormat
from ckptscope.formats.base import CheckpointReader

_READERS: list[type[CheckpointReader]] = []
R = TypeVar("R", bound=type[CheckpointReader])


def register_reader(cls: R) -> R:
    """Class decorator: add a reader; order by ``priority`` (lower sniffs first)."""
    _READERS.append(cls)
    _READERS.sort(key=lambda c: c.priority)
    return cls


def registered_readers() -> list[type[CheckpointReader]]:
    _load_builtin_readers()
    return list(_READERS)


def detect_format(path: str | Path) -> type[CheckpointReader]:
    """The reader class for ``path``, or an error naming every format that was tried."""
    path = Path(path)
    readers = registered_readers()
    if not path.exists():
        kind = "broken symbolic link" if path.is_symlink() else "no such file or directory"
        raise CkptError(kind, path)
    if path.is_dir():
        try:
            entries = list(path.iterdir())
        except OSError as exc:
            raise CkptError(f"cannot list directory: {exc.strerror or exc}", path) from None
        if not entries:
            raise UnknownFormat(path, [r.format_name for r in readers], "empty directory")
    else:
        try:
            with open(path, "rb") as handle:
                handle.read(1)
        except OSError as exc:
            raise CkptError(f"cannot read: {exc.strerror or exc}", path) from None
    for cls in readers:
        if cls.supports(path):
            return cls
    raise UnknownFormat(path, [r.format_name for r in readers])


def open_checkpoint(path: str | Path, *, trust_pickle: bool = False) -> CheckpointReader:
    """Open ``path`` with the first reader that recognises it. Reads no tensor bytes."""
    cls = detect_format(path)
    return cls(Path(path), trust_pickle=trust_pickle)


_loaded = False


def _load_builtin_readers() -> None:
    """Import the built-in format modules once; each registers itself."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from ckptscope.formats import dcp, hf_dir, megatron_dist, safetensors_file, torch_legacy, torch_zip  # noqa: F401
    from ckptscope.formats import megatron_legacy  # noqa: F401
    from ckptscope.formats import verl  # noqa: F401
