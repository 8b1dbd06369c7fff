"""Block-scaled quantised weights: a low-precision payload and its per-block scales, as one tensor.

Two layouts ship in public checkpoints, in any format that stores named tensors (safetensors files
and HF dirs in practice; FP8 also in the Megatron checkpoints ``convert --dtype keep`` writes, each
weight and its scales split over TP ranks alike, so there the pair may be several chunks):

* **FP8 block** (DeepSeek-V3/R1, Qwen3-FP8, ``transformers`` ``FineGrainedFP8Config``): ``X`` is
  ``float8_e4m3fn`` ``[..., M, N]`` and ``X_scale_inv`` (``X.weight`` -> ``X.weight_scale_inv``) holds
  one multiplier per ``bm x bn`` block, ``[..., ceil(M/bm), ceil(N/bn)]``; the value is
  ``float32(w) * scale_inv`` of its block (DeepSeek-V3 ``inference/kernel.py`` ``weight_dequant``).
  Edge blocks are partial when M or N is no multiple of the block. The block is the config's
  ``quantization_config.weight_block_size``, else 128 x 128 (the only size DeepSeek ships).
* **MXFP4** (GPT-OSS experts, OCP Microscaling): ``X_blocks`` uint8 ``[..., R, G, 16]`` packs 32 e2m1
  values per group, two a byte, the low nibble first; ``X_scales`` uint8 ``[..., R, G]`` is the
  group's e8m0 exponent (bias 127). transformers (``integrations/mxfp4.py``) dequantises to
  ``[..., R, G*32]`` and swaps the last two axes, giving the parameter ``X`` ``[..., G*32, R]``
  (``gate_up_proj`` ``[E, hidden, 2*intermediate]``); the logical tensor here has that shape and
  name, so it converts straight to the unquantised model. An e8m0 byte of 255 is NaN (OCP MX spec).

Indexing folds each such pair into one logical tensor: dtype float32 (what reading gives, every
product exact in float32), one ``Encoding.BLOCK_SCALED`` chunk on the payload's bytes, and
``quant_*`` attrs naming the scheme, block and stored tensors; the scale entry disappears from the
index. Reading a region touches only the blocks and scales it meets. ``show_stored_quantization()``
on a reader keeps the stored entries instead (``diff --raw``). Metadata only at import: numpy is
imported by the functions that compute.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptscope.core.index import CheckpointIndex
from ckptscope.core.tensor import Chunk, Encoding, TensorMeta

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

FP8_PAYLOADS = ("float8_e4m3fn", "float8_e5m2")
FP8_SCALES = ("float32", "bfloat16", "float16", "float8_e8m0fnu")
DEFAULT_FP8_BLOCK = (128, 128)
PAIR_SUFFIXES = (("_scale_inv", ""), ("_scales", "_blocks"))
"""(scale suffix, payload suffix) by which a payload and its scales are paired: FP8 blocks ``X`` +
``X_scale_inv``, MXFP4 ``X_blocks`` + ``X_scales`` (``fold_block_scaled``; rename keeps pairs whole)."""
MX_GROUP = 32
"""Values per MXFP4 scale (16 bytes of two nibbles)."""
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The 16 fp4 e2m1 codes: sign bit 3, two exponent bits, one mantissa bit (OCP MX spec table)."""

Bounds = tuple[tuple[int, int], ...]
StoredReader = Callable[[TensorMeta, Bounds], "np.ndarray"]


@dataclass(frozen=True, slots=True)
class BlockScaled:
    """One logical tensor: which stored tensors hold it and how to dequantise a box of it."""

    scheme: str
    """``"fp8_block"`` or ``"mxfp4"``."""
    payload: TensorMeta
    scale: TensorMeta
    block: tuple[int, ...]
    """FP8: ``(bm, bn)`` over the last two axes; MXFP4: ``(32,)`` values per scale."""

    def read(self, read_stored: StoredReader, bounds: Bounds) -> "np.ndarray":
        """The box ``bounds`` of the logical tensor, dequantised to float32."""
        if self.scheme == "fp8_block":
            return _read_fp8(self, read_stored, bounds)
        return _read_mxfp4(self, read_stored, bounds)


# --- pairing (metadata only) ------------------------------------------------------------------


def _plain(meta: TensorMeta) -> bool:
    """One raw little-endian chunk holding the whole tensor: the shape every HF-style file stores."""
    return len(meta.chunks) == 1 and meta.chunks[0].shape == meta.shape and _raw(meta)


def _raw(meta: TensorMeta) -> bool:
    """Raw little-endian chunks, one or several: the TP pieces of a Megatron tensor, or torch_dist's items
    (zip items its reader resolves on read), as ``convert --dtype keep`` writes FP8 (ops/convert/fp8_keep.py)."""
    return bool(meta.chunks) and all(c.encoding in (Encoding.RAW, Encoding.TORCH_ZIP_ITEM) and not c.big_endian
                                     and c.strides is None for c in meta.chunks)


