"""The plan of ``ckptscope convert`` / ``merge``: every destination tensor, its sources and the
transforms between them, decided from metadata alone (``--dry-run`` prints it; the TUI previews it).

Sources are read as one logical model whatever their format (readers merge TP/PP/FSDP shards and
expose stacked torch_dist layers per layer), so converting is always: logical source tensors ->
mapping recipes -> destination tensors.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ckptscope.core.dtypes import dtype_by_name
from ckptscope.core.errors import CkptError, UnknownFormat
from ckptscope.core.index import CheckpointIndex
from ckptscope.core.roles import is_lora_tensor
from ckptscope.core.tensor import TensorMeta
from ckptscope.core.units import plural
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.hf.quantization import unhandled_quantization
from ckptscope.formats.registry import open_checkpoint
from ckptscope.mappings.config import (
    EXPORT_NOTES,
    HF_EXPORT_NOTES,
    MEGATRON_CHECKS,
    MLA_ARCHS,
    ZERO_CENTRED_NORM,
    ModelConfig,
    check_model_sizes,
    from_hf_config,
    hf_config_conflicts,
    hf_export_problems,
    hf_shape_problems,
    padded_vocab,
    parallel_problems,
    read_hf_config,
    to_hf_config,
    to_megatron_args,
)
from ckptscope.mappings.fused_experts import fuse, has_fused_experts, stores_per_expert, unfuse
from ckptscope.mappings.links import Box, Piece, Recipe, map_box
from ckptscope.mappings.resolve import (
    MappedView,
    TensorShape,
    config_from_index,
    config_from_names,
    detect_arch,
    megatron_config_from_index,
    naming_family,
    shapes_of,
)
from ckptscope.mappings.resolve import to_hf as map_to_hf
from ckptscope.mappings.resolve import to_mcore as map_to_mcore
from ckptscope.mappings.schemas import is_ignored
from ckptscope.ops.check import metadata_problems
from ckptscope.ops.convert import fp8_keep
from ckptscope.ops.convert.peft_wrapped import AdapterExport, unwrap_peft
from ckptscope.ops.model import ModelEntries, model_entries
from ckptscope.ops.roots import resolve_root

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "generation_config.json", "chat_template.jinja")
DTYPES = ("keep", "bfloat16", "float16", "float32")
HF_EXPERT_LAYOUTS = ("per-expert", "fused")
"""HF MoE expert layouts ``--hf-experts`` writes: ``save_pretrained``'s per-expert tensors (default),
or transformers v5's fused ``mlp.experts.gate_up_proj`` / ``down_proj`` (mappings.fused_experts)."""
DEFAULT_SHARD = 5 * 1000**3

__all__ = ["Box", "ConvertPlan", "OutputTensor", "Recipe", "plan_convert", "target_family_for"]
"""``Box`` and ``Recipe`` are the mapping layer's types a plan is made of, named here for the views."""


WHOLE_MODEL_FORMATS = frozenset({"hf", "safetensors", "torch", "torch-legacy"})
"""Formats that hold a model as one whole state dict; every other format (verl, DCP, DeepSpeed,
Megatron) is a training save sharded by rank, which ``merge`` turns into one HF model."""


def target_family_for(index: CheckpointIndex) -> str:
    """The natural target: a whole HF-named model goes to Megatron-Core; a training save sharded by
    rank goes to HF, as ``merge`` does, even with HF names inside (a verl FSDP actor, DCP or ZeRO
    shards of an HF model: the wanted result is the merged HF model, not a Megatron layout)."""
    if index.format not in WHOLE_MODEL_FORMATS:
        return "hf"
    return "mcore" if model_entries(index).naming == "hf" else "hf"


def parse_size(text: str | int) -> int:
    """``5GB``, ``500MB``, ``2GiB`` or a byte count."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
    if not match:
        raise CkptError(f"--max-shard-size: cannot read {text!r} (use e.g. 5GB, 500MB)")
    number, unit = float(match.group(1)), match.group(2).rstrip("B")
    scale = {"": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
             "KI": 1024, "MI": 1024**2, "GI": 1024**3, "TI": 1024**4}[unit]
    size = int(number * scale)
    if size <= 0:
        raise CkptError("--max-shard-size must be positive")
    return size


@dataclass
class OutputTensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    """Destination dtype (the source dtype unless --dtype says otherwise)."""
    recipe: Recipe

    @property
    def nbytes(self) -> int:
        numel = 1
        for n in self.shape:
            numel *= n
        return numel * dtype_by_name(self.dtype).bits // 8


@dataclass
class ConvertPlan:
    src: str
    dst: str
    target: str
    """``hf`` or ``mcore``."""
    reader: CheckpointReader
    tensors: list[OutputTensor]
    config: ModelConfig
    arch: str
    hf_config: dict[str, Any] | None = None
    megatron_args: dict[str, Any] | None = None
    ckpt_format: str = "torch_dist"
    tp: int = 1
    pp: int = 1
    ep: int = 1
    spec: str = "local"
    """Megatron-Core layer spec the output is named for: ``local`` or ``te`` (Transformer Engine)."""
    iteration: int = 0
    num_files: int = 2
    """torch_dist data files (``__0_K.distcp``): the output layout depends on this, never on how
    many processes write it (megatron-core 0.16 writes 2 per rank; any count loads)."""
    shards: list[tuple[str, list[str]]] = field(default_factory=list)
    copies: list[tuple[Path, str]] = field(default_factory=list)
    """Files copied verbatim (tokenizer, generation config): (source path, destination name)."""
    generation_config: dict[str, Any] | None = None
    """``generation_config.json`` for an HF export from Megatron whose args carry one (``hf_generation_config``,
    written by an HF -> Megatron convert) and no file is copied: sampling settings and stop tokens."""
    notes: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    """What the written checkpoint does not carry for a model built from it alone (also in ``notes``):
    the CLI says these after a real conversion too, where notes are shown only by --dry-run / --json."""
    adapter: AdapterExport | None = None
    """A PEFT-wrapped LoRA save's adapter, written beside the base model (``peft_wrapped``)."""
    merge_lora: bool = False
    """Merge ``adapter`` into the weights written instead of writing it apart."""

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def to_json(self) -> dict[str, Any]:
        return {
            "src": self.src, "dst": self.dst, "to": self.target, "arch": self.arch,
            "format": self.ckpt_format if self.target == "mcore" else "hf",
            "tp": self.tp, "pp": self.pp, "ep": self.ep, "spec": self.spec, "iteration": self.iteration,
            "bytes": self.total_bytes,
            "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype,
                         "sources": [_piece_json(p) for p in t.recipe.pieces],
                         "transforms": t.recipe.transforms + (["cast"] if t.dtype != t.recipe.dtype else []),
                         "zero_rows": [list(b[0]) for b in t.recipe.fill]}
                        for t in self.tensors],
            "shards": [{"file": f, "tensors": len(names)} for f, names in self.shards],
            "copies": [name for _, name in self.copies],
            "dropped": self.dropped,
            "notes": self.notes,
            **({"adapter": {"dir": None if self.merge_lora else self.adapter.dir, "merged": self.merge_lora,
                            "config": self.adapter.config,
                            "tensors": [{"name": n, "source": s} for n, s in self.adapter.tensors]}}
               if self.adapter else {}),
        }


