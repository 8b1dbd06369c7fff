"""verl's Megatron checkpoint "layout schema v2": which part of an actor/critic dir holds what.

verl-project/verl ``MegatronCheckpointManager.save_checkpoint`` (verl/utils/checkpoint/
megatron_checkpoint_manager.py, docs/advance/checkpoint.rst "Locating saved contents")::

    global_step_N/actor/
      model/dist_ckpt/         torch_dist of {"model": sharded_state_dict} (use_dist_checkpointing)
      model/huggingface/       HF config + tokenizer, and the weights as safetensors when mbridge saves them
      optimizer/dist_ckpt/     torch_dist of {"optimizer", "lr_scheduler"}
      extra/dist_ckpt/         torch_dist of {"rng_state"}
      transformer_config.json
      ckpt_contents.json       rank 0 writes it LAST (tmp + os.replace): its presence means the save finished

verl's path helpers create each directory as a side effect, so an mbridge save has an empty
``model/dist_ckpt/`` and a dist-checkpointing save an empty ``model/huggingface/``; directories prove
nothing. Where the model is comes from the manifest's ``contents.model`` (``path`` +
``format``); without a manifest (a save cut short, or copied without it) it is guessed from what
the directories hold, and the save is reported incomplete.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ckptscope.formats.verl.side_files import json_file

MANIFEST = "ckpt_contents.json"
SCHEMA_VERSION = 2
MODEL_DIST = "model/dist_ckpt"
MODEL_HF = "model/huggingface"
TRAINING_DIRS = ("optimizer/dist_ckpt", "extra/dist_ckpt")
"""Where verl puts the optimizer (+ lr_scheduler) and the RNG state trees."""
_V2_DIRS = (MODEL_DIST, MODEL_HF, *TRAINING_DIRS)
_FORMATS = {"megatron_dist_checkpoint": "megatron_dist", "huggingface": "hf"}
"""Manifest ``format`` -> the reader that opens that part."""


@dataclass(slots=True)
class V2Layout:
    """What an actor dir's manifest (or, without one, its directories) says is where."""

    manifest: dict[str, Any] | None
    problem: str | None
    """What is wrong with ``ckpt_contents.json`` (missing, unreadable): the save counts as incomplete."""
    model: tuple[str, str] | None
    """``(relative dir, "megatron_dist" | "hf")`` of the model weights, None when none were saved."""
    training: list[str] = field(default_factory=list)
    """Relative dirs of the training-state torch_dist trees (optimizer, extra) that hold files."""
    warnings: list[str] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)
    """``(content key, relative path)`` of what the manifest lists besides the model but is not there (or an
    empty dir): verl's ``load_checkpoint`` opens it, so a resume fails (check said ok; a probe)."""
    migrated: bool = False
    """Made by verl's ``scripts/migrate_megatron_checkpoint_layout.py`` from a v1 dir: ``model/``,
    ``optimizer/`` and ``extra/dist_ckpt`` mirror one mixed torch_dist tree, and no manifest is written."""


def _has_files(path: Path) -> bool:
    try:
        return path.is_dir() and any(path.iterdir())
    except OSError:
        return False


def is_v2_dir(path: Path) -> bool:
    """A verl v2 actor/critic dir: the manifest, or one of the v2 subdirectories. Never raises."""
    try:
        return (path / MANIFEST).is_file() or any((path / rel).is_dir() for rel in _V2_DIRS)
    except OSError:
        return False


def v2_complete(path: Path) -> bool | None:
    """Whether a v2 dir holds a finished save (its manifest is there and readable, or it is a migrated v1
    save whose tree has torch_dist's closing files); None if not v2."""
    if not is_v2_dir(path):
        return None
    manifest, _ = json_file(path / MANIFEST)
    if isinstance(manifest, dict):
        return True
    return migrated_v1(path) and all((path / MODEL_DIST / name).is_file() for name in ("metadata.json", ".metadata"))


def _tree(path: Path) -> dict[str, int] | None:
    """Relative file name -> size of every file under ``path`` (a directory symlink followed), or None."""
    try:
        return {p.relative_to(path).as_posix(): p.stat().st_size for p in path.rglob("*") if p.is_file()} or None
    except OSError:
        return None


