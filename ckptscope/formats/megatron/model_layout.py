"""What the Megatron-Core writers (dist_writer.py, legacy_writer.py) know about a GPTModel, dense or MoE: tensor
names, TP layouts, pipeline stages, and turning a produced tensor into bytes.

Kept apart from the writers so both formats check the tensor list the same way, before anything is
produced or written: a bad name, a missing layer or a shape that does not split over TP is one
clear ``CkptError`` up front rather than a half-written checkpoint. Facts: MAPPING.md §1.2–1.5
(names, ``_extra_state``, tied embeddings), §3–§4 (TP dims, SwiGLU), §5.1 (pipeline stages), §6
(MoE: router, SequentialMLP ``local_experts.{e}``, shared experts; every layer a MoE layer).
torch and numpy are imported only inside the functions that need them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptscope.core.dtypes import DType, dtype_by_name
from ckptscope.core.errors import CkptError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

Progress = Callable[[int], None]
"""``progress(nbytes)``: called once per ``OutTensor`` after it is written, with its full size in bytes."""


@dataclass
class OutTensor:
    """One full (TP=1) Megatron-Core tensor to write.

    ``name`` is the global GPTModel name, per layer (``decoder.layers.3.mlp.linear_fc1.weight``),
    norms spelled as the TE spec does (``self_attention.linear_qkv.layer_norm_weight``; the local
    spec's ``input_layernorm.weight`` / ``pre_mlp_layernorm.weight`` are accepted too). fc1 is
    ``[gate; up]``, qkv grouped-interleaved, the vocab already padded. ``produce`` returns the values
    (a numpy array, or a torch tensor) and is called once, when the writer needs them.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    produce: Callable[[], np.ndarray]
    runs: Callable[[], list[tuple[Path, int, int]] | None] | None = None
    """Optional: the tensor's bytes (C order, ``dtype``) as file byte runs to concatenate, or None
    when they are not stored that way. The torch_dist writer then copies them file to file
    (``formats.filefill``) instead of calling ``produce``."""


LAYERS = "decoder.layers."
EXTRA = "._extra_state"
SPECS = ("local", "te")
REPLICATED, COLUMN, ROW, GLU = "replicated", "column", "row", "glu"

TOP_LAYOUT: dict[str, str] = {
    "embedding.word_embeddings.weight": COLUMN,
    "embedding.position_embeddings.weight": REPLICATED,
    "decoder.final_layernorm.weight": REPLICATED,
    "decoder.final_layernorm.bias": REPLICATED,
    "output_layer.weight": COLUMN,
}
LAYER_LAYOUT: dict[str, str] = {  # canonical (TE) per-layer names; fc1 is GLU when args say swiglu
    "self_attention.linear_qkv.layer_norm_weight": REPLICATED,
    "self_attention.linear_qkv.layer_norm_bias": REPLICATED,
    "self_attention.linear_qkv.weight": COLUMN,
    "self_attention.linear_qkv.bias": COLUMN,
    "self_attention.linear_proj.weight": ROW,
    "self_attention.linear_proj.bias": REPLICATED,
    "self_attention.q_layernorm.weight": REPLICATED,
    "self_attention.q_layernorm.bias": REPLICATED,
    "self_attention.k_layernorm.weight": REPLICATED,
    "self_attention.k_layernorm.bias": REPLICATED,
    "mlp.linear_fc1.layer_norm_weight": REPLICATED,
    "mlp.linear_fc1.layer_norm_bias": REPLICATED,
    "mlp.linear_fc1.weight": COLUMN,
    "mlp.linear_fc1.bias": COLUMN,
    "mlp.linear_fc2.weight": ROW,
    "mlp.linear_fc2.bias": REPLICATED,
    # Gemma 2/3 sandwich norms: Megatron-Bridge's TERowParallelLinearLayerNorm keeps a full norm inside the
    # row-parallel linear (src/megatron/bridge/models/gemma/modules.py), so they are replicated
    "self_attention.linear_proj.post_layernorm.weight": REPLICATED,
    "mlp.linear_fc2.post_layernorm.weight": REPLICATED,
    # multi-latent attention (megatron-core multi_latent_attention.py). The TE spec builds the down projections
    # as ``TELinear(parallel_mode="duplicated")``: whole on every TP rank; the up projections and the
    # single ``linear_q_proj`` are column-parallel; the latent norms are fused into the up projections (TE)
    # or the ``q_layernorm`` / ``kv_layernorm`` modules (local spec), replicated either way
    "input_layernorm.weight": REPLICATED,
    "self_attention.linear_q_proj.weight": COLUMN,
    "self_attention.linear_q_down_proj.weight": REPLICATED,
    "self_attention.linear_q_up_proj.weight": COLUMN,
    "self_attention.linear_q_up_proj.layer_norm_weight": REPLICATED,
    "self_attention.linear_kv_down_proj.weight": REPLICATED,
    "self_attention.linear_kv_up_proj.weight": COLUMN,
    "self_attention.linear_kv_up_proj.layer_norm_weight": REPLICATED,
    "self_attention.kv_layernorm.weight": REPLICATED,
    # GPT-OSS's attention sinks: DotProductAttention's learnable softmax offset, one per head, so split
    # over TP like the heads (its sharded_state_dict shards axis 0)
    "self_attention.core_attention.softmax_offset": COLUMN,
}
MLA_LINEARS = ("self_attention.linear_q_proj", "self_attention.linear_q_down_proj", "self_attention.linear_q_up_proj",
               "self_attention.linear_kv_down_proj", "self_attention.linear_kv_up_proj", "self_attention.linear_proj")
MLA_DOWN = ("self_attention.linear_q_down_proj.weight", "self_attention.linear_kv_down_proj.weight")
MTP = "mtp.layers."
MTP_LAYER = "transformer_layer."
MTP_LAYOUT: dict[str, str] = {  # megatron-core multi_token_prediction.py, MultiTokenPredictionLayer
    "enorm.weight": REPLICATED,
    "hnorm.weight": REPLICATED,
    "eh_proj.weight": COLUMN,  # column_parallel_linear, gather_output=False
    "final_layernorm.weight": REPLICATED,
}
LOCAL_TO_TE = {"input_layernorm.": "self_attention.linear_qkv.layer_norm_",
               "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}
"""The local spec's ``sharded_state_dict_keys_map``: its norms go to torch_dist under the TE names."""
LINEARS = ("self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1", "mlp.linear_fc2")
"""Layer modules with an ``_extra_state`` in both specs (mcore's own linears return None, TE's a tensor)."""

# --- MoE layers (MAPPING.md §6; checked on disk with megatron-core 0.16.1, local spec) ---
MOE_NORM = "pre_mlp_layernorm."
"""A MoE layer's norm is its own module in both specs (TE cannot fuse it into the router). The local
spec still applies its keys map, so torch_dist stores it as ``mlp.linear_fc1.layer_norm_*``; the TE
spec stores ``pre_mlp_layernorm.*``; per-rank ``torch`` files hold ``pre_mlp_layernorm.*`` in both."""
MOE_LAYER_LAYOUT: dict[str, str] = {
    "pre_mlp_layernorm.weight": REPLICATED,
    "pre_mlp_layernorm.bias": REPLICATED,
    "mlp.router.weight": REPLICATED,
    "mlp.router.bias": REPLICATED,  # with add_bias_linear (GPT-OSS)
    "mlp.router.expert_bias": REPLICATED,  # fp32 buffer, only with moe_router_enable_expert_bias
    "mlp.shared_experts.gate_weight": REPLICATED,  # [1, H], Qwen2-MoE's sigmoid gate
    "mlp.shared_experts.linear_fc1.weight": COLUMN,  # an MLP on the TP group: [gate; up] like a dense fc1
    "mlp.shared_experts.linear_fc2.weight": ROW,
}
EXPERTS = "mlp.experts.local_experts."
"""SequentialMLP experts: ``mlp.experts.local_experts.{e}.linear_fc1.weight`` ([gate; up]) / ``linear_fc2``."""
EXPERT_LAYOUT: dict[str, str] = {"linear_fc1.weight": COLUMN, "linear_fc2.weight": ROW,
                                 "linear_fc1.bias": COLUMN, "linear_fc2.bias": REPLICATED}  # biases: GPT-OSS
"""Split over the expert TP group (``expert_tensor_parallel_size``, which defaults to TP)."""
DIST_EXPERTS = "mlp.experts.experts."
"""torch_dist stacks every expert of a layer under one key with an expert axis after the layer axis
(``[L, E, ...]``), SequentialMLP and grouped GEMM alike (FORMATS.md §4.5)."""
MOE_PREFIXES = ("mlp.router.", "mlp.experts.", "mlp.shared_experts.")


def is_heterogeneous(args: dict[str, Any]) -> bool:
    """Layers that are not all alike (megatron-core ``TransformerBlock.sharded_state_dict``'s
    ``non_homogeneous_layers``): a ``moe_layer_freq`` list or one above 1, MTP layers, or MLA (whose
    names this writer takes verbatim: its two specs spell the latent norms differently, and the
    mapping already chose). torch_dist then keys every layer on its own, with no layer axis."""
    freq = args.get("moe_layer_freq")
    return (isinstance(freq, (list, tuple)) or (isinstance(freq, int) and freq > 1)
            or bool(args.get("mtp_num_layers")) or bool(args.get("multi_latent_attention")))


def _split_indexed(name: str, prefix: str) -> tuple[int, str] | None:
    """``{prefix}3.x.y`` -> ``(3, "x.y")``; None when ``name`` is not so."""
    if not name.startswith(prefix):
        return None
    index, _, rest = name[len(prefix):].partition(".")
    return (int(index), rest) if index.isdigit() and rest else None


def split_mtp(name: str) -> tuple[str, str] | None:
    """``mtp.layers.0.transformer_layer.x.y`` -> ``("mtp.layers.0.", "transformer_layer.x.y")``; None otherwise."""
    split = _split_indexed(name, MTP)
    return (f"{MTP}{split[0]}.", split[1]) if split else None


def is_gated(args: dict[str, Any]) -> bool:
    """fc1 is ``[gate; up]`` (split per TP rank as two halves): Megatron-LM's ``--swiglu``, or a gated
    MLP with another activation (``gated_linear_unit``, e.g. Gemma's GeGLU as Megatron-Bridge sets it)."""
    return bool(args.get("swiglu") or args.get("gated_linear_unit"))


def split_layer(name: str) -> tuple[int, str] | None:
    """``decoder.layers.3.x.y`` -> ``(3, "x.y")``; None for a top-level name."""
    return _split_indexed(name, LAYERS)


def te_sub(sub: str) -> str:
    """A per-layer name in the TE spelling (local-spec norm names translated)."""
    for local, te in LOCAL_TO_TE.items():
        if sub.startswith(local):
            return te + sub[len(local):]
    return sub


def spec_sub(sub: str, spec: str) -> str:
    """Canonical (TE) per-layer name -> the name ``spec``'s modules use in ``state_dict()``. A MoE
    layer's canonical norm is ``pre_mlp_layernorm.*`` already, the same in both specs."""
    if spec == "local":
        for local, te in LOCAL_TO_TE.items():
            if sub.startswith(te):
                return local + sub[len(te):]
    return sub


def canonical_sub(sub: str, moe: bool) -> str:
    """A per-layer name in the writers' canonical spelling: TE names, except that a MoE layer's norm
    is ``pre_mlp_layernorm.*`` (its local-spec torch_dist spelling ``mlp.linear_fc1.layer_norm_*`` is
    accepted too)."""
    if not moe:
        return te_sub(sub)
    fused = LOCAL_TO_TE[MOE_NORM]
    if sub.startswith(fused):
        return MOE_NORM + sub[len(fused):]
    return sub if sub.startswith(MOE_NORM) else te_sub(sub)


def split_expert(sub: str) -> tuple[int, str] | None:
    """``mlp.experts.local_experts.3.linear_fc1.weight`` -> ``(3, "linear_fc1.weight")``; None otherwise."""
    if not sub.startswith(EXPERTS):
        return None
    index, _, rest = sub[len(EXPERTS):].partition(".")
    if not index.isdigit() or not rest:
        return None
    return int(index), rest


def _is_moe_sub(sub: str) -> bool:
    return sub.startswith(MOE_PREFIXES)


def _layer_layout(sub: str) -> str | None:
    if sub.endswith("_scale_inv"):  # kept FP8 block scales split as their weight (ops/convert/fp8_keep.py)
        return _layer_layout(sub.removesuffix("_scale_inv"))
    expert = split_expert(sub)
    if expert is not None:
        return EXPERT_LAYOUT.get(expert[1])
    return MOE_LAYER_LAYOUT.get(sub) or LAYER_LAYOUT.get(sub)


def _is_fc1(sub: str) -> bool:
    parts = sub.split(".")
    return len(parts) >= 2 and parts[-2] == "linear_fc1"


def check_spec(spec: str) -> None:
    if spec not in SPECS:
        raise CkptError(f"unknown Megatron layer spec {spec!r} (expected one of: {', '.join(SPECS)})")


@dataclass
class Entry:
    """One validated ``OutTensor`` and its place in the model."""

    out: OutTensor
    dtype: DType
    layer: int | None
    """Global layer index; None for top-level tensors."""
    sub: str
    """Canonical name: the per-layer suffix (TE spelling, ``canonical_sub``), or the top-level name."""
    layout: str
    expert: int | None = None
    """Global expert id of a routed expert's tensor; None for everything else."""
    expert_sub: str = ""
    """The expert's own suffix (``linear_fc1.weight``) when ``expert`` is set."""
    owner: str = ""
    """Heterogeneous models: the name up to the layer (``decoder.layers.3.``,
    ``mtp.layers.0.transformer_layer.``, ``mtp.layers.0.``); ``sub`` follows it."""

    @property
    def nbytes(self) -> int:
        numel = 1
        for size in self.out.shape:
            numel *= size
        return self.dtype.nbytes(numel)


@dataclass
class ModelTensors:
    entries: list[Entry]
    num_layers: int
    tied: bool
    layer_subs: list[str] = field(default_factory=list)
    """Canonical per-layer names; every layer has all of them (homogeneous stack)."""
    moe: bool = False
    """Every layer is a MoE layer (router, experts, maybe shared experts)."""
    num_experts: int = 0
    hetero: bool = False
    """Layers differ (``is_heterogeneous``: dense and MoE layers mixed, MLA, MTP layers): megatron-core
    saves per-layer torch_dist keys (``TransformerBlock.sharded_state_dict``, non-homogeneous layers)."""
    moe_layers: frozenset[int] = frozenset()
    """``hetero``: the decoder layers that are MoE layers (Megatron's ``moe_layer_freq``)."""
    mla: bool = False
    """Multi-latent attention: names are taken as the mapping spelled them for ``--spec`` (MLA's local
    spec has no torch_dist keys map, and its latent norms have no other spelling)."""

    def is_moe_layer(self, layer: int) -> bool:
        return layer in self.moe_layers if self.hetero else self.moe


def analyse(tensors: Sequence[OutTensor], args: dict[str, Any]) -> ModelTensors:
    """Validate names, shapes and layers before anything is produced or written."""
    layers = {split[0] for split in (split_layer(t.name) for t in tensors) if split is not None}
    moe_layers = {split[0] for split in (split_layer(t.name) for t in tensors)
                  if split is not None and _is_moe_sub(split[1])}
    if is_heterogeneous(args) or 0 < len(moe_layers) < len(layers):  # dense and MoE layers mixed: args must say so
        return _analyse_heterogeneous(tensors, args)
    swiglu = is_gated(args)
    moe = bool(moe_layers)
    entries: list[Entry] = []
    seen: set[tuple[int | None, str]] = set()
    per_layer: dict[int, dict[str, Entry]] = {}
    for out in tensors:
        dtype = dtype_by_name(out.dtype)
        shape = tuple(int(s) for s in out.shape)
        split = split_layer(out.name)
        expert = None
        if split is None:
            layer, sub = None, out.name
            layout = TOP_LAYOUT.get(sub)
        else:
            layer, sub = split[0], canonical_sub(split[1], split[0] in moe_layers)
            layout = _layer_layout(sub)
            expert = split_expert(sub)
            if layout == COLUMN and _is_fc1(sub) and swiglu:
                layout = GLU
        if layout is None:
            raise CkptError(f"{out.name}: not a dense GPTModel tensor the Megatron writers know, nor a MoE one "
                            "(router, SequentialMLP experts.local_experts.{e}, shared_experts); other layer "
                            "types are not supported")
        _check_entry(out.name, shape, layout, (layer, sub), seen)
        entry = Entry(OutTensor(out.name, shape, dtype.name, out.produce, out.runs), dtype, layer, sub, layout,
                      expert[0] if expert else None, expert[1] if expert else "")
        entries.append(entry)
        if layer is not None:
            per_layer.setdefault(layer, {})[sub] = entry

    num_layers = _layer_count(per_layer, args)
    subs = list(per_layer[0]) if per_layer else []
    for i, layer in per_layer.items():
        if set(layer) != set(subs):
            differ = ", ".join(sorted(set(subs) ^ set(layer)))
            raise CkptError(f"layer {i} does not hold the same tensors as layer 0 ({differ}); "
                            "Megatron stacks homogeneous layers only (besides dense and MoE layers)")
        for sub, entry in layer.items():
            first = per_layer[0][sub]
            if (entry.out.shape, entry.dtype) != (first.out.shape, first.dtype):
                raise CkptError(f"{entry.out.name}: {entry.out.shape} {entry.dtype.name} differs from layer 0's "
                                f"{first.out.shape} {first.dtype.name}")
    num_experts = _check_moe(per_layer[0] if per_layer else {}, args) if moe else 0
    tied = _embeddings_tied({e.sub for e in entries if e.layer is None}, args)
    return ModelTensors(entries, num_layers, tied, subs, moe, num_experts)


def _check_entry(name: str, shape: tuple[int, ...], layout: str, key: object, seen: set) -> None:
    if any(s < 0 for s in shape) or (layout != REPLICATED and not shape) or (layout == ROW and len(shape) < 2):
        raise CkptError(f"{name}: bad shape {shape}")
    if key in seen:
        raise CkptError(f"{name}: given twice")
    seen.add(key)
    if layout == GLU and shape[0] % 2:
        raise CkptError(f"{name}: SwiGLU fc1 needs an even number of rows ([gate; up]), got {shape}")


def _layer_count(layers, args: dict[str, Any]) -> int:
    """The number of decoder layers, after checking they run 0..L-1 and agree with ``args``."""
    count = len(layers)
    if sorted(layers) != list(range(count)):
        raise CkptError(f"layer indices must run 0..{count - 1} without gaps, got {sorted(layers)}")
    expected = args.get("num_layers")
    if expected is not None and int(expected) != count:
        raise CkptError(f"args say num_layers={expected} but the tensors hold {count} layers")
    return count


def _embeddings_tied(names: set[str], args: dict[str, Any]) -> bool:
    """Whether the output layer is the embedding, checked against the top-level tensors given."""
    if "untie_embeddings_and_output_weights" in args:
        tied = not args["untie_embeddings_and_output_weights"]
    else:  # Megatron's default is tied; without the flag, the tensors say which
        tied = "output_layer.weight" not in names
    if tied and "output_layer.weight" in names:
        raise CkptError("embeddings are tied (untie_embeddings_and_output_weights is false) "
                        "but output_layer.weight was given")
    if not tied and "output_layer.weight" not in names:
        raise CkptError("embeddings are untied but output_layer.weight is missing")
    if "embedding.word_embeddings.weight" not in names:
        raise CkptError("embedding.word_embeddings.weight is missing")
    return tied


def _place(name: str) -> tuple[int | None, str, str, str | None]:
    """(decoder layer, owner prefix, sub, layout) of a name in a heterogeneous model."""
    split = split_layer(name)
    if split is not None:
        return split[0], f"{LAYERS}{split[0]}.", split[1], _layer_layout(split[1])
    mtp = split_mtp(name)
    if mtp is not None:
        prefix, rest = mtp
        if rest.startswith(MTP_LAYER):
            sub = rest[len(MTP_LAYER):]
            return None, prefix + MTP_LAYER, sub, _layer_layout(sub)
        return None, prefix, rest, MTP_LAYOUT.get(rest)
    return None, "", name, TOP_LAYOUT.get(name)


def _analyse_heterogeneous(tensors: Sequence[OutTensor], args: dict[str, Any]) -> ModelTensors:
    """``analyse`` for models whose layers differ (dense and MoE layers mixed, MLA, MTP layers): each layer
    (and each MTP layer's decoder layer) is checked on its own, as megatron-core keys each on its own.
    Decoder names take the canonical spelling (``canonical_sub``) except with MLA, whose names are kept
    as the mapping spelled them for ``--spec``."""
    swiglu = is_gated(args)
    mla = bool(args.get("multi_latent_attention"))
    local_impl = args.get("transformer_impl") == "local"
    moe_layers = {split[0] for split in (split_layer(t.name) for t in tensors)
                  if split is not None and _is_moe_sub(split[1])}
    entries: list[Entry] = []
    seen: set[tuple[str, str]] = set()
    owners: dict[str, dict[str, Entry]] = {}
    layers: set[int] = set()
    for out in tensors:
        dtype = dtype_by_name(out.dtype)
        shape = tuple(int(s) for s in out.shape)
        layer, owner, sub, layout = _place(out.name)
        if layer is not None and not mla:
            sub = canonical_sub(sub, layer in moe_layers)
            layout = _layer_layout(sub)
        expert = split_expert(sub) if owner else None
        if local_impl and sub.endswith(MLA_DOWN):  # ColumnParallelLinear in the local spec, TELinear duplicated in TE
            layout = COLUMN
        if layout == COLUMN and _is_fc1(sub) and swiglu:
            layout = GLU
        if layout is None:
            raise CkptError(f"{out.name}: not a GPTModel tensor the Megatron writers know (dense, MoE, MLA or MTP)")
        _check_entry(out.name, shape, layout, (owner, sub), seen)
        entry = Entry(OutTensor(out.name, shape, dtype.name, out.produce, out.runs), dtype, layer,
                      sub if owner else out.name, layout, expert[0] if expert else None, expert[1] if expert else "",
                      owner)
        entries.append(entry)
        if layer is not None:
            layers.add(layer)
        if owner and (layer is not None or owner.endswith(MTP_LAYER)):
            owners.setdefault(owner, {})[sub] = entry
    num_layers = _layer_count(layers, args)
    if args.get("moe_layer_freq") is not None or 0 < len(moe_layers) < num_layers:
        _check_moe_layer_freq(sorted(moe_layers), num_layers, args)
    counts = {_check_moe(layer, args) for layer in owners.values() if any(_is_moe_sub(sub) for sub in layer)}
    if len(counts) > 1:
        raise CkptError(f"MoE layers hold different numbers of experts: {sorted(counts)}")
    mtp = {e.owner for e in entries if e.owner.startswith(MTP) and not e.owner.endswith(MTP_LAYER)}
    if args.get("mtp_num_layers") is not None and len(mtp) != int(args["mtp_num_layers"] or 0):
        raise CkptError(f"args say mtp_num_layers={args['mtp_num_layers']} but the tensors hold {len(mtp)} MTP layers")
    tied = _embeddings_tied({e.sub for e in entries if e.layer is None and not e.owner}, args)
    return ModelTensors(entries, num_layers, tied, [], bool(counts), counts.pop() if counts else 0, hetero=True,
                        moe_layers=frozenset(moe_layers), mla=mla)


def _check_moe_layer_freq(moe_layers: list[int], num_layers: int, args: dict[str, Any]) -> None:
    """Dense and MoE layers mixed: the args must say which are which, as megatron-core builds them
    from ``moe_layer_freq`` (a 0/1 list per layer, or every N-th layer)."""
    freq = args.get("moe_layer_freq")
    if isinstance(freq, int) and freq > 0:
        pattern = [1 if i % freq == 0 else 0 for i in range(num_layers)]
    elif isinstance(freq, (list, tuple)) and len(freq) == num_layers:
        pattern = [int(bool(x)) for x in freq]
    else:
        raise CkptError(f"MoE tensors on layers {moe_layers} only: the args must say moe_layer_freq (a 0/1 "
                        f"list of {num_layers} layers), got {freq!r}")
    if [i for i, x in enumerate(pattern) if x] != moe_layers:
        raise CkptError(f"moe_layer_freq={freq!r} puts MoE on other layers than the tensors do ({moe_layers})")


def _check_moe(layer: dict[str, Entry], args: dict[str, Any]) -> int:
    """The expert count of a MoE model, after checking that its layers are what Megatron stacks: every
    layer MoE (no dense MLP), a router, experts 0..E-1 each with the same tensors and shapes (torch_dist
    stacks them under one key). Layer 0 stands for all: ``analyse`` checked the layers are alike."""
    dense = sorted(sub for sub in layer if sub.startswith("mlp.") and sub in LAYER_LAYOUT)
    if dense:
        raise CkptError(f"{', '.join(dense)}: a dense MLP next to MoE tensors in one layer")
    experts: dict[int, dict[str, Entry]] = {}
    for entry in layer.values():
        if entry.expert is not None:
            experts.setdefault(entry.expert, {})[entry.expert_sub] = entry
    if not experts:
        raise CkptError("MoE tensors but no routed experts (decoder.layers.{i}.mlp.experts.local_experts.{e}.…)")
    count = len(experts)
    if sorted(experts) != list(range(count)):
        raise CkptError(f"expert ids must run 0..{count - 1} without gaps, got {sorted(experts)}")
    first = experts[0]
    for e, tensors in experts.items():
        if set(tensors) != set(first):
            differ = ", ".join(sorted(set(first) ^ set(tensors)))
            raise CkptError(f"expert {e} does not hold the same tensors as expert 0 ({differ})")
        for sub, entry in tensors.items():
            if (entry.out.shape, entry.dtype) != (first[sub].out.shape, first[sub].dtype):
                raise CkptError(f"{entry.out.name}: {entry.out.shape} {entry.dtype.name} differs from expert 0's "
                                f"{first[sub].out.shape} {first[sub].dtype.name}")
    router = layer.get("mlp.router.weight")
    if router is None:
        raise CkptError("MoE layers without mlp.router.weight")
    if router.out.shape[:1] != (count,):
        raise CkptError(f"{router.out.name}: {router.out.shape} does not have one row per expert ({count})")
    expected = args.get("num_experts")
    if expected is not None and int(expected) != count:
        raise CkptError(f"args say num_experts={expected} but the tensors hold {count} experts")
    return count


def extra_state_value(spec: str) -> Any:
    """``get_extra_state()`` of a linear without FP8: mcore's own linears return None, TE >= 2.0 an
    empty uint8 tensor (MAPPING.md §1.3)."""
    if spec == "local":
        return None
    import torch

    return torch.empty(0, dtype=torch.uint8)


# --- pipeline stages -------------------------------------------------------------------------------------


def pipeline_layer_ranges(num_layers: int, pp: int, args: dict[str, Any] | None = None) -> list[range]:
    """Global layers of each pipeline stage as megatron-core builds them (``get_num_layers_to_build``,
    ``get_transformer_layer_offset``): an even split, ``num_layers_in_{first,last}_pipeline_stage``, or
    the ``account_for_{embedding,loss}_in_pipeline_split`` virtual layers. No VPP, no custom layout."""
    args = args or {}
    if pp < 1:
        raise CkptError(f"pipeline parallel size must be >= 1, got {pp}")
    if (args.get("virtual_pipeline_model_parallel_size") or 1) > 1 or args.get("num_layers_per_virtual_pipeline_stage"):
        raise CkptError("virtual pipeline parallelism (model0, model1, ... per file) is not supported")
    if args.get("pipeline_model_parallel_layout"):
        raise CkptError("a custom pipeline_model_parallel_layout is not supported")
    if pp == 1:
        return [range(num_layers)]
    first = args.get("num_layers_in_first_pipeline_stage")
    last = args.get("num_layers_in_last_pipeline_stage")
    embedding = int(bool(args.get("account_for_embedding_in_pipeline_split")))
    loss = int(bool(args.get("account_for_loss_in_pipeline_split")))
    if first is not None or last is not None:
        if embedding or loss:
            raise CkptError("uneven first/last pipeline stages cannot be combined with "
                            "account_for_*_in_pipeline_split")
        if any(n is not None and int(n) <= 0 for n in (first, last)):
            raise CkptError("num_layers_in_first/last_pipeline_stage must be larger than 0 (as megatron-core requires)")
        middle_stages = pp - (first is not None) - (last is not None)
        middle_layers = num_layers - int(first or 0) - int(last or 0)
        if middle_layers < 0 or (middle_stages and middle_layers % middle_stages) or \
                (not middle_stages and middle_layers):
            raise CkptError(f"{num_layers} layers cannot be split over {pp} stages with first={first}, last={last}")
        counts = [middle_layers // middle_stages if middle_stages else 0] * pp
        if first is not None:
            counts[0] = int(first)
        if last is not None:
            counts[-1] = int(last)
    else:
        total = num_layers + embedding + loss
        if total % pp:
            raise CkptError(f"{num_layers} layers do not split evenly over {pp} pipeline stages")
        counts = [total // pp] * pp
        counts[0] -= embedding
        counts[-1] -= loss
        if min(counts) < 0:
            raise CkptError(f"not enough layers for {pp} pipeline stages")
    ranges, start = [], 0
    for count in counts:
        ranges.append(range(start, start + count))
        start += count
    return ranges


# --- arrays ----------------------------------------------------------------------------------------------


def produce_array(entry: Entry) -> np.ndarray:
    """``produce()`` as a C-contiguous numpy array of the entry's dtype (bf16/fp8 via ml_dtypes), cast
    if it came in another dtype; a torch tensor is taken without a copy where possible."""
    import numpy as np

    value = entry.out.produce()
    want = entry.dtype.numpy()
    if not isinstance(value, np.ndarray) and type(value).__module__.startswith("torch"):
        import torch

        tensor = value.detach().to("cpu")
        target = getattr(torch, entry.dtype.name)
        if tensor.dtype != target:
            tensor = tensor.to(target)
        flat = tensor.contiguous().reshape(-1)
        value = flat.view(_uint_torch(flat.element_size())).numpy().view(want).reshape(tuple(tensor.shape))
    array = np.asarray(value)
    if array.dtype != want:
        array = array.astype(want)
    if tuple(array.shape) != entry.out.shape:
        raise CkptError(f"{entry.out.name}: produced shape {tuple(array.shape)}, expected {entry.out.shape}")
    return np.ascontiguousarray(array)


def _uint_torch(itemsize: int) -> Any:
    import torch

    return {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}[itemsize]


def torch_view(array: np.ndarray, dtype: DType) -> Any:
    """A torch tensor over a C-contiguous numpy array, no copy: its storage is exactly the array's
    bytes, so ``torch.save`` writes just those (a slice's base is not dragged along)."""
    import numpy as np
    import torch

    with warnings.catch_warnings():  # read-only arrays (memory maps): nothing writes through this view
        warnings.simplefilter("ignore", UserWarning)
        if array.dtype.isbuiltin and array.dtype.kind in "biufc":
            return torch.from_numpy(array)
        raw = array.view(np.dtype(f"u{array.dtype.itemsize}"))
        return torch.from_numpy(raw).view(getattr(torch, dtype.name))


def raw_bytes(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array (a copy only if it is not contiguous)."""
    import numpy as np

    flat = np.ascontiguousarray(array).reshape(-1)
    return memoryview(flat.view(np.uint8)) if flat.size else memoryview(b"")
