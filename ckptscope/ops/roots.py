"""Save directories that hold many iterations: find them so a user can pick one.

Trainers write one directory per save under a root, each with its own completeness marker:

* Megatron-LM: ``iter_0000100/`` (or ``release/``) next to a ``latest_checkpointed_iteration.txt``
  tracker that holds the iteration number or ``release``; a save is whole when Megatron's
  ``metadata.json`` (torch_dist) or every ``mp_rank_*`` file (torch) is there.
* verl: ``global_step_100/actor/`` (and ``critic/``) next to the same tracker; whole when every rank
  file (FSDP), ``ckpt_contents.json`` (Megatron layout v2) or the torch_dist markers (older Megatron
  layout) are there.
* torchtitan: ``checkpoint/step-100/``, no tracker; a step is whole when DCP's ``.metadata`` (renamed
  into place last) is there, and torchtitan resumes from the newest such step (FORMATS.md §5.7).
* DeepSpeed: ``global_step100/`` (``engine.save_checkpoint``'s default tag) next to a ``latest`` file
  naming the newest tag, written after the tag's files; a tag is taken as whole when it has its
  model-states file and optimizer files of consecutive ranks from 0 (DeepSpeed writes no marker of
  its own; ``check`` on the tag compares the rank files with the world size they record).
* accelerate: ``project_dir/checkpoints/checkpoint_3/`` (``ProjectConfiguration(automatic_checkpoint_naming=
  True)``: one ``save_state`` dir per save, numbered by save, not by step), no tracker; whole when
  ``random_states_0.pkl`` is there (``save_state`` writes the rng states after the model, optimizers,
  schedulers and samplers); ``load_state`` resumes from the highest number, whole or not.
* NeMo 2.0: ``<run>/checkpoints/<name>--...-step=100-.../`` (and a ``...-last`` copy of the newest), each
  a ``weights/`` torch_dist dir (model keys under ``module.``) beside ``context/``; no tracker; whole when
  ``weights/`` has torch_dist's ``metadata.json`` and DCP's ``.metadata``.
* HF Trainer: ``output_dir/checkpoint-100/``, no tracker; a checkpoint is whole when
  ``trainer_state.json`` is there (``Trainer._save_checkpoint`` writes it after the model, optimizer,
  scheduler and rng files). A model that ``trainer.save_model()`` left in ``output_dir`` itself is
  the ``final`` entry.

Opening the root itself offers the iterations (newest first) instead of failing, and says which
ones are incomplete (a save that crashed half-way is the usual reason to open a checkpoint at all).
``pick_iteration`` is what the CLI opens by default; ``describe_root`` / ``describe_checkpoint``
name the layout for ``inspect`` and ``check``.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ckptscope.core.errors import CkptError
from ckptscope.formats import detect_format
from ckptscope.formats.megatron.nemo_context import NEMO_CONTEXT, NEMO_WEIGHTS

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.core.index import CheckpointIndex

TRACKER = "latest_checkpointed_iteration.txt"
TRAINER_STATE = "trainer_state.json"
RELEASE = "release"
"""Megatron's ``release/`` dir, named by the tracker as ``release``: an iteration the user can pick."""
FINAL = "final"
"""The model ``trainer.save_model()`` wrote into an HF Trainer ``output_dir`` itself."""
_MEGATRON = re.compile(r"^iter_(\d+)$")
_VERL = re.compile(r"^global_step_(\d+)$")
_TORCHTITAN = re.compile(r"^step-(\d+)$")
_HF_TRAINER = re.compile(r"^checkpoint-(\d+)$")
_DEEPSPEED = re.compile(r"^global_step(\d+)$")
_ACCELERATE = re.compile(r"^checkpoint_(\d+)$")
_NEMO = re.compile(r"-step=(\d+)(?:-|$)")
_LIGHTNING = re.compile(r"^(?:.*[-_])?step=(\d+)(?:[-_].*)?\.ckpt$")
"""PyTorch Lightning ModelCheckpoint files (``epoch=1-step=400.ckpt``; its ``last.ckpt`` duplicates
the newest one and is not listed)."""
VERL_ROLES = ("actor", "critic")
"""The role dirs of a verl step, in the order opening prefers them."""
KINDS = ("megatron", "verl", "torchtitan", "hf-trainer", "deepspeed", "accelerate", "nemo", "lightning")
"""Root kinds, in the order a tie between them is broken."""
TRACKED_KINDS = ("megatron", "verl")
"""Kinds whose trainer writes ``latest_checkpointed_iteration.txt``; the others have no tracker."""

