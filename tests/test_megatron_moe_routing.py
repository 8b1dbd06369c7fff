"""Megatron MoE settings an HF MoE arch cannot spell are refused on export, not dropped.

A probe saved megatron-core MoE models (4 experts, top-2) with ``moe_router_pre_softmax``, a top-k
scaling factor, a sigmoid router with expert bias and an ungated shared expert: each was written as
Mixtral / GLM-4.5 / Qwen2-MoE with exit 0 and logits off by 0.03-0.1 from megatron-core's forward
(GLM-4.5's derived config also left transformers' defaults in: a dense first layer and a shared expert
the model has not). Here the Megatron args of a real conversion are edited the way such runs record
them, and ``convert --to hf`` must refuse with the reason, writing nothing.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import load_sample_module, run_cli
from tests.mcore_reference import iteration_dir


@pytest.fixture(scope="module")
def mcore_of(tmp_path_factory):
    """kind -> a torch_dist save ckptscope wrote from make_moe_samples.py's HF model of that kind."""
    moe = load_sample_module("make_moe_samples")
    root = tmp_path_factory.mktemp("moe_routing")
    out = {}
    for kind in ("mixtral", "qwen2_moe"):
        hf = moe.write_hf_moe(kind, root / f"hf_{kind}")
        result = run_cli("convert", str(hf), str(root / f"mcore_{kind}"), "--to", "mcore")
        assert result.code == 0, result.err
        out[kind] = root / f"mcore_{kind}"
    return out


def _with_args(src, dst, **changes):
    import shutil

    shutil.copytree(src, dst)
    iteration = iteration_dir(dst)
    common = torch.load(iteration / "common.pt", weights_only=False)
    for key, value in changes.items():
        setattr(common["args"], key, value)
    torch.save(common, iteration / "common.pt")
    return dst


@pytest.mark.parametrize("kind, changes, reason", [
    ("mixtral", {"moe_router_pre_softmax": True}, "not renormalised"),
    ("mixtral", {"moe_router_topk_scaling_factor": 2.5}, "scaled by 2.5"),
    ("mixtral", {"moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True},
     "router scores are sigmoid"),
    ("mixtral", {"moe_layer_freq": [0, 1]}, "not every layer is MoE"),
    ("mixtral", {"moe_apply_probs_on_input": True}, "weights the experts' input"),
    ("mixtral", {"moe_router_num_groups": 2, "moe_router_group_topk": 1}, "within 1 of 2 groups"),
    ("qwen2_moe", {"moe_shared_expert_gate": False}, "has no gate"),
    ("mixtral", {"moe_router_load_balancing_type": "sinkhorn"}, "sinkhorn"),
    ("qwen2_moe", {"moe_router_load_balancing_type": "sinkhorn"}, "sinkhorn"),
])
def test_routing_an_hf_moe_cannot_spell_is_refused(mcore_of, tmp_path, kind, changes, reason):
    src = _with_args(mcore_of[kind], tmp_path / "src", **changes)
    result = run_cli("convert", str(src), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 2 and reason in result.err and f"would not compute {kind}" in result.err, result.err
    assert result.err.count("\n") == 1 and not (tmp_path / "hf").exists()


@pytest.mark.parametrize("topk, said", [
    (2**63, "is 9223372036854775808, not a positive integer up to 1,048,576"),
    (0, "is 0, not a positive integer"),
    ({}, "is {}, not a positive integer"),  # the exported config.json lost num_experts_per_tok, exit 0
    (9, "top-k routes each token to 9 experts (num_experts_per_tok / moe_router_topk), of only"),
])
def test_a_top_k_no_router_can_take_is_refused(mcore_of, tmp_path, topk, said):
    """A probe set a MoE save's args.moe_router_topk to 2**63 (or 0, or {}): convert wrote a config.json with
    num_experts_per_tok 9223372036854775808 of 4 experts, exit 0 (transformers' top-k cannot run it)."""
    src = _with_args(mcore_of["mixtral"], tmp_path / "src", moe_router_topk=topk)
    result = run_cli("convert", str(src), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 2 and said in result.err and result.err.count("\n") == 1, result.err
    assert not (tmp_path / "hf").exists()


def test_the_unedited_saves_still_convert(mcore_of, tmp_path):
    for kind, src in mcore_of.items():
        result = run_cli("convert", str(src), str(tmp_path / kind), "--to", "hf")
        assert result.code == 0, (kind, result.err)


def test_glm45_without_hf_extra_gets_its_moe_layout_in_the_derived_config(tmp_path):
    """A Megatron GLM-4.5 run that never saw HF (no hf_config_extra): every layer MoE must be written as
    first_k_dense_replace=0 (transformers' default, 1, would make layer 0 dense and its experts
    unexpected keys), and a save without shared experts is refused (every GLM-4.5 MoE layer has them)."""
    import transformers

    from tests.test_glm4_moe import _write_fixture

    hf = _write_fixture(tmp_path / "hf", first_k_dense_replace=0)
    mcore = tmp_path / "mcore"
    assert run_cli("convert", str(hf), str(mcore), "--to", "mcore").code == 0
    iteration = iteration_dir(mcore)
    common = torch.load(iteration / "common.pt", weights_only=False)
    del common["args"].hf_config_extra
    common["args"].moe_layer_freq = 1  # Megatron-LM's default spelling of "every layer MoE"
    torch.save(common, iteration / "common.pt")
    back = tmp_path / "back"
    result = run_cli("convert", str(mcore), str(back), "--to", "hf")
    assert result.code == 0, result.err
    assert json.loads((back / "config.json").read_text())["first_k_dense_replace"] == 0
    tokens = torch.arange(12).unsqueeze(0)
    want, src_info = transformers.AutoModelForCausalLM.from_pretrained(str(hf), output_loading_info=True)
    got, info = transformers.AutoModelForCausalLM.from_pretrained(str(back), output_loading_info=True)
    assert not info["missing_keys"] and info["unexpected_keys"] == src_info["unexpected_keys"]  # (the MTP layer)
    with torch.no_grad():
        assert torch.equal(got(tokens).logits, want(tokens).logits)

    common["args"].moe_shared_expert_intermediate_size = None
    torch.save(common, iteration / "common.pt")
    result = run_cli("convert", str(mcore), str(tmp_path / "none"), "--to", "hf")
    assert result.code == 2 and "no shared experts" in result.err, result.err


def test_mixtral_with_its_own_dense_ffn_size_in_the_args_exports_the_experts_size(mcore_of, tmp_path):
    """Megatron-LM's args always carry ``ffn_hidden_size`` (4 x hidden when not given) beside the experts'
    ``moe_ffn_hidden_size``. A probe's megatron-core Mixtral with 48 / 24 was refused: the config derived
    from the args took Mixtral's ``intermediate_size`` (the experts' size) from ffn_hidden_size, then found
    it contradicting the args. The export now says the experts' size, and transformers loads it whole."""
    from transformers import AutoModelForCausalLM

    common = torch.load(iteration_dir(mcore_of["mixtral"]) / "common.pt", weights_only=False)
    experts = common["args"].moe_ffn_hidden_size
    src = _with_args(mcore_of["mixtral"], tmp_path / "src", ffn_hidden_size=4 * common["args"].hidden_size)
    result = run_cli("convert", str(src), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 0, result.err
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["intermediate_size"] == experts
    _, info = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
