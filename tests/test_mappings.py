"""The HF <-> Megatron-Core mapping layer: exact layouts (MAPPING.md §2–§4), derived inverses,
config translation, architecture detection. Expected layouts are written here from the row maps of
MAPPING.md, independently of the links the library derives."""

from __future__ import annotations

import numpy as np
import pytest

from ckptscope.core.errors import CkptError
from ckptscope.mappings.config import (
    ModelConfig,
    from_hf_config,
    from_megatron_args,
    padded_vocab,
    to_hf_config,
    to_megatron_args,
)
from ckptscope.mappings.links import materialize
from ckptscope.mappings.resolve import TensorShape, detect_arch, naming_family, to_hf, to_mcore

# P1 + P6: G > 1 and head_dim != hidden / heads.
CFG = ModelConfig(arch="qwen3", num_layers=1, hidden_size=64, ffn_hidden_size=96, num_attention_heads=8,
                  num_kv_heads=2, head_dim=16, vocab_size=250, padded_vocab_size=256)


def _hf_state(cfg: ModelConfig, *, bias: bool = False, qk_norm: bool = True, tied: bool = False) -> dict:
    rng = np.random.default_rng(0)
    h, d, nh, g, f, v = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_kv_heads,
                         cfg.ffn_hidden_size, cfg.vocab_size)
    p = "model.layers.0."
    state = {
        "model.embed_tokens.weight": rng.standard_normal((v, h)).astype(np.float32),
        "model.norm.weight": rng.standard_normal(h).astype(np.float32),
        p + "input_layernorm.weight": rng.standard_normal(h).astype(np.float32),
        p + "self_attn.q_proj.weight": rng.standard_normal((nh * d, h)).astype(np.float32),
        p + "self_attn.k_proj.weight": rng.standard_normal((g * d, h)).astype(np.float32),
        p + "self_attn.v_proj.weight": rng.standard_normal((g * d, h)).astype(np.float32),
        p + "self_attn.o_proj.weight": rng.standard_normal((h, nh * d)).astype(np.float32),
        p + "post_attention_layernorm.weight": rng.standard_normal(h).astype(np.float32),
        p + "mlp.gate_proj.weight": rng.standard_normal((f, h)).astype(np.float32),
        p + "mlp.up_proj.weight": rng.standard_normal((f, h)).astype(np.float32),
        p + "mlp.down_proj.weight": rng.standard_normal((h, f)).astype(np.float32),
    }
    if not tied:
        state["lm_head.weight"] = rng.standard_normal((v, h)).astype(np.float32)
    if qk_norm:
        state[p + "self_attn.q_norm.weight"] = rng.standard_normal(d).astype(np.float32)
        state[p + "self_attn.k_norm.weight"] = rng.standard_normal(d).astype(np.float32)
    if bias:
        for name, rows in (("q", nh * d), ("k", g * d), ("v", g * d)):
            state[p + f"self_attn.{name}_proj.bias"] = rng.standard_normal(rows).astype(np.float32)
    return state


def _shapes(state: dict) -> dict[str, TensorShape]:
    return {k: TensorShape(v.shape, "float32") for k, v in state.items()}


def _convert(state: dict, view) -> dict:
    return {name: materialize(recipe, lambda src, sl: state[src][sl]) for name, recipe in view.recipes.items()}


