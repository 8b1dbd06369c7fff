"""Quantised HF checkpoints that ckptscope reads as stored but cannot dequantise.

GPTQ, AWQ, bitsandbytes, compressed-tensors, fbgemm FP8, torchao and the like keep packed integer
words, codes and scales under their own tensor names, described by ``config.json``'s
``quantization_config``. Read as stored they are honest (``inspect`` lists them, ``diff`` compares
them), but any export that casts, maps or re-lays them out would write raw codes as if they were
weights: a model that loads and computes nonsense. Exports refuse them (``unhandled_quantization``).
Two schemes are dequantised exactly and stay allowed: FP8 with a 2-D ``weight_block_size``
(DeepSeek-V3, Qwen3-FP8) and GPT-OSS's MXFP4 (``formats.blockscaled``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ckptscope.formats.blockscaled import config_block_size

PACKED_SUFFIXES = (
    ".qweight", ".qzeros", ".g_idx",  # GPTQ, AWQ
    ".SCB", ".weight_format",  # bitsandbytes 8-bit
    ".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",  # bitsandbytes 4-bit
    ".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4",
    ".weight_packed", ".weight_shape", ".weight_zero_point", ".weight_global_scale",  # compressed-tensors
    ".weight_scale", ".input_scale",  # compressed-tensors / fbgemm FP8 (per tensor or channel)
)
"""Name endings of tensors only quantised checkpoints hold (``weight_scale_inv`` of FP8 blocks and
``_scales`` of MXFP4 are not here: those are dequantised)."""


def quantization_method(config: dict[str, Any] | None) -> str | None:
    """``quantization_config.quant_method`` of an HF config (also under ``text_config``), or None."""
    for part in (config or {}, (config or {}).get("text_config") or {}):
        quant = part.get("quantization_config") if isinstance(part, dict) else None
        if isinstance(quant, dict):
            return str(quant.get("quant_method") or "unknown")
    return None


def _dequantised_here(config: dict[str, Any]) -> bool:
    method = quantization_method(config)
    if method == "mxfp4":
        return True
    if method == "fp8":  # FP8 with a 2-D block: the one FP8 layout formats.blockscaled reads dequantised
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
        return (config_block_size(config) or config_block_size(text)) is not None
    return False


def unhandled_quantization(config: dict[str, Any] | None, names: Iterable[str]) -> str | None:
    """Why the weights of a checkpoint (its HF ``config``, its tensor ``names``) are quantised in a way
    ckptscope cannot dequantise, in words; None when they are not (or are FP8 blocks / MXFP4)."""
    method = quantization_method(config)
    if method is not None and not _dequantised_here(config or {}):
        return f"its weights are quantised (config.json quantization_config: quant_method {method!r})"
    packed = next((n for n in names if n.endswith(PACKED_SUFFIXES)), None)
    if packed is not None:
        return f"its weights are quantised ({packed!r} is a quantisation tensor, not a weight)"
    return None
