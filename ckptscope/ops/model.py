"""The model inside a checkpoint, kept apart from its training state: the one split every op uses.

``core.roles`` decides from names alone what each entry is for; this module applies it to an index:
the model's tensors under the names a mapping sees (wrapper stripped, stacked torch_dist tensors
per layer when asked), with the stored name behind each so reads go to the right bytes; the
training state grouped by kind; unknown entries listed. Inspect counts parameters from it, diff
compares what it calls the model, convert / merge export exactly its model and nothing else.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ckptscope.core.index import CheckpointIndex, bytes_by_dtype, count_elements, storage_aliases
from ckptscope.core.roles import (
    MODEL,
    PEFT_PREFIX,
    TRAINING_KINDS,
    UNKNOWN,
    Split,
    is_lora_tensor,
    peft_base_name,
    split_entries,
    strip_infix_wrappers,
)
from ckptscope.core.tensor import TensorMeta

if TYPE_CHECKING:  # the mappings package registers every architecture on import: inspect never needs it
    from ckptscope.mappings.links import Recipe


@dataclass
class ModelEntries:
    """One checkpoint split by role (see ``core.roles``)."""

    split: Split
    tensors: dict[str, TensorMeta]
    """Model tensors by model name (the name a mapping sees); ``meta.name`` is that name."""
    stored: dict[str, str]
    """Model name -> the name to read it by (stored name, or per-layer view name)."""
    training: dict[str, dict[str, TensorMeta]] = field(default_factory=dict)
    """Training-state kind -> stored name -> meta."""
    unknown: dict[str, TensorMeta] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return self.split.prefix

    @property
    def naming(self) -> str:
        return self.split.naming

    @property
    def num_params(self) -> int:
        """Parameters of the model as ``sum(p.numel() for p in model.parameters())`` counts them: a
        tensor stored twice on one storage (tied embeddings in a ``torch.save`` file) counts once, and
        entries that are never parameters (``_extra_state``, a saved ``inv_freq``) not at all."""
        return count_elements(parameter_tensors(self.unique_tensors()))

    @property
    def nbytes(self) -> int:
        return sum(bytes_by_dtype(self.unique_tensors(ties=False)).values())

    def unique_tensors(self, *, ties: bool = True) -> list[TensorMeta]:
        """The model's tensors, each storage (and, with ``ties``, each weight the config ties) once."""
        aliases = storage_aliases(self.tensors.values(), (self.stored[name] for name in self.tensors), ties=ties)
        if not aliases:  # no storage shared: every tensor counts
            return list(self.tensors.values())
        return [meta for name, meta in self.tensors.items() if self.stored[name] not in aliases]

    def training_tensors(self) -> dict[str, TensorMeta]:
        """Every training-state tensor by stored name (what ``diff --training-state`` adds)."""
        return {name: meta for group in self.training.values() for name, meta in group.items()}

    def to_stored(self, recipes: dict[str, Recipe]) -> dict[str, Recipe]:
        """Recipes over model names, rewritten to read the stored (or view) names."""
        from ckptscope.mappings.links import Piece, Recipe

        if all(self.stored.get(n, n) == n for n in self.stored):
            return recipes
        out = {}
        for name, recipe in recipes.items():
            pieces = [Piece(p.dst_box, self.stored.get(p.source, p.source), p.src_box) for p in recipe.pieces]
            padding = [(self.stored.get(src, src), box) for src, box in recipe.padding]
            out[name] = Recipe(recipe.name, recipe.shape, recipe.dtype, pieces, list(recipe.transforms),
                               padding=padding, fill=list(recipe.fill))
        return out

    def describe(self) -> dict[str, Any]:
        """The split as data (``inspect --json``, plans): prefix, naming, totals per role."""
        return {
            "prefix": self.prefix,
            "naming": self.naming,
            "model": _totals(self.unique_tensors(), self.unique_tensors(ties=False)),
            "training_state": {kind: _totals(group.values()) for kind, group in self.training.items()},
            "unknown": sorted(self.unknown),
        }


def parameter_tensors(metas: list[TensorMeta]) -> list[TensorMeta]:
    """``metas`` without the entries that are never parameters, by the mappings' one rule for them
    (``is_ignored``: a module's ``_extra_state``, also a dict's tensors under it, and a saved
    ``rotary_emb.inv_freq``; a probe counted 38 parameters for a module of 35). One C-level look at the
    names first, so the common checkpoint pays no per-name test."""
    joined = "\0".join(m.name for m in metas)
    if "_extra_state" not in joined and "inv_freq" not in joined:
        return metas
    from ckptscope.mappings.schemas import is_ignored  # here: the mappings package is no import of inspect's

    return [m for m in metas if not is_ignored(m.name)]


def _totals(metas, stored=None) -> dict[str, int]:
    """Count, elements and bytes of some tensors (bytes of ``stored`` when given: the same tensors with the
    config's tied copies, which have bytes of their own)."""
    metas = list(metas)
    stored = metas if stored is None else list(stored)
    return {"tensors": len(metas), "params": count_elements(parameter_tensors(metas)),
            "bytes": sum(bytes_by_dtype(stored).values())}