def migrated_v1(path: Path) -> bool:
    """A v1 dir converted by verl's migration script: no manifest, and ``model/``, ``optimizer/`` and
    ``extra/dist_ckpt`` are one tree (hard links, a symlink each, or copies: the same files, sizes and
    ``.metadata`` bytes). Such a save is whole; read once, it is the old mixed tree. Never raises."""
    if (path / MANIFEST).exists():
        return False
    try:  # the script's default: hard links, so one inode behind all three .metadata (or one dir, symlinked)
        found = [(path / rel / ".metadata").stat() for rel in (MODEL_DIST, *TRAINING_DIRS)]
    except OSError:
        return False
    if len({(st.st_dev, st.st_ino) for st in found}) == 1:
        return True
    if len({st.st_size for st in found}) != 1:
        return False
    trees = [_tree(path / rel) for rel in (MODEL_DIST, *TRAINING_DIRS)]
    if trees[0] is None or any(tree != trees[0] for tree in trees[1:]):
        return False
    try:
        first = (path / MODEL_DIST / ".metadata").read_bytes()
        return all((path / rel / ".metadata").read_bytes() == first for rel in TRAINING_DIRS)
    except OSError:
        return False


def _safe_rel(value: Any) -> str | None:
    """A manifest path that stays inside the actor dir, normalised, or None."""
    if not isinstance(value, str) or not value:
        return None
    rel = PurePosixPath(value)
    if rel.is_absolute() or ".." in rel.parts:
        return None
    return rel.as_posix()


def _guess_model(path: Path) -> tuple[str, str] | None:
    """The model part from the directories alone: torch_dist files first (verl's resume path), then HF."""
    from ckptscope.formats.hf.reader import HFDirReader

    if _has_files(path / MODEL_DIST):
        return MODEL_DIST, "megatron_dist"
    if HFDirReader.supports(path / MODEL_HF):
        return MODEL_HF, "hf"
    return None


def v2_layout(path: Path) -> V2Layout | None:
    """The v2 layout of ``path``, or None when it is not a v2 dir. Never raises."""
    if not is_v2_dir(path):
        return None
    manifest, problem = json_file(path / MANIFEST)
    if problem is None and not isinstance(manifest, dict):
        problem, manifest = "not a JSON object", None
    if problem is not None:
        problem = problem.removeprefix(f"{MANIFEST}: ")
        if not (path / MANIFEST).exists():
            problem = ("missing: verl writes it last, after every part of the save, so this save did not finish "
                       "(or was copied without it)")
    if problem is not None and migrated_v1(path):
        # one mixed tree mirrored three times, read once: the model itself unless mbridge saved the model as
        # HF weights (moved to model/huggingface), then the tree is the training state beside it
        from ckptscope.formats.hf.reader import HFDirReader

        if HFDirReader.supports(path / MODEL_HF):
            return V2Layout(manifest=None, problem=None, model=(MODEL_HF, "hf"), training=[MODEL_DIST], migrated=True)
        return V2Layout(manifest=None, problem=None, model=(MODEL_DIST, "megatron_dist"), migrated=True)
    layout = V2Layout(manifest=manifest, problem=problem, model=None)
    contents = manifest.get("contents") if manifest else None
    contents = contents if isinstance(contents, dict) else {}
    if manifest is not None and manifest.get("schema_version") != SCHEMA_VERSION:
        layout.warnings.append(f"{MANIFEST}: schema_version {manifest.get('schema_version')!r}, "
                               f"read as version {SCHEMA_VERSION}")
    entry = contents.get("model")
    if isinstance(entry, dict):
        rel, kind = _safe_rel(entry.get("path")), _FORMATS.get(str(entry.get("format")))
        if rel is None or kind is None:
            layout.warnings.append(f"{MANIFEST}: model entry {entry!r} is not a path and format ckptscope "
                                   "knows; looking at the directories instead")
        else:
            layout.model = (rel, kind)
    if layout.model is None and (manifest is None or "model" in contents or isinstance(entry, dict)):
        layout.model = _guess_model(path)
    for key, value in contents.items():
        rel = _safe_rel(value.get("path")) if isinstance(value, dict) and key != "model" else None
        if rel is not None and not ((path / rel).is_file() or _has_files(path / rel)):
            layout.missing.append((key, rel))
    dirs = [*TRAINING_DIRS]
    for key, value in contents.items():
        if key != "model" and isinstance(value, dict) and value.get("format") == "megatron_dist_checkpoint":
            rel = _safe_rel(value.get("path"))
            if rel is not None and rel not in dirs:
                dirs.append(rel)
    layout.training = [rel for rel in dirs if (layout.model is None or rel != layout.model[0])
                       and _has_files(path / rel)]
    return layout