def _piece_json(piece) -> dict[str, Any]:
    return {"source": piece.source, "box": [list(b) for b in piece.src_box], "into": [list(b) for b in piece.dst_box]}


_DENSE_MLP = re.compile(r"(^|\.)layers\.\d+\.mlp\.(linear_fc[12]|gate_proj|up_proj|down_proj)\.")


def _unmapped_hint(unmapped: list[str], arch: str) -> str:
    """What to do about tensors no rule of ``arch`` maps, said for the layouts probes met: a dense MLP in some
    layers of an MoE model (Megatron ``moe_layer_freq``) whose arch has none (Qwen MoE's ``mlp_only_layers``
    maps them), learned absolute positions beside RoPE. "pass --arch" alone sent a user looking for an
    architecture that does not exist."""
    if all(_DENSE_MLP.search(name) for name in unmapped):
        return (f"dense MLP layers among the MoE layers (Megatron moe_layer_freq) have no place in {arch}, whose "
                f"layers are all MoE (Qwen2/3-MoE's mlp_only_layers can say them)")
    if any("position_embeddings" in name for name in unmapped):
        return f"learned absolute position embeddings have no place in {arch}, which uses RoPE"
    return "pass --arch or report the layout"


def _identity_view(tensors: dict, cfg: ModelConfig, arch: str) -> MappedView:
    from ckptscope.ops.diff.plan import identity_recipes  # HF -> HF only: a conversion does not import diff

    return MappedView("hf", arch, cfg, identity_recipes(tensors))


def _no_config_reason(src: Path) -> str:
    """Why no HF config was found: none at all, or a ``config.json`` that is no model config (a JSON
    array, a directory: said as such, not as a missing file)."""
    config = (src if src.is_dir() else src.parent) / "config.json"
    if not src.is_dir() and config.is_file():
        # a single file is read on its own: the config beside it may belong to another file (a probe read
        # "is not an HF model config" about a good one, next to DeepSpeed's save_16bit_model output)
        return f"a single file is converted without the {config.name} beside it (convert the directory {src.parent})"
    if config.is_dir():
        return f"{config} is a directory, not an HF config file"
    if config.is_file():
        return f"{config} is not an HF model config (no JSON object with model_type and hidden_size)"
    if (src / "transformer_config.json").is_file():  # verl's Megatron save: a TransformerConfig without vocab or RoPE
        return ("the source has no HF config.json, and its transformer_config.json (checked against --hf-config) lacks "
                "what one needs (vocabulary size, RoPE base, HF architecture)")
    return "the source has no HF config.json and no Megatron args to derive one from"


def _source_hf_config(index: CheckpointIndex) -> dict[str, Any] | None:
    for obj in index.objects:
        if isinstance(obj.value, dict) and "model_type" in obj.value and "hidden_size" in obj.value:
            return dict(obj.value)
    for key in ("hf_config", "huggingface_config"):
        if isinstance(index.metadata.get(key), dict):
            return dict(index.metadata[key])
    return None


GENERATION_CONFIG = "generation_config.json"
GENERATION_ARG = "hf_generation_config"
"""The Megatron args key an HF -> Megatron convert keeps ``generation_config.json`` under, beside
``hf_config_extra``: Megatron never reads either, and the way back writes the file again (a probe found
sampling settings and extra stop tokens lost in HF -> Megatron -> HF)."""


def _generation_config_file(src: Path, index: CheckpointIndex, hf_config_dir: Path | None) -> dict[str, Any] | None:
    """The HF source's ``generation_config.json`` (the first of ``_config_dirs``), or None. One that does
    not parse as a JSON object is not carried, with a warning: it is not the model's to refuse over."""
    for directory in _config_dirs(src, index, hf_config_dir):
        path = directory / GENERATION_CONFIG
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            index.warnings.append(f"{path}: not carried ({type(exc).__name__}: {exc})")
            return None
        if not isinstance(value, dict):
            index.warnings.append(f"{path}: not carried (a JSON {type(value).__name__}, not an object)")
            return None
        return value
    return None


def _carried_generation_config(index: CheckpointIndex) -> dict[str, Any] | None:
    """``hf_generation_config`` from a Megatron source's args, or None."""
    for obj in index.objects:
        value = obj.value
        if isinstance(value, dict) and value.get("__class__", "").endswith("Namespace"):
            carried = value.get(GENERATION_ARG)
            if isinstance(carried, dict):
                return {str(k): v for k, v in carried.items() if k != "__class__"}
    return None


def _config_dirs(src: Path, index: CheckpointIndex, hf_config_dir: Path | None) -> list[Path]:
    """Where tokenizer/generation files may live: --hf-config, the source dir, verl's huggingface/
    (``model/huggingface/`` in verl's Megatron layout v2)."""
    dirs = []
    if hf_config_dir is not None:
        dirs.append(hf_config_dir if hf_config_dir.is_dir() else hf_config_dir.parent)
    root = src if src.is_dir() else src.parent
    dirs += [root, root / "huggingface", root / "model" / "huggingface", root.parent / "huggingface"]
    return [d for d in dirs if d.is_dir()]


ACTIVATION_SCALE = ".activation_scale"
"""transformers' static FP8 (``activation_scheme: static``) keeps one input scale per linear under this name."""


def _dequantised(tensors: dict[str, TensorMeta], dtype: str, hf_cfg: dict | None,
                 src: Path) -> tuple[dict | None, list[str]]:
    """Block-scaled sources read as logical tensors are written dequantised, so a float ``--dtype`` is
    required: ``keep`` would write the float32 reading (four times the bytes). FP8 with ``keep`` never
    gets here (``ops.convert.fp8_keep`` moves payloads and scales as stored); MXFP4 has no kept path (its
    logical tensor is the transpose of the stored blocks). The written config loses its
    ``quantization_config``: transformers would otherwise load bf16 weights as FP8."""
    scaled = [n for n, t in tensors.items() if t.quantization]
    if not scaled:
        return hf_cfg, []
    schemes = ", ".join(sorted({str(tensors[n].attr("quant_scheme")) for n in scaled}))
    if dtype == "keep":
        raise CkptError(f"{plural(len(scaled), 'tensor is', 'tensors are')} block-scaled ({schemes}; first: {scaled[0]}): convert writes "
                        f"them dequantised, pass --dtype bfloat16 (or float32, float16); keeping the quantised "
                        f"blocks and scales is not supported", src)
    notes = [f"{plural(len(scaled), 'block-scaled tensor')} ({schemes}) dequantised exactly, then cast to {dtype}"]
    static = [n for n in tensors if n.endswith(ACTIVATION_SCALE)]
    for name in static:  # FP8 static activation scales: of no use to the dequantised model, unexpected keys in it
        del tensors[name]
    if static:
        notes.append(f"{plural(len(static), 'FP8 activation scale')} ({static[0]} ...) left out with the quantisation")
    if hf_cfg and "quantization_config" in hf_cfg:
        hf_cfg = {k: v for k, v in hf_cfg.items() if k != "quantization_config"}
        notes.append("config.json written without quantization_config (the weights are no longer quantised)")
    return hf_cfg, notes


