"""Training state that trainers keep in files of their own, beside the model, for ``diff --training-state``.

The transformers Trainer saves ``optimizer.pt``, ``scheduler.pt`` and ``rng_state*.pth`` next to
``model.safetensors``; accelerate's ``save_state`` writes ``optimizer*.bin``, ``scheduler*.bin``,
``sampler*.bin`` and ``random_states_<rank>.pkl`` (all ``torch.save``), and with FSDP's sharded
state dict an ``optimizer_<N>/`` DCP directory beside ``pytorch_model_fsdp_<N>/``. The readers
index the model of such a directory only, so a diff of the model never sees these files. With
``--training-state`` each such file present on either side is its own sub-comparison, by stored
name (``optimizer.pt/state.0.exp_avg``); a file only one side has is ``only_a`` / ``only_b``; a
file ckptscope cannot open as a checkpoint is compared byte for byte, and when the bytes differ it
is ``different`` with a note saying why it was not compared by tensor. A difference in training
state is therefore never reported as identical.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptscope.core.index import CheckpointIndex
from ckptscope.formats.hf.side_files import training_file_role

_OPTIMIZER_DIR = re.compile(r"optimizer_\d+\Z")
"""accelerate's FSDP sharded optimizer, a DCP directory beside ``pytorch_model_fsdp_<i>/``."""


def _is_training_file(name: str) -> bool:
    """A trainer's own training-state file (the HF reader's roles, ``training_file_role``) or dir."""
    return training_file_role(name) is not None or bool(_OPTIMIZER_DIR.match(name))


@dataclass
class SideFile:
    """One training-state file name and where each side has it (None: that side lacks it)."""

    name: str
    a: Path | None
    b: Path | None
    plan: Any = None
    """The ``DiffPlan`` of the two files, by stored name, when both sides have it and it opens."""
    unreadable: str | None = None
    """Why the files are compared as bytes instead (the error opening them), when they are."""


def training_files(root: str | Path, index: CheckpointIndex) -> dict[str, Path]:
    """Training-state files in the directory ``root`` (the directory the user named) that the
    index did not read tensors from, by file name."""
    directory = Path(root)
    if not directory.is_dir():
        return {}
    candidates = sorted(entry for entry in directory.iterdir() if _is_training_file(entry.name))
    if not candidates:  # the usual model dir: no pass over the index's chunks
        return {}
    read = {chunk.file for meta in index.tensors.values() for chunk in meta.chunks}
    reader_root = Path(index.path)
    out = {}
    for entry in candidates:
        try:
            relative = str(entry.resolve().relative_to(reader_root.resolve()))
        except ValueError:
            relative = None
        if relative is not None and relative in read:
            continue
        if entry.is_dir() and not (entry / ".metadata").is_file():
            continue  # optimizer_0/ is a DCP directory when it has .metadata
        out[entry.name] = entry
    return out


def pair_training_files(root_a: str | Path, index_a: CheckpointIndex, root_b: str | Path,
                        index_b: CheckpointIndex) -> list[SideFile]:
    """Every training-state file either side has, paired by file name."""
    files_a, files_b = training_files(root_a, index_a), training_files(root_b, index_b)
    return [SideFile(name, files_a.get(name), files_b.get(name)) for name in sorted(set(files_a) | set(files_b))]
