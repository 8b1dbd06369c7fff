"""Which reader opens a path: each format sniffs, in the detection order of FORMATS.md §0."""

from __future__ import annotations

from collections.abc import Iterator
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
    """Every reader, built-in ones imported, in detection order."""
    _import_builtins(upto=None)
    return list(_READERS)


def _readers_in_order() -> Iterator[type[CheckpointReader]]:
    """Readers in detection order, importing each built-in module only when detection reaches
    its priority: a safetensors file never pays for the Megatron, verl or DCP modules."""
    tried: set[type[CheckpointReader]] = set()
    for priority, _ in BUILTIN_MODULES:
        _import_builtins(upto=priority)
        for cls in _READERS:
            if cls not in tried and cls.priority <= priority:
                tried.add(cls)
                yield cls
    _import_builtins(upto=None)
    yield from (cls for cls in list(_READERS) if cls not in tried)


def _format_names() -> list[str]:
    """Every format name once, in detection order (verl's two Megatron layouts share one name)."""
    return list(dict.fromkeys(r.format_name for r in registered_readers()))


def detect_format(path: str | Path) -> type[CheckpointReader]:
    """The reader class for ``path``, or an error naming every format that was tried."""
    path = Path(path)
    if not path.exists():
        kind = "broken symbolic link" if path.is_symlink() else "no such file or directory"
        raise CkptError(kind, path)
    if path.is_dir():
        try:
            entries = list(path.iterdir())
        except OSError as exc:
            raise CkptError(f"cannot list directory: {exc.strerror or exc}", path) from None
        if not entries:
            raise UnknownFormat(path, _format_names(), "empty directory")
    elif not path.is_file():  # a FIFO would block the first read forever; a device is no checkpoint
        raise CkptError("not a regular file or directory (a FIFO, device or socket)", path)
    else:
        try:
            with open(path, "rb") as handle:
                handle.read(1)
        except OSError as exc:
            raise CkptError(f"cannot read: {exc.strerror or exc}", path) from None
    for cls in _readers_in_order():
        if cls.supports(path):
            return cls
    raise UnknownFormat(path, _format_names())


def open_checkpoint(path: str | Path, *, trust_pickle: bool = False) -> CheckpointReader:
    """Open ``path`` with the first reader that recognises it. Reads no tensor bytes."""
    cls = detect_format(path)
    return cls(Path(path), trust_pickle=trust_pickle)


BUILTIN_MODULES: tuple[tuple[int, str], ...] = (
    (10, "gguf.reader"),
    (15, "peft.reader"),
    (20, "safetensors.reader"), (30, "torch_save.zip_reader"), (35, "nemo.reader"), (40, "torch_save.legacy_reader"),
    (55, "dcp.hf_shards"), (60, "hf.reader"), (68, "verl.accelerate_ranks"),
    (69, "verl.reader"), (71, "verl.v2_reader"), (80, "megatron.dist_reader"), (85, "megatron.dcp_reader"),
    (90, "dcp.reader"), (100, "megatron.legacy_reader"),
    (110, "deepspeed.reader"),
)
"""Built-in format modules with the lowest ``priority`` of the readers each registers, in
detection order (tests check this against the classes). Imported on demand: together they are
most of the time ``open`` spends importing."""

_imported: set[str] = set()


def _import_builtins(upto: int | None) -> None:
    """Import the built-in modules whose readers sniff at ``upto`` or earlier (None: all)."""
    import importlib

    for priority, module in BUILTIN_MODULES:
        if upto is not None and priority > upto:
            break
        if module not in _imported:
            importlib.import_module(f"ckptscope.formats.{module}")
            _imported.add(module)
