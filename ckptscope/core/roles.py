"""What each entry of a checkpoint is for: the model's weights, or training state of a named kind.

Trainers save the model beside everything else they need to resume: optimizer moments and master
weights, the LR scheduler, RNG states, the dataloader position, step counters, their arguments.
They also wrap the model: ``{"model": ..., "optim": ...}`` (accelerate, plain DCP saves),
``module.`` (DDP), ``_orig_mod.`` (torch.compile), ``_fsdp_wrapped_module.`` (FSDP1), Megatron's
``model`` key. A tool that exports "the tensors in the file" exports optimizer moments and doubled
prefixes into a model that then loads wrong or not at all. So every op first splits a checkpoint
into its model (under whatever wrapper holds it, with the wrapper stripped) and its training state,
by one rule, here; anything that is neither is *unknown* and is reported, never exported.

The rule works on names only (no bytes, no torch), so inspect, the TUI header, diff and convert
all see the same split:

* an entry whose first name component (after Megatron's ``chained_N.``) is a known training-state
  root (``optimizer``, ``lr_scheduler``, ``rng_state``, ``train_state``, ...) is training state of
  that kind; readers may also tag tensors (``group=optimizer``) when they know better;
* the rest are model candidates. The model prefix is found by peeling wrapper components
  (``model.``, ``module.``, ...) off until the names are a naming family we know (HF transformers,
  Megatron-Core, torchtitan); a wrapper is peeled only when that makes the names recognisable, so
  an HF checkpoint whose every key starts with ``model.`` (tied embeddings) keeps its ``model.``;
* wrappers that never belong to a model's own names (``_fsdp_wrapped_module``, ``_orig_mod``,
  ``_checkpoint_wrapped_module``) are dropped wherever they stand;
* candidates outside the model prefix, or outside a recognised naming when one was found, are
  unknown (an ``ema.`` copy, a stray tensor).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter, methodcaller

MODEL = "model"
UNKNOWN = "unknown"
TRAINING_KINDS = ("optimizer", "lr_scheduler", "rng", "dataloader", "train_state", "args", "iteration")
"""Kinds of training state, in the order views list them."""

_TRAINING_ROOTS: dict[str, str] = {
    **dict.fromkeys(("optimizer", "optimizers", "optim", "optim_state", "optimizer_state", "optimizer_states",
                     "optimizer_state_dict", "optim_state_dict", "distrib_optim", "fp32_from_fp16_params",
                     "fp32_params", "master_params", "grad_scaler", "scaler",
                     "lp_params"), "optimizer"),  # (the DeepSpeed reader's name for the module's bf16 copies)
    **dict.fromkeys(("lr_scheduler", "lr_schedulers", "scheduler", "schedulers", "opt_param_scheduler"),
                    "lr_scheduler"),
    **dict.fromkeys(("rng_state", "rng_states", "rng", "random_rng_state", "np_rng_state", "torch_rng_state",
                     "cuda_rng_state", "rng_tracker_states", "random_states"), "rng"),
    **dict.fromkeys(("dataloader", "data_loader", "dataloaders", "sampler", "data_sampler"), "dataloader"),
    **dict.fromkeys(("train_state", "trainer_state", "num_floating_point_operations_so_far", "consumed_samples",
                     "consumed_train_samples", "consumed_valid_samples", "global_step", "step", "epoch",
                     "checkpoint_version", "ntokens_seen", "log_steps",
                     # Lightning's callback states and fit loops; nanoGPT's iteration and best loss
                     "callbacks", "loops", "iter_num", "best_val_loss"), "train_state"),
    **dict.fromkeys(("args", "config", "training_args", "run_config", "nemo_model", "hyper_parameters", "hparams"),
                    "args"),
    **dict.fromkeys(("iteration",), "iteration"),
}
_CHAINED = re.compile(r"chained_\d+\Z")

PEELABLE_WRAPPERS = re.compile(r"(model\d*|module|models|state_dict|model_state_dict|model_state|net|network)\Z")
"""First components that may wrap a whole model (``{"model": sd}``, DDP ``module``, Megatron VPP
``model0``); peeled only when what is under them is a naming family we know."""
INFIX_WRAPPERS = ("_fsdp_wrapped_module.", "_orig_mod.", "_checkpoint_wrapped_module.")
"""Wrapper module names that are never part of a model's own parameter names, wherever they stand."""

