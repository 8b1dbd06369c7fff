"""``verify`` compares what two config.json files mean (ops/config_check.py): differences of meaning
are reported, differences of spelling are not. Configs are written by transformers itself."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from ckptscope.ops.config_check import config_differences  # noqa: E402

DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256)


def _saved(tmp_path, name: str, config) -> object:
    path = tmp_path / name
    path.mkdir()
    config.save_pretrained(path)
    return path


def test_meaning_differences_are_reported(tmp_path):
    pairs = [
        (transformers.LlamaConfig(**DIMS, hidden_act="gelu"), transformers.LlamaConfig(**DIMS), "activation"),
        (transformers.Qwen3MoeConfig(**DIMS, num_experts=4, norm_topk_prob=True),
         transformers.Qwen3MoeConfig(**DIMS, num_experts=4), "norm_topk_prob"),
        (transformers.MistralConfig(**DIMS, sliding_window=8), transformers.MistralConfig(**DIMS, sliding_window=None),
         ["architecture", "sliding_window", "sliding_layers"]),  # without its window a Mistral is a Llama
        (transformers.Qwen3Config(**DIMS, use_sliding_window=True, sliding_window=8, max_window_layers=0),
         transformers.Qwen3Config(**DIMS, use_sliding_window=True, sliding_window=8, max_window_layers=1),
         "sliding_layers"),  # one window, on other layers
        (transformers.LlamaConfig(**DIMS, rope_theta=500000.0), transformers.LlamaConfig(**DIMS), "rope_theta"),
    ]
    for i, (source, back, fact) in enumerate(pairs):
        found = config_differences(_saved(tmp_path, f"a{i}", source), _saved(tmp_path, f"b{i}", back))
        assert [f for f, *_ in found] == (fact if isinstance(fact, list) else [fact]), (fact, found)


def test_spelling_differences_are_not(tmp_path):
    """A Mistral without its window is a Llama; rope_theta flat or in rope_parameters is one theta;
    a key left at transformers' default is the default."""
    mistral = _saved(tmp_path, "mistral", transformers.MistralConfig(**DIMS, sliding_window=None, rope_theta=10000.0))
    llama = _saved(tmp_path, "llama", transformers.LlamaConfig(**DIMS, rope_theta=10000.0))
    assert config_differences(mistral, llama) == []
    spelled = json.loads((llama / "config.json").read_text())
    spelled.pop("rope_parameters", None)
    spelled.pop("mlp_bias", None)
    spelled["rope_theta"] = 10000
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "config.json").write_text(json.dumps(spelled))
    assert config_differences(llama, tmp_path / "flat") == []


def test_verify_fails_when_the_round_trip_config_means_another_model(tmp_path):
    """The tensors come back bit for bit, but the config written on the way back (here the one
    --hf-config hands in, with another activation) describes another model: verify says so, exit 1."""
    import torch

    from tests.conftest import run_cli

    config = transformers.LlamaConfig(**DIMS)
    torch.manual_seed(0)
    src = tmp_path / "src"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(src)
    other = _saved(tmp_path, "other", transformers.LlamaConfig(**DIMS, hidden_act="gelu"))
    same = run_cli("verify", str(src), "--json")
    assert same.code == 0, same.err
    result = run_cli("verify", str(src), "--hf-config", str(other), "--json")
    assert result.code == 1, result.err
    by = {t["name"]: t for t in json.loads(result.out)["tensors"]}
    assert by["config.json: activation"]["status"] == "different"
    assert all(t["status"] == "equal" for n, t in by.items() if not n.startswith("config.json"))
