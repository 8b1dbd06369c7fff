"""``convert --dtype keep`` of FP8 block-scaled weights: the FP8 bytes and their ``weight_scale_inv``
blocks travel together, bit for bit, through every transform and TP split; a transform that would cut
or mix a scale block is refused (exit 2, one line naming the tensor, the axis and the block).

How it works. The source is read as stored (``show_stored_quantization``): each FP8 payload ``X``
keeps its own shape and dtype, and its scales ``X_scale_inv`` (one per ``bm x bn`` block of the last
two axes, DeepSeek-V3's layout, ``formats.blockscaled``) are taken out of the model before mapping,
so the mappings see only the weights. Every destination tensor built from payloads then gets a
sibling ``<name>_scale_inv`` whose recipe is the weight's recipe with each box divided by the block:
exact when every box edge falls on a block edge of both tensors (or is the partial last block of
both), refused otherwise. Megatron TP splits are checked the same way: each rank's share along the
split axis must be whole blocks.

The Megatron side stores the scale as that sibling tensor, ``<weight>_scale_inv``, split over TP like
its weight (rows of a column-parallel weight, columns of a row-parallel one, gate and up halves of a
SwiGLU fc1, whole for replicated ones). This is ckptscope's own layout, as no real one was found:
Megatron-Core's checkpoints have no separate scale tensors for block-scaled weights, Megatron-Bridge
dequantises DeepSeek-V3's FP8 on import (NVIDIA-NeMo/Megatron-Bridge PR #3778) and exports FP8 +
``scale_inv`` only from in-memory parameters to HF (PR #1994; issue #1746 leaves a native FP8 Megatron
checkpoint open). Such a checkpoint round-trips to HF bit for bit; Megatron-Core does not load it.
"""

from __future__ import annotations

import math

from ckptscope.core.errors import CkptError
from ckptscope.core.tensor import TensorMeta
from ckptscope.core.units import plural
from ckptscope.formats.blockscaled import DEFAULT_FP8_BLOCK, FP8_PAYLOADS, config_block_size, fp8_pair_problem
from ckptscope.mappings.links import Box, Piece, Recipe

SCALE_SUFFIX = "_scale_inv"
DEFAULT_QUANT_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
"""DeepSeek-V3's ``quantization_config`` (with ``weight_block_size``), written when the HF config has none."""


def fp8_pairs(tensors: dict[str, TensorMeta], block: tuple[int, int]) -> dict[str, str]:
    """FP8 payload name -> its scale name, for the stored pairs whose shapes fit ``block``."""
    pairs = {}
    for name, scale in tensors.items():
        payload = tensors.get(name.removesuffix(SCALE_SUFFIX)) if name.endswith(SCALE_SUFFIX) else None
        if payload is not None and payload.dtype in FP8_PAYLOADS and fp8_pair_problem(payload, scale, block) is None:
            pairs[name.removesuffix(SCALE_SUFFIX)] = name
    return pairs


def config_block(hf_cfg: dict | None) -> tuple[int, int]:
    """The FP8 block of the source's HF config, DeepSeek's 128 x 128 without one (as the reader pairs them)."""
    return config_block_size(hf_cfg or {}) or DEFAULT_FP8_BLOCK


def hf_config_keeping_fp8(hf_cfg: dict, block: tuple[int, int]) -> tuple[dict, list[str]]:
    """The HF config says the weights are FP8 blocks (transformers reads ``quantization_config`` to
    load them); one derived from Megatron args has none, so DeepSeek-V3's is added."""
    quant = hf_cfg.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") == "fp8":
        if config_block(hf_cfg) != block:
            raise CkptError(f"the HF config's weight_block_size {list(config_block(hf_cfg))} is not the "
                            f"{block[0]}x{block[1]} block the FP8 scales are stored in")
        return hf_cfg, []
    cfg = {**hf_cfg, "quantization_config": {**DEFAULT_QUANT_CONFIG, "weight_block_size": list(block)}}
    return cfg, [f"config.json given quantization_config fp8 (weight_block_size {list(block)}) for the kept FP8 weights"]


