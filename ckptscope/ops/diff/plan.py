"""Pairing for ``ckptscope diff``: put both checkpoints in one canonical name space and decide, from
metadata alone, which tensors are compared with which.

The canonical space is the names both sides already share when they use the same naming; when one
side uses Megatron-Core names and the other HF names (``--map auto``), Megatron tensors are
presented as HF tensors through the mapping layer, so a fused ``linear_qkv`` is compared as the
``q_proj``/``k_proj``/``v_proj`` it holds and a difference is reported at the HF tensor it is in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex
from ckptscope.core.names import select
from ckptscope.core.roles import PEFT_PREFIX, saved_adapter_name, training_kind
from ckptscope.core.units import plural
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.registry import open_checkpoint
from ckptscope.mappings.config import ZERO_CENTRED_NORM, ModelConfig, from_hf_config, read_hf_config
from ckptscope.mappings.fused_experts import has_fused_experts, names_experts_one_by_one, unfuse
from ckptscope.mappings.gguf import gguf_as_hf
from ckptscope.mappings.links import Piece, Recipe, box_text, full_box
from ckptscope.mappings.resolve import (
    MappedView,
    config_from_index,
    config_from_names,
    detect_arch,
    naming_family,
    rules_for,
    shapes_of,
    to_hf,
)
from ckptscope.mappings.schemas import is_ignored
from ckptscope.ops.diff.sidefiles import SideFile, pair_training_files
from ckptscope.ops.model import ModelEntries, is_peft_wrapped, model_entries, peft_unwrapped
from ckptscope.ops.roots import resolve_root, save_state_model

@dataclass
class DiffSide:
    """One checkpoint as the diff sees it: its reader and its tensors in the canonical space."""

    path: str
    reader: CheckpointReader
    recipes: dict[str, Recipe]
    ignored: list[str] = field(default_factory=list)
    mapped: bool = False
    """True when names were translated (Megatron-Core -> HF)."""

    def describe(self, name: str) -> str | None:
        """The source tensor name(s) behind canonical ``name``, with slices when it is part of a
        fused or stacked tensor: ``decoder.layers.self_attention.linear_qkv.weight[0, 0:32, :] + ...``."""
        recipe = self.recipes.get(name)
        if recipe is None:
            return None
        if recipe.is_identity and not _is_view(self.reader.index(), recipe.pieces[0].source):
            return recipe.pieces[0].source
        return " + ".join(_piece_text(self.reader.index(), p) for p in recipe.pieces)


def _is_view(index: CheckpointIndex, name: str) -> bool:
    return name in index.views and name not in index.tensors


def _piece_text(index: CheckpointIndex, piece: Piece) -> str:
    source, box = piece.source, piece.src_box
    if _is_view(index, source):
        stored, layer = index.views[source]
        source, box = stored, ((layer, layer + 1),) + box
    shape = index.tensors[source].shape if source in index.tensors else tuple(b[1] for b in box)
    if box == full_box(tuple(shape)):
        return source
    return source + box_text(box, tuple(shape))


@dataclass
class DiffPair:
    """One canonical tensor: its recipe on each side (None when the side lacks it)."""

    name: str
    a: Recipe | None
    b: Recipe | None

    @property
    def static_status(self) -> str | None:
        """The status metadata alone decides, or None when values must be read."""
        if self.a is None:
            return "only_b"
        if self.b is None:
            return "only_a"
        if self.a.shape != self.b.shape:
            return "shape_mismatch"
        return None


@dataclass
class DiffPlan:
    a: DiffSide
    b: DiffSide
    pairs: list[DiffPair]
    mapping: str
    """``"none"``, ``"names"`` (same naming, per-layer views), or ``"mcore->hf"``."""
    notes: list[str] = field(default_factory=list)
    padding: list[dict] = field(default_factory=list)
    """Vocab pad rows left out of the comparison: side, tensor, rows."""
    side_files: list[SideFile] = field(default_factory=list)
    """With ``training_state``: the trainers' own optimizer / scheduler / rng files (``sidefiles``),
    each compared after the pairs above."""
    compare_config: bool = True
    """Whether the two sides' config.json files are compared too (not when ``--include`` / ``--exclude``
    picked the tensors: the user asked about those)."""

    @property
    def compared(self) -> list[DiffPair]:
        return [p for p in self.pairs if p.static_status is None]

    def bytes_to_read(self) -> int:
        """Bytes of both sides of every pair whose values are compared: the progress bar's total
        (an upper bound: pairs whose stored bytes match are settled with fewer reads)."""
        from ckptscope.core.dtypes import dtype_by_name

        return sum(r.numel * dtype_by_name(r.dtype).bits // 8 for p in self.compared for r in (p.a, p.b))


def identity_recipes(tensors: dict) -> dict[str, Recipe]:
    """Each tensor as itself: one piece, the whole tensor (the recipe of an unmapped name)."""
    return {name: Recipe(name, tuple(meta.shape), meta.dtype,
                         [Piece(full_box(tuple(meta.shape)), name, full_box(tuple(meta.shape)))], ["identity"])
            for name, meta in tensors.items()}


def _side_view(label: str, path: str | Path, tensors: dict, cfg: ModelConfig, arch: str | None):
    """One Megatron side mapped to HF names; a mapping error says which side it is."""
    try:
        return to_hf(shapes_of(tensors), cfg, arch)
    except CkptError as exc:
        raise CkptError(f"{label}: {exc.problem}", exc.path or path) from None


def _side_config(index: CheckpointIndex, tensors: dict, given: ModelConfig | None = None) -> ModelConfig:
    """What a side's own metadata says of its model, then ``--hf-config`` (``given``) for what it does not
    (a verl Megatron save without args), then what the tensor shapes tell."""
    config = config_from_index(index)
    if given is not None:
        config = config.merged(given)
    return config.merged(config_from_names(shapes_of(tensors)))


TIED_PAIRS = (("lm_head.weight", "model.embed_tokens.weight"), ("output_layer.weight", "embedding.word_embeddings.weight"))
"""(output, input embedding) names of a tied model in each naming: a side that stores only the
embedding holds the output layer too."""


def _without_adapter_name(recipes: dict[str, Recipe], other: dict[str, Recipe]) -> tuple[dict[str, Recipe], str] | None:
    """``recipes`` with the adapter name dropped from its LoRA tensors' names, and that name, when the other
    side holds those tensors under the dropped names and not the named ones (a probe: verl's LoRA-only save
    against the lora_adapter/ its merger wrote compared 0 pairs, exit 1)."""
    renamed, adapters = {}, set()
    for name in recipes:
        saved = saved_adapter_name(name) if name not in other else None
        if saved is not None and saved[0] in other and saved[0] not in recipes:
            renamed[name] = saved[0]
            adapters.add(saved[1])
    if not renamed or len(adapters) != 1:
        return None
    out = {}
    for name, recipe in recipes.items():
        new = renamed.get(name, name)
        out[new] = replace(recipe, name=new) if new != name else recipe
    return out, adapters.pop()


def _peft_unwrapped_sides(a: ModelEntries, b: ModelEntries, notes: list[str]) -> tuple[ModelEntries, ModelEntries]:
    """A side that is a PEFT-wrapped LoRA model (verl's LoRA saves) against one that is not: its base weights
    under the model's own names, so they pair with the base checkpoint or an export (they were all "renamed",
    0 compared, exit 1), its LoRA tensors as they are (only on that side, or paired with a saved adapter)."""
    sides = {"A": a, "B": b}
    for label, other in (("A", "B"), ("B", "A")):
        mine, theirs = sides[label], sides[other]
        unwrapped = peft_unwrapped(mine)
        if unwrapped is None or is_peft_wrapped(list(theirs.tensors)):
            continue
        base, lora = unwrapped
        if not any(name in theirs.tensors for name in base.tensors):
            continue
        tensors = {**base.tensors, **{name: mine.tensors[name] for name in lora}}
        stored = {**base.stored, **lora}
        sides[label] = ModelEntries(replace(mine.split, stored=dict(stored)), tensors, stored, mine.training,
                                    mine.unknown)
        notes.append(f"{label}: a model wrapped by PEFT for LoRA training: its base weights are compared under the "
                     f"model's own names ({PEFT_PREFIX} and .base_layer left out), its {len(lora)} LoRA tensors "
                     f"as they are")
    return sides["A"], sides["B"]


LOST_FILE_ISSUES = ("missing-file", "unreadable-file")
"""Damage that leaves tensors the save names unreadable."""


def _unreadable_model(index: CheckpointIndex) -> str | None:
    """Why a side's model cannot be compared, or None. Damage that leaves nothing to read (DCP without
    .metadata), or model tensors the save holds in a file that is gone, is not "only in the other side"
    or (an HF shard holding lm_head) a tied head: the diff reported it as differences, exit 1 (a probe
    with torchtitan's saves); it is refused as a missing .distcp is."""
    if not index.tensors and index.issues:
        issue = index.issues[0]
        return f"no tensor can be read: {issue.file + ': ' if issue.file else ''}{issue.detail}"
    lost = next((i for i in index.issues if i.kind in LOST_FILE_ISSUES
                 and any(training_kind(name) is None for name in i.tensors)), None)
    if lost is not None:
        return f"{lost.file}: {lost.detail}; `ckptscope check` lists the damage"
    return None


def _add_tied(recipes: dict[str, Recipe], other: dict[str, Recipe], cfg: ModelConfig) -> str | None:
    """Present a tied side's embedding as its output layer when the other side stores both.

    A tied model saved with and without ``lm_head.weight`` (torch.save keeps both keys on one
    storage; safetensors writers drop one) is the same model: compare the output layer with the
    embedding instead of reporting it missing. Only when the side's config does not say untied.
    """
    for output, embedding in TIED_PAIRS:
        if output in recipes or output not in other or embedding not in recipes or cfg.tie_word_embeddings is False:
            continue
        source = recipes[embedding]
        recipes[output] = Recipe(output, source.shape, source.dtype, list(source.pieces),
                                 source.transforms + ["tied"], padding=list(source.padding), fill=list(source.fill))
        return output
    return None


def plan_diff(path_a: str | Path, path_b: str | Path, *, mapping: str = "auto", include: tuple[str, ...] = (),
              exclude: tuple[str, ...] = (), arch: str | None = None, trust_pickle: bool = False,
              training_state: bool = False, compare_unknown: bool = True, raw: bool = False,
              hf_config: str | Path | None = None) -> DiffPlan:
    """Open both checkpoints (metadata only) and pair their models' tensors.

    Each side is split into its model and its training state (``ops.model``): the models are
    compared under the names a mapping sees (a ``{"model": ...}`` DCP against an HF dir pairs
    ``model.model.x`` with ``model.x``); ``training_state`` adds optimizer, scheduler, rng ...
    tensors, compared by stored name. Entries that are neither are compared by stored name too
    (unless ``compare_unknown`` is off: ``verify --skip-unknown``), so nothing goes unseen.
    Block-scaled tensors (FP8 + ``weight_scale_inv``, MXFP4) are compared dequantised, or with
    ``raw`` as stored: payload and scales each bit for bit.
    """
    if mapping not in ("auto", "none"):
        raise CkptError(f"--map must be auto or none, not {mapping!r}")
    if arch is not None:
        rules_for(arch)  # an unknown name is refused even when this pair needs no mapping: a typo
    given = from_hf_config(read_hf_config(Path(hf_config))) if hf_config is not None else None

    def side_config(index: CheckpointIndex, tensors: dict) -> ModelConfig:
        return _side_config(index, tensors, given)
    reader_a = open_checkpoint(resolve_root(path_a), trust_pickle=trust_pickle)
    reader_b = open_checkpoint(resolve_root(path_b), trust_pickle=trust_pickle)
    if raw:
        reader_a.show_stored_quantization()
        reader_b.show_stored_quantization()
    index_a, index_b = reader_a.index(), reader_b.index()
    for path, index in ((path_a, index_a), (path_b, index_b)):
        damage = _unreadable_model(index)
        if damage is not None:
            reader_a.close()
            reader_b.close()
            raise CkptError(damage, path)
    notes: list[str] = []
    for label, index in (("A", index_a), ("B", index_b)):
        # what the reader said of a side (files it does not assemble, weights compared as stored codes,
        # damage) qualifies every number below: said with the result, not only by inspect
        notes += [f"{label}: {warning}" for warning in index.warnings]
        schemes = sorted({str(t.attr("quant_scheme")) for t in index.tensors.values() if t.attr("quant_scheme")})
        if schemes:
            notes.append(f"{label}: block-scaled tensors ({', '.join(schemes)}) are compared as their dequantised "
                         f"values; --raw compares the stored payload and scales")
    entries_a, entries_b = model_entries(index_a), model_entries(index_b)
    vocab_kept = False  # two Megatron saves paired through HF names, vocab tensors compared whole (Megatron names)

    if mapping == "none":
        ta, tb = entries_a.tensors, entries_b.tensors
        recipes_a, recipes_b = identity_recipes(ta), identity_recipes(tb)
        ignored_a, ignored_b, mapped_a, mapped_b = [], [], False, False
        used = "none"
    else:
        same_stored = set(entries_a.tensors) == set(entries_b.tensors)
        if not same_stored or _patterns_want_layers(entries_a, index_a, include, exclude):
            entries_a, entries_b = model_entries(index_a, logical=True), model_entries(index_b, logical=True)
        entries_a, entries_b = _peft_unwrapped_sides(entries_a, entries_b, notes)
        ta, tb = entries_a.tensors, entries_b.tensors
        fam_a, fam_b = naming_family(ta), naming_family(tb)
        recipes_a, recipes_b = identity_recipes(ta), identity_recipes(tb)
        ignored_a, ignored_b = [], []
        mapped_a = mapped_b = False
        used = "none" if same_stored else "names"
        fused = {"A": fam_a == "hf" and has_fused_experts(ta), "B": fam_b == "hf" and has_fused_experts(tb)}
        per_expert = {"A": fam_a == "mcore" or names_experts_one_by_one(ta),
                      "B": fam_b == "mcore" or names_experts_one_by_one(tb)}
        if set(ta) != set(tb):
            # transformers v5 fused experts against a side that names experts one by one: compared per
            # expert, as save_pretrained writes them (two fused sides, or no per-expert side, as they are)
            for label, other, tensors, index in (("A", "B", ta, index_a), ("B", "A", tb, index_b)):
                if fused[label] and per_expert[other] and not has_fused_experts(tb if label == "A" else ta):
                    fused_arch = arch or detect_arch(tensors, side_config(index, tensors))
                    recipes = unfuse(shapes_of(tensors), fused_arch,
                                     hidden=side_config(index, tensors).hidden_size)
                    if label == "A":
                        recipes_a, mapped_a = recipes, True
                    else:
                        recipes_b, mapped_b = recipes, True
                    notes.append(f"{label}: transformers v5 fused expert tensors compared per expert ({fused_arch})")
        if {fam_a, fam_b} == {"hf", "mcore"} or (fam_a == fam_b == "mcore" and set(ta) != set(tb)):
            # each side's own config first (two Megatron saves may be two models); the other's fills what
            # one does not say (a Megatron save without args beside its HF source)
            cfg_a = side_config(index_a, ta).merged(side_config(index_b, tb))
            cfg_b = side_config(index_b, tb).merged(side_config(index_a, ta))
            cfg = cfg_a if fam_a == "mcore" else cfg_b
            if fam_a == "mcore":
                view = _side_view("A", path_a, ta, cfg_a, arch)
                recipes_a, ignored_a, mapped_a = _with_unmapped(view, ta), view.ignored, True
                notes += _view_notes("A", view)
            if fam_b == "mcore":
                view = _side_view("B", path_b, tb, cfg_b, arch)
                recipes_b, ignored_b, mapped_b = _with_unmapped(view, tb), view.ignored, True
                notes += _view_notes("B", view)
            if fam_a == fam_b == "mcore":
                # padded alike: compared whole; padded to other sizes (another TP), the real rows through HF
                # and the padding rows both have as a pair of their own
                alike = {n for n in VOCAB_TENSORS if n in ta and n in tb and ta[n].shape == tb[n].shape}
                vocab_kept = bool(alike)
                _vocab_tensors_whole(recipes_a, ta, alike)
                _vocab_tensors_whole(recipes_b, tb, alike)
                notes += _shared_padding_pairs(recipes_a, recipes_b, ta, tb, cfg_a.vocab_size or cfg_b.vocab_size,
                                               [n for n in VOCAB_TENSORS if n in ta and n in tb and n not in alike])
            if view.arch in ZERO_CENTRED_NORM and cfg.zero_centered_norm is not True:
                notes.append(f"{view.arch} norms are zero-centred (x * (1 + w)) but the Megatron args do not record "
                             f"apply_layernorm_1p: equal norm weights here are norms that differ by 1.0 in the "
                             f"two models")
            used = "mcore->hf"
        elif {fam_a, fam_b} == {"hf", "gguf"}:
            if fam_a == "gguf":
                recipes_a, mapped_a = _gguf_recipes("A", index_a, ta, notes), True
            if fam_b == "gguf":
                recipes_b, mapped_b = _gguf_recipes("B", index_b, tb, notes), True
            used = "gguf->hf"
        elif fam_a != fam_b and "other" not in (fam_a, fam_b):
            notes.append(f"A has {fam_a} names and B {fam_b} names, and ckptscope has no mapping between "
                         f"them: tensors are paired by name only")
        for label, other in (("A", "B"), ("B", "A")):
            mine, theirs = (recipes_a, recipes_b) if label == "A" else (recipes_b, recipes_a)
            unnamed = _without_adapter_name(mine, theirs)
            if unnamed is not None:
                recipes, adapter = unnamed
                if label == "A":
                    recipes_a = recipes
                else:
                    recipes_b = recipes
                notes.append(f"{label}: PEFT adapter name {adapter!r} left out of the LoRA tensor names, as {other} "
                             f"(a saved adapter) spells them")
        for label, mine, theirs, index, tensors in (("A", recipes_a, recipes_b, index_a, ta),
                                                    ("B", recipes_b, recipes_a, index_b, tb)):
            tied = _add_tied(mine, theirs, side_config(index, tensors))
            if tied:
                notes.append(f"{label}: tied embeddings, {tied} compared as the input embedding")
    for label, entries in (("A", entries_a), ("B", entries_b)):
        if entries.prefix:
            notes.append(f"{label}: model found under {entries.prefix!r} (compared without it)")
    recipes_a, recipes_b = entries_a.to_stored(recipes_a), entries_b.to_stored(recipes_b)
    for label, entries, recipes in (("A", entries_a, recipes_a), ("B", entries_b, recipes_b)):
        extra = dict(entries.unknown) if compare_unknown else {}
        if entries.unknown and compare_unknown:
            notes.append(f"{label}: {plural(len(entries.unknown), 'entry is', 'entries are')} neither model weights nor known training "
                         f"state (first: {next(iter(entries.unknown))}); compared by stored name")
        state = entries.training_tensors()
        if training_state:
            extra.update(state)
        elif state:
            # DeepSpeed's low-precision module copies sit with the optimizer state: a probe took "optimizer" for
            # all of it while the bf16 weights a load_module_only resume uses were among them
            copies = sum(1 for name in state if name.startswith("lp_params."))
            what = ", ".join(sorted(entries.training)) + (
                f", of which {plural(copies, 'is', 'are')} the module's low-precision copies (lp_params.*) the fp32 "
                f"masters stand in for" if copies else "")
            notes.append(f"{label}: {plural(len(state), 'training-state tensor')} not compared "
                         f"({what}; --training-state adds them)")
        for name, recipe in identity_recipes(extra).items():
            recipes.setdefault(name, recipe)
    side_a = DiffSide(str(path_a), reader_a, recipes_a, ignored_a, mapped_a)
    side_b = DiffSide(str(path_b), reader_b, recipes_b, ignored_b, mapped_b)
    if mapping != "none":
        # Names that are never values (TE _extra_state, rotary inv_freq) are not compared.
        for side in (side_a, side_b):
            for name in [n for n in side.recipes if is_ignored(n)]:
                side.ignored.append(name)
                del side.recipes[name]

    vocab_notes = _vocab_row_pairs(side_a, side_b, index_a, index_b, given)
    every = list(side_a.recipes) + [n for n in side_b.recipes if n not in side_a.recipes]
    names = select(every, include, exclude)
    notes += [note for rows, note in vocab_notes.items() if rows in names]
    namespace = ""
    if used == "mcore->hf":
        kept = " (the vocab tensors keep their Megatron names)" if vocab_kept else ""
        namespace = f" (pairs are named by HF names here{kept}: the mapping is mcore->hf)"
    if not names and (include or exclude):  # a typo in a pattern must not read as "identical"
        raise CkptError(f"no tensor of either side matches --include {' '.join(include) or '(all)'}"
                        f"{' --exclude ' + ' '.join(exclude) if exclude else ''}{namespace}")
    unused = [p for p in exclude if not select(every, (p,))]
    # (with --training-state a pattern may name an entry of a trainer's side file instead)
    if unused and not training_state:  # an exclusion that excluded nothing is said, not silently ignored
        notes.append(f"--exclude {' '.join(unused)} matched no tensor, so nothing was left out{namespace}")
    pairs = [DiffPair(n, side_a.recipes.get(n), side_b.recipes.get(n)) for n in names]
    side_files = pair_training_files(_searched(path_a), index_a, _searched(path_b), index_b)
    if training_state:
        for side_file in side_files:
            _plan_side_file(side_file, trust_pickle, include, exclude)
    else:
        for label, present in (("A", [f.name for f in side_files if f.a]), ("B", [f.name for f in side_files if f.b])):
            if present:
                notes.append(f"{label}: training-state {'file' if len(present) == 1 else 'files'} "
                             f"{', '.join(present)} not compared (--training-state adds them)")
        side_files = []
    padding = []
    for label, side in (("a", side_a), ("b", side_b)):
        for name in names:
            recipe = side.recipes.get(name)
            for source, box in (recipe.padding if recipe else ()):
                padding.append({"side": label, "name": name, "source": source,
                                "rows": [box[0][0], box[0][1]], "box": box})
    return DiffPlan(side_a, side_b, pairs, used, notes, padding, side_files, compare_config=not (include or exclude))


VOCAB_TENSORS = ("embedding.word_embeddings.weight", "output_layer.weight")
"""Megatron-Core's vocabulary-sized tensors, padded to ``padded_vocab_size`` rows."""


def _vocab_tensors_whole(recipes: dict[str, Recipe], tensors: dict, names: set[str]) -> None:
    """Two Megatron saves paired through HF names (stored names differ: a per-rank ``torch`` save's
    ``input_layernorm`` against torch_dist's ``linear_qkv.layer_norm_weight``) still compare their
    vocabulary tensors whole, under the Megatron names: the HF view drops the padding rows, and a
    Megatron -> HF -> Megatron ``verify`` whose trained padding rows came back as zeros said
    "identical" (the padding rows enter Megatron's softmax). ``_vocab_row_pairs`` then adds the
    real vocabulary's rows as a pair of their own. Only ``names``, the vocab tensors both sides pad alike:
    a lossless reshard to another TP pads to another size, and stays compared through HF (real rows)."""
    for name in [n for n, r in recipes.items() if any(p.source in names for p in r.pieces)]:
        del recipes[name]
    recipes.update(identity_recipes({n: tensors[n] for n in sorted(names) if n in tensors}))


def _shared_padding_pairs(recipes_a: dict[str, Recipe], recipes_b: dict[str, Recipe], ta: dict, tb: dict,
                          vocab: int | None, names: list[str]) -> list[str]:
    """Two Megatron saves padded to other sizes: the padding rows both tables have (``vocab`` up to the
    smaller one) as a pair of their own, so trained padding rows against zeros are a difference (a reviewer:
    a TP=4 export of a save with trained padding was 'identical'); the larger table's further rows are
    listed under ``padding``. Returns the notes."""
    notes = []
    for name in names:
        a, b = ta[name], tb[name]
        if vocab is None or len(a.shape) != 2 or len(b.shape) != 2 or a.shape[1] != b.shape[1]:
            continue
        low = min(a.shape[0], b.shape[0])
        if low <= vocab:
            continue
        rows = f"{name}[{vocab}:{low}]"
        dst, src = ((0, low - vocab), (0, a.shape[1])), ((vocab, low), (0, a.shape[1]))
        recipes_a[rows] = Recipe(rows, (low - vocab, a.shape[1]), a.dtype, [Piece(dst, name, src)], ["padding rows"])
        recipes_b[rows] = Recipe(rows, (low - vocab, b.shape[1]), b.dtype, [Piece(dst, name, src)], ["padding rows"])
        notes.append(f"{name}: padded to {a.shape[0]} rows in A and {b.shape[0]} in B (vocab_size {vocab}); {rows} "
                     f"compares the padding rows both have")
    return notes


def _vocab_row_pairs(side_a: DiffSide, side_b: DiffSide, index_a: CheckpointIndex,
                     index_b: CheckpointIndex, given: ModelConfig | None = None) -> dict[str, str]:
    """For two Megatron-Core checkpoints whose vocabulary is padded (vocab_size < padded_vocab_size
    rows), add a pair ``<tensor>[:vocab_size]`` beside each whole vocab tensor: the real vocabulary's
    rows on their own. A Megatron -> HF -> Megatron round trip drops the padding rows and writes
    them back as zeros, so the whole tensor differs while the model's own rows are equal; the whole
    tensor stays compared (the padding rows enter Megatron's softmax), and the extra pair says which
    it is. Returns each added pair's note, by the pair's name."""
    cfg_a, cfg_b = config_from_index(index_a), config_from_index(index_b)
    vocab = cfg_a.vocab_size or cfg_b.vocab_size or (given.vocab_size if given is not None else None)
    if vocab is None or (cfg_a.vocab_size and cfg_b.vocab_size and cfg_a.vocab_size != cfg_b.vocab_size):
        return {}
    notes = {}
    for name in VOCAB_TENSORS:
        ra, rb = side_a.recipes.get(name), side_b.recipes.get(name)
        # padded to other sizes (a TP=2 save pads to a multiple of 256, TP=1 to 128): the real rows still pair
        if ra is None or rb is None or not ra.is_identity or not rb.is_identity or len(ra.shape) != 2 \
                or len(rb.shape) != 2 or ra.shape[1] != rb.shape[1] or min(ra.shape[0], rb.shape[0]) < vocab \
                or max(ra.shape[0], rb.shape[0]) <= vocab:
            continue
        rows = f"{name}[:{vocab}]"
        box = ((0, vocab), (0, ra.shape[1]))
        for side, recipe in ((side_a, ra), (side_b, rb)):
            side.recipes[rows] = Recipe(rows, (vocab, ra.shape[1]), recipe.dtype,
                                        [Piece(box, recipe.pieces[0].source, box)], ["vocab rows"])
        spans = [f"{vocab}-{r.shape[0] - 1}" if r.shape[0] > vocab else "none" for r in (ra, rb)]
        padded = spans[0] if spans[0] == spans[1] else f"{spans[0]} in A and {spans[1]} in B"
        notes[rows] = (f"{name}: rows {padded} are vocab padding (vocab_size {vocab}); {rows} "
                       f"compares the real vocabulary alone (an export to HF drops the padding rows, and an import "
                       f"writes them as zeros)")
    return notes


def _patterns_want_layers(entries, index: CheckpointIndex, include: tuple[str, ...], exclude: tuple[str, ...]) -> bool:
    """``--include decoder.layers.0.self_attention`` on two Megatron checkpoints: the stored names are
    stacked (``decoder.layers.self_attention...``), so the patterns select per-layer views when they
    match those and no stored name (the timeline's per-layer cells ask for exactly this)."""
    if not (include or exclude) or not index.views:
        return False
    stored = list(entries.tensors)
    # a pattern that matches no stored name but a per-layer one (an --exclude of layer 1 was ignored: a probe)
    logical = list(model_entries(index, logical=True).tensors)
    return any(not select(stored, (p,)) and select(logical, (p,)) for p in (*include, *exclude))


def _searched(path: str | Path) -> str | Path:
    """The directory whose training-state files count: the one the user named (an accelerate
    ``save_state`` dir, whose model is a subdirectory), else the iteration it stands for."""
    return path if save_state_model(path) else resolve_root(path)


def _plan_side_file(side_file: SideFile, trust_pickle: bool, include: tuple[str, ...],
                    exclude: tuple[str, ...]) -> None:
    """Plan one training-state file pair by stored name; a pair that does not open as checkpoints
    is left to a byte comparison, with the reason kept for the report."""
    if side_file.a is None or side_file.b is None:
        return
    try:
        side_file.plan = plan_diff(side_file.a, side_file.b, mapping="none", trust_pickle=trust_pickle,
                                   training_state=True)
    except CkptError as exc:
        side_file.unreadable = str(exc)
        return
    if include or exclude:
        keep = set(select([f"{side_file.name}/{p.name}" for p in side_file.plan.pairs], include, exclude))
        side_file.plan.pairs = [p for p in side_file.plan.pairs if f"{side_file.name}/{p.name}" in keep]


def _gguf_recipes(label: str, index: CheckpointIndex, tensors: dict, notes: list[str]) -> dict[str, Recipe]:
    """A GGUF side under HF names (``mappings.gguf``), tensors without an HF name under their own."""
    recipes, unmapped = gguf_as_hf(tensors, index.metadata)
    recipes.update(identity_recipes({n: tensors[n] for n in unmapped}))
    notes.append(f"{label}: llama.cpp names mapped to HF, q/k rows un-permuted (convert_hf_to_gguf.py's rope "
                 f"permutation)")
    quantised = sorted({meta.attr("ggml_type") for meta in tensors.values()
                        if meta.attr("ggml_type") not in (None, "F32", "F16", "BF16")})
    if quantised:
        notes.append(f"{label}: quantised tensors ({', '.join(quantised)}) are compared as their dequantised "
                     f"values; each pair's quant_error says whether its difference is the quantisation error "
                     f"its type implies")
    return recipes


def _with_unmapped(view: MappedView, tensors: dict) -> dict[str, Recipe]:
    """Mapped recipes plus, under their own names, tensors no rule knows (reported as only_a/only_b)."""
    recipes = dict(view.recipes)
    recipes.update(identity_recipes({n: tensors[n] for n in view.unmapped}))
    return recipes


def _view_notes(label: str, view: MappedView) -> list[str]:
    notes = [f"{label}: Megatron-Core names mapped to HF ({view.arch})"]
    if view.unmapped:
        notes.append(f"{label}: {plural(len(view.unmapped), 'tensor matches', 'tensors match')} no {view.arch} rule; compared by name")
    return notes