Iteration = int | str
"""An iteration number, or ``release`` / ``final``."""


@dataclass(frozen=True, slots=True)
class IterationInfo:
    path: str
    """Directory to open for this iteration (``iter_0000100``, ``global_step_100/actor``, ``checkpoint-100``)."""
    iteration: Iteration
    """The step number, or ``"release"`` (Megatron ``release/``) or ``"final"`` (HF Trainer ``output_dir``)."""
    size: int
    """Bytes of every file below ``path`` (for ``final``: the files of ``output_dir`` itself)."""
    complete: bool
    """The trainer's own completeness marker is there (see the module docstring)."""
    latest: bool = False
    """The tracker names this iteration (no tracker: the newest complete one)."""
    kind: str = ""
    """``megatron``, ``verl``, ``torchtitan`` or ``hf-trainer``: which trainer's layout the root has."""
    roles: tuple[str, ...] = ()
    """verl: the role dirs saved at this step (``actor``, ``critic``); ``path`` is the first."""
    saved: float | None = None
    """When the save was last written: the newest modification time of its files (epoch seconds)."""

    @property
    def label(self) -> str:
        """How listings show it: ``20``, ``release``, ``final``."""
        return str(self.iteration)

    @property
    def number(self) -> int | None:
        return self.iteration if isinstance(self.iteration, int) else None


def parse_iteration(text: str | int) -> Iteration:
    """``--iteration`` / ``--step`` text: a number (``0000010`` is 10), else a name (``release``, ``final``)."""
    if isinstance(text, int):
        return text
    text = text.strip()
    return int(text) if text.isdigit() else text


def _order(info: IterationInfo) -> tuple[int, int]:
    """Newest first: ``final`` above every step, ``release`` (a converted or initial model) below."""
    if info.iteration == FINAL:
        return (2, 0)
    if isinstance(info.iteration, int):
        return (1, info.iteration)
    return (0, 0)


def _dir_stats(path: Path) -> tuple[int, float | None]:
    """Bytes of every file below ``path`` and the newest modification time among them."""
    total, newest = 0, None
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_size
            newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
    return total, newest


def _dir_size(path: Path) -> int:
    return _dir_stats(path)[0]


def _top_size(path: Path) -> int:
    total = 0
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    return total


def _is_complete(path: Path, kind: str = "") -> bool:
    """Whether ``path`` holds a whole save, judged by its trainer's own marker."""
    try:
        entries = [e.name for e in path.iterdir()]
    except OSError:
        return False
    if kind == "hf-trainer":  # Trainer._save_checkpoint writes trainer_state.json last
        return TRAINER_STATE in entries and (path / TRAINER_STATE).is_file()
    if kind == "accelerate":  # save_state writes the rng states after the model and optimizer state
        return ACCELERATE_RNG in entries
    if kind == "nemo":  # the weights dir: torch_dist's metadata.json and DCP's .metadata
        return "metadata.json" in entries and ".metadata" in entries
    if kind == "deepspeed":
        from ckptscope.formats.deepspeed.reader import ds_layout

        layout = ds_layout(path)
        return layout is not None and bool(layout.model) and sorted(layout.optim) == list(range(len(layout.optim)))
    if kind == "torchtitan":  # DCP renames .metadata into place once every rank wrote its data
        if ".metadata" in entries or any(e.endswith(".distcp") for e in entries):
            return ".metadata" in entries and "common.pt" not in entries
        # ``last_save_in_hf``: the last step exported as HF safetensors shards; torchtitan's
        # ``_find_load_step`` resumes only from a step with the shards' index (or DCP's .metadata), and
        # consolidation writes the index after the shards: shards without it are a save cut short
        if any(e.endswith(".safetensors") for e in entries):
            return "model.safetensors.index.json" in entries
    from ckptscope.formats.megatron.legacy_reader import is_complete_save
    from ckptscope.formats.verl.reader import verl_complete

    verl = verl_complete(path)  # every rank file / the torch_dist marker, not just "a reader sniffs it"
    if verl is not None:
        return verl
    if any(e.startswith("mp_rank_") for e in entries):  # Megatron legacy: every rank file finished
        return is_complete_save(path)
    if "metadata.json" in entries:  # Megatron dist: its marker is written after everything else (§4.1)
        # ... but DCP data without DCP's own .metadata is no save, whatever metadata.json says
        return ".metadata" in entries or not any(e.endswith(".distcp") for e in entries)
    if ".metadata" in entries or any(e.endswith(".distcp") for e in entries):
        # DCP renames .metadata into place once all data is written (§5.1); a torch_dist save that has
        # it but still lacks Megatron's marker (common.pt present) crashed before finalising.
        return ".metadata" in entries and "common.pt" not in entries
    try:
        detect_format(path)
    except CkptError:
        return False
    return True


