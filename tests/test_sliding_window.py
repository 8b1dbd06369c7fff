"""Sliding-window attention of Mistral and Qwen2/3 carried both ways (mappings/window.py).

HF -> Megatron writes ``window_size = (W - 1, 0)`` and, when only some layers use the window,
``window_attn_skip_freq`` as megatron-core's per-layer list. Judged by megatron-core's own forward
of the written checkpoint, with the window read from the args the export wrote (only its mask helper
is replaced by a CPU copy: megatron-core allocates that mask on "cuda"), against transformers. The
way back writes the window keys transformers reads, and gives the source's logits exactly. The
window is short (4) against a 12-token batch, and the tests check that it changes the logits, so a
window dropped or misplaced shows.
"""

from __future__ import annotations

import argparse
import json
from unittest import mock

import pytest
import torch

from ckptscope.ops.convert.execute import execute_convert
from ckptscope.ops.convert.plan import plan_convert
from tests.mcore_reference import (common_state, generators, hf_logits, iteration_dir, mcore_logits_from_dist,
                                   tokens_for)

DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=64, sliding_window=4)


def _config(kind: str):
    import transformers

    if kind == "mistral":  # every layer
        return transformers.MistralConfig(**DIMS)
    if kind == "qwen2":  # transformers' default pattern: layers from max_window_layers on
        return transformers.Qwen2Config(**DIMS, use_sliding_window=True, max_window_layers=1)
    if kind == "qwen3":  # an explicit layer_types list, window on the first layer only
        return transformers.Qwen3Config(**DIMS, use_sliding_window=True,
                                        layer_types=["sliding_attention", "full_attention"])
    raise AssertionError(kind)


EXPECTED = {"mistral": (None, [True, True]), "qwen2": ([0, 1], [False, True]), "qwen3": ([1, 0], [True, False])}
"""kind -> (window_attn_skip_freq the export must write, which layers use the window)."""


def _hf_model(kind: str, path):
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(kind), attn_implementation="eager").float().eval()
    model.save_pretrained(path)
    return path


def _cpu_sliding_window_mask(sq, skv, window_size):
    """megatron.core.transformer.utils.get_sliding_window_causal_mask, on CPU (True = masked)."""
    keep = torch.ones(sq, skv, dtype=torch.bool)
    return ~torch.tril(torch.triu(keep, diagonal=skv - sq - window_size[0]), diagonal=skv - sq + window_size[1])


def _mcore_logits(iter_dir, hf_dir, tokens):
    """megatron-core's forward of ``iter_dir`` with the window the export wrote into common.pt."""
    written = common_state(iter_dir)["args"]
    args = generators().megatron_args(_config_of(hf_dir), tp=1)
    args = argparse.Namespace(**{**vars(args), "window_size": written.window_size,
                                 "window_attn_skip_freq": written.window_attn_skip_freq})
    with mock.patch("megatron.core.fusions.fused_softmax.get_sliding_window_causal_mask", _cpu_sliding_window_mask):
        return mcore_logits_from_dist(iter_dir, args, tokens)


def _config_of(hf_dir):
    import transformers

    return transformers.AutoConfig.from_pretrained(str(hf_dir))


@pytest.mark.parametrize("kind", ["mistral", "qwen2", "qwen3"])
def test_window_reaches_megatron_core_and_comes_back(tmp_path, kind):
    hf = _hf_model(kind, tmp_path / "hf")
    mcore, back = tmp_path / "mcore", tmp_path / "back"
    execute_convert(plan_convert(hf, mcore, to="mcore"))
    iter_dir = iteration_dir(mcore)
    args = common_state(iter_dir)["args"]
    skip, layers = EXPECTED[kind]
    assert list(args.window_size) == [DIMS["sliding_window"] - 1, 0]
    assert args.window_attn_skip_freq == skip

    tokens = tokens_for(DIMS["vocab_size"])
    want = hf_logits(hf, tokens)
    full = _config_of(hf)
    full.sliding_window = None
    if getattr(full, "layer_types", None):
        full.layer_types = ["full_attention"] * DIMS["num_hidden_layers"]
    import transformers

    unwindowed = transformers.AutoModelForCausalLM.from_pretrained(str(hf), config=full, attn_implementation="eager")
    with torch.no_grad():
        assert (unwindowed(tokens).logits.float() - want).abs().max().item() > 1e-3  # the window matters here

    got = _mcore_logits(iter_dir, hf, tokens)
    assert torch.isfinite(got).all()
    assert (got[..., :DIMS["vocab_size"]] - want).abs().max().item() <= 1e-5

    execute_convert(plan_convert(mcore, back, to="hf"))
    config = json.loads((back / "config.json").read_text())
    assert config["sliding_window"] == DIMS["sliding_window"]
    if kind != "mistral":  # Mistral's window is on every layer; Qwen's layers say theirs
        assert config["layer_types"] == ["sliding_attention" if on else "full_attention" for on in layers]
    assert torch.equal(hf_logits(back, tokens), want)


def test_a_megatron_window_skipping_layers_is_refused_as_mistral(tmp_path, cli):
    """Mistral applies its window to every layer: args that skip one cannot be written as a Mistral."""
    hf = _hf_model("mistral", tmp_path / "hf")
    mcore = tmp_path / "mcore"
    execute_convert(plan_convert(hf, mcore, to="mcore"))
    iter_dir = iteration_dir(mcore)
    common = torch.load(iter_dir / "common.pt", weights_only=False)
    common["args"].window_attn_skip_freq = 2  # layer 2 full attention
    torch.save(common, iter_dir / "common.pt")
    result = cli("convert", str(mcore), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and "every layer" in result.err and not (tmp_path / "out").exists(), result.err


def test_an_hf_config_whose_window_differs_from_the_args_is_refused(tmp_path, cli):
    """--hf-config says the model the export claims to be: a window other than the args' is refused."""
    hf = _hf_model("mistral", tmp_path / "hf")
    mcore = tmp_path / "mcore"
    execute_convert(plan_convert(hf, mcore, to="mcore"))
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((hf / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "sliding_window": 8}))
    result = cli("convert", str(mcore), str(tmp_path / "out"), "--to", "hf", "--hf-config", str(other))
    assert result.code == 2 and "sliding window" in result.err and not (tmp_path / "out").exists(), result.err
    (other / "config.json").write_text(json.dumps({**config, "sliding_window": None}))
    result = cli("convert", str(mcore), str(tmp_path / "out"), "--to", "hf", "--hf-config", str(other))
    assert result.code == 2 and "window" in result.err and not (tmp_path / "out").exists(), result.err


def test_a_llama_config_with_a_stray_window_converts_as_transformers_computes_it(tmp_path):
    """transformers' Llama has no sliding window: a ``sliding_window`` key in its config changes nothing,
    so the export has no window either (before: refused)."""
    import transformers

    config = transformers.LlamaConfig(**{k: v for k, v in DIMS.items() if k != "sliding_window"})
    config.sliding_window = 4
    torch.manual_seed(0)
    hf = tmp_path / "hf"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(hf)
    assert json.loads((hf / "config.json").read_text())["sliding_window"] == 4
    mcore = tmp_path / "mcore"
    execute_convert(plan_convert(hf, mcore, to="mcore"))
    assert getattr(common_state(iteration_dir(mcore))["args"], "window_size", None) is None