def _fp8_scales_apart(tensors: dict[str, TensorMeta], block: tuple[int, int], dtype: str,
                      src: Path) -> tuple[dict[str, str], dict[str, TensorMeta]]:
    """The FP8 weights whose scales are separate model tensors (``ops.convert.fp8_keep``), taken out of
    ``tensors`` so the mappings see only the weights: weight name -> scale name, and both metas. Only
    ``--dtype keep`` converts them; a layout the readers do not fold (ckptscope's Megatron layout,
    scales split over TP ranks) is refused with another dtype rather than cast without its scales."""
    pairs = fp8_keep.fp8_pairs(tensors, block)
    if pairs and dtype != "keep":
        first = next(iter(pairs))
        raise CkptError(f"{first} is FP8 with its block scales stored apart ({pairs[first]}), a layout ckptscope "
                        f"reads only as stored: convert it with --dtype keep", src)
    metas = {n: tensors[n] for pair in pairs.items() for n in pair}
    for scale in pairs.values():
        del tensors[scale]
    return pairs, metas


def plan_convert(src: str | Path, dst: str | Path, **options: Any) -> ConvertPlan:
    """``_plan_convert`` (below), whose errors also name what is damaged in SRC: a save whose
    ``common.pt`` is missing fails for want of the model's shape, and saying only that would send
    the user looking for a config when the save itself did not finish."""
    try:
        return _plan_convert(src, dst, **options)
    except UnknownFormat:
        raise
    except CkptError as exc:
        damage = _damage(src, options.get("trust_pickle", False))
        if damage is None or damage in str(exc):
            raise
        raise CkptError(f"{exc.problem}; the checkpoint is damaged: {damage} (ckptscope check lists every "
                        f"problem)", exc.path) from None


_METADATA_SUFFIXES = (".yaml", ".yml", ".json", ".txt")


def _refuse_untied_lm_head(reader: CheckpointReader, entries: ModelEntries, src: Path) -> None:
    """An HF-named model whose config ties the embeddings keeps ``lm_head.weight`` only as the embedding's copy
    (FSDP / DCP / Trainer saves store it apart); one that differs was trained apart, and either export drops
    it (a probe: logits off by 0.6, exit 0): refused."""
    if not _same_values(reader, entries, "lm_head.weight", "model.embed_tokens.weight"):
        raise CkptError("the config ties lm_head to the embedding, but this model stores an lm_head.weight of its "
                        "own that differs from model.embed_tokens.weight: the export would drop the trained output "
                        "layer; pass an --hf-config with tie_word_embeddings false", src)


