"""Tiny block-scaled checkpoints for the FP8 and MXFP4 tests, written with the real libraries.

FP8: a Llama model built by transformers (random init, bf16), its linear weights quantised the way
DeepSeek-V3's release does it per 128x128 block (``scale = amax / 448``, ``w_fp8 = (w / scale)`` cast
to ``float8_e4m3fn``, stored ``weight_scale_inv = scale``), saved by ``safetensors.torch.save_file``
with a ``quantization_config`` like DeepSeek-V3's config.json. Hidden 200 / intermediate 300 are
no multiples of 128, so every weight has partial edge blocks. transformers' own ``Fp8Quantize``
skips such shapes and GPT-OSS's MXFP4 quantiser runs on triton only, so both quantisers are
written here from the published formulas (neither is the code under test: ckptscope only reads).

MXFP4: GPT-OSS's expert layout (``mlp.experts.gate_up_proj_blocks`` ``[E, 2I, H/32, 16]`` uint8 and
``_scales`` ``[E, 2I, H/32]`` uint8, ``down_proj_*`` likewise) made from random weights by the OCP
MX recipe: per 32 values, shared exponent ``floor(log2(amax)) - 2`` (e2m1's largest exponent),
each value rounded to the nearest e2m1 code, two codes a byte, the low nibble first.
"""

from __future__ import annotations

import json
from pathlib import Path