_FAMILIES = (
    # A layer entry must name a module inside the layer (model.layers.0.mlp.up_proj.weight), so a
    # toy model's model.layers.0.weight is not taken for transformers' naming.
    ("mcore", re.compile(r"decoder\.(layers\.(\d+\.)?[A-Za-z_]+\.|final_(layer)?norm\.)|embedding\.word_embeddings\.|"
                         r"embedding\.position_embeddings\.|output_layer\.|mtp\.")),
    ("hf", re.compile(r"model\.(layers\.\d+\.[A-Za-z_]+\.|embed_tokens\.|norm\.|rotary_emb\.|language_model\.)|"
                      r"lm_head\.")),
    ("gguf", re.compile(r"token_embd\.|output(_norm)?\.weight\Z|blk\.\d+\.[a-z_]+\.")),  # llama.cpp's names
    ("torchtitan", re.compile(r"tok_embeddings\.|(output|lm_head)\.weight\Z|norm\.weight\Z|"
                              r"layers\.\d+\.(attention|feed_forward|attention_norm|ffn_norm|moe)\.")),
)


_ANY_FAMILY = re.compile("|".join(f"(?P<{family}>{pattern.pattern})" for family, pattern in _FAMILIES))
"""Every family's pattern in one alternation, tried in ``_FAMILIES`` order: one ``match`` per name
tells which family claims it first (the outer named group is the last one closed, ``lastgroup``)."""
_PATTERNS = dict(_FAMILIES)
# Membership, not the vote: the head of transformers' *ForSequenceClassification / *ForTokenClassification
# (reward models, verl's critic: num_labels=1) belongs to an HF model, but a custom model's own ``score``
# must not make its names look like transformers' (a reviewer's proj.* + score.* model lost proj.*).
_PATTERNS["hf"] = re.compile(_PATTERNS["hf"].pattern + r"|score\.(weight|bias)\Z")


def naming_family(names: Iterable[str]) -> str:
    """``"mcore"`` (Megatron-Core GPTModel names), ``"hf"`` (transformers names), ``"gguf"``
    (llama.cpp's), ``"torchtitan"`` (torchtitan's Llama-style names) or ``"other"``: whichever most
    names follow (a name counts for the first family in ``_FAMILIES`` that it follows)."""
    return _family_count(names)[0]


def _family_count(names: Iterable[str]) -> tuple[str, int]:
    """``naming_family`` and how many of the names follow it (0 for ``other``)."""
    counts = dict.fromkeys(("mcore", "hf", "gguf", "torchtitan"), 0)
    match = _ANY_FAMILY.match
    for found in map(match, names):
        if found is not None:
            counts[found.lastgroup] += 1
    best, count = max(counts.items(), key=lambda kv: kv[1])
    return (best, count) if count else ("other", 0)


def in_family(name: str, family: str) -> bool:
    """Whether ``name`` follows ``family``'s naming (``other`` admits every name)."""
    pattern = _PATTERNS.get(family)
    return pattern is None or bool(pattern.match(name))


def training_kind(name: str, group: str | None = None) -> str | None:
    """The kind of training state ``name`` is (``optimizer``, ``rng``, ...), or None for a model
    candidate. ``group`` is a reader's own tag (``optimizer`` for Megatron/DCP optimizer state)."""
    if group == "optimizer":
        return "optimizer"
    first, _, rest = name.partition(".")
    if first.startswith("chained_") and _CHAINED.match(first) and rest:
        first = rest.partition(".")[0]
    if "/" in first:  # Megatron ShardedObject keys: rng_state/shard_0.0_1.2
        first = first.split("/", 1)[0]
    return _TRAINING_ROOTS.get(first)


PEFT_PREFIX = "base_model.model."
"""``PeftModel`` -> ``LoraModel`` -> the base model: every key of a PEFT-wrapped model, and of a saved
adapter, starts with it."""
_ADAPTER_NAMED = re.compile(r"\.(lora_A|lora_B|lora_embedding_A|lora_embedding_B)\.([A-Za-z0-9_-]+)\.(weight|bias)$")
"""A LoRA tensor of a PEFT-wrapped model in training (``...q_proj.lora_A.default.weight``); a saved adapter
(``save_pretrained``, verl's merger) drops the adapter name: ``...q_proj.lora_A.weight``."""


def peft_base_name(name: str) -> str:
    """The base model's own name of a PEFT-wrapped weight: ``base_model.model.`` and ``.base_layer`` left out
    (what the base checkpoint, a saved adapter's base or verl's merger calls it)."""
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def saved_adapter_name(name: str) -> tuple[str, str] | None:
    """``(name as a saved adapter spells it, adapter name)`` of a live model's LoRA tensor
    (``...lora_A.default.weight`` -> ``(...lora_A.weight, "default")``), or None for any other name."""
    match = _ADAPTER_NAMED.search(name)
    if match is None:
        return None
    return name[:match.start()] + f".{match.group(1)}.{match.group(3)}", match.group(2)


