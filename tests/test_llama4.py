"""Llama 4 text models between HF and Megatron-Core: dense and MoE layers interleaved
(``interleave_moe_layer_step=2``), a shared expert and a router per MoE layer, fused transposed experts.

HF fixtures are written by transformers (``Llama4TextConfig`` -> ``AutoModelForCausalLM.from_config`` ->
``save_pretrained``). The Megatron side is judged by megatron-core: a GPTModel from its own block spec
(``get_gpt_decoder_block_spec``: dense and MoE layers from ``moe_layer_freq``) built with the settings the
export wrote loads our torch_dist output through ``dist_checkpointing.load`` and gives transformers'
logits within 1e-5. Two configs, because megatron-core 0.16.1 applies ``qk_l2_norm`` on every layer
while Llama 4 skips it on NoPE layers (the export says so in a note): ``qk_norm`` has q/k norm and RoPE
on every layer, ``nope`` has a NoPE layer and no q/k norm.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.conftest import run_cli  # noqa: E402
from tests.arch_roundtrip import assert_diff_clean, assert_round_trip, convert, eager_logits, hf_tensors, mcore_load, megatron_args, rewrite_args  # noqa: E402

DIMS = dict(vocab_size=128, hidden_size=64, intermediate_size=32, intermediate_size_mlp=48, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
            interleave_moe_layer_step=2, max_position_embeddings=256)
"""Layers 1 and 3 MoE (4 experts, top 1, shared expert), 0 and 2 dense with a larger FFN; GQA."""
CONFIGS = {"qk_norm": dict(use_qk_norm=True, no_rope_layers=[1, 1, 1, 1]),
           "nope": dict(use_qk_norm=False)}  # default no_rope_layers: layer 3 has no RoPE
TOKENS = torch.tensor([[5, 17, 99, 3, 42, 7, 12, 100, 9, 1, 77, 12], [2, 8, 19, 120, 127, 4, 60, 33, 5, 91, 6, 0]])
CARRIED = ("model_type", "intermediate_size", "intermediate_size_mlp", "interleave_moe_layer_step", "moe_layers",
           "use_qk_norm", "no_rope_layers", "attention_chunk_size", "attn_temperature_tuning", "rope_parameters",
           "num_local_experts", "num_experts_per_tok", "head_dim", "num_key_value_heads")


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def hf_dir(request, tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.Llama4TextConfig(**DIMS, **CONFIGS[request.param])
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.3)  # a swapped or lost norm must show
            elif "router" in name or "experts" in name:
                param.normal_(0.0, 0.3)  # routers that pick different experts per token
    out = tmp_path_factory.mktemp(request.param) / "hf"
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def dist_dir(hf_dir):
    return convert(hf_dir, hf_dir.parent / "mcore_dist", to="mcore")


@pytest.fixture(scope="module")
def hf_logits(hf_dir):
    return eager_logits(hf_dir, TOKENS)


@pytest.mark.parametrize("fmt,tp,ep", [("torch_dist", 1, 1), ("torch", 2, 2)])
def test_round_trip_gives_bitwise_equal_logits_and_config(hf_dir, tmp_path, fmt, tp, ep):
    assert_round_trip(hf_dir, tmp_path, TOKENS, CARRIED, "Llama4ForCausalLM", ckpt_format=fmt, tp=tp, ep=ep)


def test_diff_across_naming_is_clean(hf_dir, dist_dir, tmp_path):
    legacy = convert(hf_dir, tmp_path / "leg", to="mcore", ckpt_format="torch", tp=2, ep=2)
    assert_diff_clean(hf_dir, dist_dir, legacy)


def test_megatron_args_say_which_layers_are_moe(dist_dir):
    args = megatron_args(dist_dir)
    assert args["moe_layer_freq"] == [0, 1, 0, 1]
    assert args["ffn_hidden_size"] == DIMS["intermediate_size_mlp"]
    assert args["moe_ffn_hidden_size"] == args["moe_shared_expert_intermediate_size"] == DIMS["intermediate_size"]
    assert args["rotary_interleaved"] and args["moe_apply_probs_on_input"]
    assert args["moe_router_score_function"] == "sigmoid"


# --- megatron-core ---------------------------------------------------------------------------------


def _mcore_model(args: dict):
    """A GPTModel from megatron-core's own block spec with the settings our export wrote."""
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=args["num_layers"], hidden_size=args["hidden_size"], ffn_hidden_size=args["ffn_hidden_size"],
        num_attention_heads=args["num_attention_heads"], num_query_groups=args["num_query_groups"],
        kv_channels=args["kv_channels"], gated_linear_unit=args["swiglu"], activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=False, qk_layernorm=False, qk_l2_norm=args["qk_l2_norm"],
        no_rope_freq=args.get("no_rope_freq"), rotary_interleaved=args["rotary_interleaved"],
        normalization="RMSNorm", layernorm_epsilon=args["norm_epsilon"], hidden_dropout=0.0, attention_dropout=0.0,
        params_dtype=torch.float32, num_moe_experts=args["num_experts"], moe_layer_freq=args["moe_layer_freq"],
        moe_ffn_hidden_size=args["moe_ffn_hidden_size"],
        moe_shared_expert_intermediate_size=args["moe_shared_expert_intermediate_size"],
        moe_router_topk=args["moe_router_topk"], moe_router_score_function=args["moe_router_score_function"],
        moe_apply_probs_on_input=args["moe_apply_probs_on_input"], moe_router_pre_softmax=False,
        moe_token_dispatcher_type="allgather", moe_aux_loss_coeff=0.0, moe_grouped_gemm=False,
        bias_activation_fusion=False, use_cpu_initialization=True, perform_initialization=False)
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm",
                                      qk_l2_norm=args["qk_l2_norm"])
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args["padded_vocab_size"],
                    max_sequence_length=args["max_position_embeddings"],
                    share_embeddings_and_output_weights=not args["untie_embeddings_and_output_weights"],
                    position_embedding_type="rope", rotary_base=args["rotary_base"]).eval()


