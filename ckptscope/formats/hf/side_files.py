"""The files beside a Hugging Face model's weights, and what each is for.

Shared by the HF model reader and the PEFT adapter reader: a transformers Trainer writes the same
``checkpoint-N`` dir around either (``optimizer.pt``, ``scheduler.pt``, ``rng_state*.pth``,
``training_args.bin`` and, last, ``trainer_state.json``), so both list that training state with the
same roles and both report a save whose ``trainer_state.json`` is missing as unfinished.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo, ObjectEntry
from ckptscope.core.names import natural_key
from ckptscope.formats.pickles.safe import to_plain, type_name
from ckptscope.formats.pickles.torch_file import is_torch_zip, read_torch_zip

_CONFIG_FILES = ("config.json", "generation_config.json", "adapter_config.json")
_TOKENIZER_HINTS = ("tokenizer", "vocab", "merges.txt", "special_tokens_map", "chat_template")
TRAINER_STATE = "trainer_state.json"
TRAINING_ARGS = "training_args.bin"
_TRAINER_ROLES = {TRAINING_ARGS: "args", TRAINER_STATE: "state"}
"""transformers.trainer's TRAINING_ARGS_NAME and TRAINER_STATE_NAME, and what each is for."""
_RNG_STATE = re.compile(r"^rng_state(_\d+)?\.pth$")
_TRAINING_FILES = (
    (re.compile(r"optimizer(_\d+)?\.(pt|bin)\Z"), "optimizer"),
    (re.compile(r"scheduler(_\d+)?\.(pt|bin)\Z"), "scheduler"),
    (re.compile(r"scaler\.pt\Z"), "scaler"),
    (re.compile(r"sampler(_\d+)?\.bin\Z"), "sampler"),
    (re.compile(r"(rng_state(_\d+)?\.pth|random_states_\d+\.pkl)\Z"), "rng"),
)
"""The training state trainers keep in files of their own: transformers.trainer's OPTIMIZER_NAME,
SCHEDULER_NAME, SCALER_NAME and ``rng_state[_<rank>].pth``; accelerate's ``save_state`` names
(``optimizer[_<i>].bin``, ``scheduler[_<i>].bin``, ``sampler[_<i>].bin``, ``random_states_<rank>.pkl``)."""


def training_file_role(name: str) -> str | None:
    """``optimizer``, ``scheduler``, ``scaler``, ``sampler`` or ``rng`` for a trainer's training-state
    file name (``_TRAINING_FILES``), else None."""
    return next((role for pattern, role in _TRAINING_FILES if pattern.match(name)), None)
_TRAINER_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_TRAINER_SUBDIRS = re.compile(r"^(global_step\d+|optimizer_\d+)$")
"""DeepSpeed's ``global_stepN/`` (engine.save_checkpoint under the Trainer checkpoint) and the
FSDP sharded optimizer's ``optimizer_N/``: listed, never read."""
_TRAINER_STATE_KEYS = ("global_step", "epoch", "max_steps", "num_train_epochs", "save_steps",
                       "train_batch_size", "best_global_step", "best_model_checkpoint")


def load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CkptError(f"cannot read: {exc.strerror or exc}", path) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CkptError(f"bad JSON: {exc}", path) from None


def add_side_files(index: CheckpointIndex, root: Path) -> None:
    """Every file in ``root`` beside the weights, with its role; for a transformers Trainer
    ``checkpoint-N`` dir (a full model or a PEFT adapter) its training state and the
    ``trainer_state.json`` that marks a finished save."""
    data_files = {c.file for t in index.tensors.values() for c in t.chunks}
    entries = sorted(root.iterdir(), key=lambda p: natural_key(p.name))
    names = {p.name for p in entries if p.is_file()}
    trainer = _is_trainer_checkpoint(root, names)
    for path in entries:
        if not path.is_file():
            if trainer and path.is_dir() and _TRAINER_SUBDIRS.match(path.name):
                _add_trainer_subdir(index, root, path)
            continue
        name = path.name
        if name in data_files:
            role = "data"
        elif name.endswith(".json") and ".index" in name:
            role = "index"
        elif name in _CONFIG_FILES:
            role = "config"
        elif name in _TRAINER_ROLES:
            role = _TRAINER_ROLES[name]
        elif (kind := training_file_role(name)) is not None:
            role = kind
        elif trainer and name in ("latest", "zero_to_fp32.py"):
            role = "deepspeed"
        elif any(h in name for h in _TOKENIZER_HINTS):
            role = "tokenizer"
        else:
            role = "other"
        index.files.append(FileInfo(name, path.stat().st_size, role))
        if role == "config":
            config = load_json(path)
            index.objects.append(ObjectEntry(name.removesuffix(".json"), "json", config))
            if name == "config.json" and isinstance(config, dict):
                for key in ("architectures", "model_type", "torch_dtype", "dtype", "tie_word_embeddings"):
                    if key in config:
                        index.metadata.setdefault(key, config[key])
        elif role == "state":
            _add_trainer_state(index, path)
        elif role == "args":
            _add_training_args(index, path)
    if trainer:
        index.metadata.setdefault("trainer", {"global_step": None})
        if TRAINER_STATE not in names:
            index.add_issue("missing-marker", "not found; transformers' Trainer writes it last, so this save "
                            "did not finish (resume_from_checkpoint needs it)", file=TRAINER_STATE,
                            warning=f"{TRAINER_STATE}: not found: an HF Trainer checkpoint whose save did "
                                    "not finish")


def _is_trainer_checkpoint(root: Path, names: set[str]) -> bool:
    """A Trainer ``checkpoint-N`` dir: its name, or the files only ``_save_checkpoint`` writes."""
    return bool(_TRAINER_CHECKPOINT.match(root.name) or TRAINER_STATE in names
                or names & {"optimizer.pt", "scheduler.pt", "scaler.pt"}
                or any(_RNG_STATE.match(n) for n in names))


def _add_trainer_subdir(index: CheckpointIndex, root: Path, folder: Path) -> None:
    deepspeed = folder.name.startswith("global_step")
    for path in sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: natural_key(str(p))):
        rel = path.relative_to(root).as_posix()
        role = "optimizer" if not deepspeed or path.name.endswith("optim_states.pt") else "deepspeed"
        index.files.append(FileInfo(rel, path.stat().st_size, role))


def _add_trainer_state(index: CheckpointIndex, path: Path) -> None:
    """``trainer_state.json`` as an object; its ``global_step`` is the iteration. A file that does
    not parse is an issue (a crash while it was written), not a failure."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        index.add_issue("unreadable-file", f"cannot parse: {exc}", file=path.name)
        return
    index.objects.append(ObjectEntry("trainer_state", "json", state))
    if not isinstance(state, dict):
        return
    summary = {k: state[k] for k in _TRAINER_STATE_KEYS if k in state}
    summary.setdefault("global_step", None)
    index.metadata["trainer"] = summary
    step = state.get("global_step")
    if isinstance(step, int) and not isinstance(step, bool):
        index.metadata.setdefault("iteration", step)


def _add_training_args(index: CheckpointIndex, path: Path) -> None:
    """The pickled ``TrainingArguments``, read by the safe stub unpickler (nothing is imported or
    called; torch is not needed): its fields as a dict."""
    if not is_torch_zip(path):
        return
    try:
        parsed = read_torch_zip(path)
    except CkptError as exc:
        index.add_issue("unreadable-file", exc.problem, file=path.name)
        return
    index.objects.append(ObjectEntry("training_args", type_name(parsed.obj), to_plain(parsed.obj)))