def is_lora_tensor(name: str) -> bool:
    """A LoRA adapter's own tensor in PEFT's naming (``lora_A`` / ``lora_B`` / ``lora_embedding_*`` / DoRA's
    ``lora_magnitude_vector``), in a training state dict or a saved adapter."""
    return ".lora_" in name


def strip_infix_wrappers(name: str) -> str:
    """``model.layers.0._fsdp_wrapped_module.mlp.weight`` -> ``model.layers.0.mlp.weight``."""
    if "_mod" not in name:  # every infix wrapper contains it; the common case returns at once
        return name
    for wrapper in INFIX_WRAPPERS:
        if wrapper in name:
            name = name.replace("." + wrapper, ".")
            if name.startswith(wrapper):
                name = name[len(wrapper):]
    return name


@dataclass
class Split:
    """One checkpoint's entries by role. Names in ``model`` are what a mapping sees (wrappers
    stripped); ``stored`` leads each back to the name the checkpoint stores."""

    prefix: str = ""
    """The wrapper prefix peeled off model entries (``""``, ``"model."``, ``"module.model."``...)."""
    naming: str = "other"
    """Naming family of the model entries: ``hf``, ``mcore``, ``torchtitan`` or ``other``."""
    stored: dict[str, str] = field(default_factory=dict)
    """Model name -> stored name, for every model entry, in stored order."""
    training: dict[str, list[str]] = field(default_factory=dict)
    """Training-state kind -> stored names."""
    unknown: list[str] = field(default_factory=list)
    """Stored names that are neither model weights (under the prefix, in the naming) nor known state."""
    collisions: list[tuple[str, str, str]] = field(default_factory=list)
    """(model name, first stored name, second stored name) that strip to the same model name."""

    def role(self, stored_name: str) -> str:
        """``model``, a training kind or ``unknown`` for one stored name (slow path: views use
        ``roles_by_name``)."""
        return self.roles_by_name().get(stored_name, UNKNOWN)

    @property
    def all_model(self) -> bool:
        """Every entry is a model weight (no training state, nothing unknown): the common case,
        where a caller needs no per-name look-up at all (a 1M-entry dict misses the caches)."""
        return not self.training and not self.unknown and not self.collisions

    def roles_by_name(self) -> dict[str, str]:
        out = dict.fromkeys(self.stored.values(), MODEL)
        for kind, names in self.training.items():
            out.update(dict.fromkeys(names, kind))
        out.update(dict.fromkeys(self.unknown, UNKNOWN))
        return out


def split_entries(names: Iterable[str], groups: Mapping[str, str] | None = None) -> Split:
    """Split stored tensor names into model (wrappers peeled), training state by kind, and unknown.

    ``groups`` holds readers' own tags (stored name -> ``optimizer``) where they have them.
    """
    groups = groups or {}
    names = list(names)
    container = _app_container(names)
    if container:
        return _under(container, split_entries([n[len(container):] for n in names],
                                               {k[len(container):]: v for k, v in groups.items()
                                                if k.startswith(container)}))
    if not groups:
        plain = _split_plain(names)
        if plain is not None:
            return plain
    split = Split()
    candidates: list[tuple[str, str]] = []  # (name without infix wrappers, stored name)
    by_first: dict[str, str | None] = {}  # first component -> kind: it alone decides, but for chained_N
    for name in names:
        first = name.partition(".")[0]
        group = groups.get(name) if groups else None
        if group is None and first in by_first:  # the common case: one dict look-up per name
            kind = by_first[first]
        else:
            kind = training_kind(name, group)
            if group is None and not first.startswith("chained_"):
                by_first[first] = kind
        if kind is not None:
            split.training.setdefault(kind, []).append(name)
        else:
            candidates.append((strip_infix_wrappers(name) if "_mod" in name else name, name))
    prefix, family = _model_prefix([c for c, _ in candidates])
    split.prefix, split.naming = prefix, family
    follows = _PATTERNS[family].match if family in _PATTERNS else None
    stored_names = split.stored
    for clean, stored in candidates:
        if not clean.startswith(prefix):
            split.unknown.append(stored)
            continue
        model_name = clean[len(prefix):] if prefix else clean
        if follows is not None and follows(model_name) is None:
            split.unknown.append(stored)
            continue
        if model_name in stored_names:
            split.collisions.append((model_name, stored_names[model_name], stored))
            continue
        stored_names[model_name] = stored
    return split