@pytest.fixture(scope="module")
def mcore_loaded(dist_dir):
    """(state, sharded state dict, logits) of a fresh megatron-core Llama 4 that loaded ``dist_dir``."""
    return mcore_load(dist_dir, _mcore_model, TOKENS, DIMS["vocab_size"])


def test_megatron_core_loads_it_and_computes_the_same_logits(mcore_loaded, hf_logits):
    _, _, logits = mcore_loaded
    assert torch.isfinite(logits).all()  # every parameter came from the checkpoint (NaN otherwise)
    assert (logits - hf_logits).abs().max().item() <= 1e-5


def test_torch_dist_keys_shapes_and_objects_are_megatron_cores(dist_dir, mcore_loaded):
    """Per-layer keys (non-homogeneous layers), their global shapes, and the ``_extra_state`` objects:
    exactly what the real model's ``sharded_state_dict()`` asks for."""
    from torch.distributed.checkpoint import FileSystemReader

    _, wanted, _ = mcore_loaded
    stored = FileSystemReader(str(dist_dir / "iter_0000000")).read_metadata().state_dict_metadata
    tensors = {sh.key: sh for sh in wanted.values() if hasattr(sh, "global_shape") or hasattr(sh, "data")}
    objects = {f"{sh.key}/shard_{'.'.join(map(str, sh.global_offset))}_{'.'.join(map(str, sh.global_shape))}"
               for sh in wanted.values() if type(sh).__name__ == "ShardedObject"}
    assert {k for k in stored if hasattr(stored[k], "size")} == set(tensors) - {k.split("/")[0] for k in objects}
    assert {k for k in stored if not hasattr(stored[k], "size")} >= objects
    for key, sh in tensors.items():
        if hasattr(sh, "global_shape") and key in stored and hasattr(stored[key], "size"):
            assert tuple(stored[key].size) == tuple(sh.global_shape), key


def test_megatron_core_holds_dense_moe_shared_and_router_where_hf_does(hf_dir, mcore_loaded):
    """What megatron-core loaded, against the HF tensors as Llama 4 uses them: one assertion per pitfall,
    independent of ckptscope's reader."""
    state, _, _ = mcore_loaded
    hf = hf_tensors(hf_dir)
    for i in (0, 2):  # dense layers: no router, no experts, the dense FFN
        h, m = f"model.layers.{i}.feed_forward.", f"decoder.layers.{i}.mlp."
        assert not any(k.startswith(m + "router") or k.startswith(m + "experts") for k in state)
        assert torch.equal(state[m + "linear_fc1.weight"], torch.cat([hf[h + "gate_proj.weight"], hf[h + "up_proj.weight"]]))
        assert torch.equal(state[m + "linear_fc2.weight"], hf[h + "down_proj.weight"])
    for i in (1, 3):  # MoE layers
        h, m = f"model.layers.{i}.feed_forward.", f"decoder.layers.{i}.mlp."
        assert m + "linear_fc1.weight" not in state
        assert torch.equal(state[m + "router.weight"], hf[h + "router.weight"])
        assert torch.equal(state[m + "shared_experts.linear_fc1.weight"],
                           torch.cat([hf[h + "shared_expert.gate_proj.weight"], hf[h + "shared_expert.up_proj.weight"]]))
        assert torch.equal(state[m + "shared_experts.linear_fc2.weight"], hf[h + "shared_expert.down_proj.weight"])
        assert torch.equal(state[f"decoder.layers.{i}.pre_mlp_layernorm.weight"],
                           hf[f"model.layers.{i}.post_attention_layernorm.weight"])
        for e in range(DIMS["num_local_experts"]):
            x = f"{m}experts.local_experts.{e}."
            assert torch.equal(state[x + "linear_fc1.weight"], hf[h + "experts.gate_up_proj"][e].T)
            assert torch.equal(state[x + "linear_fc2.weight"], hf[h + "experts.down_proj"][e].T)


