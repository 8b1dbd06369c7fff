"""Proof by real clients: what ``ckptscope convert`` writes is loaded by megatron-core and by
transformers, and both give the logits of the model it came from (CPU, fp32, tiny models)."""

from __future__ import annotations

import pytest
import torch

from ckptscope.ops.convert.execute import execute_convert
from ckptscope.ops.convert.plan import plan_convert
from tests.mcore_reference import generators, hf_logits, iteration_dir, mcore_logits_from_dist, tokens_for


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return generators(), tmp_path_factory.mktemp("clients")


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_tied", "qwen3"])
def test_hf_to_mcore_loads_in_megatron_with_transformers_logits(pairs, tmp_path, name):
    gen, out = pairs
    hf = gen.write_hf(name, out / f"hf_{name}")
    mcore = tmp_path / "mcore"
    execute_convert(plan_convert(hf, mcore, to="mcore"))
    import json

    vocab = json.loads((hf / "config.json").read_text())["vocab_size"]
    tokens = tokens_for(vocab)
    want = hf_logits(hf, tokens)
    got = mcore_logits_from_dist(iteration_dir(mcore), hf, tokens, strict="assume_ok_unexpected")
    assert got.shape[-1] >= vocab
    assert torch.isfinite(got).all()  # every parameter came from the checkpoint (the harness fills NaN first)
    assert (got[..., :vocab] - want).abs().max().item() <= 1e-5


def test_megatron_tp2_save_to_hf_gives_its_logits(pairs, tmp_path):
    """A TP=2 GPTModel saved by megatron-core on 2 gloo ranks (whose logits the generator checked
    against transformers) -> convert --to hf -> transformers gives those logits."""
    gen, out = pairs
    root = gen.write_mcore("llama_gqa", out, tp=2)
    hf_out = tmp_path / "hf"
    execute_convert(plan_convert(root, hf_out, to="hf", hf_config=out / "hf_llama_gqa"))
    import json

    vocab = json.loads((hf_out / "config.json").read_text())["vocab_size"]
    tokens = tokens_for(vocab)
    mcore = mcore_logits_from_dist(iteration_dir(root), out / "hf_llama_gqa", tokens)
    assert (hf_logits(hf_out, tokens) - mcore[..., :vocab]).abs().max().item() <= 1e-5
