"""transformers >= 5 config.json spellings the config translation must read."""

from __future__ import annotations

import pytest

from ckptscope.mappings.config import from_hf_config, to_hf_config, to_megatron_args


def test_rope_theta_inside_rope_parameters_reaches_megatron_and_back():
    """v5 writes ``rope_parameters: {rope_theta: ...}`` and no ``rope_theta``; reading only the old key
    gave Megatron rotary_base 10000 for Mixtral's 1e6 (a different model after the round trip)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=2)
    doc = config.to_dict()
    assert "rope_theta" not in doc and doc["rope_parameters"]["rope_theta"] == 1e6
    cfg = from_hf_config(doc)
    assert cfg.rope_theta == 1e6
    assert to_megatron_args(cfg)["rotary_base"] == 1e6
    assert to_hf_config(cfg)["rope_theta"] == 1e6