def test_tp2_ep2_files_hold_dense_and_moe_layers_as_megatron_does(hf_dir, tmp_path):
    """Per-rank files against the HF tensors: a dense layer's fc1 and a MoE layer's shared-expert fc1 split
    as [gate_t; up_t]; expert e on EP rank e // 2 as local expert e % 2, its fc1 rows [gate_t; up_t] of
    the transposed HF slice."""
    mcore = convert(hf_dir, tmp_path / "mcore", to="mcore", ckpt_format="torch", tp=2, ep=2)
    hf = hf_tensors(hf_dir)
    inter, dense = DIMS["intermediate_size"], DIMS["intermediate_size_mlp"]
    for tp_rank in (0, 1):
        for ep_rank in (0, 1):
            path = mcore / "iter_0000000" / f"mp_rank_0{tp_rank}_00{ep_rank}" / "model_optim_rng.pt"
            model = torch.load(path, map_location="cpu", weights_only=False)["model"]
            d = slice(tp_rank * dense // 2, (tp_rank + 1) * dense // 2)
            h = "model.layers.2.feed_forward."
            assert torch.equal(model["decoder.layers.2.mlp.linear_fc1.weight"],
                               torch.cat([hf[h + "gate_proj.weight"][d], hf[h + "up_proj.weight"][d]]))
            assert "decoder.layers.2.mlp.router.weight" not in model
            rows = slice(tp_rank * inter // 2, (tp_rank + 1) * inter // 2)
            h = "model.layers.3.feed_forward."
            assert torch.equal(model["decoder.layers.3.mlp.shared_experts.linear_fc1.weight"],
                               torch.cat([hf[h + "shared_expert.gate_proj.weight"][rows],
                                          hf[h + "shared_expert.up_proj.weight"][rows]]))
            assert torch.equal(model["decoder.layers.3.mlp.router.weight"], hf[h + "router.weight"])
            for local in (0, 1):
                fused = hf[h + "experts.gate_up_proj"][ep_rank * 2 + local].T  # [gate; up] rows
                assert torch.equal(model[f"decoder.layers.3.mlp.experts.local_experts.{local}.linear_fc1.weight"],
                                   torch.cat([fused[:inter][rows], fused[inter:][rows]]))


# --- refusals and notes ------------------------------------------------------------------------------


def test_export_notes_what_megatron_core_computes_differently(hf_dir, tmp_path):
    result = run_cli("convert", str(hf_dir), str(tmp_path / "out"), "--to", "mcore", "--dry-run")
    assert result.code == 0, result.err
    assert "chunks of 8192 tokens" in result.out
    nope = json.loads((hf_dir / "config.json").read_text())["use_qk_norm"] is False
    assert ("qk_l2_norm" in result.out) is False  # this config has no NoPE layer with a q/k norm
    assert ("temperature" in result.out) is nope


def test_export_notes_qk_norm_on_nope_layers(tmp_path):
    model = transformers.AutoModelForCausalLM.from_config(transformers.Llama4TextConfig(**DIMS))  # defaults: both
    model.save_pretrained(tmp_path / "hf")
    result = run_cli("convert", str(tmp_path / "hf"), str(tmp_path / "out"), "--to", "mcore", "--dry-run")
    assert result.code == 0 and "NoPE layers [3]" in result.out and "qk_l2_norm" in result.out, result.out


def test_export_refuses_more_than_one_expert_per_token(tmp_path):
    """megatron-core applies the router scores to the experts' input only with top-1 routing."""
    config = transformers.Llama4TextConfig(**{**DIMS, "num_experts_per_tok": 2})
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "hf")
    result = run_cli("convert", str(tmp_path / "hf"), str(tmp_path / "out"), "--to", "mcore")
    assert result.code == 2 and "num_experts_per_tok" in result.err, result.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key,value", [("rotary_interleaved", False), ("moe_apply_probs_on_input", None),
                                       ("moe_router_score_function", "softmax")])
def test_megatron_source_that_computes_something_else_is_refused(dist_dir, tmp_path, key, value):
    edited = rewrite_args(dist_dir, tmp_path, **{key: value})
    result = run_cli("convert", str(edited), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and key in result.err, result.err
    assert not (tmp_path / "out").exists()
