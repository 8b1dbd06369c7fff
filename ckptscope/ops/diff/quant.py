"""Quantisation error: when one side of a pair is a block-quantised GGUF tensor, how far its
dequantised values are from the other side, and whether that is what its ggml type implies.

``diff hf_dir model.gguf`` compares the dequantised values, so every quantised tensor "differs";
the question a user has is whether it differs by more than quantising it should have cost. Per
such pair this adds one record (``PairResult.quant``, JSON ``quant_error``):

* ``rel_rms``: ``||q - r|| / ||r||``, with ``r`` the reference (unquantised) side, whichever of A
  and B it is; ``max_abs``: ``max |q - r|``;
* ``expected_rel_rms``: the bound its type implies, ``BOUND_FACTOR / levels``. A block with
  ``levels`` steps between its smallest and largest code has a rounding step of about
  ``2·absmax / levels`` and an RMS rounding error of ``step / sqrt(12)``; for normally distributed
  weights the block ``absmax`` is 2-3 RMS, so the expected relative RMS error is about
  ``1.4 / levels``. The bound takes ``3 / levels``: twice that, for heavier tails, quantised
  scales and non-uniform code books (IQ*, fp4). It is a heuristic for "plausible", not a proof;
* ``within``: ``rel_rms <= expected_rel_rms``: the difference is quantisation error. Beyond it,
  something else differs too (another checkpoint, a wrong permutation, a bad export).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.mappings.links import Recipe
    from ckptscope.ops.diff.metrics import Accumulator
    from ckptscope.ops.diff.plan import DiffSide

BOUND_FACTOR = 3.0
CODE_LEVELS = {
    "Q8_0": 255, "Q8_1": 255, "Q8_K": 255, "Q6_K": 63, "Q5_0": 31, "Q5_1": 31, "Q5_K": 31,
    "Q4_0": 15, "Q4_1": 15, "Q4_K": 15, "IQ4_NL": 15, "IQ4_XS": 15, "MXFP4": 15, "NVFP4": 15,
    "Q3_K": 7, "IQ3_XXS": 7, "IQ3_S": 7, "Q2_K": 3, "IQ2_XXS": 3, "IQ2_XS": 3, "IQ2_S": 3,
    "TQ1_0": 2, "TQ2_0": 2, "IQ1_S": 2, "IQ1_M": 2, "Q1_0": 1,
}
"""Steps between a block's lowest and highest code: ``2**bits - 1`` for b-bit codes, 2 for ternary."""


def expected_rel_rms(ggml_type: str) -> float | None:
    """The relative RMS error quantising to ``ggml_type`` plausibly costs (module docstring)."""
    levels = CODE_LEVELS.get(ggml_type)
    return BOUND_FACTOR / levels if levels else None


def quantised_type(side: DiffSide, recipe: Recipe | None) -> str | None:
    """The ggml type of the block-quantised stored tensor behind ``recipe``, or None."""
    if recipe is None:
        return None
    tensors = side.reader.index().tensors
    for piece in recipe.pieces:
        meta = tensors.get(piece.source)
        if meta is not None and meta.attr("stored_bytes") is not None and meta.attr("ggml_type") in CODE_LEVELS:
            return meta.attr("ggml_type")
    return None


def quant_error(acc: Accumulator, side: str, ggml_type: str) -> dict[str, Any]:
    """The record for a pair whose ``side`` (``"A"`` or ``"B"``) is quantised to ``ggml_type``."""
    ref_sq = acc.sum_sq_b if side == "A" else acc.sum_sq_a
    if acc.nan or not math.isfinite(acc.sum_sq_diff):
        rel = None
    elif acc.num_diff == 0:
        rel = 0.0
    else:
        rel = math.sqrt(acc.sum_sq_diff / ref_sq) if ref_sq > 0 else None
    bound = expected_rel_rms(ggml_type)
    return {"side": side, "ggml_type": ggml_type, "rel_rms": rel,
            "max_abs": None if acc.nan else acc.max_abs, "expected_rel_rms": bound,
            "within": rel is not None and bound is not None and rel <= bound}


def quant_note(results: list) -> str | None:
    """One line for the report: which differences are quantisation error and which are not."""
    quantised = [r for r in results if r.quant is not None and r.status in ("different", "close")]
    if not quantised:
        return None
    types = ", ".join(sorted({r.quant["ggml_type"] for r in quantised}))
    beyond = [r for r in quantised if not r.quant["within"]]
    if not beyond:
        return (f"all {len(quantised)} differing quantised tensors ({types}) are within the relative RMS error "
                "their types imply: their differences are quantisation error")
    first = beyond[0]
    return (f"{len(quantised) - len(beyond)} of {len(quantised)} differing quantised tensors ({types}) are within "
            f"the error their types imply (quantisation error); {len(beyond)} are NOT (first: {first.name}, "
            f"{first.quant['ggml_type']} relative RMS error {_pct(first.quant['rel_rms'])} > "
            f"{_pct(first.quant['expected_rel_rms'])}): more than quantisation differs there")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.3g}%"