def _app_container(names: list[str]) -> str:
    """``"app."`` when every name sits under one key that is itself no model or training root and
    holds one (the DCP tutorial's ``{"app": AppState}`` whose ``state_dict`` is ``{"model": ...,
    "optim": ...}``); else ``""``. Without it ``app.optim...`` was taken for model weights, and the
    model was never found under ``app.model.``."""
    if not names:
        return ""
    first = names[0].partition(".")[0]
    if (not first or PEELABLE_WRAPPERS.match(first) or first in _TRAINING_ROOTS or first.startswith("chained_")
            or first == "base_model"):  # PEFT's wrapper: adapters are told apart by their own reader
        return ""
    container = first + "."
    seconds = set()
    for name in names:
        if not name.startswith(container):
            return ""
        seconds.add(name[len(container):].partition(".")[0])
    if any(PEELABLE_WRAPPERS.match(s) or s in _TRAINING_ROOTS for s in seconds):
        return container
    return ""


def _under(container: str, inner: Split) -> Split:
    """``inner`` (a split of the names without ``container``) with ``container`` put back."""
    return Split(prefix=container + inner.prefix, naming=inner.naming,
                 stored={model: container + stored for model, stored in inner.stored.items()},
                 training={kind: [container + n for n in names] for kind, names in inner.training.items()},
                 unknown=[container + n for n in inner.unknown],
                 collisions=[(m, container + a, container + b) for m, a, b in inner.collisions])


def _split_plain(names: list[str]) -> Split | None:
    """``split_entries`` for the common checkpoint in C-level passes (issue 15: 100,000 names): no reader
    tags, no training state, no infix wrapper, no prefix, and every name in the family found (or none
    found). None when any of that does not hold: the general loop decides then."""
    if "_mod" in "\0".join(names):  # an infix wrapper somewhere (or a name that merely contains _mod)
        return None
    for first in set(map(itemgetter(0), map(methodcaller("partition", "."), names))):
        if first.startswith("chained_") or training_kind(first) is not None:
            return None
    prefix, family, claimed = _model_prefix_counted(names)
    if prefix:
        return None
    pattern = _PATTERNS.get(family)
    # every name claimed by the family already matched its pattern (which admits at least as much): no second pass
    if pattern is not None and claimed != len(names) and not all(map(pattern.match, names)):
        return None
    stored = dict(zip(names, names))
    if len(stored) != len(names):  # a name twice: the general loop records the collision
        return None
    return Split(prefix=prefix, naming=family, stored=stored)


def _model_prefix(names: list[str]) -> tuple[str, str]:
    """``_model_prefix_counted`` without the count."""
    return _model_prefix_counted(names)[:2]


def _model_prefix_counted(names: list[str]) -> tuple[str, str, int]:
    """The wrapper prefix under which most names form a known naming family, that family, and how many
    names it claims there (0 when no family holds half of them).

    Tries the names as they are first, then under each peelable wrapper component, depth first,
    and keeps the prefix under which the most names are recognised (the shallowest on a tie; the
    search stops at a prefix that explains every name); with none, the common run of peelable
    wrappers that holds every name (``module.``), else no prefix.

    Most names is the rule, not the first family found: torchtitan's model saved under DCP's
    ``{"model": ...}`` reads ``model.layers.0.attention.wq.weight``, which transformers' pattern
    also admits as it stands, but only under ``model.`` does every name, ``model.tok_embeddings``
    and ``model.output`` included, follow one family.
    """
    prefix = ""
    current = names
    best: tuple[int, str, str] | None = None  # (names recognised, prefix, family)
    for _ in range(4):  # module.model.model. is as deep as real wrappers go
        family, count = _family_count(current)
        if family != "other" and (best is None or count > best[0]):
            best = (count, prefix, family)
            if count == len(names):
                break
        heads: dict[str, list[str]] = {}
        for name in current:
            head, dot, rest = name.partition(".")
            if dot and PEELABLE_WRAPPERS.match(head):
                heads.setdefault(head, []).append(rest)
        if not heads:
            break
        head, rest = max(heads.items(), key=lambda kv: len(kv[1]))
        prefix, current = prefix + head + ".", rest
    if best is not None and 2 * best[0] >= len(names):
        return best[1], best[2], best[0]
    # Nothing recognised, or only a few names (an HF model renamed to backbone.layers...: lm_head alone
    # still looks like HF): peel only wrappers that hold every name, and judge no name by a family.
    prefix = ""
    current = names
    while current:
        heads = {name.partition(".")[0] for name in current}
        if len(heads) != 1:
            break
        head = next(iter(heads))
        if not PEELABLE_WRAPPERS.match(head) or not all("." in n for n in current):
            break
        prefix += head + "."
        current = [name.partition(".")[2] for name in current]
    return prefix, "other", 0