def test_qkv_rows_follow_the_grouped_layout():
    hf = _hf_state(CFG)
    mc = _convert(hf, to_mcore(_shapes(hf), CFG))
    fused = mc["decoder.layers.0.self_attention.linear_qkv.weight"]
    r, d = 4, 16
    assert fused.shape == ((8 + 2 * 2) * 16, 64)
    q, k, v = (hf[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv")
    for row in range(fused.shape[0]):  # MAPPING.md §2.1 row map, written out row by row
        g, s = divmod(row, (r + 2) * d)
        if s < r * d:
            want = q[g * r * d + s]
        elif s < (r + 1) * d:
            want = k[g * d + s - r * d]
        else:
            want = v[g * d + s - (r + 1) * d]
        assert np.array_equal(fused[row], want), row
    assert not np.array_equal(fused, np.concatenate([q, k, v]))  # the naive cat is a different tensor


def test_qkv_bias_uses_the_same_interleave():
    cfg = ModelConfig(**{**CFG.to_dict(), "arch": "qwen2"})
    hf = _hf_state(cfg, bias=True, qk_norm=False)
    mc = _convert(hf, to_mcore(_shapes(hf), cfg))
    bias = mc["decoder.layers.0.self_attention.linear_qkv.bias"]
    q, k, v = (hf[f"model.layers.0.self_attn.{n}_proj.bias"] for n in "qkv")
    want = np.concatenate([q.reshape(2, 64), k.reshape(2, 16), v.reshape(2, 16)], axis=1).reshape(-1)
    assert np.array_equal(bias, want)


def test_fc1_is_gate_then_up():
    hf = _hf_state(CFG)
    mc = _convert(hf, to_mcore(_shapes(hf), CFG))
    fc1 = mc["decoder.layers.0.mlp.linear_fc1.weight"]
    assert np.array_equal(fc1[:96], hf["model.layers.0.mlp.gate_proj.weight"])
    assert np.array_equal(fc1[96:], hf["model.layers.0.mlp.up_proj.weight"])


def test_vocab_is_padded_with_zero_rows_and_stripped_back():
    hf = _hf_state(CFG)
    view = to_mcore(_shapes(hf), CFG)
    mc = _convert(hf, view)
    emb = mc["embedding.word_embeddings.weight"]
    assert emb.shape == (256, 64)
    assert np.array_equal(emb[:250], hf["model.embed_tokens.weight"]) and not emb[250:].any()
    assert view.recipes["embedding.word_embeddings.weight"].fill == [((250, 256), (0, 64))]
    back = to_hf({k: TensorShape(v.shape, "float32") for k, v in mc.items()}, CFG)
    assert back.recipes["model.embed_tokens.weight"].shape == (250, 64)
    assert back.recipes["model.embed_tokens.weight"].padding == [("embedding.word_embeddings.weight",
                                                                  ((250, 256), (0, 64)))]


@pytest.mark.parametrize("arch,bias,qk_norm,tied", [("llama", False, False, False), ("qwen2", True, False, True),
                                                    ("qwen3", False, True, False)])
def test_round_trip_is_bit_exact_and_renames_norms(arch, bias, qk_norm, tied):
    cfg = ModelConfig(**{**CFG.to_dict(), "arch": arch})
    hf = _hf_state(cfg, bias=bias, qk_norm=qk_norm, tied=tied)
    view = to_mcore(_shapes(hf), cfg)
    assert not view.unmapped
    mc = _convert(hf, view)
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in mc
    assert ("output_layer.weight" in mc) is (not tied)
    back_view = to_hf({k: TensorShape(v.shape, "float32") for k, v in mc.items()}, cfg)
    assert not back_view.unmapped
    back = _convert(mc, back_view)
    assert set(back) == set(hf)
    for name in hf:
        assert np.array_equal(back[name], hf[name]), name


def test_local_spec_names_and_both_spellings_read_back():
    hf = _hf_state(CFG)
    local = to_mcore(_shapes(hf), CFG, local_spec=True)
    assert "decoder.layers.0.input_layernorm.weight" in local.recipes
    assert "decoder.layers.0.pre_mlp_layernorm.weight" in local.recipes
    back = to_hf({k: TensorShape(r.shape, "float32") for k, r in local.recipes.items()}, CFG)
    assert set(back.recipes) == set(hf)


def test_stacked_experts_map_to_per_expert_hf_names():
    cfg = ModelConfig(arch="mixtral", num_layers=1, hidden_size=8, num_attention_heads=2, num_kv_heads=1,
                      head_dim=4, num_experts=4, moe_ffn_hidden_size=6)
    shapes = {"decoder.layers.0.mlp.experts.experts.linear_fc1.weight": TensorShape((4, 12, 8), "bfloat16"),
              "decoder.layers.0.mlp.experts.experts.linear_fc2.weight": TensorShape((4, 8, 6), "bfloat16"),
              "decoder.layers.0.mlp.router.weight": TensorShape((4, 8), "bfloat16")}
    view = to_hf(shapes, cfg)
    w3 = view.recipes["model.layers.0.block_sparse_moe.experts.2.w3.weight"]
    assert w3.shape == (6, 8)
    (piece,) = w3.pieces
    assert piece.src_box == ((2, 3), (6, 12), (0, 8))
    stacked = np.arange(4 * 12 * 8).reshape(4, 12, 8)
    got = materialize(w3, lambda src, sl: stacked[sl])
    assert np.array_equal(got, stacked[2, 6:12])
    assert "model.layers.0.block_sparse_moe.gate.weight" in view.recipes


def test_wrong_config_is_one_clear_error():
    shapes = {"decoder.layers.0.self_attention.linear_qkv.weight": TensorShape((100, 64), "float32")}
    with pytest.raises(CkptError, match="fused QKV has 100 rows"):
        to_hf(shapes, CFG)


def test_config_translation_round_trips():
    hf_cfg = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 250,
              "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 128,
              "torch_dtype": "bfloat16"}
    cfg = from_hf_config(hf_cfg)
    assert cfg.qkv_bias and cfg.head_dim == 8 and cfg.tie_word_embeddings
    args = to_megatron_args(cfg, tp=2)
    assert args["padded_vocab_size"] == padded_vocab(250, 128, 2) == 256
    assert args["group_query_attention"] and args["num_query_groups"] == 2 and args["add_qkv_bias"]
    again = from_megatron_args({"__class__": "argparse.Namespace", **args})
    for key in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                "vocab_size", "tie_word_embeddings", "qkv_bias", "norm_epsilon", "rope_theta"):
        assert getattr(again, key) == getattr(cfg, key), key
    back = to_hf_config(again.merged(ModelConfig(arch="qwen2")))
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "tie_word_embeddings", "rms_norm_eps", "rope_theta", "max_position_embeddings"):
        assert back[key] == hf_cfg[key], key


def test_padded_vocab_examples():  # MAPPING.md §4.1, computed examples
    assert padded_vocab(151936, 128, 2) == 152064
    assert padded_vocab(128256, 128, 8) == 129024
    assert padded_vocab(32000, 128, 3) == 32256


def test_detection():
    assert naming_family(["decoder.layers.0.mlp.linear_fc1.weight", "embedding.word_embeddings.weight"]) == "mcore"
    assert naming_family(["model.layers.0.mlp.up_proj.weight", "lm_head.weight"]) == "hf"
    assert detect_arch(["model.layers.0.self_attn.q_norm.weight"], ModelConfig()) == "qwen3"
    assert detect_arch(["decoder.layers.0.self_attention.linear_qkv.bias"], ModelConfig()) == "qwen2"
    assert detect_arch(["model.layers.0.block_sparse_moe.gate.weight"], ModelConfig()) == "mixtral"
    assert detect_arch(["model.layers.0.mlp.up_proj.weight"], ModelConfig()) == "llama"
