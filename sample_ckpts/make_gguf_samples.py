#!/usr/bin/env python
"""Write tiny GGUF (llama.cpp) samples with the real writer, ``gguf.GGUFWriter`` (gguf-py).

    python sample_ckpts/make_gguf_samples.py [OUT_DIR] [--only NAME ...]

``tiny_llama.gguf``: a 2-layer llama-shaped model (token_embd, blk.N.attn_norm / attn_q / attn_k /
attn_v / attn_output / ffn_norm / ffn_gate / ffn_up / ffn_down, output_norm, output) with llama.*
hyperparameters and a tokenizer.ggml.* vocabulary, holding every type ckptscope reads: F32, F16,
BF16, Q8_0, Q4_K and Q6_K.

``all_quants.gguf``: one ``[2, 256]`` tensor of every other quantised type ckptscope reads (legacy
Q4_0/Q4_1/Q5_0/Q5_1, K-quants Q2_K/Q3_K/Q5_K, TQ1_0/TQ2_0, IQ4_NL/IQ4_XS, MXFP4, and the lattice
IQ1/IQ2/IQ3 types and NVFP4 that it reads through the optional gguf package).

``other_quants.gguf``: Q8_1, Q8_K and Q1_0 tensors (random valid blocks), which ckptscope lists
with their block layout but does not dequantise (gguf-py cannot either).

How each type is produced:

* F32 / F16: numpy arrays handed to ``add_tensor`` as they are.
* BF16, Q8_0, Q4_0, Q5_1: ``gguf.quants.quantize`` (gguf-py's bit-exact ports of ggml's reference
  quantisers), bytes handed to ``add_tensor(..., raw_dtype=...)``.
* Q4_0, Q4_1, Q5_0, Q5_1, TQ1_0, TQ2_0, MXFP4 (all_quants): ``gguf.quants.quantize`` as well.
* Q2_K, Q3_K, Q5_K, IQ* and NVFP4 (all_quants), Q8_1, Q8_K, Q1_0 (other_quants): gguf-py has no
  quantiser for them, so the blocks are random bytes with their f16/f32 scale fields set to small
  finite values (``random_blocks``): valid blocks of the type, whose values only matter as the
  bytes both dequantisers must agree on.
* Q4_K, Q6_K: gguf-py 0.19 cannot quantise K-quants (``quantize`` raises NotImplementedError; only
  their dequantisers exist). ``quantize_q4_k`` / ``quantize_q6_k`` below are simplified versions of
  ggml's ``quantize_row_q4_K_ref`` / ``quantize_row_q6_K_ref``: the same block layout and packing,
  but plain min/max (Q4_K) and abs-max (Q6_K) scales per sub-block instead of ggml's iterative
  scale search, so their error is somewhat larger than llama.cpp's. Every block is valid, and the
  script checks that ``gguf.quants.dequantize`` of the packed bytes is close to the input.

Shapes in numpy order (``[out_features, in_features]``); GGUF stores the dims reversed. Rows that
are K-quantised have 256 elements (one super-block), so the hidden size is 256.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HIDDEN = 256
FFN = 512
LAYERS = 2
HEADS = 4
KV_HEADS = 2
VOCAB = 256
HEAD_DIM = HIDDEN // HEADS

LAYER_TYPES = [
    {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q8_0",
     "ffn_gate": "Q4_K", "ffn_up": "Q8_0", "ffn_down": "Q6_K"},
    {"attn_q": "F16", "attn_k": "BF16", "attn_v": "F32", "attn_output": "F16",
     "ffn_gate": "BF16", "ffn_up": "F16", "ffn_down": "F32"},
]
"""ggml type of each weight in blk.0 and blk.1 (norms are F32, as llama.cpp writes them)."""


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """float32 ``(..., n*256)`` -> Q4_K bytes ``(..., n*144)``.

    Per super-block: 8 sub-blocks of 32 with ``x ~= d*sc_j*q - dmin*m_j``, q in 0..15, sc_j and m_j
    6-bit. Block bytes: f16 d, f16 dmin, 12 bytes of scales/mins packed as ggml's
    ``get_scale_min_k4`` unpacks them, 128 bytes of quants (32-byte group g: low nibbles are
    sub-block 2g, high nibbles sub-block 2g+1).
    """
    shape = rows.shape
    x = rows.astype(np.float32).reshape(-1, 8, 32)
    n = x.shape[0]
    lo = np.minimum(x.min(axis=2), 0.0)                      # (n, 8), <= 0
    hi = x.max(axis=2)
    scale = (hi - lo) / 15.0
    d = _f16(scale.max(axis=1) / 63.0).astype(np.float32)    # (n,)
    dmin = _f16((-lo).max(axis=1) / 63.0).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(0, 63).astype(np.uint8)
        m = np.where(dmin[:, None] > 0, np.rint(-lo / dmin[:, None]), 0).clip(0, 63).astype(np.uint8)
        step = d[:, None] * sc
        q = np.where(step[..., None] > 0, np.rint((x + (dmin[:, None] * m)[..., None]) / step[..., None]), 0)
    q = q.clip(0, 15).astype(np.uint8)                       # (n, 8, 32)
    packed = np.zeros((n, 12), dtype=np.uint8)
    packed[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(n, 128)
    out = np.concatenate([_f16(d).reshape(n, 1).view(np.uint8), _f16(dmin).reshape(n, 1).view(np.uint8),
                          packed, qs], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // 256 * 144)


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """float32 ``(..., n*256)`` -> Q6_K bytes ``(..., n*210)``.

    Per super-block: 16 sub-blocks of 16 with ``x ~= d*sc_j*(q-32)``, q in 0..63, sc_j int8. Block
    bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], f16 d; element
    128h + 32k + l lives in ql[64h + 32(k%2) + l] (low nibble for k < 2) and bits 2k.. of qh[32h + l].
    """
    shape = rows.shape
    x = rows.astype(np.float32).reshape(-1, 16, 16)
    n = x.shape[0]
    scale = np.abs(x).max(axis=2) / 31.0                    # (n, 16)
    d = _f16(scale.max(axis=1) / 127.0).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(-128, 127).astype(np.int8)
        step = d[:, None] * sc.astype(np.float32)
        q = np.where(step[..., None] > 0, np.rint(x / step[..., None]), 0)
    q = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(n, 2, 4, 32)   # half, quarter k, l
    low, high = q & 0x0F, q >> 4
    ql = (low[:, :, 0:2, :] | (low[:, :, 2:4, :] << 4)).reshape(n, 128)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(n, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), _f16(d).reshape(n, 1).view(np.uint8)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // 256 * 210)


def encode(values: np.ndarray, type_name: str) -> tuple[np.ndarray, object | None]:
    """``(array for add_tensor, raw_dtype)`` for one ggml type, checked against gguf-py's dequantiser."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    values = values.astype(np.float32)
    if type_name == "F32":
        return values, None
    if type_name == "F16":
        return values.astype(np.float16), None
    if type_name == "Q4_K":
        data = quantize_q4_k(values)
    elif type_name == "Q6_K":
        data = quantize_q6_k(values)
    else:
        data = gguf.quants.quantize(values, qtype)
    back = gguf.quants.dequantize(data, qtype)
    assert back.shape == values.shape, (type_name, back.shape, values.shape)
    err = np.abs(back - values).max() / max(float(np.abs(values).max()), 1e-12)
    assert err < 0.2, f"{type_name}: relative error {err:.3f}, the packing is wrong"
    return data, qtype


