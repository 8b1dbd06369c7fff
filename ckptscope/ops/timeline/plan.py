"""What a timeline reads: the iterations of a save root, the model tensors every one of them holds,
the Adam second moments that belong to them, and the learning rate each save recorded.

Metadata only (no tensor bytes): every iteration is opened through the registry, split into model
and training state by ``ops.model`` (so a ``{"model": ...}`` DCP, a flattened torchtitan save and an
HF dir all give the same model names), and a tensor is followed when every chosen iteration has it
with the same shape and a float dtype; anything else is named in ``notes``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.core.index import TIED_BY_CONFIG, CheckpointIndex
from ckptscope.core.names import select
from ckptscope.core.roles import naming_family
from ckptscope.core.tensor import TensorMeta
from ckptscope.core.units import plural
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.registry import open_checkpoint
from ckptscope.mappings.schemas import is_ignored
from ckptscope.ops.model import ModelEntries, model_entries
from ckptscope.ops.roots import IterationInfo, discover_iterations, not_a_save_root, root_kind

SAMPLE_RUNS = 16
"""``--sample N`` takes its N rows as at most this many evenly spaced runs of consecutive rows: few
enough reads to stay fast, spread enough to see the whole tensor."""
DEFAULT_EPS = 1e-8
"""torch's Adam/AdamW default, used for the step size when no saved param group says otherwise."""
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)(?=\.|$)")
_LAST_LR = re.compile(r"(?:^|\.)_?last_lr(?:\.0)?$")
_GROUP_LR = re.compile(r"(?:^|\.)param_groups\..*\.lr$")
_GROUP_EPS = re.compile(r"(?:^|\.)param_groups\..*\.eps$")


def module_of(name: str) -> tuple[str, str | None]:
    """The module a tensor is reported under and its layer (None outside the repeated layers).

    Inside a layer the module is the layer's direct child (``model.layers.0.self_attn``,
    ``decoder.layers.0.mlp``), and its experts apart (``...mlp.experts``); outside, the tensor's
    owner (``model.embed_tokens``, ``lm_head``, ``model.norm``).
    """
    match = _LAYER.search(name)
    if match is None:
        return (name.rsplit(".", 1)[0] if "." in name else name), None
    layer = name[: match.end()].lstrip(".")
    rest = name[match.end():].lstrip(".").split(".")
    if len(rest) <= 1:
        return layer, layer
    module = f"{layer}.{rest[0]}"
    if "experts" in rest[1:-1]:
        module = f"{layer}.{'.'.join(rest[: rest.index('experts') + 1])}"
    return module, layer