def _looks_megatron(path: Path) -> bool:
    """A ``release/`` dir without a tracker next to it counts only if it holds Megatron files."""
    try:
        names = {e.name for e in path.iterdir()}
    except OSError:
        return False
    return bool(names & {"metadata.json", ".metadata", "common.pt"}) or any(n.startswith("mp_rank_") for n in names)


def read_tracker(root: Path) -> Iteration | None:
    """What Megatron's tracker file names: an iteration, ``"release"``, or None (missing or garbage)."""
    try:
        text = (Path(root) / TRACKER).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    if text.isdigit():
        return int(text)
    return RELEASE if text == RELEASE else None


def _root_has_model(root: Path) -> bool:
    """``output_dir`` itself holds a model (``trainer.save_model()`` at the end of training): HF weights, or the
    adapter of a PEFT model (its checkpoints are adapters too; a probe's final adapter was ignored by every
    command but ``lora merge``, which opened it)."""
    try:
        return detect_format(root).format_name in ("hf", "peft")
    except CkptError:
        return False


ACCELERATE_FOLDER = "checkpoints"
"""accelerate's automatic checkpoint naming puts its ``checkpoint_N`` dirs here, inside ``project_dir``."""
ACCELERATE_RNG = "random_states_0.pkl"

TORCHTITAN_FOLDER = "checkpoint"
"""torchtitan's default ``checkpoint.folder`` inside its dump folder (FORMATS.md §5.7)."""


