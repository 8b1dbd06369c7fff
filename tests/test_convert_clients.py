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


@pytest.mark.parametrize("kind, norm_topk_prob", [("qwen2_moe", False), ("qwen3_moe", True), ("qwen3_moe", False)])
def test_qwen_moe_routing_renormalisation_survives_both_ways(tmp_path, kind, norm_topk_prob):
    """norm_topk_prob=False (Qwen2-MoE's default) keeps the full softmax's top-k weights: Megatron
    needs moe_router_pre_softmax for that, else it renormalises and computes another model; and the
    way back must write norm_topk_prob as it was (transformers' default is False, Qwen3-MoE
    releases say True). Judged by megatron-core's forward of the written checkpoint (the MoE model
    of make_moe_samples.py, with the written args' moe_router_pre_softmax) and by transformers."""
    import dataclasses
    import json

    import transformers
    from megatron.core import dist_checkpointing

    from tests.conftest import load_sample_module
    from tests.mcore_reference import allow_router_without_te, common_state, stored_vocab_rows

    moe = load_sample_module("make_moe_samples")
    config = moe.hf_moe_config(kind)
    config.norm_topk_prob = norm_topk_prob
    torch.manual_seed(0)
    model = getattr(transformers, moe.HF_MOE[kind][0])(config).float().eval()
    with torch.no_grad():  # routers far from uniform, so renormalising changes the mixture
        for name, param in model.named_parameters():
            param.normal_(0, 1.0 if name.endswith("gate.weight") else 0.1)
    hf = tmp_path / "hf"
    model.save_pretrained(hf)
    mcore, back = tmp_path / "mcore", tmp_path / "back"
    execute_convert(plan_convert(hf, mcore, to="mcore"))
    execute_convert(plan_convert(mcore, back, to="hf"))
    assert json.loads((back / "config.json").read_text())["norm_topk_prob"] is norm_topk_prob
    tokens = tokens_for(config.vocab_size)
    want = hf_logits(hf, tokens)
    assert (hf_logits(back, tokens) - want).abs().max().item() == 0.0

    iter_dir = iteration_dir(mcore)
    pre_softmax = common_state(iter_dir)["args"].moe_router_pre_softmax
    assert pre_softmax is (not norm_topk_prob)
    args = moe.moe_args(kind)
    args.padded_vocab_size = stored_vocab_rows(iter_dir)
    allow_router_without_te()
    plain = moe.moe_transformer_config
    moe.moe_transformer_config = lambda a: dataclasses.replace(plain(a), moe_router_pre_softmax=pre_softmax)
    try:
        moe.ensure_single_rank_world()
        with moe.cpu_megatron():
            gpt = moe.build_moe_model(args)
            loaded = dist_checkpointing.load({"model": gpt.sharded_state_dict()}, str(iter_dir),
                                             strict="assume_ok_unexpected")
            gpt.load_state_dict(loaded["model"], strict=True)
            got = generators().mcore_model_logits(gpt, tokens)
    finally:
        moe.moe_transformer_config = plain
    assert (got[..., :config.vocab_size] - want).abs().max().item() <= 1e-4