def config_block_size(config: dict) -> tuple[int, int] | None:
    """An HF config's ``quantization_config.weight_block_size``, when it names a 2-D block."""
    quant = config.get("quantization_config")
    size = quant.get("weight_block_size") if isinstance(quant, dict) else None
    if isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size):
        return size[0], size[1]
    return None


def _config_block(index: CheckpointIndex) -> tuple[int, int] | None:
    for obj in index.objects:
        if obj.name == "config" and isinstance(obj.value, dict):
            size = config_block_size(obj.value)
            if size is not None:
                return size
    return None


def fp8_pair_problem(payload: TensorMeta, scale: TensorMeta, block: tuple[int, int]) -> str | None:
    """Why ``payload`` + ``scale`` is not an FP8 block pair, or None when it is."""
    if payload.dtype not in FP8_PAYLOADS or scale.dtype not in FP8_SCALES:
        return f"dtypes {payload.dtype} + {scale.dtype}"
    if len(payload.shape) < 2 or len(scale.shape) != len(payload.shape) or scale.shape[:-2] != payload.shape[:-2]:
        return f"shapes {list(payload.shape)} + {list(scale.shape)}"
    grid = tuple(math.ceil(n / b) for n, b in zip(payload.shape[-2:], block))
    if scale.shape[-2:] != grid:
        return (f"scale grid {list(scale.shape[-2:])} is not that of {block[0]}x{block[1]} blocks over "
                f"{list(payload.shape[-2:])} ({list(grid)})")
    return None


def _mxfp4_pair(payload: TensorMeta, scale: TensorMeta) -> str | None:
    if payload.dtype != "uint8" or scale.dtype not in ("uint8", "float8_e8m0fnu"):
        return f"dtypes {payload.dtype} + {scale.dtype}"
    if len(payload.shape) < 3 or payload.shape[-1] != MX_GROUP // 2 or scale.shape != payload.shape[:-1]:
        return f"shapes {list(payload.shape)} + {list(scale.shape)}"
    return None


def fold_block_scaled(index: CheckpointIndex) -> dict[str, BlockScaled]:
    """Replace each payload + scales pair in ``index.tensors`` by its logical tensor (at the payload's
    place in the order) and return how to read them. A pair whose shapes do not fit is left as stored,
    with a warning: guessing a block would be silently wrong."""
    tensors = index.tensors
    found: dict[str, BlockScaled] = {}
    if "_scale" not in "\0".join(tensors):  # no scale tensor at all: one C-level scan (issue 15)
        return found
    block = _config_block(index) or DEFAULT_FP8_BLOCK
    for name in list(tensors):
        if name.endswith("_scale_inv"):
            scheme, payload_name, logical = "fp8_block", name.removesuffix("_scale_inv"), name.removesuffix("_scale_inv")
        elif name.endswith("_scales"):
            scheme, payload_name, logical = "mxfp4", name.removesuffix("_scales") + "_blocks", name.removesuffix("_scales")
        else:
            continue
        payload, scale = tensors.get(payload_name), tensors[name]
        stored_as = _raw if scheme == "fp8_block" else _plain  # MXFP4's logical axes are not the stored ones
        if payload is None or not (stored_as(payload) and stored_as(scale)):
            continue
        if scheme == "fp8_block":
            problem = fp8_pair_problem(payload, scale, block)
        else:
            problem = _mxfp4_pair(payload, scale)
            if problem is None and logical in tensors:
                problem = f"{logical} is stored too"
        if problem is not None:
            if payload.dtype in FP8_PAYLOADS or payload_name.endswith("_blocks"):
                index.warnings.append(f"{payload_name}: listed as stored, not dequantised: {problem}")
            continue
        entry = BlockScaled(scheme, payload, scale, block if scheme == "fp8_block" else (MX_GROUP,))
        found[logical] = entry
    if not found:
        return found
    rebuilt: dict[str, TensorMeta] = {}
    owner = {e.payload.name: logical for logical, e in found.items()}
    scales = {e.scale.name for e in found.values()}
    for name, meta in tensors.items():
        if name in owner:
            rebuilt[owner[name]] = _logical_meta(owner[name], found[owner[name]])
        elif name not in scales:
            rebuilt[name] = meta
    tensors.clear()
    tensors.update(rebuilt)
    return found


