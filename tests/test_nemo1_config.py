"""NeMo 1.x ``model_config.yaml`` settings read as Megatron args (``mappings.nemo1_config``)."""

from __future__ import annotations

import pytest

from ckptscope.mappings.nemo1_config import from_nemo1_config, megatron_args, unread_settings

BASE = {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 96, "num_attention_heads": 8, "num_query_groups": 2,
        "kv_channels": 8, "normalization": "rmsnorm", "activation": "fast-swiglu", "position_embedding_type": "rope",
        "rotary_base": 500000, "layernorm_epsilon": 1e-5, "bias": False, "share_embeddings_and_output_weights": False,
        "encoder_seq_length": 4096}


def test_a_llama_config_reads_as_its_megatron_args():
    cfg = from_nemo1_config(BASE)
    assert (cfg.num_layers, cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_attention_heads, cfg.num_kv_heads,
            cfg.head_dim) == (2, 64, 96, 8, 2, 8)
    assert cfg.swiglu is True and cfg.rope_theta == 500000 and cfg.norm_epsilon == 1e-5
    assert cfg.tie_word_embeddings is False and cfg.qkv_bias is False and cfg.linear_bias is False
    assert cfg.max_position_embeddings == 4096 and cfg.vocab_size is None
    assert cfg.megatron_facts["normalization"] == "RMSNorm" and cfg.megatron_facts["position_embedding_type"] == "rope"


@pytest.mark.parametrize("change, args", [
    ({"num_query_groups": None}, {"group_query_attention": False}),
    ({"num_query_groups": 8}, {"group_query_attention": False}),
    ({"normalization": "layernorm1p"}, {"normalization": "LayerNorm", "apply_layernorm_1p": True}),
    ({"activation": "gelu"}, {"swiglu": False, "gated_linear_unit": False}),
    ({"activation": "fast-geglu"}, {"swiglu": False, "gated_linear_unit": True}),
    ({"activation": "squared-relu"}, {"squared_relu": True}),
    ({"bias": True}, {"add_bias_linear": True, "add_qkv_bias": True}),
    ({"bias": False, "qkv_bias": True}, {"add_bias_linear": False, "add_qkv_bias": True}),
    ({"share_embeddings_and_output_weights": True}, {"untie_embeddings_and_output_weights": False}),
    ({"rotary_percentage": 0.5}, {"rotary_percent": 0.5}),
    ({"position_embedding_type": "learned_absolute"}, {"position_embedding_type": "learned_absolute"}),
])
def test_each_setting_is_translated(change, args):
    got = megatron_args({**BASE, **change})
    assert {k: got.get(k) for k in args} == args


@pytest.mark.parametrize("change", [
    {"scale_positional_embedding": True}, {"seq_len_interpolation_factor": 4}, {"position_embedding_type": "alibi"},
    {"activation": "reglu"}, {"normalization": "rmsnorm1p"}, {"transformer_block_type": "post_ln"},
    {"headscale": True}, {"num_moe_experts": 8}, {"openai_gelu": True}, {"normalize_attention_scores": False},
])
def test_a_setting_with_no_translation_leaves_the_config_unread(change):
    assert unread_settings({**BASE, **change}) and from_nemo1_config({**BASE, **change}) is None


def test_neutral_values_of_those_settings_are_read():
    neutral = {"scale_positional_embedding": False, "seq_len_interpolation_factor": None, "transformer_block_type": "pre_ln",
               "headscale": False, "num_moe_experts": 1, "openai_gelu": False, "normalize_attention_scores": True}
    assert not unread_settings({**BASE, **neutral}) and from_nemo1_config({**BASE, **neutral}) is not None