def _same_values(reader: CheckpointReader, entries: ModelEntries, a: str, b: str) -> bool:
    """Whether model tensors ``a`` and ``b`` hold the same bytes, read in blocks of rows (~64 MB): a
    Megatron save stores ``output_layer.weight`` beside tied word embeddings only as their copy (the
    last pipeline stage's), as FSDP / DCP / Trainer saves store ``lm_head.weight``; one that differs is an
    untied model whatever the config says."""
    meta_a, meta_b = entries.tensors.get(a), entries.tensors.get(b)
    if meta_a is None or meta_b is None:
        return meta_a is None  # nothing stored apart: nothing to lose
    if meta_a.shape != meta_b.shape or meta_a.dtype != meta_b.dtype:
        return False
    if meta_a.chunks == meta_b.chunks:  # one storage (a torch.save tie): the same bytes, nothing to read
        return True
    if not meta_a.shape:
        return reader.read(entries.stored[a]).tobytes() == reader.read(entries.stored[b]).tobytes()
    rows = meta_a.shape[0]
    step = max(1, (64 << 20) // max(1, meta_a.nbytes // max(1, rows)))
    for lo in range(0, rows, step):
        region = (slice(lo, min(rows, lo + step)),)
        if reader.read(entries.stored[a], region).tobytes() != reader.read(entries.stored[b], region).tobytes():
            return False
    return True


def _agrees_with_the_args(index: CheckpointIndex, hf_config: dict[str, Any], source: str, src: Path) -> None:
    """An HF config that describes another model than the Megatron args is refused: its values are the
    ones the export writes (RoPE base, norm epsilon, routing, tied head), so the trained model would
    come out another with exit 0."""
    args_cfg = megatron_config_from_index(index)
    if args_cfg is None:
        return
    conflicts = hf_config_conflicts(args_cfg, hf_config)
    if conflicts:
        raise CkptError(f"{source} describes another model than this checkpoint's Megatron args: "
                        f"{'; '.join(conflicts)}. The export would compute the config's model, not the trained "
                        f"one: fix the config", src)


def _refuse_damage(index: CheckpointIndex, entries: ModelEntries, src: Path) -> list[str]:
    """A damaged model is not exported: readers index what is there (a missing HF shard's tensors are
    absent, a missing Megatron rank's shards read as zeros, for inspect and check to show), and an
    export of that would be a smaller or zeroed model with exit 0. Damage confined to training state
    (an optimizer rank file) does not touch the model and is let through. Returns the warnings of what
    was let through that concerns the save as a whole (a damaged ``metadata.json``, Megatron's completion
    marker: the export goes on, and says so, where it used to say nothing; a probe)."""
    training = set(entries.training_tensors())
    passed: list[str] = []
    for issue in index.issues:
        if issue.kind == "unassembled-file":
            continue  # refused before, with its own reason
        if issue.kind == "args-mismatch":  # (a probe: rank 1 of another run's save exported beside rank 0, exit 0)
            raise CkptError(f"{issue.file}: {issue.detail} Not converted: its shards would be mixed into the model "
                            f"(`ckptscope check` lists every rank file)", src)
        if issue.kind == "unloadable-file":  # bytes no tensor owns: every tensor reads whole, the export is clean
            passed.append(f"{issue.file}: {issue.detail}; the files written are whole")
            continue
        if issue.tensors and all(name in training for name in issue.tensors):
            continue
        if issue.kind == "missing-state-file":  # an optimizer or RNG file a resume needs; the model is whole
            passed.append(f"{issue.file}: missing (training state; not part of the export)")
            continue
        if not issue.tensors and issue.file and issue.file.endswith(_METADATA_SUFFIXES):
            # a config or tracker file: what it leaves unknown is refused where it is needed
            passed.append(f"{issue.file}: {issue.detail}")
            continue
        where = f"{issue.file}: " if issue.file else ""
        raise CkptError(f"the checkpoint is damaged ({where}{issue.detail}); an export would lack or zero what it "
                        f"held: not converted (`ckptscope check` lists every problem)", src)
    found = metadata_problems(meta for name, meta in index.tensors.items() if name not in training)
    if found:
        raise CkptError(f"the checkpoint is damaged ({found[0].kind} in {found[0].tensor}: {found[0].detail}); an "
                        f"export would zero what no chunk holds: not converted (`ckptscope check` lists every "
                        f"problem)", src)
    return passed


REPLICA_CHECK_BYTES = 64 * 1024**2
"""Copies of a tensor every TP rank keeps are compared before an export up to this size each (norms, biases,
routers); larger ones (experts kept whole on every TP rank) are left to ``check``, which reads them all."""


def _refuse_diverged_replicas(reader: CheckpointReader, entries: ModelEntries, src: Path) -> None:
    """A Megatron per-rank TP save whose ranks hold different values of a tensor they all keep (a norm whose
    gradients were not reduced): the ranks ran different models, and an export would write rank 0's without
    a word (``check`` said ``replica-mismatch``; convert took rank 0's). Refused, naming the tensor."""
    training = set(entries.training_tensors())
    differing = [(name, chunk) for name, chunk in reader.differing_replicas(max_bytes=REPLICA_CHECK_BYTES)
                 if name not in training]
    if differing:
        name, chunk = differing[0]
        more = f" (and {len(differing) - 1} more)" if len(differing) > 1 else ""
        raise CkptError(f"the TP ranks disagree on {name!r}, which every rank keeps a copy of: {chunk.file}'s copy "
                        f"differs from {reader.index().tensors[name].chunks[0].file}'s{more}; the ranks ran different "
                        f"weights and an export would keep one: not converted (`ckptscope check` lists them)", src)


def _refuse_disagreeing_copies(reader: CheckpointReader, src: Path) -> None:
    """A DeepSpeed save whose fp32 masters disagree with the module's own copy: an optimizer file of another
    rank or save, whose masters an export would write (a probe: swapped TP rank files exported with every
    split weight's halves swapped, exit 0). Refused, naming the file."""
    found = reader.disagreeing_copies()
    if found:
        name, file, _ = found[0]
        more = f" (and {len(found) - 1} more files)" if len(found) > 1 else ""
        raise CkptError(f"{file}: its fp32 master of {name!r} differs from the module's own copy of it{more}: the "
                        "file belongs to another rank or another save; not converted (`ckptscope check` lists them)",
                        src)


def _damage(src: str | Path, trust_pickle: bool) -> str | None:
    """The first missing or unreadable file SRC's reader found, or None (or when SRC does not open)."""
    try:
        with open_checkpoint(resolve_root(src), trust_pickle=trust_pickle) as reader:
            issues = reader.index().issues
    except CkptError:
        return None
    found = next((i for i in issues if i.kind in ("missing-file", "unreadable-file")), None)
    if found is None:
        return None
    return f"{found.file}: {found.detail}" if found.file else found.detail


def _plan_convert(src: str | Path, dst: str | Path, *, to: str, tp: int = 1, pp: int = 1, ep: int = 1,
                 ckpt_format: str = "torch_dist", spec: str = "local", dtype: str = "keep",
                 hf_config: str | Path | None = None,
                 arch: str | None = None, max_shard_size: str | int = DEFAULT_SHARD,
                 trust_pickle: bool = False, skip_unknown: bool = False,
                 hf_experts: str = "per-expert", vocab_divisible_by: int | None = None,
                 merge_lora: bool = False) -> ConvertPlan:
    """Open SRC (metadata only), map its model to the target space and lay out the destination.

    ``merge_lora``: a PEFT-wrapped LoRA save's adapter is merged into the weights written (``execute``
    writes base + adapter to a temporary dir and merges them as ``lora merge`` does) instead of written apart.

    ``vocab_divisible_by``: Megatron's ``make_vocab_size_divisible_by`` for ``--to mcore`` when SRC does not
    say it (``verify`` passes its Megatron source's, so the vocabulary comes back padded as it was).

    Only the model is exported (``ops.model``): training state is left out and said so in the
    notes; entries that are neither refuse the conversion unless ``skip_unknown`` (then they are
    listed as dropped), so nothing reaches the output without a rule that put it there.
    """
    if to not in ("hf", "mcore"):
        raise CkptError(f"--to must be hf or mcore, not {to!r}")
    if dtype not in DTYPES:
        raise CkptError(f"--dtype must be one of {', '.join(DTYPES)}")
    if tp < 1 or pp < 1 or ep < 1:
        raise CkptError("--tp, --pp and --ep must be at least 1")
    if ep > 1 and (to != "mcore" or ckpt_format != "torch"):
        raise CkptError("--ep applies to --to mcore --ckpt-format torch (per-rank files); torch_dist files do not "
                        "depend on the parallel layout")
    if ckpt_format not in ("torch_dist", "torch"):
        raise CkptError("--ckpt-format must be torch_dist or torch")
    if spec not in ("local", "te"):
        raise CkptError("--spec must be local or te")
    if hf_experts not in HF_EXPERT_LAYOUTS:
        raise CkptError(f"--hf-experts must be one of {', '.join(HF_EXPERT_LAYOUTS)}")
    if hf_experts != "per-expert" and to != "hf":
        raise CkptError("--hf-experts applies to --to hf")
    src_path = Path(resolve_root(src))
    reader = open_checkpoint(src_path, trust_pickle=trust_pickle)
    index = reader.index()
    apart = [i for i in index.issues if i.kind == "unassembled-file"]
    if apart:  # files whose tensors the reader does not show: an export would silently lack them
        raise CkptError(f"{plural(len(apart), 'file')} of this checkpoint {'is' if len(apart) == 1 else 'are'} not "
                        f"assembled by ckptscope (first: {apart[0].file}, {apart[0].detail.split(':')[0]}); an export "
                        f"would lack their tensors", src_path)
    entries = model_entries(index, logical=True)
    warned = _refuse_damage(index, entries, src_path)
    _refuse_diverged_replicas(reader, entries, src_path)
    _refuse_disagreeing_copies(reader, src_path)
    several = index.metadata.get("accelerate_models")
    if several:  # exporting the first alone would drop the others without a word
        raise CkptError(f"an accelerate save_state of {len(several)} models ({', '.join(several)}): convert one "
                        f"of them by its file, e.g. {src_path / several[1]}", src_path)
    tensors = entries.tensors
    if not tensors:
        raise CkptError("no model tensors to convert", src_path)
    hf_cfg_dict = read_hf_config(Path(hf_config)) if hf_config else _source_hf_config(index)
    quantised = unhandled_quantization(_source_hf_config(index), tensors) or (
        unhandled_quantization(hf_cfg_dict, ()) if hf_config else None)
    if quantised:  # cast, mapped or re-laid out, packed words and codes would be written as weights
        raise CkptError(f"{quantised}: ckptscope reads such checkpoints as stored but cannot dequantise them, so "
                        f"an export would write the quantised values as weights; not converted", src_path)
    block = fp8_keep.config_block(hf_cfg_dict or _source_hf_config(index))
    if dtype == "keep" and {t.attr("quant_scheme") for t in tensors.values() if t.quantization} == {"fp8_block"}:
        reader.close()  # the logical index told us there is FP8 to keep: read it again as stored
        reader = open_checkpoint(src_path, trust_pickle=trust_pickle)
        reader.show_stored_quantization()
        index = reader.index()
        entries = model_entries(index, logical=True)
        tensors = entries.tensors
    fp8, fp8_metas = _fp8_scales_apart(tensors, block, dtype, src_path)
    wrapped = unwrap_peft(entries, index, src_path)
    adapter_notes: list[str] = []
    if merge_lora and wrapped is None:
        raise CkptError("--merge-lora: this checkpoint is not a model wrapped by PEFT for LoRA training (no "
                        "base_model.model.* weights with lora_A/lora_B beside them); for a saved adapter use "
                        "`ckptscope lora merge ADAPTER BASE OUT`", src_path)
    if wrapped is not None:
        if to != "hf":  # Megatron-Core's GPTModel has no adapter to load it into, and a merge is not verl's export
            raise CkptError("a model wrapped by PEFT for LoRA training converts to HF only (base weights + "
                            "lora_adapter/, as verl's model merger writes it); merge that with `ckptscope lora merge` "
                            "and convert the merged model to Megatron-Core", src_path)
        entries, adapter = wrapped
        tensors = entries.tensors
        adapter.dtype = None if dtype == "keep" else dtype
        if merge_lora:
            adapter_notes.append(f"PEFT-wrapped LoRA training state: the adapter ({adapter.describe()}) is merged into "
                                 f"the base weights (W + lora_alpha/r * B @ A, as PEFT's merge_and_unload; rounded "
                                 f"once to the weights' dtype)")
        else:
            adapter_notes.append(f"PEFT-wrapped LoRA training state: the base weights are the model (not merged, as "
                                 f"verl's model merger writes them); the adapter ({adapter.describe()}) goes to "
                                 f"{adapter.dir}/, and `ckptscope lora merge {Path(dst) / adapter.dir} {dst} OUT` "
                                 f"merges it (or convert with --merge-lora)")
        adapter_notes.append("lora_train_meta.json records r, lora_alpha and task_type only: a run that used rsLoRA "
                             "or per-module ranks or alphas (one started from a saved adapter) is not described by "
                             "it, and its export would compute another model")
    family = naming_family(tensors)
    if family not in ("hf", "mcore"):
        # before the unknown entries' refusal: its "pass --skip-unknown" hid that nothing would convert
        # (torchtitan 0.3's lm_head.weight read as unknown; a probe with torchtitan's own CheckpointManager)
        raise CkptError(_unmapped_naming(family, tensors, index), src_path)
    split_notes, split_dropped = _split_report(entries, skip_unknown, src_path)
    hf_cfg_dict, quant_notes = _dequantised(tensors, dtype, hf_cfg_dict, src_path)
    if fp8:
        quant_notes.append(fp8_keep.describe(len(fp8), block))
    cfg = config_from_index(index)
    if hf_cfg_dict:
        cfg = from_hf_config(hf_cfg_dict).merged(cfg)
    cfg = cfg.merged(config_from_names(shapes_of(tensors)))
    check_model_sizes(cfg, src_path)  # a size no model has would fail deep in the mappings or loop for ever
    notes: list[str] = list(split_notes) + quant_notes
    iteration = index.iteration or 0
    shapes = shapes_of(tensors)

    if to == "hf":
        if family == "mcore":
            view = map_to_hf(shapes, cfg, arch)
            notes.append(f"Megatron-Core names mapped to HF ({view.arch})")
        elif family == "hf" and has_fused_experts(tensors) and stores_per_expert(arch or detect_arch(tensors, cfg)):
            arch_name = arch or detect_arch(tensors, cfg)
            view = MappedView("hf", arch_name, cfg, unfuse(shapes, arch_name, hidden=cfg.hidden_size))
            notes.append("transformers v5 fused expert tensors read per expert")
        elif family == "hf":
            view = _identity_view(tensors, cfg, arch or cfg.arch or "llama")
            notes.append("HF names kept; shards merged into whole tensors")
        else:
            raise CkptError(_unmapped_naming(family, tensors, index), src_path)
        if view.unmapped:
            raise CkptError(f"{plural(len(view.unmapped), 'tensor matches', 'tensors match')} no {view.arch} rule "
                            f"(first: {view.unmapped[0]}); {_unmapped_hint(view.unmapped, view.arch)}")
        if family == "mcore":
            check_norm_convention(cfg, view.arch, src_path)
            problems = hf_export_problems(cfg, view.arch)
            if problems:  # the args describe a model the HF config would not compute
                raise CkptError(f"this Megatron model would not compute {view.arch}: " + "; ".join(problems), src_path)
        embedding = shapes.get("embedding.word_embeddings.weight") if family == "mcore" else None
        # The embedding's rows stand in for an unknown vocabulary only where the config says the rest (RoPE
        # base included: NeMo's model.yaml does; verl's transformer_config.json does not, and stays refused)
        stored_rows = embedding.shape[0] if embedding is not None and embedding.shape and cfg.rope_theta else None
        if hf_cfg_dict is None and cfg.vocab_size is None and (cfg.padded_vocab_size or stored_rows):
            # (NeMo 2.0's model.yaml leaves vocab_size null: NeMo takes it from the tokenizer at build time)
            said = "the Megatron args have only padded_vocab_size" if cfg.padded_vocab_size else \
                "the model config does not say it; the embedding has that many rows"
            cfg = ModelConfig(**{**cfg.to_dict(), "vocab_size": cfg.padded_vocab_size or stored_rows})
            # said on stderr, not only in --dry-run: the padding rows become tokens the model can emit (Megatron-LM
            # records vocab_size None when the tokenizer gives it; a probe's export said nothing)
            warned = warned + [
                f"the true vocabulary size is unknown ({said}): all {cfg.vocab_size} rows kept, padding included; "
                f"pass --hf-config DIR to strip the padding"]
        config_source = "--hf-config" if hf_config else "the HF config it carries"
        if hf_cfg_dict is None:
            if cfg.num_attention_heads and cfg.hidden_size and cfg.num_layers and cfg.vocab_size:
                hf_cfg_dict = to_hf_config(cfg.merged(ModelConfig(arch=view.arch)))
                notes.append("config.json derived from the Megatron args")
                config_source = "the config derived from the Megatron args"
            else:
                raise CkptError(_no_config_reason(src_path) + "; pass --hf-config DIR", src_path)
        if family == "mcore":
            _agrees_with_the_args(index, hf_cfg_dict, config_source, src_path)
        recipes = dict(view.recipes)
        dropped = list(split_dropped)
        tied = bool(hf_cfg_dict.get("tie_word_embeddings", cfg.tie_word_embeddings))
        if tied and "lm_head.weight" in recipes:
            if family == "mcore" and not _same_values(reader, entries, "output_layer.weight",
                                                      "embedding.word_embeddings.weight"):
                raise CkptError("the config ties lm_head to the embedding, but this Megatron model stores an "
                                "output layer of its own (output_layer.weight differs from the word embeddings): "
                                "the export would drop the trained output layer; set tie_word_embeddings false",
                                src_path)
            if family == "hf":
                _refuse_untied_lm_head(reader, entries, src_path)
            del recipes["lm_head.weight"]  # P7c: both keys written and transformers refuses to re-tie
            dropped.append("lm_head.weight")
            notes.append("tied embeddings: lm_head.weight not written (it is model.embed_tokens.weight)")
        if not tied and "lm_head.weight" not in recipes and "model.embed_tokens.weight" in recipes \
                and "score.weight" not in recipes:  # a classification model's head is its score
            raise CkptError("the config says untied embeddings but the source has no output layer; "
                            "check tie_word_embeddings")
        problems = hf_shape_problems(hf_cfg_dict, {n: r.shape for n, r in recipes.items()})
        if problems:
            source = "--hf-config" if hf_config else ("the source's config.json" if _source_hf_config(index) else
                                                     "the config derived from the Megatron args")
            raise CkptError(f"the tensors do not fit {source}: {'; '.join(problems)}"
                            + ("" if hf_config else "; pass --hf-config DIR"), src_path)
        if hf_experts == "fused":
            if fp8:  # checked on CPU only, where transformers 5.24 drops fused gate_up_proj_scale_inv as unexpected
                raise CkptError("--hf-experts fused with the FP8 weights kept: transformers does not load fused "
                                "expert scales on CPU (the experts would load unscaled); keep the per-expert "
                                "layout or pass --dtype bfloat16", src_path)
            if not any(".experts." in name for name in recipes):
                raise CkptError("--hf-experts fused: this model has no routed experts", src_path)
            recipes = fuse(recipes, view.arch)
            notes.append("experts written as transformers v5 fused tensors (mlp.experts.gate_up_proj / down_proj)")
        if fp8:
            recipes = fp8_keep.with_scales(recipes, fp8, fp8_metas, block)
            hf_cfg_dict, kept_notes = fp8_keep.hf_config_keeping_fp8(hf_cfg_dict, block)
            notes += kept_notes
        recipes = entries.to_stored(recipes)
        out = [OutputTensor(n, r.shape, r.dtype if dtype == "keep" else dtype, r) for n, r in recipes.items()]
        caveats = warned + adapter_notes + (HF_EXPORT_NOTES[view.arch](from_hf_config(hf_cfg_dict))
                                            if family == "mcore" and view.arch in HF_EXPORT_NOTES else [])
        plan = ConvertPlan(str(src), str(dst), "hf", reader, out, cfg, view.arch, hf_config=hf_cfg_dict,
                           iteration=iteration, notes=notes + caveats + view_notes(view), caveats=caveats,
                           dropped=dropped + view.ignored, adapter=wrapped[1] if wrapped else None,
                           merge_lora=merge_lora)
        plan.shards = _shard(out, parse_size(max_shard_size))
        plan.copies = _copies(src_path, index, Path(hf_config) if hf_config else None)
        if family == "mcore" and GENERATION_CONFIG not in {name for _, name in plan.copies}:
            plan.generation_config = _carried_generation_config(index)
            if plan.generation_config is not None:
                plan.notes.append(f"{GENERATION_CONFIG} written from the Megatron args (hf_generation_config)")
        return plan

    # --- to Megatron-Core ---
    if family == "mcore":
        hf_view = map_to_hf(shapes, cfg, arch)
        if hf_view.unmapped:
            raise CkptError(f"{plural(len(hf_view.unmapped), 'tensor matches', 'tensors match')} no {hf_view.arch} rule "
                            f"(first: {hf_view.unmapped[0]})")
        arch_name = hf_view.arch
        check_norm_convention(cfg, arch_name, src_path)
        source_space = {n: r for n, r in hf_view.recipes.items()}
    elif family == "hf":
        arch_name = arch or cfg.arch or None
        source_space = None
        if cfg.tie_word_embeddings and "lm_head.weight" in tensors and "model.embed_tokens.weight" in tensors:
            # torch.save keeps both keys of a tied model (one storage); transformers re-ties on load
            # and ignores the stored lm_head, so Megatron's shared embedding is the whole truth.
            shared = tensors["lm_head.weight"].attr("shares_storage_with") == entries.stored["model.embed_tokens.weight"]
            _refuse_untied_lm_head(reader, entries, src_path)
            del tensors["lm_head.weight"]
            shapes = shapes_of(tensors)
            notes.append("tied embeddings: lm_head.weight " + ("shares the embedding's storage; not written" if shared
                         else "is stored apart but the config ties it (transformers ignores it on load); not written"))
        if has_fused_experts(tensors):  # read per expert, then composed back onto the fused tensors
            arch_name = arch_name or detect_arch(tensors, cfg)
            source_space = unfuse(shapes, arch_name, hidden=cfg.hidden_size)
            notes.append("transformers v5 fused expert tensors read per expert")
    else:
        raise CkptError(_unmapped_naming(family, tensors, index), src_path)
    if cfg.vocab_size is None:
        raise CkptError("the vocabulary size is unknown" + (" (the Megatron args have only padded_vocab_size)"
                        if cfg.padded_vocab_size else "") + "; pass --hf-config DIR", src_path)
    divisible = cfg.make_vocab_size_divisible_by or vocab_divisible_by or 128
    padded = padded_vocab(cfg.vocab_size, divisible, tp)
    cfg_out = ModelConfig(**{**cfg.to_dict(), "padded_vocab_size": padded})
    if source_space is None:
        view = map_to_mcore(shapes, cfg_out, arch_name, local_spec=_local_names(ckpt_format, spec, arch_name))
    else:  # Megatron -> Megatron (re-shard / re-format): go through the HF space, composing recipes
        hf_shapes = {n: TensorShape(r.shape, r.dtype) for n, r in source_space.items()}
        view = map_to_mcore(hf_shapes, cfg_out, arch_name, local_spec=_local_names(ckpt_format, spec, arch_name))
        view.recipes = {n: compose(r, source_space) for n, r in view.recipes.items()}
    if view.unmapped:
        if any(name.startswith("score.") for name in view.unmapped):  # a reward model, verl's critic
            raise CkptError("score.weight is the head of a sequence/token classification model (a reward model, a "
                            "value model such as verl's critic): Megatron-Core's GPTModel has no such head, so it "
                            "is not converted to Megatron (--to hf exports it whole)", src_path)
        raise CkptError(f"{plural(len(view.unmapped), 'tensor matches', 'tensors match')} no {view.arch} rule "
                        f"(first: {view.unmapped[0]})", src_path)
    cfg_out = cfg_out.merged(ModelConfig(arch=view.arch, mtp_num_layers=view.config.mtp_num_layers))
    if view.arch == "llama":  # (GPT-OSS's biases are its own: its args hook writes them)
        cfg_out = _with_linear_bias(cfg_out, view.recipes, src_path)
    if cfg_out.tie_word_embeddings is None:
        cfg_out = ModelConfig(**{**cfg_out.to_dict(), "tie_word_embeddings": "output_layer.weight" not in view.recipes})
    if ep > 1 and (not cfg_out.num_experts or cfg_out.num_experts % ep):
        raise CkptError(f"--ep {ep} needs a MoE model whose expert count it divides "
                        f"(this one has {cfg_out.num_experts or 'no'} experts)")
    problems = parallel_problems(cfg_out, tp=tp, pp=pp, ep=ep)
    if problems:
        raise CkptError("; ".join(problems), src_path)
    args = to_megatron_args(cfg_out, tp=tp, pp=pp, ep=ep, ckpt_format=ckpt_format,
                            make_vocab_size_divisible_by=divisible)
    if pp > 1 and cfg_out.num_layers:
        # torch_dist stores the layers whole, but its args must name a split megatron-core can build: the torch
        # writer refused 3 layers over 2 stages while torch_dist wrote those args (a probe)
        from ckptscope.formats.megatron.model_layout import pipeline_layer_ranges

        pipeline_layer_ranges(cfg_out.num_layers, pp, args)
    args["iteration"] = iteration
    generation = (_generation_config_file(src_path, index, Path(hf_config) if hf_config else None)
                  if family == "hf" else _carried_generation_config(index))
    if generation is not None:  # the way back to HF writes it again (Megatron itself never reads it)
        args[GENERATION_ARG] = generation
        notes.append(f"{GENERATION_CONFIG} carried in the Megatron args ({GENERATION_ARG})")
    if arch_name in MLA_ARCHS or view.arch in MLA_ARCHS:  # MLA's down projections split by spec (legacy_layout)
        args["transformer_impl"] = "local" if spec == "local" else "transformer_engine"
    caveats = warned + (EXPORT_NOTES[view.arch](cfg_out) if view.arch in EXPORT_NOTES else [])
    notes += caveats
    recipes = view.recipes
    if fp8:
        recipes = fp8_keep.with_scales(recipes, fp8, fp8_metas, block)
        fp8_keep.check_tp_splits(recipes, args, tp, block)
        notes.append(fp8_keep.MEGATRON_NOTE)
    out = [OutputTensor(n, r.shape, r.dtype if dtype == "keep" else dtype, r)
           for n, r in entries.to_stored(recipes).items()]
    if dtype != "keep":
        args["bf16"], args["fp16"] = dtype == "bfloat16", dtype == "float16"
    return ConvertPlan(str(src), str(dst), "mcore", reader, out, cfg_out, view.arch, megatron_args=args,
                       ckpt_format=ckpt_format, tp=tp, pp=pp, ep=ep, spec=spec, iteration=iteration,
                       notes=notes + view_notes(view) + [
                           f"vocabulary {cfg.vocab_size} padded to {padded} rows" if padded != cfg.vocab_size else
                           f"vocabulary {cfg.vocab_size}: a multiple of {divisible} x TP {tp}, no padding rows"],
                       caveats=caveats,
                       dropped=split_dropped + view.ignored)


_LINEAR_BIASES = (".self_attention.linear_proj.bias", ".mlp.linear_fc1.bias", ".mlp.linear_fc2.bias")


def _with_linear_bias(cfg: ModelConfig, recipes: dict[str, Recipe], src: Path) -> ModelConfig:
    """``add_bias_linear`` from the tensors the export writes: Megatron-Core puts a bias on every linear or on
    none (q/k/v aside, ``add_qkv_bias``). A model with biases on some linears only (HF Llama with
    ``attention_bias`` but not ``mlp_bias``, or the reverse) has no Megatron spelling: its output-projection
    bias would be written for a model that has none (megatron-core ignores the key on load), so refused."""
    found = {suffix for suffix in _LINEAR_BIASES if any(name.endswith(suffix) for name in recipes)}
    if not found:
        return cfg if not cfg.linear_bias else replace(cfg, linear_bias=False)
    if len(found) < len(_LINEAR_BIASES):
        have = ", ".join(s.rsplit(".", 2)[-2] for s in sorted(found))
        raise CkptError(f"only some linears have biases ({have}): Megatron-Core's add_bias_linear puts one on every "
                        "linear or on none, so no Megatron model computes this one (HF Llama with attention_bias but "
                        "not mlp_bias, or the reverse); not converted", src)
    return replace(cfg, linear_bias=True, qkv_bias=True)


def check_norm_convention(cfg: ModelConfig, arch: str, src: Path) -> None:
    """Refuse a Megatron source whose norm convention differs from the target arch's.

    Gemma's HF norms compute ``x * (1 + w)``; Megatron-Core does so only with zero-centred gamma
    (``apply_layernorm_1p``). Copying the weights across conventions would add or drop 1.0 on every
    norm without a trace, so the args must say the same as the arch (MAPPING.md P2: such a model
    still round-trips bit-exactly). Rewriting the values by 1.0 is not offered: it is not exact in
    bf16, and a checkpoint that trained as one convention is rarely meant as the other.
    """
    wants = arch in ZERO_CENTRED_NORM
    has = cfg.zero_centered_norm
    if wants and has is not True:
        said = "do not record it" if has is None else "say apply_layernorm_1p=False"
        raise CkptError(f"{arch} stores zero-centred norm weights (x * (1 + w)), but this Megatron checkpoint's "
                        f"args {said}: its norms would be off by 1.0 in HF. Convert only a checkpoint trained with "
                        f"--apply-layernorm-1p (layernorm_zero_centered_gamma)", src)
    if not wants and has:
        raise CkptError(f"this Megatron checkpoint was trained with zero-centred norms (apply_layernorm_1p) but "
                        f"{arch}'s HF norms are not: its norms would be off by 1.0; pass the right --arch", src)
    problems = MEGATRON_CHECKS[arch](cfg) if arch in MEGATRON_CHECKS else []
    if problems:  # the arch computes something its Megatron args do not describe (GPT-OSS's activation)
        raise CkptError(f"this Megatron checkpoint would not compute {arch}: " + "; ".join(problems), src)


def _split_report(entries: ModelEntries, skip_unknown: bool, src: Path) -> tuple[list[str], list[str]]:
    """Notes and dropped names for what is not exported; refuses unknown entries and name clashes."""
    if entries.split.collisions:
        model_name, first, second = entries.split.collisions[0]
        raise CkptError(f"{first} and {second} are both the model's {model_name} once wrappers are removed", src)
    notes, dropped = [], []
    if entries.prefix:
        notes.append(f"model found under {entries.prefix!r}; exported without it")
    if entries.training:
        kinds = ", ".join(f"{kind} {len(names)}" for kind, names in entries.training.items())
        notes.append(f"training state left out ({kinds} tensors)")
    if entries.unknown:
        first = next(iter(entries.unknown))
        if not skip_unknown:
            raise CkptError(f"{plural(len(entries.unknown), 'entry is', 'entries are')} neither model weights ({entries.naming} names"
                            f"{' under ' + repr(entries.prefix) if entries.prefix else ''}) nor known training "
                            f"state (first: {first}); pass --skip-unknown to leave them out", src)
        notes.append(f"{plural(len(entries.unknown), 'unknown entry', 'unknown entries')} left out (first: {first})")
        dropped += list(entries.unknown)
    return notes, dropped


def _unmapped_naming(family: str, tensors: dict, index: CheckpointIndex | None = None) -> str:
    example = next(iter(tensors), "")
    if family == "torchtitan":
        return (f"torchtitan names ({example}, ...) have no HF or Megatron-Core mapping in ckptscope yet; export "
                f"them with torchtitan's HF state-dict adapter (last_save_in_hf) and convert that")
    if index is not None and index.format == "peft":
        return (f"a PEFT adapter ({example}, ...) is not a model to convert: `ckptscope lora merge ADAPTER BASE OUT` "
                f"merges it into its base model, which converts")
    lora = next((name for name in tensors if ".lora_A." in name or ".lora_B." in name), None)
    if lora is not None and all(map(is_lora_tensor, tensors)):
        # verl's checkpoint.save_lora_only: the shards hold the adapter and no base weights (a probe with verl 0.9.1)
        return (f"an adapter-only LoRA save ({len(tensors)} lora_A/lora_B tensors, first {lora}; verl's "
                f"checkpoint.save_lora_only): it holds no base weights, so there is no model to convert. verl's model "
                f"merger writes it as lora_adapter/ (r and lora_alpha from lora_train_meta.json); then `ckptscope lora "
                f"merge lora_adapter/ BASE OUT` merges it into the HF model training started from")
    if lora is not None:
        # a model wrapped by PEFT during training (verl's LoRA saves: base_model.model.<name>, .base_layer, lora_A/B)
        return (f"a model wrapped by PEFT for LoRA training ({lora}, ...): its base weights and adapter are "
                f"stored together, and ckptscope does not unwrap or merge them from training shards yet; export the "
                f"adapter with PEFT (verl's model merger writes base weights and lora_adapter/), then "
                f"`ckptscope lora merge ADAPTER BASE OUT` merges it into its base model, which converts")
    if example.startswith("base_model.model."):
        return (f"a model wrapped by PEFT ({example}, ...): ckptscope does not unwrap PEFT-wrapped training state; "
                f"save the model or its adapter with PEFT's own save_pretrained and convert that")
    architectures = index.metadata.get("architectures") if index is not None else None
    if isinstance(architectures, list) and architectures:
        return (f"{architectures[0]} (tensor names {example}, ...) has no HF <-> Megatron-Core mapping in ckptscope; "
                f"`ckptscope archs` lists the architectures that have one")
    return (f"the model's tensor names ({example}, ...) are neither HF transformers nor Megatron-Core names; "
            f"ckptscope has no mapping for them")


def compose(outer: Recipe, inner: dict[str, Recipe]) -> Recipe:
    """A recipe over ``inner``'s destinations, rewritten over ``inner``'s sources (block algebra only)."""
    pieces = []
    for piece in outer.pieces:
        mid = inner[piece.source]
        for sub in mid.pieces:
            # intersect piece.src_box (in mid's space) with sub.dst_box
            lo_hi = []
            for (a0, a1), (b0, b1) in zip(piece.src_box, sub.dst_box):
                lo, hi = max(a0, b0), min(a1, b1)
                if lo >= hi:
                    break
                lo_hi.append((lo, hi))
            else:
                box = tuple(lo_hi)
                pieces.append(Piece(map_box(box, piece.src_box, piece.dst_box), sub.source,
                                    map_box(box, sub.dst_box, sub.src_box)))
    return Recipe(outer.name, outer.shape, outer.dtype, pieces, outer.transforms, fill=outer.fill)


def _local_names(ckpt_format: str, spec: str, arch: str | None) -> bool:
    """Whether the Megatron names are the local spec's. Per-rank files always use them with ``--spec local``;
    torch_dist stores the local spec's norms under the TE names (its keys map), except for MLA, whose local
    spec has no keys map (mappings/deepseek.py), so there the spelling follows ``--spec`` too."""
    return spec == "local" and (ckpt_format == "torch" or arch in MLA_ARCHS)


def view_notes(view: MappedView) -> list[str]:
    skipped = sum(1 for n in view.ignored if is_ignored(n))  # the rest: copies the target keeps once (view.notes)
    return ([f"{plural(skipped, 'non-value entry', 'non-value entries')} skipped (_extra_state, inv_freq)"]
            if skipped else []) + view.notes


def _shard(tensors: list[OutputTensor], limit: int) -> list[tuple[str, list[str]]]:
    groups: list[list[str]] = [[]]
    size = 0
    for t in tensors:
        if groups[-1] and size + t.nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(t.name)
        size += t.nbytes
    if len(groups) == 1:
        return [("model.safetensors", groups[0])]
    n = len(groups)
    return [(f"model-{i + 1:05d}-of-{n:05d}.safetensors", g) for i, g in enumerate(groups)]


def _copies(src: Path, index: CheckpointIndex, hf_config_dir: Path | None) -> list[tuple[Path, str]]:
    out: dict[str, Path] = {}
    for directory in _config_dirs(src, index, hf_config_dir):
        for name in TOKENIZER_FILES:
            candidate = directory / name
            if name not in out and candidate.is_file():
                out[name] = candidate
    return [(path, name) for name, path in out.items()]