def _groups(index: CheckpointIndex) -> dict[str, str]:
    if not any(map(_attrs_of, index.tensors.values())):  # most checkpoints: one C-level pass
        return {}
    return {name: group for name, meta in index.tensors.items()
            if meta.attrs and (group := meta.attr("group")) is not None}


_attrs_of = operator.attrgetter("attrs")


def model_entries(index: CheckpointIndex, *, logical: bool = False) -> ModelEntries:
    """Split ``index``; with ``logical`` the model's stacked tensors appear as their per-layer views."""
    split = split_entries(index.tensors, _groups(index))
    tensors: dict[str, TensorMeta] = {}
    stored: dict[str, str] = {}
    if (not logical or not index.views) and len(split.stored) == len(index.tensors) and all(
            map(operator.is_, split.stored, split.stored.values())):  # every entry is the model, as stored
        tensors = dict(index.tensors)
        stored = dict(split.stored)
    elif not logical or not index.views:
        for model_name, name in split.stored.items():
            meta = index.tensors[name]
            tensors[model_name] = meta if model_name == name else replace(meta, name=model_name)
        stored = dict(split.stored)
    else:
        model_stored = set(split.stored.values())
        prefix = split.prefix
        for name, meta in index.logical_tensors().items():
            backing = index.views[name][0] if name in index.views and name not in index.tensors else name
            if backing not in model_stored:
                continue
            clean = strip_infix_wrappers(name)
            model_name = clean[len(prefix):] if clean.startswith(prefix) else clean
            tensors[model_name] = meta if meta.name == model_name else replace(meta, name=model_name)
            stored[model_name] = name
    training: dict[str, dict[str, TensorMeta]] = {}
    for kind in TRAINING_KINDS:
        for name in split.training.get(kind, ()):
            training.setdefault(kind, {})[name] = index.tensors[name]
    unknown = {name: index.tensors[name] for name in split.unknown}
    return ModelEntries(split, tensors, stored, training, unknown)


def is_peft_wrapped(names: list[str]) -> bool:
    """Every name under PEFT's ``base_model.model.``, some of them LoRA tensors and some not (an adapter
    alone, verl's ``save_lora_only`` or a saved adapter, has no base model)."""
    lora = sum(map(is_lora_tensor, names))
    return 0 < lora < len(names) and all(n.startswith(PEFT_PREFIX) for n in names)


def peft_unwrapped(entries: ModelEntries) -> tuple[ModelEntries, dict[str, str]] | None:
    """A PEFT-wrapped model as its base model under the model's own names (``base_model.model.`` and
    ``.base_layer`` dropped: what the base checkpoint, or verl's merger, calls each weight) and, apart, its
    LoRA tensors (model name -> stored name); None when ``entries`` is not PEFT-wrapped. A name that would
    land on another's keeps its wrapped name (the caller sees it as the odd one out)."""
    names = list(entries.tensors)
    if not is_peft_wrapped(names):
        return None
    tensors: dict[str, TensorMeta] = {}
    stored: dict[str, str] = {}
    adapter: dict[str, str] = {}
    for name in names:
        if is_lora_tensor(name):
            adapter[name] = entries.stored[name]
            continue
        plain = peft_base_name(name)
        if plain in tensors or plain in entries.tensors:
            plain = name
        tensors[plain] = entries.tensors[name] if plain == name else replace(entries.tensors[name], name=plain)
        stored[plain] = entries.stored[name]
    split = replace(entries.split, prefix=PEFT_PREFIX + entries.split.prefix, stored=dict(stored))
    return ModelEntries(split, tensors, stored, training=entries.training, unknown=entries.unknown), adapter


def role_totals(index: CheckpointIndex, entries: ModelEntries | None = None) -> dict[str, dict[str, int]]:
    """Tensors, parameters and bytes per role (``model``, each training kind, ``unknown``), for
    summaries (the TUI header, ``inspect``). ``entries``: the index's split, when the caller has it."""
    entries = entries or model_entries(index)
    out = {MODEL: _totals(entries.unique_tensors(), entries.unique_tensors(ties=False))}
    out.update({kind: _totals(group.values()) for kind, group in entries.training.items()})
    if entries.unknown:
        out[UNKNOWN] = _totals(entries.unknown.values())
    return out


def training_heads(index: CheckpointIndex, entries: ModelEntries) -> set[str]:
    """First name segments under which every tensor is training state (``optimizer``, Megatron's
    ``distrib_optim``, ``lr_scheduler`` ...): a tree lists them after the model, not sorted in among its
    modules (the TUI showed ``decoder``, ``distrib_optim``, ``embedding`` in that order)."""
    training = entries.training_tensors()
    if not training:
        return set()
    heads = {name.partition(".")[0] for name in training}
    return heads - {name.partition(".")[0] for name in index.tensors if name not in training}