FP8_MAX = 448.0
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def quantize_fp8_block(weight, block: int = 128):
    """DeepSeek-V3's per-block FP8 weight quantisation (edge blocks partial). Returns (fp8, scale_inv)."""
    import torch

    w = weight.float()
    rows, cols = w.shape
    grid = (-(-rows // block), -(-cols // block))
    scale = torch.empty(grid, dtype=torch.float32)
    out = torch.empty_like(w)
    for i in range(grid[0]):
        for j in range(grid[1]):
            tile = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            s = tile.abs().amax().clamp(min=1e-12) / FP8_MAX
            scale[i, j] = s
            out[i * block:(i + 1) * block, j * block:(j + 1) * block] = tile / s
    return out.to(torch.float8_e4m3fn), scale


def write_fp8_llama(out: Path, *, hidden: int = 200, intermediate: int = 300) -> Path:
    """A one-layer Llama HF dir whose projections are FP8 block-scaled (norms, embeddings in bf16)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, vocab_size=260,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    tensors = {}
    for name, value in model.state_dict().items():
        if name.endswith(("proj.weight", "proj_with_mqa.weight")):
            fp8, scale_inv = quantize_fp8_block(value)
            tensors[name] = fp8.contiguous()
            tensors[name.removesuffix("weight") + "weight_scale_inv"] = scale_inv.contiguous()
        else:
            tensors[name] = value.contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
    cfg["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def quantize_mxfp4(weight):
    """OCP MX quantisation of ``[..., K]`` (K a multiple of 32) -> (blocks uint8 [..., K/32, 16], scales uint8)."""
    import torch

    w = weight.float().reshape(*weight.shape[:-1], weight.shape[-1] // 32, 32)
    amax = w.abs().amax(dim=-1).clamp(min=2.0 ** -120)
    exponent = torch.floor(torch.log2(amax)) - 2
    scaled = w / torch.pow(2.0, exponent)[..., None]
    grid = torch.tensor(E2M1)
    code = (scaled.abs()[..., None] - grid).abs().argmin(dim=-1)
    code = code | ((scaled < 0).to(torch.int64) << 3)
    code = code.to(torch.uint8)
    packed = code[..., 0::2] | (code[..., 1::2] << 4)
    return packed.contiguous(), (exponent + 127).to(torch.uint8).contiguous()


def write_gpt_oss_experts(out: Path, *, experts: int = 2, hidden: int = 96, intermediate: int = 64) -> Path:
    """A safetensors file with one GPT-OSS layer's MXFP4 experts (+ their bf16 biases), a second layer
    of synthetic codes covering every nibble and exponent, and ``original.safetensors`` beside it with
    the unquantised float32 parameters of the first layer.

    The unquantised parameters are ``gate_up_proj`` ``[E, H, 2I]`` and ``down_proj`` ``[E, I, H]``
    (transformers' GptOssExperts); the checkpoint stores each transposed, ``[E, out, in]``, quantised
    over ``in`` in groups of 32, which is what transformers' dequantisation undoes."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(1)
    gate_up = torch.randn(experts, hidden, 2 * intermediate) * 0.02
    down = torch.randn(experts, intermediate, hidden) * 0.02
    prefix = "model.layers.0.mlp.experts."
    tensors = {}
    for name, value in (("gate_up_proj", gate_up), ("down_proj", down)):
        blocks, scales = quantize_mxfp4(value.transpose(1, 2).contiguous())
        tensors[prefix + name + "_blocks"] = blocks
        tensors[prefix + name + "_scales"] = scales
        tensors[prefix + name + "_bias"] = torch.zeros(experts, value.shape[-1], dtype=torch.bfloat16)
    # a second layer of raw codes: every byte value in the blocks, every finite e8m0 exponent (0..254)
    codes = torch.arange(experts * 64 * 9 * 16, dtype=torch.int64).remainder(256).to(torch.uint8)
    tensors["model.layers.1.mlp.experts.down_proj_blocks"] = codes.reshape(experts, 64, 9, 16)
    exps = torch.arange(experts * 64 * 9, dtype=torch.int64).remainder(255).to(torch.uint8)
    tensors["model.layers.1.mlp.experts.down_proj_scales"] = exps.reshape(experts, 64, 9)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "experts.safetensors"
    save_file(tensors, str(path))
    save_file({prefix + "gate_up_proj": gate_up.contiguous(), prefix + "down_proj": down.contiguous()},
              str(out / "original.safetensors"))
    return path


def write_gpt_oss_mxfp4_dir(out: Path, *, hidden: int = 64, intermediate: int = 96) -> Path:
    """A one-layer GPT-OSS HF dir as OpenAI ships it: the model built by transformers (random init,
    bf16), its expert ``gate_up_proj`` / ``down_proj`` stored as MXFP4 ``_blocks`` + ``_scales`` of
    the transposed ``[E, out, in]`` weights, everything else bf16, and ``quantization_config``
    ``{"quant_method": "mxfp4"}`` with the release's ``modules_to_not_convert``."""
    import torch
    from safetensors.torch import save_file
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(2)
    config = GptOssConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                          num_experts_per_tok=2, vocab_size=128, layer_types=["full_attention"])
    model = GptOssForCausalLM(config).to(torch.bfloat16)
    tensors = {}
    for name, value in model.state_dict().items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = quantize_mxfp4(value.transpose(1, 2).contiguous())
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        else:
            tensors[name] = value.contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


FP8_DEEPSEEK_DIMS = dict(vocab_size=300, hidden_size=256, intermediate_size=256, moe_intermediate_size=256,
                         num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=1,
                         num_experts_per_tok=2, n_group=2, topk_group=1, num_attention_heads=4,
                         num_key_value_heads=4, q_lora_rank=192, kv_lora_rank=128, qk_rope_head_dim=64,
                         qk_nope_head_dim=64, v_head_dim=64, max_position_embeddings=64)
"""Every TP=2 share is whole 128-blocks (q/kv up 512 rows, o_proj 256 columns, fc1 [256; 256]), TP=4 is
not; ``q_a_proj`` (192 columns) and ``kv_a_proj_with_mqa`` (192 rows) have partial edge blocks."""


def write_fp8_deepseek_v3(out: Path, **dims) -> Path:
    """A tiny DeepSeek-V3 HF dir as the release stores it: the model built and saved by transformers
    (random init, bf16, ``save_pretrained``: per-expert tensors), then every projection of the decoder
    layers quantised per 128x128 block (``quantize_fp8_block``) and stored with its ``weight_scale_inv``;
    embeddings, head, norms and the router stay bf16, as in DeepSeek-V3's release."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    torch.manual_seed(0)
    config = DeepseekV3Config(**{**FP8_DEEPSEEK_DIMS, **dims})
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tensors = {}
    for name, value in load_file(str(out / "model.safetensors")).items():
        if name.startswith("model.layers.") and name.endswith(("proj.weight", "proj_with_mqa.weight")):
            tensors[name], tensors[name + "_scale_inv"] = (t.contiguous() for t in quantize_fp8_block(value))
        else:
            tensors[name] = value
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out