def discover_iterations(path: str | Path) -> list[IterationInfo] | None:
    """Iterations saved under ``path``, newest first; ``None`` when ``path`` is not a save root."""
    root = Path(path)
    if not root.is_dir():
        return None
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return None
    has_tracker = (root / TRACKER).is_file()
    latest = read_tracker(root)
    found: list[IterationInfo] = []
    for entry in entries:
        if not entry.is_dir():
            if (m := _LIGHTNING.match(entry.name)) and entry.is_file():
                # one file per save, written whole by torch.save (Lightning's own atomic save)
                st = entry.stat()
                found.append(IterationInfo(path=str(entry), iteration=int(m.group(1)), size=st.st_size,
                                           saved=st.st_mtime, complete=True, latest=False, kind="lightning"))
            continue
        target, kind, roles, iteration = None, "", (), None
        if m := _MEGATRON.match(entry.name):
            target, kind, iteration = entry, "megatron", int(m.group(1))
        elif entry.name == RELEASE and (has_tracker or _looks_megatron(entry)):
            target, kind, iteration = entry, "megatron", RELEASE
        elif m := _VERL.match(entry.name):
            roles = tuple(r for r in VERL_ROLES if (entry / r).is_dir())
            target, kind, iteration = (entry / roles[0] if roles else entry), "verl", int(m.group(1))
        elif m := _TORCHTITAN.match(entry.name):
            target, kind, iteration = entry, "torchtitan", int(m.group(1))
        elif m := _HF_TRAINER.match(entry.name):
            # under FSDP's SHARDED_STATE_DICT the Trainer saves through accelerate: the model is one level
            # down (pytorch_model_fsdp_0/), beside optimizer_0/ (a probe: inspect and timeline refused the root)
            target, kind, iteration = Path(save_state_model(entry) or entry), "hf-trainer", int(m.group(1))
        elif m := _DEEPSPEED.match(entry.name):
            target, kind, iteration = entry, "deepspeed", int(m.group(1))
        elif (m := _ACCELERATE.match(entry.name)) and _is_save_state(entry):
            target, kind, iteration = Path(save_state_model(entry) or entry), "accelerate", int(m.group(1))
        elif (m := _NEMO.search(entry.name)) and nemo_weights(entry) is not None:
            if entry.name.endswith("-last") and any(e.name == entry.name[:-5] for e in entries):
                continue  # NeMo's copy of the newest save, listed once
            target, kind, iteration = Path(nemo_weights(entry)), "nemo", int(m.group(1))
        if target is None or iteration is None:
            continue
        whole = entry if kind in ("accelerate", "hf-trainer") else target  # (its model may be one level down)
        size, saved = _dir_stats(whole)
        # a verl step is whole when every role saved in it is (a critic missing a rank file left the step
        # "complete" from its actor alone; a probe with verl 0.9.1's checkpoint manager)
        complete = all(_is_complete(entry / r, kind) for r in roles) if roles else _is_complete(whole, kind)
        found.append(IterationInfo(path=str(target), iteration=iteration, size=size, saved=saved,
                                   complete=complete, latest=has_tracker and iteration == latest,
                                   kind=kind, roles=roles))
    if found and all(i.kind == "deepspeed" for i in found) and _root_has_model(root) and (root / TRAINER_STATE).is_file():
        return None  # an HF Trainer checkpoint-N with DeepSpeed's global_stepN inside: a checkpoint, not a root
    # (HF weights beside DeepSpeed saves without trainer_state.json: engine.save_16bit_model()'s export in the
    # save dir, possibly older than the save 'latest' names, which DeepSpeed resumes from: a DeepSpeed root;
    # the weights open by their file, as describe_root says. A probe exported such a stale bf16 copy.)
    trainer_saves = [i for i in found if i.kind == "hf-trainer"]
    if trainer_saves and any(i.kind == "deepspeed" for i in found):
        # Trainer + ZeRO-3: trainer.save_model() writes a DeepSpeed save (+ 'latest') into output_dir itself.
        # That is the run's final model, not another training save (it was listed as a second iteration N).
        from ckptscope.formats.deepspeed.reader import read_latest

        tag = read_latest(root)
        final = next((i for i in found if i.kind == "deepspeed" and Path(i.path).name == tag), None)
        found = [i for i in found if i.kind != "deepspeed"]
        if final is not None:
            found.append(replace(final, path=str(root), iteration=FINAL, kind="hf-trainer", latest=False))
    if found and root_kind(found) == "deepspeed":
        found += _deepspeed_custom_tag(root, found)
    if not found and not has_tracker:
        # torchtitan's dump folder: its saves are one level down, in checkpoint/ (checkpoint.folder)
        folder = root / TORCHTITAN_FOLDER
        if folder.is_dir():
            inner = discover_iterations(folder)
            if inner and root_kind(inner) == "torchtitan":
                return inner
        folder = root / ACCELERATE_FOLDER  # accelerate's project_dir: its saves are in checkpoints/
        if folder.is_dir():
            inner = discover_iterations(folder)
            if inner and root_kind(inner) == "accelerate":
                return inner
        return None
    if found and root_kind(found) == "hf-trainer" and _root_has_model(root):
        found.append(IterationInfo(path=str(root), iteration=FINAL, size=_top_size(root), complete=True,
                                   kind="hf-trainer"))
    found.sort(key=_order, reverse=True)
    if not has_tracker:  # torchtitan, HF Trainer: no tracker, the newest complete save is the latest
        from ckptscope.formats.deepspeed.reader import read_latest

        tag = read_latest(root)  # DeepSpeed's own tracker
        newest = next((i for i in found if i.kind == "deepspeed" and Path(i.path).name == tag), None)
        if root_kind(found) != "deepspeed":  # DeepSpeed resumes from its own 'latest' only
            newest = newest or next((i for i in found if i.complete and i.kind not in TRACKED_KINDS), None)
        if newest is not None:
            found = [replace(i, latest=True) if i is newest else i for i in found]
    return found


