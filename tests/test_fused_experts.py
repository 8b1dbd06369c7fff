"""transformers v5's fused MoE expert tensors (``mlp.experts.gate_up_proj [E, 2I, H]``,
``mlp.experts.down_proj [E, H, I]``) are the same model as the per-expert layout.

Both layouts are written by transformers itself: ``save_pretrained()`` converts back to per-expert
tensors, ``save_pretrained(save_original_format=False)`` keeps the fused in-memory ones. So the diff
between the two is judged against transformers' own conversion, not against ours (MAPPING.md P2).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ckptscope.ops.convert.execute import execute_convert  # noqa: E402
from ckptscope.ops.convert.plan import plan_convert  # noqa: E402
from tests.conftest import run_cli  # noqa: E402

COMMON = dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              num_experts_per_tok=2)
TOKENS = torch.tensor([[1, 5, 99, 42, 7, 13, 64, 2], [3, 88, 21, 0, 50, 9, 77, 31]])


def _config(arch: str):
    if arch == "mixtral":  # v5 also renames block_sparse_moe.gate -> mlp.gate
        return transformers.MixtralConfig(**COMMON, intermediate_size=32, num_local_experts=4)
    return transformers.Qwen3MoeConfig(**COMMON, intermediate_size=48, moe_intermediate_size=32, num_experts=4,
                                       head_dim=16)


@pytest.fixture(scope="module", params=["mixtral", "qwen3_moe"])
def saved(request, tmp_path_factory):
    """(per-expert dir, fused dir) of one random model, both written by transformers."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(request.param))
    out = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(out / "per_expert")
    model.save_pretrained(out / "fused", save_original_format=False)
    return out / "per_expert", out / "fused"


def _logits(hf):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32,
                                                                     output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        return model.eval()(input_ids=TOKENS).logits


def test_transformers_writes_the_fused_layout(saved):
    from safetensors import safe_open

    with safe_open(str(saved[1] / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert "model.layers.0.mlp.experts.gate_up_proj" in names and not any(".experts.0." in n for n in names)


def test_fused_and_per_expert_diff_equal(saved):
    per_expert, fused = saved
    for a, b in ((per_expert, fused), (fused, per_expert)):
        result = run_cli("diff", str(a), str(b), "--plain")
        assert result.code == 0, result.out + result.err
        assert ", 0 different" in result.out and "only in" not in result.out  # every tensor paired


def test_a_swapped_expert_half_is_a_difference(saved, tmp_path):
    """The pairing is real: gate and up of one expert swapped in the fused tensor is reported."""
    import shutil

    from safetensors.torch import load_file, save_file

    per_expert, fused = saved
    broken = tmp_path / "broken"
    shutil.copytree(fused, broken)
    state = load_file(broken / "model.safetensors")
    gate_up = state["model.layers.1.mlp.experts.gate_up_proj"].clone()
    half = gate_up.shape[1] // 2
    gate_up[2] = torch.cat([gate_up[2, half:], gate_up[2, :half]])
    state["model.layers.1.mlp.experts.gate_up_proj"] = gate_up
    save_file(state, broken / "model.safetensors", metadata={"format": "pt"})
    result = run_cli("diff", str(per_expert), str(broken), "--plain")
    assert result.code == 1, result.out + result.err
    assert "experts.2." in result.out


def test_fused_to_mcore_and_back_gives_bitwise_equal_logits(saved, tmp_path):
    per_expert, fused = saved
    mcore = tmp_path / "mcore"
    execute_convert(plan_convert(fused, mcore, to="mcore"))
    assert run_cli("diff", str(fused), str(mcore), "--plain").code == 0
    assert run_cli("diff", str(per_expert), str(mcore), "--plain").code == 0
    back = tmp_path / "hf"
    # the source's config.json: Megatron args do not record every MoE router fact (Qwen3-MoE's norm_topk_prob)
    execute_convert(plan_convert(mcore, back, to="hf", hf_config=fused))
    # Against the same layout: transformers' own fused and per-expert loads of one model differ by ~3e-8
    # (same values, other memory layout, other matmul order), so bitwise equality is per layout.
    assert torch.equal(_logits(back), _logits(per_expert))
    assert run_cli("diff", str(back), str(per_expert), "--map", "none", "--plain").code == 0  # transformers' names


def test_fused_written_on_request_is_what_transformers_writes(saved, tmp_path):
    per_expert, fused = saved
    mcore = tmp_path / "mcore"
    execute_convert(plan_convert(per_expert, mcore, to="mcore"))
    result = run_cli("convert", str(mcore), str(tmp_path / "hf"), "--to", "hf", "--hf-experts", "fused",
                     "--hf-config", str(per_expert))
    assert result.code == 0, result.err
    same = run_cli("diff", str(fused), str(tmp_path / "hf"), "--map", "none", "--plain")  # same names, same bytes
    assert same.code == 0 and ", 0 different" in same.out and "only in" not in same.out, same.out + same.err
    # Bitwise-equal tensors, yet the logits may differ in the last bit: transformers computes on the file's
    # memory map, and another byte offset (alignment) changes the CPU matmul's summation order.
    assert (_logits(tmp_path / "hf") - _logits(fused)).abs().max().item() <= 1e-6


def test_hf_fused_to_hf_per_expert(saved, tmp_path):
    per_expert, fused = saved
    result = run_cli("convert", str(fused), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 0, result.err
    assert run_cli("diff", str(per_expert), str(tmp_path / "hf"), "--map", "none", "--plain").code == 0


def test_fused_layout_refused_where_it_does_not_apply(saved, tmp_path):
    per_expert, _ = saved
    to_mcore = run_cli("convert", str(per_expert), str(tmp_path / "a"), "--to", "mcore", "--hf-experts", "fused")
    assert to_mcore.code == 2 and "--hf-experts applies to --to hf" in to_mcore.err
    dense = tmp_path / "dense"
    transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2)).save_pretrained(dense)
    result = run_cli("convert", str(dense), str(tmp_path / "b"), "--to", "hf", "--hf-experts", "fused")
    assert result.code == 2 and "no routed experts" in result.err
    assert not (tmp_path / "b").exists()
