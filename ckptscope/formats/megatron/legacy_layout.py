"""Rules that turn Megatron legacy per-rank names into one logical model (no I/O, no torch).

FORMATS.md §3 and MAPPING.md §4, §5.1, §6.2:

* rank folders ``mp_rank_TT[_PPP][_EEE]``: the PP suffix exists iff PP > 1, the EP suffix iff
  EP > 1, so a two-number folder is read with the sizes from ``args``;
* a pipeline stage numbers its layers from 0; the global index adds the stage offset, which
  depends on ``num_layers``, PP, VPP, uneven first/last stages, embedding/loss accounting or an
  explicit ``pipeline_model_parallel_layout``. ``layer_offsets`` computes it from ``args`` the
  way megatron-core does; the reader checks it against the layers actually present;
* TP split of each parameter, decided by name (the MAPPING.md §4 table): column-parallel (dim 0),
  row-parallel (dim 1), SwiGLU fc1 (each rank holds ``[gate_t; up_t]``) or replicated;
* experts: ``local_experts.{i}`` and TE grouped ``weight{i}`` get the global id
  ``ep_rank * E_local + i``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

RANK_DIR = re.compile(r"mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?")
MODEL_FILE = "model_optim_rng.pt"
DIST_OPTIM_FILE = "distrib_optim.pt"
_LAYER = re.compile(r"(^|\.)(decoder|encoder|transformer)\.layers\.(\d+)(?=\.)")
_LOCAL_EXPERT = re.compile(r"(\.experts\.local_experts\.)(\d+)(?=\.)")
_GROUPED_EXPERT = re.compile(r"(\.experts\.linear_fc[12]\.(?:weight|bias|_extra_state))(\d+)$")
_PARAM_NUMBER = re.compile(r"^(weight|bias)\d*(?:_scale_inv)?$")
"""A parameter name; ``weight_scale_inv`` (kept FP8 block scales, ops/convert/fp8_keep.py) splits as its weight."""


class Split(str, Enum):
    """How one parameter is divided over tensor-parallel ranks."""

    REPLICATED = "replicated"
    COLUMN = "column"
    """Concatenated on dim 0."""
    ROW = "row"
    """Concatenated on dim 1."""
    GLU = "glu"
    """SwiGLU fc1: rank t holds ``[gate_t; up_t]``; the global tensor is ``[gate; up]``."""


_COLUMN_MODULES = {"word_embeddings", "output_layer", "linear_qkv", "query_key_value", "linear_q_proj",
                   "linear_q_up_proj", "linear_kv_up_proj", "eh_proj"}  # eh_proj: MTP's column-parallel linear
_GLU_MODULES = {"linear_fc1", "dense_h_to_4h"}
_ROW_MODULES = {"linear_proj", "linear_fc2", "dense_4h_to_h"}


_MLA_DOWN = {"linear_q_down_proj", "linear_kv_down_proj"}
"""MLA's down projections: ``TELinear(parallel_mode="duplicated")`` with TransformerEngine (whole on every
rank), ``ColumnParallelLinear`` with the local spec (``transformer_impl: local``), megatron-core 0.16.1."""


def tp_split(name: str, *, swiglu: bool, local_impl: bool = False) -> Split:
    """The TP split of a parameter by its name (MAPPING.md §4). Anything not in the table
    (norms, ``layer_norm_weight``, router, position embeddings, row-parallel biases) is replicated.
    ``local_impl``: the args say ``transformer_impl: local`` (MLA's down projections are split then)."""
    parts = name.split(".")
    if len(parts) < 2:
        return Split.REPLICATED
    if parts[-2:] == ["core_attention", "softmax_offset"]:  # GPT-OSS's attention sinks: one per head
        return Split.COLUMN
    match = _PARAM_NUMBER.match(parts[-1])
    if match is None:
        return Split.REPLICATED
    param, module = match.group(1), parts[-2]
    if module in _GLU_MODULES:
        return Split.GLU if swiglu else Split.COLUMN
    if module in _COLUMN_MODULES or (local_impl and module in _MLA_DOWN):
        return Split.COLUMN
    is_row = module in _ROW_MODULES or (module == "dense" and len(parts) >= 3 and parts[-3] == "self_attention")
    if is_row:
        return Split.ROW if param == "weight" else Split.REPLICATED
    return Split.REPLICATED


def is_extra_state(name: str) -> bool:
    """TE / mcore ``_extra_state`` entries (``_extra_state``, grouped ``_extra_state{i}``): metadata, not weights."""
    return re.search(r"(^|\.)_extra_state\d*$", name) is not None


def is_expert(name: str) -> bool:
    """A routed expert's parameter (split over EP ranks), as opposed to shared/dense ones."""
    return _LOCAL_EXPERT.search(name) is not None or _GROUPED_EXPERT.search(name) is not None


def is_legacy_grouped(name: str) -> bool:
    """Legacy GroupedMLP ``experts.weight1`` / ``weight2``: all local experts fused, transposed."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] == "experts" and parts[-1] in ("weight1", "weight2")


def local_layer(name: str) -> int | None:
    """The stage-local layer index of ``decoder.layers.{j}.…`` (also old ``encoder``/``transformer``)."""
    match = _LAYER.search(name)
    return int(match.group(3)) if match else None


def local_experts(name: str) -> int | None:
    """The local expert index in ``name``, or None."""
    match = _LOCAL_EXPERT.search(name) or _GROUPED_EXPERT.search(name)
    return int(match.group(2)) if match else None


def globalize(name: str, layer_offset: int, expert_offset: int) -> str:
    """``name`` with its layer index shifted by ``layer_offset`` and its expert id by ``expert_offset``."""
    name = _LAYER.sub(lambda m: f"{m.group(1)}{m.group(2)}.layers.{int(m.group(3)) + layer_offset}", name, count=1)
    name = _LOCAL_EXPERT.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + expert_offset}", name, count=1)
    return _GROUPED_EXPERT.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + expert_offset}", name, count=1)


# --- parallel sizes and pipeline offsets ---------------------------------------------------------


def _int(args: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = args.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


@dataclass(frozen=True, slots=True)
class Parallelism:
    """The model-parallel sizes of a save, from ``args`` (1 when absent)."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    vpp: int | None = None
    etp: int | None = None
    num_layers: int | None = None
    num_experts: int | None = None
    swiglu: bool = False
    local_impl: bool = False
    """``transformer_impl: local`` (Megatron-LM's default is transformer_engine)."""

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> Parallelism:
        vpp = _int(args, "virtual_pipeline_model_parallel_size")
        return cls(
            tp=_int(args, "tensor_model_parallel_size") or 1,
            pp=_int(args, "pipeline_model_parallel_size") or 1,
            ep=_int(args, "expert_model_parallel_size") or 1,
            vpp=vpp if vpp and vpp > 1 else None,
            etp=_int(args, "expert_tensor_parallel_size"),
            num_layers=_int(args, "num_layers", "encoder_num_layers"),
            num_experts=_int(args, "num_experts", "num_moe_experts"),
            swiglu=bool(args.get("swiglu") or args.get("gated_linear_unit")),  # GeGLU (Gemma) is gated too
            local_impl=args.get("transformer_impl") == "local",
        )


def parse_rank_dir(name: str, pp: int, ep: int) -> tuple[int, int, int] | None:
    """``(tp, pp, ep)`` ranks of a folder name, or None when it does not fit the sizes."""
    match = RANK_DIR.fullmatch(name)
    if match is None:
        return None
    nums = [int(g) for g in match.groups() if g is not None]
    tp_rank, rest = nums[0], nums[1:]
    want = (pp > 1) + (ep > 1)
    if len(rest) != want:
        return None
    pp_rank = rest.pop(0) if pp > 1 else 0
    ep_rank = rest.pop(0) if ep > 1 else 0
    return tp_rank, pp_rank, ep_rank


def _expand_layout(layout: str) -> list[str]:
    """``pipeline_model_parallel_layout`` (e.g. ``"Ettt|(tt|)*2,tL"``) as one string per stage."""
    text = layout.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    return text.split("|")


def layer_offsets(args: dict[str, Any], pp: int, vpp: int | None) -> dict[tuple[int, int], int] | None:
    """Global offset of the first layer of every (pp rank, virtual stage), from ``args``.

    Mirrors megatron-core's ``get_transformer_layer_offset`` (MAPPING.md §5.1): an explicit
    layout, uneven first/last stages, embedding/loss counted as layers, and VPP. None when
    ``args`` lack what is needed.
    """
    vp = vpp or 1
    stages = [(p, v) for v in range(vp) for p in range(pp)]
    if pp == 1 and vp == 1:
        return {(0, 0): 0}
    layout = args.get("pipeline_model_parallel_layout")
    if isinstance(layout, str) and layout:
        flat = _expand_layout(layout)
        if len(flat) % pp:
            return None
        vp_layout = len(flat) // pp
        offsets, total = {}, 0
        for i, stage in enumerate(flat):  # stage i is (pp = i % P, vpp = i // P): layer-id order
            offsets[(i % pp, i // pp)] = total
            total += stage.count("t")
        return offsets if vp_layout == vp else None
    if layout not in (None, ""):
        return None  # a pickled layout object: not worth decoding, the reader counts layers instead
    num_layers = _int(args, "num_layers", "encoder_num_layers")
    if num_layers is None:
        return None
    first = _int(args, "num_layers_in_first_pipeline_stage", "decoder_first_pipeline_num_layers")
    last = _int(args, "num_layers_in_last_pipeline_stage", "decoder_last_pipeline_num_layers")
    out: dict[tuple[int, int], int] = {}
    if first is not None or last is not None:
        middle_stages = pp - (first is not None) - (last is not None)
        middle_layers = num_layers - (first or 0) - (last or 0)
        for p, v in stages:
            middle_rank = p if first is None else p - 1
            if vpp:
                first_chunk, last_chunk = (first or 0) // vp, (last or 0) // vp
                middle_chunk = middle_layers // vp
                total = first_chunk + middle_chunk + last_chunk
                per_middle = middle_chunk // middle_stages if middle_stages > 0 else 0
                out[(p, v)] = v * total if p == 0 else v * total + first_chunk + middle_rank * per_middle
            else:
                per_rank = middle_layers // middle_stages if middle_stages > 0 else 0
                out[(p, v)] = 0 if p == 0 else middle_rank * per_rank + (first or 0)
        return out
    embedding = bool(args.get("account_for_embedding_in_pipeline_split"))
    loss = bool(args.get("account_for_loss_in_pipeline_split"))
    counted = num_layers + embedding + loss
    per_rank = counted // pp
    for p, v in stages:
        offset = v * (counted // vp) + p * (per_rank // vp) if vpp else p * per_rank
        if embedding and not (p == 0 and v == 0):
            offset -= 1
        out[(p, v)] = offset
    return out


def counts_from_offsets(offsets: dict[tuple[int, int], int], num_layers: int) -> dict[tuple[int, int], int]:
    """Layers per stage implied by offsets taken in layer-id order (virtual stage, then pp rank)."""
    order = sorted(offsets, key=lambda pv: (pv[1], pv[0]))
    out = {}
    for i, stage in enumerate(order):
        end = offsets[order[i + 1]] if i + 1 < len(order) else num_layers
        out[stage] = end - offsets[stage]
    return out


def offsets_from_counts(counts: dict[tuple[int, int], int]) -> dict[tuple[int, int], int]:
    """Cumulative offsets in layer-id order from the layers each stage actually holds."""
    out, total = {}, 0
    for stage in sorted(counts, key=lambda pv: (pv[1], pv[0])):
        out[stage] = total
        total += counts[stage]
    return out