def _logical_meta(name: str, entry: BlockScaled) -> TensorMeta:
    """The logical tensor's metadata; its ``quant_*`` attrs are what ``TensorMeta.quantization`` reads."""
    payload, scale = entry.payload, entry.scale
    if entry.scheme == "fp8_block":
        shape = payload.shape
        payload_dtype, scale_dtype = payload.dtype, scale.dtype
        values = "float32(w) * scale_inv of its block"
    else:
        *lead, rows, groups, _ = payload.shape
        shape = (*lead, groups * MX_GROUP, rows)
        payload_dtype, scale_dtype = "float4_e2m1fn x2 in uint8, low nibble first", "e8m0 in uint8, bias 127"
        values = "e2m1 * 2**(scale - 127), last two axes swapped as transformers loads it"
    attrs = (("quant_scheme", entry.scheme), ("quant_block", "x".join(map(str, entry.block))),
             ("quant_payload", payload.name), ("quant_payload_dtype", payload_dtype),
             ("quant_payload_shape", str(list(payload.shape))), ("quant_scale", scale.name),
             ("quant_scale_dtype", scale_dtype), ("quant_scale_shape", str(list(scale.shape))),
             ("stored_bytes", str(sum(c.byte_length for c in payload.chunks + scale.chunks))),
             ("values", "dequantised to float32 on read: " + values))
    if entry.scheme == "fp8_block":  # one logical chunk per stored payload chunk (same offsets and shape)
        chunks = tuple(Chunk(c.offsets, c.shape, c.file, c.byte_offset, c.byte_length, Encoding.BLOCK_SCALED)
                       for c in payload.chunks)
    else:
        stored = payload.chunks[0]
        chunks = (Chunk((0,) * len(shape), shape, stored.file, stored.byte_offset, stored.byte_length,
                        Encoding.BLOCK_SCALED),)
    return TensorMeta(name, "float32", shape, chunks, attrs)


# --- dequantisation (numpy) --------------------------------------------------------------------


def dequantize_fp8_block(payload: "np.ndarray", scale: "np.ndarray", block: tuple[int, int],
                         origin: tuple[int, int] = (0, 0)) -> "np.ndarray":
    """``float32(payload) * scale`` of each element's block. ``payload`` is a box of the stored tensor
    starting at row/column ``origin``; ``scale`` the scale rows/columns of the blocks it meets."""
    import numpy as np

    bm, bn = block
    r0, c0 = origin
    rows, cols = payload.shape[-2:]
    expanded = np.repeat(np.repeat(scale.astype(np.float32), bm, axis=-2), bn, axis=-1)
    dr, dc = r0 - (r0 // bm) * bm, c0 - (c0 // bn) * bn
    expanded = expanded[..., dr:dr + rows, dc:dc + cols]
    return payload.astype(np.float32) * expanded


def dequantize_mxfp4(blocks: "np.ndarray", scales: "np.ndarray") -> "np.ndarray":
    """``[..., G, 16]`` packed e2m1 + ``[..., G]`` e8m0 exponents -> float32 ``[..., G*32]`` (not transposed)."""
    import numpy as np

    lut = np.array(E2M1, dtype=np.float32)
    values = np.empty(blocks.shape[:-1] + (MX_GROUP,), dtype=np.float32)
    values[..., 0::2] = lut[blocks & 0x0F]
    values[..., 1::2] = lut[blocks >> 4]
    exponent = scales.view(np.uint8).astype(np.int32) - 127
    with np.errstate(over="ignore"):  # 6 * 2**127 is past float32's range: inf, as in transformers
        out = np.ldexp(values, exponent[..., None])
    out[scales.view(np.uint8) == 255] = np.nan
    return out.reshape(*blocks.shape[:-2], blocks.shape[-2] * MX_GROUP)


def _read_fp8(entry: BlockScaled, read_stored: StoredReader, bounds: Bounds) -> "np.ndarray":
    bm, bn = entry.block
    (r0, r1), (c0, c1) = bounds[-2:]
    scale_bounds = bounds[:-2] + ((r0 // bm, -(-r1 // bm)), (c0 // bn, -(-c1 // bn)))
    payload = read_stored(entry.payload, bounds)
    scale = read_stored(entry.scale, scale_bounds)
    return dequantize_fp8_block(payload, scale, (bm, bn), (r0, c0))


def _read_mxfp4(entry: BlockScaled, read_stored: StoredReader, bounds: Bounds) -> "np.ndarray":
    """Logical ``[..., k, r]`` is stored ``[..., r, k/32, 16]``: read the groups the box meets, then swap."""
    import numpy as np

    lead, (k0, k1), (r0, r1) = bounds[:-2], bounds[-2], bounds[-1]
    g0, g1 = k0 // MX_GROUP, -(-k1 // MX_GROUP)
    box = lead + ((r0, r1), (g0, g1))
    blocks = read_stored(entry.payload, box + ((0, MX_GROUP // 2),))
    scales = read_stored(entry.scale, box)
    values = dequantize_mxfp4(blocks, scales)[..., k0 - g0 * MX_GROUP:k1 - g0 * MX_GROUP]
    return np.ascontiguousarray(np.swapaxes(values, -1, -2))