def _deepspeed_custom_tag(root: Path, found: list[IterationInfo]) -> list[IterationInfo]:
    """The save DeepSpeed's ``latest`` names when it is a tag of the user's own (``save_checkpoint(dir,
    tag="final")``) beside numbered ``global_stepN`` saves: listed under its name, and the default pick,
    as DeepSpeed resumes from it and ``zero_to_fp32`` exports it. Only numbered dirs were listed, so a
    probe's root exported its older ``global_step2`` instead, and ``check`` called the healthy save damaged."""
    from ckptscope.formats.deepspeed.reader import read_latest

    tag = read_latest(root)
    if tag is None or _DEEPSPEED.match(tag) or any(Path(i.path).name == tag for i in found):
        return []
    entry = root / tag
    size, saved = _dir_stats(entry)
    return [IterationInfo(path=str(entry), iteration=tag, size=size, saved=saved,
                          complete=_is_complete(entry, "deepspeed"), kind="deepspeed")]


def root_kind(found: list[IterationInfo]) -> str:
    """The trainer whose layout a root has: the kind most of its iterations have (``megatron`` for a
    root that has only a tracker so far)."""
    counts = Counter(i.kind for i in found if i.kind)
    if not counts:
        return "megatron"
    return max(KINDS, key=lambda k: (counts.get(k, 0), -KINDS.index(k)))


def _label(info: IterationInfo) -> str:
    notes = [note for note, on in (("latest", info.latest), ("incomplete", not info.complete)) if on]
    return f"{info.label} ({', '.join(notes)})" if notes else info.label


def describe_iterations(found: list[IterationInfo]) -> str:
    """One line naming every iteration, e.g. ``30 (incomplete), 20 (latest), 10``."""
    return ", ".join(_label(i) for i in found) or "none"


def default_iteration(found: list[IterationInfo]) -> IterationInfo | None:
    """What opening a save root picks: the latest (tracker) iteration when it is complete, else the
    newest complete one; None when no iteration is complete."""
    latest = next((i for i in found if i.latest and i.complete), None)
    return latest or next((i for i in found if i.complete), None)


def find_iteration(found: list[IterationInfo], iteration: Iteration) -> IterationInfo | None:
    wanted = str(parse_iteration(iteration))
    return next((i for i in found if i.label == wanted), None)


def pick_iteration(root: str | Path, found: list[IterationInfo], iteration: Iteration | None = None) -> IterationInfo:
    """Iteration ``iteration`` of the root (any, even incomplete: the user asked for it), or the
    default one. Raises ``CkptError`` listing what is there when there is no such iteration."""
    if iteration is not None:
        chosen = find_iteration(found, iteration)
        if chosen is None:
            raise CkptError(f"no iteration {iteration}; available: {describe_iterations(found)}", root)
        return chosen
    chosen = default_iteration(found)
    if chosen is None:
        raise CkptError(f"save directory without a complete iteration; found: {describe_iterations(found)}", root)
    return chosen


ACCELERATE_FSDP_MODEL = "pytorch_model_fsdp_0"
"""accelerate's ``save_state`` writes an FSDP sharded model here (``FSDP_MODEL_NAME`` + ``_0``), a
DCP dir of ``{"model": state_dict}``, beside ``optimizer_0/``, ``scheduler.bin`` and
``random_states_R.pkl`` (FORMATS.md §9.4)."""


def _is_save_state(path: Path) -> bool:
    """A dir ``Accelerator.save_state`` wrote, or began to: its model, optimizer or rng files."""
    try:
        names = {e.name for e in path.iterdir()}
    except OSError:
        return False
    return bool(names & {ACCELERATE_FSDP_MODEL, "optimizer.bin", "optimizer_0", "model.safetensors",
                         "pytorch_model.bin"}) or any(n.startswith("random_states_") for n in names)


def save_state_model(path: str | Path) -> str | None:
    """The model inside an accelerate ``save_state`` dir (``pytorch_model_fsdp_0/``), or None.

    Users point at the dir they passed to ``save_state``; its model is one level down, and
    everything else there is training state, so the dir stands for its model.
    """
    candidate = Path(path) / ACCELERATE_FSDP_MODEL
    if candidate.is_dir() and not (Path(path) / "model.safetensors").exists():
        return str(candidate)
    return None


