#!/usr/bin/env python
"""Write tiny GGUF (llama.cpp) samples with the real writer, ``gguf.GGUFWriter`` (gguf-py).

    python sample_ckpts/make_gguf_samples.py [OUT_DIR] [--only NAME ...]

``tiny_llama.gguf``: a 2-layer llama-shaped model (token_embd, blk.N.attn_norm / attn_q / attn_k /
attn_v / attn_output / ffn_norm / ffn_gate / ffn_up / ffn_down, output_norm, output) with llama.*
hyperparameters and a tokenizer.ggml.* vocabulary, holding every type ckptscope reads: F32, F16,
BF16, Q8_0, Q4_K and Q6_K.

``other_quants.gguf``: Q4_0 and Q5_1 tensors (quantised by gguf-py), which ckptscope lists but
does not dequantise.

How each type is produced:

* F32 / F16: numpy arrays handed to ``add_tensor`` as they are.
* BF16, Q8_0, Q4_0, Q5_1: ``gguf.quants.quantize`` (gguf-py's bit-exact ports of ggml's reference
  quantisers), bytes handed to ``add_tensor(..., raw_dtype=...)``.
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
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, arch)
    kv(writer)
    for name, (values, type_name) in tensors.items():
        data, raw_dtype = encode(values, type_name)
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


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
    """``other_quants.gguf``: types ckptscope lists but does not dequantise (Q4_0, Q5_1)."""
    import gguf

    rng = np.random.default_rng(1)
    tensors = {"blk.0.attn_q.weight": ((rng.standard_normal((64, 64)) * 0.02).astype(np.float32), "Q4_0"),
               "blk.0.attn_k.weight": ((rng.standard_normal((64, 64)) * 0.02).astype(np.float32), "Q5_1"),
               "blk.0.attn_norm.weight": (np.ones(64, dtype=np.float32), "F32")}

    def kv(writer: "gguf.GGUFWriter") -> None:
        writer.add_block_count(1)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    return _write(out / "other_quants.gguf", "llama", tensors, kv)


WRITERS = {"tiny_llama.gguf": write_tiny_llama, "other_quants.gguf": write_other_quants}


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
