"""Dequantising ggml blocks to float32, bit for bit as gguf-py's ``gguf.quants.dequantize`` does.

Written from the block layouts in ggml's ``ggml-common.h`` and the reference
``dequantize_row_*`` functions in ``ggml-quants.c``. The float32 operations are done in the same
order as there (and as in gguf-py), with no fused multiply-add, so results are identical
(``tests/test_gguf.py`` checks every type on random bytes, NaN/inf scales included):

* Q8_0: ``x = f32(d) * q``; Q4_0 / Q5_0: ``x = d * (q - 8)`` / ``d * (q - 16)``
* Q4_1 / Q5_1: ``x = d * q + m``
* Q2_K, Q4_K, Q5_K: ``x = (d * sc) * q - (dmin * m)``
* Q3_K: ``x = (d * (sc - 32)) * q``, q in -4..3; Q6_K: ``x = (d * sc) * (q - 32)``
* TQ1_0 / TQ2_0: ``x = d * t``, t in -1..1 (base-3 digits / 2-bit codes)
* IQ4_NL / IQ4_XS: ``x = d * kvalues[q]`` / ``(d * (sc - 32)) * kvalues[q]``, ggml's 16-entry
  non-linear table; MXFP4: ``x = e8m0_half(e) * kvalues[q]``, the doubled fp4 e2m1 values

The lattice types (IQ1_*, IQ2_*, IQ3_*) decode through ggml's large codebook grids, and NVFP4
through an fp8 scale decode; ckptscope does not carry those tables: it hands such blocks to
``gguf.quants.dequantize`` when the optional ``gguf`` package is installed
(``pip install ckptscope[gguf]``) and refuses with one line otherwise (``DELEGATED``).

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


def _nibbles(qs: np.ndarray, group: int) -> np.ndarray:
    """Bytes ``(n, k*group)`` -> 4-bit codes ``(n, 2*k*group)``: per group of ``group`` bytes, the low
    nibbles (elements 0..group-1) then the high nibbles (group..2*group-1), as ggml packs them."""
    n = qs.shape[0]
    g = qs.reshape(n, -1, 1, group)
    return np.concatenate([g & 0x0F, g >> 4], axis=2).reshape(n, -1)


def _crumbs(qs: np.ndarray, group: int) -> np.ndarray:
    """Bytes ``(n, k*group)`` -> 2-bit codes ``(n, 4*k*group)``: per group, bits 0-1 of every byte,
    then bits 2-3, 4-5, 6-7 (the K-quant / TQ2_0 order)."""
    n = qs.shape[0]
    g = qs.reshape(n, -1, 1, group)
    return ((g >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03).reshape(n, -1)


def _bits(mask: np.ndarray, per_byte_first: bool = False) -> np.ndarray:
    """Bytes ``(n, B)`` -> single bits. Default: bit k of byte l is element ``B*k + l`` (the K-quant
    high-bit masks); ``per_byte_first``: bit k of byte l is element ``8*l + k`` (a little-endian bit
    string, Q5_0/Q5_1's ``qh``)."""
    n, width = mask.shape
    shifts = np.arange(8, dtype=np.uint8)
    if per_byte_first:
        return ((mask.reshape(n, width, 1) >> shifts.reshape(1, 1, 8)) & 1).reshape(n, -1)
    return ((mask.reshape(n, 1, width) >> shifts.reshape(1, 8, 1)) & 1).reshape(n, -1)


def dequant_q4_0(blocks: np.ndarray) -> np.ndarray:
    """``(n, 18)``: f16 d, 16 B of nibbles (elements 0-15 low, 16-31 high); ``x = d*(q-8)``."""
    q = _nibbles(blocks[:, 2:18], 16).astype(np.int8) - np.int8(8)
    return _f16(blocks[:, 0:2]) * q.astype(np.float32)


def dequant_q4_1(blocks: np.ndarray) -> np.ndarray:
    """``(n, 20)``: f16 d, f16 m, 16 B of nibbles; ``x = d*q + m``."""
    q = _nibbles(blocks[:, 4:20], 16).astype(np.float32)
    return _f16(blocks[:, 0:2]) * q + _f16(blocks[:, 2:4])


def _q5(blocks: np.ndarray, start: int) -> np.ndarray:
    """The 5-bit codes of Q5_0/Q5_1: 32 high bits (little-endian u32) at ``start``, then 16 B of nibbles."""
    high = _bits(blocks[:, start:start + 4], per_byte_first=True)
    return _nibbles(blocks[:, start + 4:start + 20], 16) | (high << 4)


def dequant_q5_0(blocks: np.ndarray) -> np.ndarray:
    """``(n, 22)``: f16 d, u32 high bits, 16 B of nibbles; ``x = d*(q-16)``."""
    q = _q5(blocks, 2).astype(np.int8) - np.int8(16)
    return _f16(blocks[:, 0:2]) * q.astype(np.float32)


def dequant_q5_1(blocks: np.ndarray) -> np.ndarray:
    """``(n, 24)``: f16 d, f16 m, u32 high bits, 16 B of nibbles; ``x = d*q + m``."""
    return _f16(blocks[:, 0:2]) * _q5(blocks, 4).astype(np.float32) + _f16(blocks[:, 2:4])


def dequant_q2_k(blocks: np.ndarray) -> np.ndarray:
    """``(n, 84)``: 16 B scales (low nibble scale, high nibble min, one per 16 elements), 64 B of 2-bit
    codes (two halves of 128 elements), f16 d, f16 dmin; ``x = (d*sc)*q - dmin*m``."""
    n = blocks.shape[0]
    sc, d, dmin = blocks[:, 0:16], _f16(blocks[:, 80:82]), _f16(blocks[:, 82:84])
    scale = (d * (sc & 0x0F).astype(np.float32)).reshape(n, 16, 1)
    offset = (dmin * (sc >> 4).astype(np.float32)).reshape(n, 16, 1)
    q = _crumbs(blocks[:, 16:80], 32).reshape(n, 16, 16).astype(np.float32)
    return (scale * q - offset).reshape(n, QK_K)


def _q3k_scales(packed: np.ndarray) -> np.ndarray:
    """12 bytes -> 16 signed 6-bit scales: low 4 bits from the nibbles of bytes 0-7 (all low nibbles,
    then all high), high 2 bits from bytes 8-11 (bits 0-1 of each, then 2-3, 4-5, 6-7); minus 32."""
    low = _nibbles(packed[:, 0:8], 8)
    high = _crumbs(packed[:, 8:12], 4)
    return (low | (high << 4)).astype(np.int8) - np.int8(32)


def dequant_q3_k(blocks: np.ndarray) -> np.ndarray:
    """``(n, 110)``: 32 B high-bit mask, 64 B of 2-bit low codes, 12 B scales, f16 d. A set mask bit
    means no offset, a clear one subtracts 4; ``x = (d*sc)*q``."""
    n = blocks.shape[0]
    d = _f16(blocks[:, 108:110])
    scale = (d * _q3k_scales(blocks[:, 96:108]).astype(np.float32)).reshape(n, 16, 1)
    low = _crumbs(blocks[:, 32:96], 32).astype(np.int8)
    high = _bits(blocks[:, 0:32]) ^ 1
    q = (low - (high << 2).astype(np.int8)).reshape(n, 16, 16).astype(np.float32)
    return (scale * q).reshape(n, QK_K)


def dequant_q5_k(blocks: np.ndarray) -> np.ndarray:
    """``(n, 176)``: f16 d, f16 dmin, 12 B scales/mins (as Q4_K), 32 B high bits, 128 B of nibbles."""
    n = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, m = _q4k_scales_mins(blocks[:, 4:16])
    scale = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    offset = (dmin * m.astype(np.float32)).reshape(n, 8, 1)
    q = (_nibbles(blocks[:, 48:176], 32) | (_bits(blocks[:, 16:48]) << 4)).reshape(n, 8, 32).astype(np.float32)
    return (scale * q - offset).reshape(n, QK_K)


_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _trits(packed: np.ndarray, digits: int) -> np.ndarray:
    """Base-3 packed bytes -> digits 0..2. Digit k of byte b is the top "third" of ``(b * 3**k) mod 256``
    (``(v * 3) >> 8``); digit-major order, as ggml unpacks them."""
    n, width = packed.shape
    shifted = packed.reshape(n, 1, width) * _POW3[:digits].reshape(1, digits, 1)  # uint8: wraps mod 256
    return ((shifted.astype(np.uint16) * 3) >> 8).reshape(n, -1)


def dequant_tq1_0(blocks: np.ndarray) -> np.ndarray:
    """``(n, 54)``: 48 B of 5 base-3 digits each (32 B then 16 B), 4 B of 4 digits, f16 d; ``x = d*(t-1)``."""
    t = np.concatenate([_trits(blocks[:, 0:32], 5), _trits(blocks[:, 32:48], 5), _trits(blocks[:, 48:52], 4)],
                       axis=1).astype(np.int8) - np.int8(1)
    return _f16(blocks[:, 52:54]) * t.astype(np.float32)


def dequant_tq2_0(blocks: np.ndarray) -> np.ndarray:
    """``(n, 66)``: 64 B of 2-bit codes, f16 d; ``x = d*(q-1)``."""
    q = _crumbs(blocks[:, 0:64], 32).astype(np.int8) - np.int8(1)
    return _f16(blocks[:, 64:66]) * q.astype(np.float32)


IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
"""ggml's ``kvalues_iq4nl``: the non-linear 4-bit code book of IQ4_NL and IQ4_XS."""
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)
"""fp4 e2m1 values doubled (ggml's ``kvalues_mxfp4``); the scale is halved to match."""


