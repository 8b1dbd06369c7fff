"""``rename``: new names for stored tensors, data copied bit for bit, written atomically.

Plan first (``plan_rename``: names checked, files listed, nothing written; what ``--dry-run``
prints and the TUI previews), then execute (``execute_rename``). Only headers, indices and
metadata are rebuilt; tensor bytes are copied (or hard-linked) verbatim, never decoded.

Each checkpoint format has a ``RenameWriter`` (files.py; the built-in ones are listed in
``BUILTIN_WRITERS``) that knows which files to rewrite and how; the planning, validation and
atomic write are shared.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex
from ckptscope.formats import open_checkpoint
from ckptscope.ops.atomic import atomic_output, check_destination, link_or_copy
from ckptscope.ops.check import metadata_problems
from ckptscope.ops.rename.dcp import DcpRenameWriter
from ckptscope.ops.rename.files import FileAction, Progress, RenamePlan, RenameWriter
from ckptscope.ops.rename.plan import NameChanges, compute_name_changes
from ckptscope.ops.rename.safetensors import SafetensorsRenameWriter
from ckptscope.ops.rename.torch import TorchRenameWriter
from ckptscope.ops.roots import save_state_model

BUILTIN_WRITERS: tuple[RenameWriter, ...] = (DcpRenameWriter(), SafetensorsRenameWriter(), TorchRenameWriter())
"""Tried in this order; for an HF dir the safetensors writer comes before the torch one."""

_EXTRA_WRITERS: list[RenameWriter] = []


def register_rename_writer(writer: RenameWriter) -> RenameWriter:
    """Add a writer for another format (tried after the built-in ones)."""
    _EXTRA_WRITERS.append(writer)
    return writer


def _writer_for(index: CheckpointIndex, src: Path) -> RenameWriter:
    """The first registered writer for this format whose ``check`` accepts the checkpoint."""
    writers = (*BUILTIN_WRITERS, *_EXTRA_WRITERS)
    refusal: CkptError | None = None
    for writer in writers:
        if index.format in writer.formats:
            try:
                writer.check(index, src)
            except CkptError as exc:
                refusal = refusal or exc
                continue
            return writer
    if refusal is not None:
        raise refusal
    supported = sorted({f for w in writers for f in w.formats})
    raise CkptError(f"rename does not support {index.format} checkpoints yet (supported: {', '.join(supported)})",
                    src)


def changes_checker(index: CheckpointIndex, src: str | Path) -> Callable[[NameChanges], str | None]:
    """For previews: what ``plan_rename`` would refuse of a set of changes beyond the names themselves
    (a torch file's tensor moved out of its dict), as one line, or None. The writer is looked up and
    its files read on the first call, so a UI can build this where it cannot block."""
    checker: Callable[[NameChanges], str | None] | None = None
    lock = threading.Lock()

    def check(changes: NameChanges) -> str | None:
        nonlocal checker
        with lock:
            if checker is None:
                try:
                    make = getattr(_writer_for(index, Path(src)), "changes_checker", None)
                except CkptError as exc:  # a format rename cannot write: every rule is refused on apply
                    message = str(exc)
                    checker = lambda _changes: message  # noqa: E731
                else:
                    checker = make(index) if make is not None else (lambda _changes: None)
            try:
                return checker(changes)
            except CkptError as exc:
                return str(exc)
    return check


def plan_rename(src: str | Path, dst: str | Path, *, subs: Sequence[tuple[str, str]] = (),
                drops: Sequence[str] = (), mapping: Mapping[str, str] | None = None,
                overwrite: bool = False) -> RenamePlan:
    """Check the request against the checkpoint's stored names and list what will be written."""
    src, dst = Path(src), Path(dst)
    if not (subs or drops or mapping):
        raise CkptError("nothing to do: give --sub, --drop or --map")
    model = save_state_model(src)
    if model is not None:
        raise CkptError(f"an accelerate save_state dir: its model is {model}; rename that DCP dir (the optimizer_N/ "
                        f"dir beside it keeps the old names)", src)
    with open_checkpoint(src) as reader:
        reader.show_stored_quantization()  # names and bytes as stored: an FP8 weight and its scales apart
        index = reader.index()
    if index.issues:  # readers index damaged checkpoints; a rename would silently copy the damage
        first = index.issues[0]
        raise CkptError(f"the checkpoint is damaged ({first.file + ': ' if first.file else ''}{first.detail}); "
                        f"`ckptscope check` lists every problem", src)
    found = metadata_problems(index.tensors.values())
    if found:  # a hole or overlap in the metadata would be copied into the new metadata as it is
        raise CkptError(f"the checkpoint is damaged ({found[0].kind} in {found[0].tensor}: {found[0].detail}); "
                        f"`ckptscope check` lists every problem", src)
    writer = _writer_for(index, src)
    check_destination(src, dst, overwrite=overwrite)
    changes = compute_name_changes(list(index.tensors), subs=subs, drops=drops, mapping=mapping)
    return RenamePlan(src=src, dst=dst, format=index.format, changes=changes, overwrite=overwrite,
                      directory=src.is_dir(), files=writer.plan_files(index, changes),
                      nbytes={name: meta.nbytes for name, meta in index.tensors.items()})


def execute_rename(plan: RenamePlan, progress: Progress | None = None, *, workers: int | None = None) -> None:
    """Write the destination atomically. The source is only ever read.

    Files are written in parallel (the range copies release the GIL while they read and write), which
    is how a rename of a sharded checkpoint keeps up with ``cp``.
    """
    check_destination(plan.src, plan.dst, overwrite=plan.overwrite)
    with open_checkpoint(plan.src) as reader:
        reader.show_stored_quantization()
        writer = _writer_for(reader.index(), plan.src)
    total, done = plan.total_bytes, 0
    lock = threading.Lock()

    def advance(n: int) -> None:
        nonlocal done
        with lock:
            done += n
            if progress:
                progress(done, total)

    with atomic_output(plan.dst, directory=plan.directory, overwrite=plan.overwrite) as staging:
        written: dict[str, str] = {}

        def locate(action: FileAction) -> tuple[Path, Path]:
            if plan.directory:
                return plan.src / action.path, staging / action.path
            return plan.src, staging

        def write_one(action: FileAction) -> None:
            src_file, out_file = locate(action)
            out_file.parent.mkdir(parents=True, exist_ok=True)
            if action.action.startswith("rewrite"):
                placed = writer.write_file(plan, action, src_file, out_file, advance)
                with lock:
                    written.update(placed)
                return
            if action.action == "link":
                link_or_copy(src_file, out_file)
            elif src_file.is_dir():
                shutil.copytree(src_file, out_file)
            else:
                shutil.copy2(src_file, out_file)
            advance(action.nbytes)

        jobs = [a for a in plan.files if a.action.startswith("rewrite") or a.action in ("copy", "link")]
        with ThreadPoolExecutor(max_workers=workers or min(4, len(jobs) or 1)) as pool:
            for future in [pool.submit(write_one, a) for a in jobs]:
                future.result()
        for action in plan.files:
            if action.action == "regenerate":
                src_file, out_file = locate(action)
                out_file.parent.mkdir(parents=True, exist_ok=True)
                writer.regenerate(plan, action, src_file, out_file, written)
