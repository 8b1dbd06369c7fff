"""Dequantising ggml blocks to float32, bit for bit as gguf-py's ``gguf.quants.dequantize`` does.

Written from the block layouts in ggml's ``ggml-common.h`` and the reference
``dequantize_row_*`` functions in ``ggml-quants.c``. The float32 operations are done in the same
order as there (and as in gguf-py), with no fused multiply-add, so results are identical:

* Q8_0: ``x = f32(d) * q``
* Q4_K: ``x = (f32(d) * sc) * q - (f32(dmin) * m)``
* Q6_K: ``x = (f32(d) * sc) * q``

Imported only when values are read (numpy is not needed to list a file).
"""

from __future__ import annotations

import numpy as np

from ckptscope.formats.gguf.types import QK_K


def _f16(raw: np.ndarray) -> np.ndarray:
    """Little-endian f16 bytes ``(n, 2)`` -> float32 ``(n, 1)``."""
    return np.ascontiguousarray(raw).view("<f2").astype(np.float32)


def dequant_q8_0(blocks: np.ndarray) -> np.ndarray:
    """``(n, 34)`` uint8 -> ``(n, 32)`` float32. Block: f16 d, int8 q[32]."""
    d = _f16(blocks[:, :2])
    q = np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.float32)
    return q * d


def _q4k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes -> 8 six-bit scales and 8 six-bit mins (``get_scale_min_k4``).

    Sub-blocks 0-3: scale = b[j] & 63, min = b[j+4] & 63. Sub-blocks 4-7: the low 4 bits come from
    b[j+4] (scale: low nibble, min: high nibble), the high 2 bits from the top bits of b[j-4]
    (scale) and b[j] (min).
    """
    b = packed.astype(np.uint8)
    lo_sc, lo_m, hi = b[:, 0:4], b[:, 4:8], b[:, 8:12]
    scales = np.empty((b.shape[0], 8), dtype=np.uint8)
    mins = np.empty((b.shape[0], 8), dtype=np.uint8)
    scales[:, :4] = lo_sc & 63
    mins[:, :4] = lo_m & 63
    scales[:, 4:] = (hi & 0x0F) | ((lo_sc >> 6) << 4)
    mins[:, 4:] = (hi >> 4) | ((lo_m >> 6) << 4)
    return scales, mins


def dequant_q4_k(blocks: np.ndarray) -> np.ndarray:
    """``(n, 144)`` uint8 -> ``(n, 256)`` float32.

    Block: f16 d, f16 dmin, 12 B scales/mins, 128 B quants. The quants come in 4 groups of 32
    bytes; group g gives elements 64g..64g+31 (low nibbles, sub-block 2g) and 64g+32..64g+63
    (high nibbles, sub-block 2g+1).
    """
    n = blocks.shape[0]
    d = _f16(blocks[:, 0:2])
    dmin = _f16(blocks[:, 2:4])
    sc, m = _q4k_scales_mins(blocks[:, 4:16])
    scale = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    offset = (dmin * m.astype(np.float32)).reshape(n, 8, 1)
    qs = blocks[:, 16:144].reshape(n, 4, 1, 32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)
    return (scale * q - offset).reshape(n, QK_K)


def dequant_q6_k(blocks: np.ndarray) -> np.ndarray:
    """``(n, 210)`` uint8 -> ``(n, 256)`` float32.

    Block: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], f16 d. Each half h of 128
    elements uses ql[64h:64h+64] and qh[32h:32h+32]; its quarter k (32 elements, l = 0..31) takes
    the low nibble (k = 0, 1) or high nibble (k = 2, 3) of ql[64h + 32(k % 2) + l] and bits 2k..2k+1
    of qh[32h + l]; q = that 6-bit value - 32. Element e uses scale e // 16.
    """
    n = blocks.shape[0]
    ql = blocks[:, 0:128].reshape(n, 2, 2, 32)          # half, which 32 bytes, l
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)        # half, -, l
    scales = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
    d = _f16(blocks[:, 208:210])
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # half, quarter k, l
    high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    q = ((low | (high << 4)).astype(np.int8) - np.int8(32)).reshape(n, 16, 16).astype(np.float32)
    return ((d * scales).reshape(n, 16, 1) * q).reshape(n, QK_K)


BLOCK_DEQUANT = {"Q8_0": (32, 34, dequant_q8_0), "Q4_K": (QK_K, 144, dequant_q4_k), "Q6_K": (QK_K, 210, dequant_q6_k)}
"""ggml type name -> (elements per block, bytes per block, function)."""


def dequantize_rows(raw: np.ndarray, type_name: str) -> np.ndarray:
    """``raw``: uint8 array ``(..., row_bytes)`` of whole blocks -> float32 ``(..., row_elements)``."""
    block, size, fn = BLOCK_DEQUANT[type_name]
    lead = raw.shape[:-1]
    blocks = np.ascontiguousarray(raw).reshape(-1, size)
    with np.errstate(all="ignore"):  # inf/NaN scales in a file give inf/NaN values, as in ggml, silently
        values = fn(blocks) if blocks.shape[0] else np.zeros((0, block), dtype=np.float32)
    return values.reshape(*lead, raw.shape[-1] // size * block)