def dequant_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    """``(n, 18)``: f16 d, 16 B of 4-bit indices; ``x = d*IQ4_VALUES[q]``."""
    return _f16(blocks[:, 0:2]) * IQ4_VALUES[_nibbles(blocks[:, 2:18], 16)]


def dequant_iq4_xs(blocks: np.ndarray) -> np.ndarray:
    """``(n, 136)``: f16 d, u16 of high scale bits (2 per sub-block), 4 B of low scale nibbles, 128 B of
    indices (16 B per 32-element sub-block); ``x = (d*(sc-32))*IQ4_VALUES[q]``."""
    n = blocks.shape[0]
    d = _f16(blocks[:, 0:2])
    high_bits = np.ascontiguousarray(blocks[:, 2:4]).view("<u2").astype(np.uint16)
    high = ((high_bits >> np.arange(0, 16, 2, dtype=np.uint16).reshape(1, 8)) & 0x03).astype(np.uint8)
    low = np.stack([blocks[:, 4:8] & 0x0F, blocks[:, 4:8] >> 4], axis=2).reshape(n, 8)
    sc = (low | (high << 4)).astype(np.int8) - np.int8(32)
    scale = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    return (scale * IQ4_VALUES[_nibbles(blocks[:, 8:136], 16)].reshape(n, 8, 32)).reshape(n, QK_K)


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    """An e8m0 exponent byte as float32, halved (ggml's ``ggml_e8m0_to_fp32_half``): 2**(e-128)."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(np.uint32)
    return bits.view(np.float32)


def dequant_mxfp4(blocks: np.ndarray) -> np.ndarray:
    """``(n, 17)``: e8m0 exponent, 16 B of fp4 e2m1 codes; ``x = e8m0_half(e)*MXFP4_VALUES[q]``."""
    return _e8m0_half(blocks[:, 0:1]) * MXFP4_VALUES[_nibbles(blocks[:, 1:17], 16)]


BLOCK_DEQUANT = {
    "Q4_0": (32, 18, dequant_q4_0), "Q4_1": (32, 20, dequant_q4_1), "Q5_0": (32, 22, dequant_q5_0),
    "Q5_1": (32, 24, dequant_q5_1), "Q8_0": (32, 34, dequant_q8_0),
    "Q2_K": (QK_K, 84, dequant_q2_k), "Q3_K": (QK_K, 110, dequant_q3_k), "Q4_K": (QK_K, 144, dequant_q4_k),
    "Q5_K": (QK_K, 176, dequant_q5_k), "Q6_K": (QK_K, 210, dequant_q6_k),
    "TQ1_0": (QK_K, 54, dequant_tq1_0), "TQ2_0": (QK_K, 66, dequant_tq2_0),
    "IQ4_NL": (32, 18, dequant_iq4_nl), "IQ4_XS": (QK_K, 136, dequant_iq4_xs), "MXFP4": (32, 17, dequant_mxfp4),
}
"""ggml type name -> (elements per block, bytes per block, function): ckptscope's own dequantisers."""