@dataclass(frozen=True)
class TimelineTensor:
    """One model tensor followed through every iteration."""

    name: str
    """Model name (wrapper prefix stripped, as ``ops.model`` names it)."""
    shape: tuple[int, ...]
    dtype: str
    stored: tuple[str, ...]
    """The name to read it by, per iteration (in ``TimelinePlan.iterations`` order)."""
    module: str
    layer: str | None
    rows: tuple[tuple[int, int], ...] | None = None
    """``--sample``: the row ranges read (first axis); None reads everything."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class OptimizerTensor:
    """The Adam ``exp_avg_sq`` of one parameter, per iteration (None where a save lacks it)."""

    param: str
    stored: tuple[str | None, ...]
    shape: tuple[int, ...]
    module: str
    layer: str | None
    rows: tuple[tuple[int, int], ...] | None = None
    offsets: tuple[int | None, ...] | None = None
    """Flat state (Megatron's distributed optimizer): ``stored`` is a 1-D buffer, the parameter's
    elements start at this offset in it per iteration, and ``shape`` / ``rows`` are flat."""


@dataclass
class TimelinePlan:
    root: str
    kind: str
    """Root kind (``megatron``, ``torchtitan``, ``hf-trainer``, ``verl``)."""
    iterations: list[IterationInfo]
    """Oldest first."""
    readers: list[CheckpointReader]
    tensors: list[TimelineTensor]
    optimizer: list[OptimizerTensor] = field(default_factory=list)
    lr: list[float | None] = field(default_factory=list)
    """The learning rate each save recorded for its next step (scheduler ``_last_lr``), per iteration."""
    eps: float = DEFAULT_EPS
    sample: int | None = None
    notes: list[str] = field(default_factory=list)
    optimizer_note: str | None = None
    """Why no Adam statistics are computed (None when some are)."""
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    optimizer_readers: list[CheckpointReader | None] = field(default_factory=list)
    """Per iteration, where ``OptimizerTensor.stored`` is read when the Adam state is in a file of its
    own (HF Trainer ``optimizer.pt``); empty, or None for an iteration: from ``readers``."""

    @property
    def labels(self) -> list[int]:
        return [int(i.iteration) for i in self.iterations]

    def optimizer_reader(self, i: int) -> CheckpointReader:
        """The reader that holds iteration ``i``'s Adam state."""
        side = self.optimizer_readers[i] if i < len(self.optimizer_readers) else None
        return side if side is not None else self.readers[i]

    def all_readers(self) -> list[CheckpointReader]:
        return self.readers + [r for r in self.optimizer_readers if r is not None]

    def close(self) -> None:
        for reader in self.all_readers():
            reader.close()


def parse_range(text: str | None) -> tuple[int | None, int | None]:
    """``--iterations 1000:5000`` (inclusive; either side may be left out), or one number."""
    if text is None or text.strip() in ("", ":"):
        return None, None
    lo, sep, hi = text.strip().partition(":")
    try:
        first = int(lo) if lo.strip() else None
        last = (int(hi) if hi.strip() else None) if sep else first
    except ValueError:
        raise CkptError(f"--iterations must look like 1000:5000 (either side optional), not {text!r}") from None
    if first is not None and last is not None and first > last:
        raise CkptError(f"--iterations {text}: the first iteration is after the last")
    return first, last


def _choose(root: Path, found: list[IterationInfo] | None, lo: int | None, hi: int | None,
            notes: list[str]) -> list[IterationInfo]:
    if found is None:
        raise CkptError(not_a_save_root(root), root)
    numbered = sorted((i for i in found if i.number is not None), key=lambda i: i.number or 0)
    named = [i.label for i in found if i.number is None]  # release, final, a DeepSpeed tag of the user's own
    chosen = [i for i in numbered if (lo is None or i.iteration >= lo) and (hi is None or i.iteration <= hi)]
    incomplete = [i for i in chosen if not i.complete]
    if incomplete:
        notes.append(f"skipped {plural(len(incomplete), 'incomplete iteration')}: "
                     f"{', '.join(i.label for i in incomplete)}")
    chosen = [i for i in chosen if i.complete]
    if len(chosen) < 2:
        complete = [i.label for i in numbered if i.complete]
        have = f"the only complete one is iteration {complete[0]}" if len(complete) == 1 else \
            f"complete iterations: {', '.join(complete)}" if complete else "none is complete"
        if named:
            have += f" ({', '.join(named)} {'has' if len(named) == 1 else 'have'} no step number to order by)"
        raise CkptError(f"a timeline needs at least 2 complete iterations in range; {have}", root)
    return chosen


def _sample_rows(shape: tuple[int, ...], rows: int | None) -> tuple[tuple[int, int], ...] | None:
    """At most ``rows`` rows of the first axis, as evenly spaced runs (deterministic)."""
    if rows is None or not shape or shape[0] <= rows:
        return None
    runs = min(SAMPLE_RUNS, rows)
    length, extra = divmod(rows, runs)
    out = []
    for k in range(runs):
        size = length + (1 if k < extra else 0)
        start = (k * (shape[0] - size)) // max(1, runs - 1) if runs > 1 else 0
        out.append((start, start + size))
    return tuple(out)


def _optimizer_param(name: str, moment: str, params: set[str], stored_to_model: dict[str, str]) -> str | None:
    """The parameter an optimizer entry belongs to, if its name says so: ``optimizer.state.<param>.exp_avg_sq``
    (torch ``get_optimizer_state_dict``), ``optimizer.state.exp_avg_sq.<param>`` (Megatron), any
    wrapper in front. Position-indexed state (``state.12.exp_avg_sq``) names no parameter: None."""
    parts = name.split(".")
    if moment not in parts:
        return None
    at = parts.index(moment)
    for rest in (parts[:at], parts[at + 1:]):
        for start in range(len(rest)):
            candidate = ".".join(rest[start:])
            if candidate in params:
                return candidate
            if candidate in stored_to_model:
                return stored_to_model[candidate]
    return None


def _scalars(reader: CheckpointReader, pattern: re.Pattern) -> list[Any]:
    out = []
    for obj in reader.index().objects:
        if pattern.search(obj.name):
            value = obj.value[0] if isinstance(obj.value, list) and obj.value else obj.value
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out.append(float(value))
    return out


def _param_group_lists(value: Any, depth: int = 0) -> list[list]:
    """Every ``param_groups`` list of dicts inside a rendered object, a few levels deep (Megatron keeps
    them at ``optimizer.optimizer.param_groups`` or in a per-DP-group object's list)."""
    if depth > 4:
        return []
    out = []
    if isinstance(value, dict):
        groups = value.get("param_groups")
        if isinstance(groups, list) and groups and all(isinstance(g, dict) for g in groups):
            out.append(groups)
        for key, item in value.items():
            if key != "param_groups":
                out += _param_group_lists(item, depth + 1)
    elif isinstance(value, list):
        for item in value[:8]:
            out += _param_group_lists(item, depth + 1)
    return out


def _group_scalars(reader: CheckpointReader, key: str) -> list[float]:
    """``key`` (``lr``, ``eps``) of every optimizer param group: flattened objects
    (``...param_groups.0.lr``) or ``param_groups`` lists of dicts (DeepSpeed's
    ``optimizer.base_optimizer_state.param_groups``, a torch ``optimizer.state_dict()``, Megatron's
    optimizer objects)."""
    out = _scalars(reader, _GROUP_LR if key == "lr" else _GROUP_EPS)
    for obj in reader.index().objects:
        value = {"param_groups": obj.value} if obj.name.rsplit(".", 1)[-1] == "param_groups" else obj.value
        for groups in _param_group_lists(value):
            out += [float(g[key]) for g in groups
                    if isinstance(g.get(key), (int, float)) and not isinstance(g.get(key), bool)]
    return out


SCHEDULER_FILES = ("scheduler.pt", "scheduler.bin")
"""Where HF Trainer (``scheduler.pt``) and accelerate (``scheduler.bin``) keep ``lr_scheduler.state_dict()``
beside the model: a separate torch.save file the model's reader does not index."""


def _last_lr_in(value: Any) -> float | None:
    """``_last_lr`` (first group) anywhere in a rendered object (a scheduler state dict)."""
    if isinstance(value, dict):
        for key in ("_last_lr", "last_lr"):
            found = value.get(key)
            if isinstance(found, list) and found and isinstance(found[0], (int, float)):
                return float(found[0])
        for item in value.values():
            found = _last_lr_in(item)
            if found is not None:
                return found
    return None


def _scheduler_file_lr(directory: Path) -> float | None:
    for name in SCHEDULER_FILES:
        path = directory / name
        if not path.is_file():
            continue
        try:
            with open_checkpoint(path) as reader:  # the safe stub unpickler, never torch.load
                for obj in reader.index().objects:
                    found = _last_lr_in({obj.name: obj.value})
                    if found is not None:
                        return found
        except CkptError:
            continue
    return None


def _saved_lr(reader: CheckpointReader, directory: Path) -> float | None:
    """The LR the save recorded for its next step: the scheduler's ``_last_lr`` (first group), in the
    checkpoint (flattened, or in a scheduler state dict object) or in a ``scheduler.pt`` beside it,
    else the optimizer's param-group LR when every group agrees."""
    values = _scalars(reader, _LAST_LR)
    if values:
        return values[0]
    for obj in reader.index().objects:  # a scheduler state dict kept whole (verl's extra_state.lr_scheduler)
        last = obj.value.get("_last_lr") if isinstance(obj.value, dict) else None
        if obj.name.rsplit(".", 1)[-1] in ("lr_scheduler", "scheduler") and isinstance(last, list) and last \
                and isinstance(last[0], (int, float)) and not isinstance(last[0], bool):
            return float(last[0])
    found = _scheduler_file_lr(directory)
    if found is None and directory.name == "pytorch_model_fsdp_0":  # a save_state dir: its files are one level up
        found = _scheduler_file_lr(directory.parent)
    if found is not None:
        return found
    groups = set(_group_scalars(reader, "lr"))
    return groups.pop() if len(groups) == 1 else None


def _optimizer_candidates(entry: ModelEntries, reader: CheckpointReader) -> dict[str, Any]:
    """The optimizer tensors of a save, plus the per-layer views of stacked ones (Megatron torch_dist
    keeps ``optimizer.state.exp_avg_sq.decoder.layers.<x>`` with a leading layer axis, as its model)."""
    out = dict(entry.training.get("optimizer", {}))
    index = reader.index()
    if index.views:
        logical = index.logical_tensors()
        for view, (backing, _layer) in index.views.items():
            if backing in out and view in logical:
                out[view] = logical[view]
    return out


def _plan_optimizer(entries: list[ModelEntries], tensors: list[TimelineTensor], readers: list[CheckpointReader],
                    labels: list[str]) -> tuple[list[OptimizerTensor], str | None, list[str]]:
    by_param: dict[str, list[str | None]] = {}
    wanted = {t.name: t for t in tensors}
    any_moments = False
    orphans: list[str] = []
    """exp_avg_sq of no model tensor: torchtitan 0.3 keeps Adam state on the fused ``qkv_linear.wqkv``
    its model saves as ``wq`` / ``wk`` / ``wv`` (a probe); the module's statistics then leave it out."""
    for i, entry in enumerate(entries):
        stored_to_model = {s: m for m, s in entry.stored.items()}
        model_names = set(entry.tensors)
        viewed = {backing for backing, _layer in readers[i].index().views.values()}
        """Stacked Megatron entries whose per-layer views are candidates too: not orphans (a probe with
        verl's Megatron saves was told their statistics were left out while the table had them)."""
        for name, meta in _optimizer_candidates(entry, readers[i]).items():
            if "exp_avg_sq" not in name.split(".") or not meta.dtype_info.is_float:
                continue
            any_moments = True
            param = _optimizer_param(name, "exp_avg_sq", model_names, stored_to_model)
            if param is None or param not in model_names:
                if i == 0 and name not in viewed:
                    orphans.append(name)
                continue
            if param not in wanted or tuple(meta.shape) != wanted[param].shape:
                continue
            by_param.setdefault(param, [None] * len(entries))[i] = name
    if not any_moments:
        return [], "no Adam exp_avg_sq saved in these iterations", []
    if not by_param:
        return [], "the saved exp_avg_sq entries name no parameter of the model: no per-layer Adam statistics", []
    notes = _check_named_masters(by_param, entries, readers, wanted, labels)
    if orphans:
        notes.append(f"{plural(len(orphans), 'saved exp_avg_sq names', 'saved exp_avg_sq entries name')} no tensor "
                     f"of the model (first: {orphans[0]}); the Adam statistics of their modules leave them out")
    by_param = {p: stored for p, stored in by_param.items() if any(s is not None for s in stored)}
    if not by_param:
        return [], "no saved exp_avg_sq belongs to its parameter's weights: no per-layer Adam statistics", notes
    return _optimizer_tensors(by_param, wanted), None, notes


_MASTERS = ("param", "fp32_param")
"""Megatron's names for the fp32 master beside a parameter's moments (``optimizer.state.<this>.<key>``)."""


def _check_named_masters(by_param: dict[str, list[str | None]], entries: list[ModelEntries],
                         readers: list[CheckpointReader], wanted: dict[str, TimelineTensor],
                         labels: list[str]) -> list[str]:
    """Where the save keeps the fp32 master beside a parameter's named moments (Megatron), the master
    must be that parameter's weights: megatron-core 0.16.1's ``fully_reshardable`` save of a
    distributed optimizer with several grad buckets stores every later bucket's state shifted by
    the bucket padding (it warns "param range exceeds unpadded buffer"), under the right names but
    with another parameter's numbers. Such entries are dropped (set to None) and named in a note."""
    from ckptscope.ops.timeline.optim_megatron import master_is_weights

    dropped: dict[str, list[str]] = {}
    candidates: list[dict | None] = [None] * len(entries)
    for param, stored in by_param.items():
        for i, name in enumerate(stored):
            if name is None:
                continue
            if candidates[i] is None:
                candidates[i] = _optimizer_candidates(entries[i], readers[i])
            for master in _MASTERS:
                sibling = ".".join(master if part == "exp_avg_sq" else part for part in name.split("."))
                if sibling != name and sibling in candidates[i]:
                    if not master_is_weights(readers[i], sibling, entries[i].stored[param], wanted[param].dtype):
                        stored[i] = None
                        dropped.setdefault(labels[i], []).append(param)
                    break
    return [f"no Adam statistics at iteration {label} for {plural(len(params), 'tensor')} whose saved fp32 master "
            f"is not its weights (the optimizer state is another parameter's; megatron-core's fully_reshardable "
            f"save with several grad buckets does this): {', '.join(params)}" for label, params in dropped.items()]


@dataclass
class _SideOptimizer:
    """Adam state whose names come from elsewhere than its own keys: HF Trainer's positional
    ``optimizer.pt`` beside each save (``readers``: that file per iteration), Megatron's flat
    distributed-optimizer buffers (read from the save's own reader)."""

    tensors: list[OptimizerTensor]
    readers: list[CheckpointReader | None]
    eps: float | None
    note: str | None
    notes: list[str]


def _close_all(readers: list[CheckpointReader | None]) -> None:
    """Close the optimizer-state readers a side plan opened (on failure, or when it names nothing)."""
    for reader in readers:
        if reader is not None:
            reader.close()


def _unnamed_notes(reasons: dict[str, list[str]]) -> list[str]:
    """One note per reason, naming the iterations it left without Adam statistics."""
    return [f"no Adam statistics for iteration{'s' if len(labels) > 1 else ''} {', '.join(labels)}: {why}"
            for why, labels in reasons.items()]


def _plan_flat_optimizer(chosen: list[IterationInfo], entries: list[ModelEntries], tensors: list[TimelineTensor],
                         readers: list[CheckpointReader]) -> _SideOptimizer | None:
    """Megatron's distributed optimizer (flat buckets, ``optim_megatron``), per iteration; None when no
    iteration has such buffers."""
    from ckptscope.ops.timeline.optim_megatron import flat_buffers, name_flat_state

    found = [flat_buffers(r) for r in readers]
    if not any(buffers or why for buffers, why in found):
        return None
    wanted = {t.name: t for t in tensors}
    places: dict[str, list[tuple[str, int] | None]] = {}
    reasons: dict[str, list[str]] = {}
    ambiguous: set[str] = set()
    stitched: list[CheckpointReader | None] = [None] * len(chosen)  # TP shards read as global tensors
    for i, (info, entry, reader, (buffers, why)) in enumerate(zip(chosen, entries, readers, found)):
        names = None
        if why is None and buffers:
            model = {n: (entry.stored[n], meta) for n, meta in entry.tensors.items()}
            names, why = name_flat_state(reader, model, buffers)
        if names is None:
            reasons.setdefault(why or "no distributed-optimizer buffers", []).append(info.label)
            continue
        ambiguous.update(names.ambiguous)
        stitched[i] = names.reader
        if names.unassembled:
            reasons.setdefault(names.unassembled_note(), []).append(info.label)
        for skipped in names.skipped:
            reasons.setdefault(f"for the tensors of one of its flat buffers: {skipped}", []).append(info.label)
        for param, (buffer, start, _numel) in names.place.items():
            if param in wanted:
                places.setdefault(param, [None] * len(chosen))[i] = (buffer, start)
    notes = _unnamed_notes(reasons)
    if ambiguous:
        notes.append(f"no Adam statistics for tensors with identical weights, not told apart in the flat "
                     f"optimizer buffers: {', '.join(sorted(ambiguous))}")
    if not places:
        first = next(iter(reasons), "no followed tensor in them")
        return _SideOptimizer([], [], None, f"distributed-optimizer buffers: {first}: no per-layer Adam statistics",
                              notes[1:] if reasons else notes)
    notes.append("Adam state of the distributed optimizer's flat buffers named by matching its fp32 masters "
                 "to the model's weights")
    out = []
    for param, where in places.items():
        t = wanted[param]
        row = t.numel // t.shape[0] if t.shape and t.shape[0] else 1
        rows = tuple((lo * row, hi * row) for lo, hi in t.rows) if t.rows else None
        out.append(OptimizerTensor(param, tuple(w[0] if w else None for w in where), (t.numel,), t.module, t.layer,
                                   rows, tuple(w[1] if w else None for w in where)))
    return _SideOptimizer(out, stitched, None, None, notes)


def _optimizer_tensors(by_param: dict[str, list[str | None]],
                       wanted: dict[str, TimelineTensor]) -> list[OptimizerTensor]:
    out = []
    for param, stored in by_param.items():
        t = wanted[param]
        out.append(OptimizerTensor(param, tuple(stored), t.shape, t.module, t.layer, t.rows))
    return out


def _parameters_order(index: CheckpointIndex) -> list[tuple[str, TensorMeta]]:
    """The state dict's tensors as ``model.parameters()`` yields them: a pair the config ties is one
    parameter, yielded where it comes first (a tied Qwen2 under verl had 26 positions for 27 tensors and
    lost its Adam statistics; a probe with verl 0.9.1)."""
    out, tied_seen = [], set()
    for name, meta in index.tensors.items():
        partner = meta.attr(TIED_BY_CONFIG)
        if partner is not None:
            if partner in tied_seen:
                continue
            tied_seen.add(name)
        out.append((name, meta))
    return out


def _plan_side_optimizer(chosen: list[IterationInfo], entries: list[ModelEntries], tensors: list[TimelineTensor],
                         readers: list[CheckpointReader]) -> _SideOptimizer | None:
    """Adam state numbered by parameter position in files of its own, per iteration: HF Trainer's
    ``optimizer.pt`` (``optim_hf``) or verl FSDP's ``optim_world_size_*_rank_*.pt`` (``optim_verl``);
    None when no iteration has either. An iteration whose positions cannot be named is left out,
    and the notes say why."""
    from ckptscope.ops.timeline.optim_hf import OPTIMIZER_FILE, hf_trainer_state
    from ckptscope.ops.timeline.optim_verl import OPTIMIZER_FILES, has_verl_optimizer, verl_fsdp_state

    hf = [(Path(info.path) / OPTIMIZER_FILE).is_file() for info in chosen]
    verl = [not h and has_verl_optimizer(info.path) for info, h in zip(chosen, hf)]
    if not any(hf) and not any(verl):
        return None
    label = OPTIMIZER_FILE if any(hf) else OPTIMIZER_FILES
    wanted = {t.name: t for t in tensors}
    by_param: dict[str, list[str | None]] = {}
    opened: list[CheckpointReader | None] = []
    reasons: dict[str, list[str]] = {}
    eps_values, groupings = set(), set()
    try:
        for i, (info, entry, reader) in enumerate(zip(chosen, entries, readers)):
            if verl[i]:
                model_name = {stored: name for name, stored in entry.stored.items()}
                order = [(model_name.get(n, n), tuple(m.shape)) for n, m in _parameters_order(reader.index())]
                state, why = verl_fsdp_state(info.path, order)
            else:
                state, why = hf_trainer_state(info.path, {n: tuple(m.shape) for n, m in entry.tensors.items()})
            opened.append(state.reader if state else None)
            if state is None:
                reasons.setdefault(why, []).append(info.label)
                continue
            groupings.add(state.grouping)
            if state.eps is not None:
                eps_values.add(state.eps)
            for param, key in state.stored.items():
                if param in wanted:
                    by_param.setdefault(param, [None] * len(chosen))[i] = key
    except BaseException:
        _close_all(opened)
        raise
    notes = _unnamed_notes(reasons)
    if not by_param:
        _close_all(opened)
        first = next(iter(reasons), "no exp_avg_sq of a followed tensor")
        return _SideOptimizer([], [], None, f"{label}: {first}: no per-layer Adam statistics", notes[1:])
    notes.append(f"Adam state of {label} named by position ({', '.join(sorted(groupings))}), every "
                 "exp_avg_sq checked against its parameter's shape")
    eps = eps_values.pop() if len(eps_values) == 1 else None
    return _SideOptimizer(_optimizer_tensors(by_param, wanted), opened, eps, None, notes)


ACCELERATE_OPTIMIZER = "optimizer_0"


def _plan_save_state_optimizer(chosen: list[IterationInfo], entries: list[ModelEntries],
                               tensors: list[TimelineTensor]) -> _SideOptimizer | None:
    """accelerate's ``save_state`` under FSDP (accelerate's own roots, the Trainer under FSDP): each save's model
    is ``pytorch_model_fsdp_0/`` and its Adam state the DCP dir ``optimizer_0/`` beside it, keyed by the
    parameter's name (``optimizer.state.<name>.exp_avg_sq``, ``get_optimizer_state_dict``'s FQNs). A probe
    found the timeline saying "no Adam exp_avg_sq saved" for both. None when no iteration has that dir."""
    from ckptscope.formats.registry import open_checkpoint

    dirs = [Path(info.path).parent / ACCELERATE_OPTIMIZER if Path(info.path).name == "pytorch_model_fsdp_0" else None
            for info in chosen]
    if not any(d is not None and d.is_dir() for d in dirs):
        return None
    wanted = {t.name: t for t in tensors}
    by_param: dict[str, list[str | None]] = {}
    opened: list[CheckpointReader | None] = []
    reasons: dict[str, list[str]] = {}
    try:
        for i, (info, directory) in enumerate(zip(chosen, dirs)):
            if directory is None or not directory.is_dir():
                opened.append(None)
                reasons.setdefault(f"no {ACCELERATE_OPTIMIZER}/ beside the model", []).append(info.label)
                continue
            reader = open_checkpoint(directory)
            opened.append(reader)
            names = reader.index().tensors
            found = 0
            for param, t in wanted.items():
                key = f"optimizer.state.{param}.exp_avg_sq"
                if key in names and tuple(names[key].shape) == tuple(t.shape):
                    by_param.setdefault(param, [None] * len(chosen))[i] = key
                    found += 1
            if not found:
                reasons.setdefault(f"{ACCELERATE_OPTIMIZER}/ holds no exp_avg_sq under the model's names",
                                   []).append(info.label)
    except BaseException:
        _close_all(opened)
        raise
    notes = _unnamed_notes(reasons)
    if not by_param:
        _close_all(opened)
        return _SideOptimizer([], [], None, f"{ACCELERATE_OPTIMIZER}/: no per-layer Adam statistics", notes)
    notes.append(f"Adam state of {ACCELERATE_OPTIMIZER}/ (accelerate's FSDP optimizer save) named by parameter, "
                 "every exp_avg_sq checked against its parameter's shape")
    eps = next((v for r in opened if r is not None for v in _group_scalars(r, "eps")), None)
    return _SideOptimizer(_optimizer_tensors(by_param, wanted), opened, eps, None, notes)


def _naming_change(entries: list[ModelEntries], chosen: list[IterationInfo]) -> str:
    """Which chosen iterations name their tensors how, when the namings differ: torchtitan's last save
    in HF names (``last_save_in_hf``) after DCP saves in its own (a probe), or a root holding saves
    before and after a conversion; and the longest run of one naming to follow instead. Empty when
    every iteration names its tensors alike."""
    families = [naming_family(e.tensors) for e in entries]
    if len(set(families)) < 2:
        return ""
    runs: list[tuple[str, list[str]]] = []
    for family, info in zip(families, chosen):
        if runs and runs[-1][0] == family:
            runs[-1][1].append(info.label)
        else:
            runs.append((family, [info.label]))
    said = "; ".join(f"{_span(labels)} {'has' if len(labels) == 1 else 'have'} {family} names" for family, labels in runs)
    family, longest = max(runs, key=lambda run: len(run[1]))
    if len(longest) < 2:
        return said
    return f"{said}; --iterations {longest[0]}:{longest[-1]} follows the {family}-named ones"


def _span(labels: list[str]) -> str:
    return f"iteration {labels[0]}" if len(labels) == 1 else f"iterations {labels[0]} to {labels[-1]}"


def build_timeline_plan(root: str | Path, *, iterations: str | tuple[int | None, int | None] | None = None,
                        include: tuple[str, ...] = (), exclude: tuple[str, ...] = (), sample: int | None = None,
                        optimizer: bool = True, trust_pickle: bool = False) -> TimelinePlan:
    """Open every complete iteration of ``root`` in range (metadata only) and decide what to read.

    ``iterations``: ``"1000:5000"`` or ``(1000, 5000)``, inclusive. ``include`` / ``exclude``: globs
    over model tensor names, as ``inspect`` and ``diff`` take them. ``sample``: read at most this
    many rows (first axis) of each tensor. Raises ``CkptError`` for anything that is not a save root
    with two complete iterations in range.
    """
    root = Path(root)
    if sample is not None and sample < 1:
        raise CkptError("--sample must be a positive number of rows")
    lo, hi = parse_range(iterations) if not isinstance(iterations, tuple) else iterations
    notes: list[str] = []
    found = discover_iterations(root)
    chosen = _choose(root, found, lo, hi, notes)
    kind = root_kind(found or [])
    readers: list[CheckpointReader] = []
    opt_readers: list[CheckpointReader | None] = []
    try:
        readable = []
        for info in chosen:
            reader = None
            try:
                reader = open_checkpoint(info.path, trust_pickle=trust_pickle)
                index = reader.index()
                if index.issues and not model_entries(index).tensors:
                    # its model tree cut short: said so, not taken for a save "named differently" (a probe)
                    issue = index.issues[0]
                    raise CkptError(f"no model tensor can be read: {issue.file + ': ' if issue.file else ''}"
                                    f"{issue.detail}")
            except CkptError as exc:  # a save cut short past the tracker stopped the whole timeline (a probe)
                if reader is not None:
                    reader.close()
                notes.append(f"iteration {info.label} left out: it cannot be read ({exc})")
                continue
            readers.append(reader)
            readable.append(info)
        if len(readable) < 2:
            raise CkptError(f"{plural(len(readable), 'iteration')} of the chosen ones can be read; a timeline needs two"
                            + (f" ({notes[-1]})" if notes else ""), root)
        chosen = readable
        entries = [model_entries(r.index(), logical=True) for r in readers]
        first = entries[0]
        names = select([n for n in first.tensors if not is_ignored(n)], include, exclude)
        if not names:
            raise CkptError("no model tensors left to follow (check --include / --exclude)", root)
        tensors, missing, non_float = [], [], []
        for name in names:
            meta = first.tensors[name]
            if not meta.dtype_info.is_float:
                non_float.append(name)
                continue
            same = all(name in e.tensors and e.tensors[name].shape == meta.shape for e in entries)
            if not same:
                missing.append(name)
                continue
            module, layer = module_of(name)
            tensors.append(TimelineTensor(name, tuple(meta.shape), meta.dtype, tuple(e.stored[name] for e in entries),
                                          module, layer, _sample_rows(tuple(meta.shape), sample)))
        if missing:
            notes.append(f"{plural(len(missing), 'tensor')} not in every iteration with one shape, not followed "
                         f"(first: {missing[0]})")
        if non_float:
            notes.append(f"{plural(len(non_float), 'non-float tensor')} not followed (first: {non_float[0]})")
        later = set().union(*(set(e.tensors) for e in entries[1:])) - set(first.tensors)
        later = [n for n in select(sorted(later), include, exclude) if not is_ignored(n)]
        if later:
            notes.append(f"{plural(len(later), 'tensor')} appear after iteration {chosen[0].label}, not followed "
                         f"(first: {later[0]})")
        change = _naming_change(entries, chosen)
        if change:  # a name both namings share (lm_head.weight) is no timeline of the model
            raise CkptError(f"the chosen iterations name their tensors differently: {change}", root)
        if not tensors:
            raise CkptError("no float model tensor is in every chosen iteration", root)
        opt, opt_note, opt_notes = (_plan_optimizer(entries, tensors, readers, [i.label for i in chosen])
                                    if optimizer else ([], "optimizer statistics not asked for", []))
        notes += opt_notes
        side = _plan_side_optimizer(chosen, entries, tensors, readers) if optimizer and not opt else None
        if optimizer and not opt and side is None:
            side = _plan_save_state_optimizer(chosen, entries, tensors)
        if optimizer and not opt and side is None:
            side = _plan_flat_optimizer(chosen, entries, tensors, readers)
        eps_values = [v for r in readers for v in _group_scalars(r, "eps")]
        if side is not None:
            opt, opt_note, opt_readers = side.tensors, side.note, side.readers
            notes += side.notes
            eps_values = [side.eps] if side.eps is not None else eps_values
        lrs = [_saved_lr(r, Path(info.path)) for r, info in zip(readers, chosen)]
        eps = eps_values[0] if eps_values else DEFAULT_EPS
        if opt and not eps_values:
            notes.append(f"no Adam eps saved: step sizes use {DEFAULT_EPS:g}")
        if opt and not any(v is not None for v in lrs):
            notes.append("no learning rate saved (scheduler _last_lr or param-group lr): step sizes left out")
        if sample is not None:
            notes.append(f"sampled: at most {plural(sample, 'row')} (first axis) of each tensor, in up to "
                         f"{SAMPLE_RUNS} evenly spaced runs; norms and changes are of the sampled rows only")
    except BaseException:
        for reader in readers + [r for r in opt_readers if r is not None]:
            reader.close()
        raise
    return TimelinePlan(str(root), kind, chosen, readers, tensors, opt, lrs, eps, sample, notes, opt_note,
                        tuple(include), tuple(exclude), opt_readers)