SCALE_FIELDS: dict[str, tuple[int, str]] = {
    "Q2_K": (80, "<f2"), "Q3_K": (108, "<f2"), "Q5_K": (0, "<f2"), "IQ4_NL": (0, "<f2"), "IQ4_XS": (0, "<f2"),
    "IQ2_XXS": (0, "<f2"), "IQ2_XS": (0, "<f2"), "IQ2_S": (0, "<f2"), "IQ3_XXS": (0, "<f2"), "IQ3_S": (0, "<f2"),
    "IQ1_S": (0, "<f2"), "Q8_1": (0, "<f2"), "Q8_K": (0, "<f4"), "Q1_0": (0, "<f2"),
}
"""Byte offset and type of the block scale ``d`` (ggml-common.h), set to a finite value in random blocks."""
QUANTISABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "TQ1_0", "TQ2_0", "MXFP4")
"""Types gguf-py 0.19 can quantise (besides Q8_0 and BF16)."""


def random_blocks(type_name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes of ``rows`` rows of ``cols`` elements of a ggml type, scales made small and finite."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    if type_name in SCALE_FIELDS:
        offset, fmt = SCALE_FIELDS[type_name]
        width = np.dtype(fmt).itemsize
        scale = (rng.uniform(0.001, 0.01, size=(rows, cols // block, 1))).astype(fmt)
        raw[..., offset:offset + width] = scale.view(np.uint8)
    return raw.reshape(rows, cols // block * size)


def write_all_quants(out: Path) -> Path:
    """``all_quants.gguf``: a ``[2, 256]`` tensor of every quantised type beyond tiny_llama's."""
    import gguf

    rng = np.random.default_rng(2)
    tensors: dict[str, tuple[np.ndarray, object]] = {}
    for type_name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "TQ1_0", "TQ2_0", "IQ4_NL", "IQ4_XS",
                      "MXFP4", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "NVFP4"):
        qtype = gguf.GGMLQuantizationType[type_name]
        if type_name in QUANTISABLE:
            values = (rng.standard_normal((2, 256)) * 0.02).astype(np.float32)
            tensors[f"{type_name.lower()}.weight"] = (gguf.quants.quantize(values, qtype), qtype)
        else:
            tensors[f"{type_name.lower()}.weight"] = (random_blocks(type_name, 2, 256, rng), qtype)
    return _write_raw(out / "all_quants.gguf", tensors)


def _write_raw(path: Path, tensors: dict[str, tuple[np.ndarray, object]], kv=None, arch: str = "llama") -> Path:
    """Already-encoded tensors (array + raw_dtype) through GGUFWriter; ``kv`` adds the metadata
    (default: a minimal llama header)."""
    import gguf

    def minimal(writer: "gguf.GGUFWriter") -> None:
        writer.add_block_count(1)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, arch)
    (kv or minimal)(writer)
    for name, (data, raw_dtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_llama_tensors(seed: int = 0) -> dict[str, tuple[np.ndarray, str]]:
    """name -> (float32 values in numpy order, ggml type)."""
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + rng.standard_normal(HIDDEN) * 0.05).astype(np.float32)

    out: dict[str, tuple[np.ndarray, str]] = {"token_embd.weight": (w(VOCAB, HIDDEN), "Q4_K")}
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
              "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HIDDEN),
              "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
    for layer, types in enumerate(LAYER_TYPES):
        out[f"blk.{layer}.attn_norm.weight"] = (norm(), "F32")
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            out[f"blk.{layer}.{part}.weight"] = (w(*shapes[part]), types[part])
        out[f"blk.{layer}.ffn_norm.weight"] = (norm(), "F32")
        for part in ("ffn_gate", "ffn_up", "ffn_down"):
            out[f"blk.{layer}.{part}.weight"] = (w(*shapes[part]), types[part])
    out["output_norm.weight"] = (norm(), "F32")
    out["output.weight"] = (w(VOCAB, HIDDEN), "Q6_K")
    return out


def _write(path: Path, arch: str, tensors: dict[str, tuple[np.ndarray, str]], kv) -> Path:
    """Float tensors encoded to their ggml types (``encode``), then written by ``_write_raw``."""
    return _write_raw(path, {name: encode(values, type_name) for name, (values, type_name) in tensors.items()},
                      kv, arch)


def write_tiny_llama(out: Path) -> Path:
    """``tiny_llama.gguf``: every readable type in a llama-shaped model."""
    import gguf

    def kv(writer: "gguf.GGUFWriter") -> None:
        writer.add_name("ckptscope tiny llama")
        writer.add_context_length(128)
        writer.add_embedding_length(HIDDEN)
        writer.add_block_count(LAYERS)
        writer.add_feed_forward_length(FFN)
        writer.add_head_count(HEADS)
        writer.add_head_count_kv(KV_HEADS)
        writer.add_rope_dimension_count(HEAD_DIM)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_vocab_size(VOCAB)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.add_tokenizer_model("llama")
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(VOCAB - 3)]
        writer.add_token_list(tokens)
        writer.add_token_scores([float(-i) for i in range(VOCAB)])
        writer.add_token_types([2, 3, 3] + [6] * (VOCAB - 3))
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)

    return _write(out / "tiny_llama.gguf", "llama", tiny_llama_tensors(), kv)


def write_other_quants(out: Path) -> Path:
    """``other_quants.gguf``: types ckptscope lists but does not dequantise (Q8_1, Q8_K, Q1_0)."""
    import gguf

    rng = np.random.default_rng(1)
    tensors = {f"{name.lower()}.weight": (random_blocks(name, 2, 256, rng), gguf.GGMLQuantizationType[name])
               for name in ("Q8_1", "Q8_K", "Q1_0")}
    tensors["attn_norm.weight"] = (np.ones(64, dtype=np.float32), None)
    return _write_raw(out / "other_quants.gguf", tensors)


WRITERS = {"tiny_llama.gguf": write_tiny_llama, "all_quants.gguf": write_all_quants,
           "other_quants.gguf": write_other_quants}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--only", nargs="*", choices=sorted(WRITERS), help="write only these samples")
    args = parser.parse_args(argv)
    for name in args.only or WRITERS:
        print(f"wrote {WRITERS[name](Path(args.out))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