def _gguf_dequant(type_name: str):
    """``gguf.quants.dequantize`` for one type, as a block function; CkptError without the package."""
    try:
        import gguf.quants
    except ImportError:
        from ckptscope.core.errors import CkptError

        raise CkptError(f"{type_name} values need the optional gguf package (its code book tables): "
                        "pip install 'ckptscope[gguf]'") from None
    qtype = gguf.GGMLQuantizationType[type_name]
    return lambda blocks: np.asarray(gguf.quants.dequantize(blocks, qtype), dtype=np.float32)


def dequantize_rows(raw: np.ndarray, type_name: str) -> np.ndarray:
    """``raw``: uint8 array ``(..., row_bytes)`` of whole blocks -> float32 ``(..., row_elements)``."""
    if type_name in BLOCK_DEQUANT:
        block, size, fn = BLOCK_DEQUANT[type_name]
    else:
        from ckptscope.formats.gguf.types import BY_NAME

        block, size, fn = BY_NAME[type_name].block_size, BY_NAME[type_name].type_size, _gguf_dequant(type_name)
    lead = raw.shape[:-1]
    blocks = np.ascontiguousarray(raw).reshape(-1, size)
    with np.errstate(all="ignore"):  # inf/NaN scales in a file give inf/NaN values, as in ggml, silently
        values = fn(blocks) if blocks.shape[0] else np.zeros((0, block), dtype=np.float32)
    return values.reshape(*lead, raw.shape[-1] // size * block)
