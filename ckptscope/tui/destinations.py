"""Where an op's output goes by default: next to the checkpoint, never inside a checkpoint dir or a
trainer's save root (convert ``-hf`` / ``-mcore``, rename ``-renamed``). One rule for every form, so a
user who accepts the default never writes into the run they are reading."""

from __future__ import annotations

import re
from pathlib import Path

_ITERATION_DIR = re.compile(r"^(iter_\d+|release|global_step_?\d+|step-\d+|checkpoint-\d+)$")
"""A save inside a trainer's save root (Megatron, verl, DeepSpeed, torchtitan, HF Trainer)."""
_CONTAINED_MODEL = re.compile(r"^(pytorch_model_fsdp_\d+|mp_rank_\d+(_\d+)*)$")
"""A model dir inside a save dir (accelerate's save_state, a Megatron rank dir)."""


def destination_base(src: str | Path) -> Path:
    """What the destination is named after, so that it lands NEXT TO the checkpoint and never inside
    a checkpoint dir or a trainer's save root: the save root for a save inside one
    (``run/iter_0000100``, ``run/global_step_10/actor``, ``out/checkpoint-500``, ``dump/checkpoint/step-4``
    -> ``run``, ``run``, ``out``, ``dump/checkpoint``), an accelerate ``save_state`` dir for its
    ``pytorch_model_fsdp_0``, else the source itself (a file without its suffix: the result is always
    a directory)."""
    path = Path(src)
    if path.name in ("", ".", ".."):
        path = path.resolve()
    for level in (path, path.parent):
        if _ITERATION_DIR.match(level.name) and level.parent.name not in ("", ".", ".."):
            return level.parent
    if _CONTAINED_MODEL.match(path.name) and path.parent.name not in ("", ".", ".."):
        return path.parent
    if path.is_file():
        return path.with_name(path.stem)
    return path


def default_destination(src: str | Path, tag: str, *, keep_suffix: bool = False) -> Path:
    """``<base>-<tag>`` next to the source (``-hf``, ``-mcore``, ``-renamed``), the first that does not
    exist yet (``-hf-2``, ...). ``keep_suffix``: a file source keeps its suffix (a renamed
    ``x.safetensors`` is ``x-renamed.safetensors``); otherwise the result is a directory."""
    suffix = Path(src).suffix if keep_suffix and Path(src).is_file() else ""
    base = destination_base(src)
    for n in range(1, 1000):
        candidate = base.with_name(f"{base.name}-{tag}{suffix}" if n == 1 else f"{base.name}-{tag}-{n}{suffix}")
        if not candidate.exists():
            return candidate
    return base.with_name(f"{base.name}-{tag}{suffix}")


def replaced_text(dst: str | Path, overwrite: bool, *, limit: int = 10_000) -> str | None:
    """What an overwrite will delete, said in the confirm step: ``replaces the existing folder … (12 files,
    3.1 MiB)``; None when nothing is replaced. A probe ticked "overwrite" on a folder holding unrelated
    files and the form said only where it would write; the files were gone after enter."""
    from ckptscope.core.units import human_bytes, plural

    path = Path(dst)
    if not overwrite or not (path.exists() or path.is_symlink()):
        return None
    if path.is_symlink() or not path.is_dir():
        size = path.lstat().st_size
        return f"replaces the existing file {path} ({human_bytes(size)}): what is there now is deleted"
    files, size = 0, 0
    for entry in path.rglob("*"):
        if files >= limit:
            break
        if entry.is_file() and not entry.is_symlink():
            files += 1
            size += entry.stat().st_size
    counted = f"{plural(files, 'file')}{'+' if files >= limit else ''}, {human_bytes(size)}"
    return f"replaces the existing folder {path} ({counted}): what is there now is deleted"