def tracker_gap(path: str | Path, found: list[IterationInfo], chosen: IterationInfo) -> str | None:
    """Why the default pick ``chosen`` is not what the trainer's own tracker names, or None.

    Megatron and verl resume from the iteration in ``latest_checkpointed_iteration.txt`` and DeepSpeed
    from the tag in ``latest``; when that save is missing or incomplete, opening the root falls back to
    the newest complete one, which is then not the run's latest state: commands say so on stderr."""
    root = Path(path)
    kind = root_kind(found)
    if kind in TRACKED_KINDS:
        if not (root / TRACKER).is_file():
            return f"no {TRACKER} (the trainer resumes from what it names); using iteration {chosen.label}"
        named = read_tracker(root)
        if named is None:
            return f"{TRACKER} holds no iteration; using iteration {chosen.label}, the newest complete one"
        if str(named) == chosen.label:
            return None
        state = "which is incomplete" if find_iteration(found, named) is not None else "which is not here"
        return (f"{TRACKER} names iteration {named}, {state}; using iteration {chosen.label}, the newest "
                f"complete one (--iteration picks another)")
    if kind == "deepspeed":
        try:
            tag = (root / "latest").read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return (f"no 'latest' file, so DeepSpeed's load_checkpoint would resume from nothing; using "
                    f"{Path(chosen.path).name}, the newest complete save")
        if tag == Path(chosen.path).name:
            return None
        return (f"'latest' names {tag[:40]!r}, which is not a complete save here; using {Path(chosen.path).name}, "
                f"the newest complete one (--iteration picks another)")
    return None


def verl_step_role(path: str | Path) -> str | None:
    """The role dir (``actor``, else ``critic``) inside one verl ``global_step_N/`` dir, or None.
    verl saves each role beside the others in the step dir; the role holds the checkpoint."""
    path = Path(path)
    if not _VERL.match(path.name):
        return None
    return next((str(path / role) for role in VERL_ROLES if (path / role).is_dir()), None)


def nemo_weights(path: str | Path) -> str | None:
    """The ``weights/`` torch_dist dir of a NeMo 2.0 checkpoint (``weights/`` + ``context/``), or None."""
    path = Path(path)
    weights = path / NEMO_WEIGHTS
    if (path / NEMO_CONTEXT).is_dir() and (weights / "metadata.json").is_file():
        return str(weights)
    return None


def model_dir_within(path: str | Path) -> str | None:
    """The checkpoint dir a user's dir stands for when the checkpoint is one level down: an
    accelerate ``save_state`` dir's FSDP model, a verl step dir's actor, a NeMo 2.0 checkpoint's
    ``weights/``. None otherwise."""
    return save_state_model(path) or verl_step_role(path) or nemo_weights(path)


SAVE_DIR_PATTERNS = ("iter_*, release, global_step_* (verl), global_stepN (DeepSpeed), step-*, checkpoint-*, "
                     "checkpoint_*, epoch=E-step=N.ckpt")


def not_a_save_root(path: str | Path) -> str:
    """Why ``path`` has no iterations to choose from, in one line (a DeepSpeed dir whose ``latest`` names a
    tag of the user's own, which has no order, is said as such; a probe found the old line naming verl's
    pattern only)."""
    from ckptscope.formats.deepspeed.reader import read_latest

    tag = read_latest(Path(path)) if Path(path).is_dir() else None
    if tag and not _DEEPSPEED.match(tag):
        return (f"a DeepSpeed save dir whose tags are its own ('latest' names {tag!r}): only global_stepN saves "
                f"are numbered, so there are no iterations to choose or order; name a tag dir instead")
    return f"not a save directory with iterations ({SAVE_DIR_PATTERNS})"


def resolve_root(path: str | Path, iteration: Iteration | None = None) -> str:
    """A save root (Megatron tracker, verl/torchtitan/HF Trainer step dirs) stands for its default
    iteration (``pick_iteration``), or for ``iteration`` when given; an accelerate ``save_state`` dir
    for its sharded model. Any other path stands for itself; ``iteration`` on it is an error."""
    found = discover_iterations(path)
    if found is None:
        if iteration is not None:
            raise CkptError(f"--iteration {iteration}: {not_a_save_root(path)}", path)
        return model_dir_within(path) or str(path)
    if not found and iteration is None:
        return str(path)
    return pick_iteration(path, found, iteration).path


