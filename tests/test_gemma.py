"""Gemma 2 / Gemma 3 (text) between HF and Megatron-Core: four norms per layer, zero-centred norm
weights, q/k norms (Gemma 3), tied embeddings and the config facts only HF spells (soft-capping,
sliding window, local/global RoPE, the sqrt(hidden) embedding scale kept with the arch).

Fixtures are written by transformers itself (``AutoModelForCausalLM.from_config(...).save_pretrained``)
with random norm weights, so a dropped or added 1.0, a swapped norm or a lost soft-cap changes the
logits. megatron-core cannot build Gemma on CPU (its torch RMSNorm refuses zero-centred gamma, and the
post-norms are Megatron-Bridge's ``TERowParallelLinearLayerNorm``), so the Megatron side is judged by
keys and shapes against a real ``GPTModel.sharded_state_dict()`` and a real ``dist_checkpointing.load``
of the tensors it has; the numbers are judged by transformers' logits after the round trip.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ckptscope.ops.convert.execute import execute_convert  # noqa: E402
from ckptscope.ops.convert.plan import plan_convert  # noqa: E402
from tests.conftest import run_cli  # noqa: E402
from tests.arch_roundtrip import rewrite_args  # noqa: E402
from tests.mcore_reference import generators  # noqa: E402

DIMS = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=24, sliding_window=5, max_position_embeddings=64,
            query_pre_attn_scalar=20)
"""GQA (2 groups of 2 heads), head_dim 24 != hidden/heads (16), a sliding window shorter than the batch."""
TOKENS = torch.tensor([[5, 17, 299, 3, 42, 7, 128, 250, 9, 1, 77, 12], [2, 8, 19, 150, 298, 4, 60, 33, 5, 91, 6, 0]])
CARRIED = ("model_type", "hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping",
           "final_logit_softcapping", "sliding_window", "layer_types", "rope_parameters", "tie_word_embeddings")


def _config(arch: str):
    if arch == "gemma2":
        return transformers.Gemma2Config(**DIMS, attn_logit_softcapping=30.0, final_logit_softcapping=3.0)
    # Gemma 3 1B style (Gemma3ForCausalLM): one sliding layer, one global layer, local/global RoPE
    return transformers.Gemma3TextConfig(**DIMS, layer_types=["sliding_attention", "full_attention"])


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def hf_dir(request, tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(request.param))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # HF initialises them to 0 (= scale 1): make a lost 1.0 visible
                param.normal_(0.0, 0.5)
    out = tmp_path_factory.mktemp(request.param) / "hf"
    model.save_pretrained(out)
    return out


def _logits(hf):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32,
                                                               attn_implementation="eager").eval()
    with torch.no_grad():
        return model(input_ids=TOKENS).logits


def _convert(src, dst, **kw):
    execute_convert(plan_convert(src, dst, **kw))
    return dst


@pytest.fixture(scope="module")
def dist_dir(hf_dir):
    return _convert(hf_dir, hf_dir.parent / "mcore_dist", to="mcore")


@pytest.mark.parametrize("fmt,tp", [("torch_dist", 1), ("torch", 2)])
def test_round_trip_gives_bitwise_equal_logits_and_config(hf_dir, tmp_path, fmt, tp):
    mcore = _convert(hf_dir, tmp_path / "mcore", to="mcore", ckpt_format=fmt, tp=tp)
    back = _convert(mcore, tmp_path / "hf", to="hf")  # no --hf-config: everything from the Megatron args
    assert torch.equal(_logits(back), _logits(hf_dir))
    src, got = (json.loads((d / "config.json").read_text()) for d in (hf_dir, back))
    for key in CARRIED:  # model_type keeps Gemma's sqrt(hidden) embedding scale; the rest are HF-only facts
        assert got.get(key) == src.get(key), key
    assert got["architectures"] == src["architectures"]


def test_diff_across_naming_is_clean(hf_dir, dist_dir):
    result = run_cli("diff", str(hf_dir), str(dist_dir), "--plain")
    assert result.code == 0, result.out + result.err


def test_megatron_args_record_zero_centred_norms_and_gemma_facts(hf_dir, dist_dir):
    args = vars(torch.load(dist_dir / "iter_0000000" / "common.pt", map_location="cpu", weights_only=False)["args"])
    assert args["apply_layernorm_1p"] is True and args["layernorm_zero_centered_gamma"] is True
    assert args["gated_linear_unit"] is True and args["swiglu"] is False  # GeGLU: gated, not SiLU
    src = json.loads((hf_dir / "config.json").read_text())
    assert args["hf_config_extra"]["model_type"] == src["model_type"]
    assert args["hf_config_extra"]["sliding_window"] == src["sliding_window"]
    assert args["qk_layernorm"] is (src["model_type"] == "gemma3_text")
    # rotary_base is the global layers' RoPE base (transformers 5 keeps Gemma 3's per layer type); a probe's
    # export wrote the default 10000 for bases of 1e6 and 1000
    rope = src.get("rope_parameters") or {}
    want = rope["full_attention"]["rope_theta"] if "full_attention" in rope else src.get("rope_theta", rope.get("rope_theta"))
    assert args["rotary_base"] == want


def test_gemma3_local_rope_base_is_said_and_the_global_one_written(tmp_path):
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(**DIMS, layer_types=["sliding_attention", "full_attention"], rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}})
    hf = tmp_path / "hf"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(hf)
    result = run_cli("convert", str(hf), str(tmp_path / "mcore"), "--to", "mcore")
    assert result.code == 0 and "the local layers' RoPE base" in result.err, result.err
    args = vars(torch.load(tmp_path / "mcore" / "iter_0000000" / "common.pt", map_location="cpu", weights_only=False)["args"])
    assert args["rotary_base"] == 1e6
    back = _convert(tmp_path / "mcore", tmp_path / "back", to="hf")
    assert torch.equal(_logits(back), _logits(hf))


_rewrite_args = rewrite_args  # one helper for every arch's Megatron-args edits (tests/arch_roundtrip.py)


@pytest.mark.parametrize("changes", [dict(apply_layernorm_1p=False, layernorm_zero_centered_gamma=False),
                                     dict(apply_layernorm_1p=None, layernorm_zero_centered_gamma=None)],
                         ids=["says-not-zero-centred", "does-not-say"])
def test_export_refuses_megatron_norms_that_are_not_zero_centred(dist_dir, tmp_path, changes):
    edited = _rewrite_args(dist_dir, tmp_path, **changes)
    for to in ("hf", "mcore"):  # to HF, and a Megatron re-shard that would write apply_layernorm_1p=True
        result = run_cli("convert", str(edited), str(tmp_path / f"out_{to}"), "--to", to)
        assert result.code == 2 and "zero-centred" in result.err, result.err
        assert not (tmp_path / f"out_{to}").exists()


def test_diff_warns_when_megatron_norms_are_not_zero_centred(hf_dir, dist_dir, tmp_path):
    """Stored values are equal, so diff cannot call them different; it must not let them pass unremarked."""
    edited = _rewrite_args(dist_dir, tmp_path, apply_layernorm_1p=False, layernorm_zero_centered_gamma=False)
    result = run_cli("diff", str(hf_dir), str(edited), "--plain")
    assert "do not record apply_layernorm_1p" in " ".join(result.out.split()), result.out + result.err
    assert "apply_layernorm_1p" not in run_cli("diff", str(hf_dir), str(dist_dir), "--plain").out


def test_zero_centred_megatron_checkpoint_refused_as_llama(tmp_path):
    gen = generators()
    hf = gen.write_hf("llama_gqa", tmp_path / "llama")
    mcore = _convert(hf, tmp_path / "mcore", to="mcore")
    edited = _rewrite_args(mcore, tmp_path, apply_layernorm_1p=True)
    result = run_cli("convert", str(edited), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and "zero-centred" in result.err, result.err


def test_tp2_files_split_geglu_fc1_as_gate_and_up_halves(hf_dir, tmp_path):
    """Megatron shards a gated fc1 as [gate_t; up_t] per rank (MAPPING.md §3.2); a plain row split would
    give rank 0 all of gate. Checked against the HF tensors, not against our own reader."""
    from safetensors.torch import load_file

    mcore = _convert(hf_dir, tmp_path / "mcore", to="mcore", ckpt_format="torch", tp=2)
    hf = load_file(hf_dir / "model.safetensors")
    half = DIMS["intermediate_size"] // 2
    for rank in (0, 1):
        model = torch.load(mcore / "iter_0000000" / f"mp_rank_0{rank}" / "model_optim_rng.pt", map_location="cpu",
                           weights_only=False)["model"]
        rows = slice(rank * half, (rank + 1) * half)
        gate, up = hf["model.layers.1.mlp.gate_proj.weight"][rows], hf["model.layers.1.mlp.up_proj.weight"][rows]
        assert torch.equal(model["decoder.layers.1.mlp.linear_fc1.weight"], torch.cat([gate, up]))
        for hf_name, mc_name in (("post_attention_layernorm", "self_attention.linear_proj.post_layernorm"),
                                 ("pre_feedforward_layernorm", "pre_mlp_layernorm"),
                                 ("post_feedforward_layernorm", "mlp.linear_fc2.post_layernorm")):
            assert torch.equal(model[f"decoder.layers.1.{mc_name}.weight"], hf[f"model.layers.1.{hf_name}.weight"])


def test_torch_dist_matches_megatron_core_gpt_model_keys(hf_dir, dist_dir):
    """Every key a real GPTModel of these dimensions asks for is in the checkpoint with its global shape
    and loads through ``dist_checkpointing.load``; the only extra keys are the two post-norms, which
    megatron-core's GPTModel lacks and Megatron-Bridge's Gemma layers add."""
    from megatron.core import dist_checkpointing
    from safetensors.torch import load_file
    from torch.distributed.checkpoint import FileSystemReader

    gen = generators()
    cfg = transformers.AutoConfig.from_pretrained(str(hf_dir))
    iter_dir = dist_dir / "iter_0000000"
    stored = FileSystemReader(str(iter_dir)).read_metadata().state_dict_metadata
    args = gen.megatron_args(transformers.Gemma2Config(**DIMS), tp=1)
    args.qk_layernorm = cfg.model_type == "gemma3_text"
    args.padded_vocab_size = int(stored["embedding.word_embeddings.weight"].size[0])
    gen.ensure_single_rank_world()
    with gen.cpu_megatron():
        model = gen.build_gpt_model(args)
        wanted = {sh.key: sh for sh in model.sharded_state_dict().values() if "_extra_state" not in sh.key}
        for key, sharded in wanted.items():  # storage keys: per-layer tensors stacked on a layer axis
            assert key in stored, key
            if hasattr(sharded, "global_shape"):
                assert tuple(stored[key].size) == tuple(sharded.global_shape), key
            else:  # the gated fc1's factory (W and V halves): its TP=1 tensor, behind the layer axis
                assert tuple(stored[key].size)[1:] == tuple(sharded.data.shape), key
        extra = {k for k in stored if "_extra_state" not in k and k not in wanted}
        assert extra == {"decoder.layers.self_attention.linear_proj.post_layernorm.weight",
                         "decoder.layers.mlp.linear_fc2.post_layernorm.weight"}
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(iter_dir),
                                         strict="assume_ok_unexpected")
    state = loaded["model"]
    hf = load_file(hf_dir / "model.safetensors")
    assert torch.equal(state["decoder.layers.1.input_layernorm.weight"], hf["model.layers.1.input_layernorm.weight"])
    assert torch.equal(state["decoder.layers.0.pre_mlp_layernorm.weight"],
                       hf["model.layers.0.pre_feedforward_layernorm.weight"])
    if args.qk_layernorm:
        assert torch.equal(state["decoder.layers.1.self_attention.k_layernorm.weight"],
                           hf["model.layers.1.self_attn.k_norm.weight"])