def _scale_axis(name: str, axis: int, s: tuple[int, int], d: tuple[int, int], src_n: int, dst_n: int,
                b: int, what: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """One axis of a piece, in scale blocks: (source box, destination box). Refuses a cut inside a block."""
    (s0, s1), (d0, d1) = s, d
    whole = (s1 - s0) % b == 0 or (s1 == src_n and d1 == dst_n)
    if s0 % b or d0 % b or not whole:
        edge = next((v for v in (s0, s1, d0, d1) if v % b and v not in (src_n, dst_n)), d1)
        raise CkptError(f"{name}: {what} cuts axis {axis} at {edge}, inside a {b}-wide FP8 scale block: its "
                        f"scales cannot move with its blocks; convert with --dtype bfloat16 instead")
    return (s0 // b, -(-s1 // b)), (d0 // b, -(-d1 // b))


def scale_recipe(recipe: Recipe, source_shapes: dict[str, tuple[int, ...]], scale_names: dict[str, str],
                 scale_dtype: str, block: tuple[int, int]) -> Recipe:
    """The recipe of ``recipe``'s scales: the same boxes over the scale grids. Leading axes (layer,
    expert) map unchanged; the last two are divided by the block, which must not be cut."""
    what = f"its {', '.join(recipe.transforms)} transform" if recipe.transforms else "the mapping"
    dst_shape = recipe.shape
    grid = dst_shape[:-2] + tuple(math.ceil(n / b) for n, b in zip(dst_shape[-2:], block))
    pieces = []
    for piece in recipe.pieces:
        src_shape = source_shapes[piece.source]
        src_box, dst_box = list(piece.src_box), list(piece.dst_box)
        for k, b in ((1, block[1]), (2, block[0])):
            src_box[-k], dst_box[-k] = _scale_axis(recipe.name, len(dst_shape) - k, src_box[-k], dst_box[-k],
                                                   src_shape[-k], dst_shape[-k], b, what)
        pieces.append(Piece(tuple(dst_box), scale_names[piece.source], tuple(src_box)))
    fill: list[Box] = []
    for box in recipe.fill:  # zero (padding) rows: whole blocks of zero scales
        box = list(box)
        for k, b in ((1, block[1]), (2, block[0])):
            _, box[-k] = _scale_axis(recipe.name, len(dst_shape) - k, box[-k], box[-k], dst_shape[-k],
                                     dst_shape[-k], b, "zero padding")
        fill.append(tuple(box))
    return Recipe(recipe.name + SCALE_SUFFIX, grid, scale_dtype, pieces, list(recipe.transforms), fill=fill)


def split_problem(name: str, shape: tuple[int, ...], split: str, tp: int, block: tuple[int, int]) -> str | None:
    """Why a TP split of the FP8 weight ``name`` would cut its scale blocks, or None. ``split`` is
    ``formats.megatron.legacy_layout.Split``'s value: column (rows), row (columns), glu (rows of gate
    and of up), replicated."""
    if tp == 1 or split == "replicated":
        return None
    axis, parts = (len(shape) - 1, tp) if split == "row" else (len(shape) - 2, 2 * tp if split == "glu" else tp)
    size, b = shape[axis], block[0] if axis == len(shape) - 2 else block[1]
    if size % parts == 0 and (size // parts) % b == 0:
        return None
    per = f"{size // parts}" if size % parts == 0 else f"{size}/{parts}"
    halves = " (each of gate and up)" if split == "glu" else ""
    return (f"{name}: TP {tp} gives each rank {per} of its {size} {'columns' if split == 'row' else 'rows'}"
            f"{halves} (axis {axis}), not a multiple of the {b}-wide FP8 scale block: the scales "
            f"({name}{SCALE_SUFFIX}) cannot be split with their blocks; pick a TP that divides it into whole "
            f"blocks, or convert with --dtype bfloat16")


def describe(count: int, block: tuple[int, int]) -> str:
    return (f"{plural(count, 'FP8 weight')} kept as stored, each with its {block[0]}x{block[1]}-block scales "
            f"(<weight>{SCALE_SUFFIX}) moved and split with it, bit for bit")


def with_scales(recipes: dict[str, Recipe], pairs: dict[str, str], metas: dict[str, TensorMeta],
                block: tuple[int, int]) -> dict[str, Recipe]:
    """``recipes`` with each FP8 destination followed by its ``_scale_inv`` recipe. A destination
    drawing on FP8 and other tensors at once has no single scale grid: refused."""
    out: dict[str, Recipe] = {}
    for name, recipe in recipes.items():
        out[name] = recipe
        sources = recipe.sources
        scaled = [s for s in sources if s in pairs]
        if not scaled:
            continue
        if len(scaled) != len(sources):
            other = next(s for s in sources if s not in pairs)
            raise CkptError(f"{name}: built from the FP8 weight {scaled[0]} and the unquantised {other}: one "
                            f"tensor cannot hold both; convert with --dtype bfloat16 instead")
        dtypes = {metas[pairs[s]].dtype for s in scaled} | {metas[s].dtype for s in scaled}
        if len(dtypes) != 2:
            raise CkptError(f"{name}: its FP8 sources differ in payload or scale dtype ({', '.join(sorted(dtypes))})")
        shapes = {s: metas[s].shape for s in scaled}
        out[name + SCALE_SUFFIX] = scale_recipe(recipe, shapes, pairs, metas[pairs[scaled[0]]].dtype, block)
    return out


def check_tp_splits(recipes: dict[str, Recipe], args: dict, tp: int, block: tuple[int, int]) -> None:
    """Refuse a TP degree whose split of any FP8 weight falls inside a scale block (torch_dist files
    hold whole tensors, but a TP rank loading them takes the same share the per-rank files hold)."""
    from ckptscope.formats.megatron.legacy_layout import is_expert, tp_split
    from ckptscope.formats.megatron.model_layout import is_gated

    etp = int(args.get("expert_tensor_parallel_size") or tp)
    for name, recipe in recipes.items():
        if name + SCALE_SUFFIX not in recipes:
            continue
        degree = etp if is_expert(name) else tp
        split = tp_split(name, swiglu=is_gated(args), local_impl=args.get("transformer_impl") == "local")
        problem = split_problem(name, recipe.shape, split.value, degree, block)
        if problem:
            raise CkptError(problem)


MEGATRON_NOTE = ("FP8 scales stored as sibling <weight>_scale_inv tensors (ckptscope's layout: Megatron-Core has "
                 "none for block-scaled weights and does not load them; convert back to HF to use them)")