def resume_target(found: list[IterationInfo]) -> IterationInfo | None:
    """The iteration the trainer itself would resume from, by its own rule, for roots without a
    tracker: torchtitan takes the newest step with ``.metadata``; HF Trainer's
    ``get_last_checkpoint`` takes the highest ``checkpoint-N``, whole or not (a final model in
    ``output_dir`` is not a checkpoint to resume from)."""
    kind = root_kind(found)
    if kind in ("hf-trainer", "accelerate"):
        return next((i for i in found if i.kind == kind and i.number is not None), None)
    return default_iteration(found) or (found[0] if found else None)


# --- naming the layout ------------------------------------------------------------------------------


def _megatron_format(path: Path) -> str | None:
    try:
        names = {e.name for e in path.iterdir()}
    except OSError:
        return None
    if "metadata.json" in names or "common.pt" in names:
        return "torch_dist"
    if any(n.startswith("mp_rank_") for n in names):
        return "torch"
    if ".metadata" in names:
        from ckptscope.formats.megatron.dcp_reader import sniff_ckpt_format

        return sniff_ckpt_format(path) or "DCP"
    return None


def _tracker_text(root: Path) -> str:
    try:
        text = (root / TRACKER).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return "no tracker"
    if text.isdigit():
        return f"tracker: iteration {int(text)}"
    if text == RELEASE:
        return "tracker: release"
    return f"tracker: {text[:20]!r}"


def describe_root(root: str | Path, found: list[IterationInfo]) -> str:
    """The layout of a save root, e.g. ``Megatron-LM save root (torch_dist, tracker: iteration 5)``."""
    root = Path(root)
    kind = root_kind(found)
    chosen = default_iteration(found) or (found[0] if found else None)
    if kind == "megatron":
        fmt = _megatron_format(Path(chosen.path)) if chosen else None
        return f"Megatron-LM save root ({f'{fmt}, ' if fmt else ''}{_tracker_text(root)})"
    if kind == "verl":
        backend = None
        if chosen is not None:
            from ckptscope.formats.verl.reader import megatron_dist_dir
            from ckptscope.formats.verl.v2 import is_v2_dir

            chosen_path = Path(chosen.path)
            backend = "Megatron" if megatron_dist_dir(chosen_path) or is_v2_dir(chosen_path) else "FSDP"
        tracker = _tracker_text(root).replace("iteration", "step")
        return f"verl checkpoint dir ({f'{backend}, ' if backend else ''}{tracker})"
    newest = next((i for i in found if i.latest), None)
    if kind == "deepspeed":
        beside = "; HF weights beside them (save_16bit_model's) open by their file" if _root_has_model(root) else ""
        return f"DeepSpeed save dir ({f'latest: {Path(newest.path).name}' if newest else 'no latest tag'}{beside})"
    if kind == "torchtitan":
        where = f"newest complete: {Path(newest.path).name}" if newest else "no complete step"
        return f"torchtitan checkpoint folder (DCP, {where})"
    if kind == "accelerate":
        where = f"newest complete: checkpoint_{newest.label}" if newest else "no complete save"
        return f"accelerate checkpoints folder (save_state dirs numbered by save, {where})"
    if kind == "nemo":
        where = f"newest complete: step {newest.label}" if newest else "no complete checkpoint"
        return f"NeMo 2.0 checkpoints dir (torch_dist weights/, {where})"
    if kind == "lightning":
        where = f"newest: {Path(newest.path).name}" if newest else "no checkpoint"
        return f"PyTorch Lightning checkpoint dir (.ckpt files by step, {where})"
    steps = sum(1 for i in found if i.number is not None)
    if any(i.iteration == FINAL for i in found):
        return f"HF Trainer output dir (final model + {steps} checkpoint{'s' if steps != 1 else ''})"
    where = f"newest complete: checkpoint-{newest.label}" if newest else "no complete checkpoint"
    sharded = " with FSDP sharded models" if any(Path(i.path).name == ACCELERATE_FSDP_MODEL for i in found) else ""
    return f"HF Trainer output dir{sharded} ({where})"


_FORMAT_LAYOUTS = {
    "safetensors": "safetensors file", "hf": "Hugging Face model dir", "torch": "torch.save file",
    "torch-legacy": "torch.save file (legacy format)", "megatron_dist": "Megatron-Core torch_dist dir",
    "dcp": "PyTorch DCP dir",
    "dcp_safetensors_shards": "PyTorch DCP HuggingFaceStorageWriter shards (per-rank safetensors pieces)", "megatron_legacy": "Megatron-LM per-rank checkpoint (torch)",
    "megatron_dcp": "Megatron-LM DCP dir (torch_dcp / fsdp_dtensor)",
    "verl_fsdp": "verl FSDP checkpoint dir", "verl_megatron": "verl Megatron checkpoint dir",
    "accelerate_fsdp_ranks": "accelerate FSDP per-rank save",
    "verl_hf": "verl FSDP checkpoint dir (HF model only)",
    "nemo": "NeMo .nemo archive (model_weights.ckpt, read in place)",
}

_MEGATRON_SUBFORMATS = {"megatron_dist": "torch_dist", "megatron_legacy": "torch", "megatron_dcp": None,
                        "dcp": "DCP without metadata.json"}
"""Reader format -> the ``--ckpt-format`` it is (None: the reader says, in ``metadata["megatron"]``)."""


def describe_checkpoint(path: str | Path, index: CheckpointIndex, *, fallback: bool = True) -> str | None:
    """The layout of one checkpoint, e.g. ``HF Trainer checkpoint (step 4)`` or
    ``Megatron-LM iteration dir (torch_dist, iteration 10)``: a trainer's save dir. Anything else is
    named by its format (``PyTorch DCP dir``), or None without ``fallback``."""
    path = Path(path)
    fmt = index.format
    name = path.name
    trainer = index.metadata.get("trainer")
    if fmt in ("hf", "peft") and isinstance(trainer, dict):
        of = " of a PEFT adapter" if fmt == "peft" else ""
        step = trainer.get("global_step")
        if step is None:
            m = _HF_TRAINER.match(name)
            return (f"HF Trainer checkpoint{of} ({f'step {m.group(1)}, ' if m else ''}incomplete: "
                    f"no {TRAINER_STATE})")
        return f"HF Trainer checkpoint{of} (step {step})"
    if fmt in _MEGATRON_SUBFORMATS and (_MEGATRON.match(name) or name == RELEASE):
        sub = _MEGATRON_SUBFORMATS[fmt] or (index.metadata.get("megatron") or {}).get("ckpt_format", "DCP")
        if name == RELEASE:
            return f"Megatron-LM release checkpoint ({sub})"
        return f"Megatron-LM iteration dir ({sub}, iteration {int(name[5:])})"
    if fmt == "dcp" and name.startswith("pytorch_model_fsdp_"):
        return "accelerate FSDP sharded model (DCP)"
    if fmt == "dcp" and (m := _TORCHTITAN.match(name)):
        return f"torchtitan step dir (DCP, step {m.group(1)})"
    if fmt == "deepspeed":
        info = index.metadata.get("deepspeed") or {}
        what = "DeepSpeed universal checkpoint (ds_to_universal)" if info.get("universal") else "DeepSpeed ZeRO save"
        parts = [f"ZeRO-{info['zero_stage']}" if info.get("zero_stage") is not None else None,
                 info.get("optimizer"),
                 f"AutoTP over {info['autotp']['tp_size']} ranks" if isinstance(info.get("autotp"), dict) else None,
                 (f"pipeline of {info['pipeline_stages']} stage{'s' if info['pipeline_stages'] != 1 else ''}"
                  if info.get("pipeline_stages") else None),
                 f"tag {info['tag']}" if info.get("tag") else None]
        return f"{what} ({', '.join(p for p in parts if p)})" if any(parts) else what
    if fmt.startswith("verl") and name in VERL_ROLES and (m := _VERL.match(path.parent.name)):
        backend = {"verl_megatron": "Megatron", "verl_hf": "FSDP, HF model only"}.get(fmt, "FSDP")
        return f"verl {name} ({backend}, step {m.group(1)})"
    return _FORMAT_LAYOUTS.get(fmt, fmt) if fallback else None
