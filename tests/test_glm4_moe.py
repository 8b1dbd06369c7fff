"""GLM-4.5 (``Glm4MoeForCausalLM``) between HF and Megatron-Core: grouped-query attention with a fused QKV
bias and per-head q/k norms, partial RoPE, a first dense layer, routed + shared experts, the sigmoid router's
``e_score_correction_bias`` and an MTP layer.

The fixture is written by transformers itself (``Glm4MoeConfig`` -> ``AutoModelForCausalLM.from_config`` ->
``save_pretrained``) with random norms, random q/k/v biases and a random score-correction bias, so a bias
dropped or fused in the wrong order changes the logits. ``head_dim`` (24) differs from ``hidden / heads`` and
only half of it rotates (``partial_rotary_factor`` 0.5). transformers does not build MTP layers, so MTP
layer 0 is appended as the GLM-4.5 release stores it (``model.layers.{num_hidden_layers}.``: a MoE decoder
layer plus ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm`` and copies of the embedding and head).

The Megatron side is judged by megatron-core 0.16.1 on CPU (gloo world of 1): a ``GPTModel`` built from the
export's own args with megatron-core's layer specs (``get_gpt_decoder_block_spec`` / ``get_gpt_mtp_block_spec``,
local implementations) loads the torch_dist output through ``dist_checkpointing.load``; its logits are
compared with transformers' and its ``sharded_state_dict()`` keys and shapes with what was stored.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

from safetensors.torch import load_file  # noqa: E402

from tests import mcore_reference  # noqa: E402
from tests.arch_roundtrip import (append_mtp_layer, assert_diff_clean, assert_hf_config_refused,  # noqa: E402
                                  convert, load_strictly, mcore_load, megatron_args, perturbed_logits,
                                  rewrite_args)
from tests.conftest import run_cli  # noqa: E402
from tests.mcore_reference import generators  # noqa: E402

DIMS = dict(vocab_size=300, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
            first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=24, attention_bias=True, use_qk_norm=True,
            routed_scaling_factor=2.5, max_position_embeddings=64)
"""GQA (2 query heads per group), head 24 != 64 / 4, one dense layer then two MoE layers of 4 experts."""
TOKENS = generators().tokens_for(DIMS["vocab_size"])
MTP = "model.layers.4."
CARRIED = ("model_type", "architectures", "head_dim", "attention_bias", "use_qk_norm", "rope_parameters",
           "first_k_dense_replace", "n_routed_experts", "n_shared_experts", "moe_intermediate_size",
           "num_experts_per_tok", "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob",
           "num_nextn_predict_layers", "intermediate_size", "num_key_value_heads", "hidden_act")


def _write_fixture(out, **change):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.Glm4MoeConfig(**{**DIMS, **change}))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.3)
            elif name.endswith(".bias"):  # zeros by default: make a lost or misplaced bias change the output
                param.normal_(0.0, 0.5)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 1.0)
    model.save_pretrained(out)
    append_mtp_layer(out, DIMS["num_hidden_layers"], DIMS["hidden_size"])
    return out


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return _write_fixture(tmp_path_factory.mktemp("glm") / "hf")


@pytest.fixture(scope="module")
def dist_dir(hf_dir):
    return convert(hf_dir, hf_dir.parent / "dist", to="mcore")


def _logits(hf):
    return mcore_reference.hf_logits(hf, TOKENS)  # transformers, fp32, eager attention (ignores the MTP layer)


@pytest.fixture(scope="module")
def hf_logits(hf_dir):
    return _logits(hf_dir)


# --- HF -> Megatron -> HF ----------------------------------------------------------------------------------


def _assert_same_model(src_dir, back, src_logits):
    assert torch.equal(_logits(back), src_logits)
    src, got = load_file(src_dir / "model.safetensors"), load_file(back / "model.safetensors")
    assert sorted(got) == sorted(src)  # the MTP layer included: transformers ignores it, so only this sees it
    for name, value in src.items():
        assert torch.equal(got[name], value), name
    src_cfg, got_cfg = (json.loads((d / "config.json").read_text()) for d in (src_dir, back))
    for key in CARRIED:
        assert got_cfg.get(key) == src_cfg.get(key), key


@pytest.mark.parametrize("fmt,tp,pp,ep", [("torch_dist", 1, 1, 1), ("torch", 2, 1, 2),
                                          ("torch", 1, 2, 1)])
def test_round_trip_gives_bitwise_equal_logits_tensors_and_config(hf_dir, hf_logits, tmp_path, fmt, tp, pp, ep):
    mcore = convert(hf_dir, tmp_path / "mcore", to="mcore", ckpt_format=fmt, tp=tp, pp=pp, ep=ep)
    back = convert(mcore, tmp_path / "hf", to="hf")  # no --hf-config: everything from the Megatron args
    _assert_same_model(hf_dir, back, hf_logits)


def test_air_variant_without_qk_norm_round_trips(tmp_path):
    """GLM-4.5-Air: no q/k norm, no score scaling."""
    hf = _write_fixture(tmp_path / "air", use_qk_norm=False, routed_scaling_factor=1.0)
    assert "model.layers.0.self_attn.q_norm.weight" not in load_file(hf / "model.safetensors")
    mcore = convert(hf, tmp_path / "mcore", to="mcore")
    assert megatron_args(mcore)["qk_layernorm"] is False
    _assert_same_model(hf, convert(mcore, tmp_path / "back", to="hf"), _logits(hf))


def test_diff_across_naming_is_clean(hf_dir, dist_dir, tmp_path):
    legacy = convert(hf_dir, tmp_path / "leg", to="mcore", ckpt_format="torch", tp=2, ep=2)
    assert_diff_clean(hf_dir, dist_dir, legacy)


def test_megatron_args_are_megatron_bridges_glm45_settings(dist_dir):
    args = megatron_args(dist_dir)
    assert args["add_qkv_bias"] is True and args["qk_layernorm"] is True and args["add_bias_linear"] is False
    assert args["rotary_percent"] == 0.5 and args["rotary_interleaved"] is False
    assert args["kv_channels"] == 24 and args["num_query_groups"] == 2 and args["group_query_attention"]
    assert args["moe_layer_freq"] == [0, 1, 1, 1]  # first_k_dense_replace = 1
    assert args["moe_router_enable_expert_bias"] is True and args["moe_router_score_function"] == "sigmoid"
    assert args["moe_router_topk_scaling_factor"] == 2.5 and args["moe_router_pre_softmax"] is False
    assert args["moe_shared_expert_intermediate_size"] == 32 and args["moe_ffn_hidden_size"] == 32
    assert args["ffn_hidden_size"] == 96 and args["num_experts"] == 4 and args["moe_router_topk"] == 2
    assert args["mtp_num_layers"] == 1 and args["hf_config_extra"]["model_type"] == "glm4_moe"


def test_archs_lists_glm45(tmp_path):
    result = run_cli("archs")
    assert result.code == 0, result.err
    assert "glm4_moe" in result.out and "Glm4MoeForCausalLM" in result.out
    assert "mlp.gate.e_score_correction_bias" in result.out and "self_attn.q_proj.bias" in result.out


# --- megatron-core itself ----------------------------------------------------------------------------------


def _mcore_model(args: dict, mtp: bool = False):
    """megatron-core's GPTModel for the export's own args, from its own block (and MTP) specs."""
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=args["num_layers"], hidden_size=args["hidden_size"], ffn_hidden_size=args["ffn_hidden_size"],
        num_attention_heads=args["num_attention_heads"], num_query_groups=args["num_query_groups"],
        kv_channels=args["kv_channels"], gated_linear_unit=args["swiglu"], activation_func=F.silu,
        add_bias_linear=args["add_bias_linear"], add_qkv_bias=args["add_qkv_bias"],
        qk_layernorm=args["qk_layernorm"], rotary_interleaved=args["rotary_interleaved"],
        normalization=args["normalization"], layernorm_epsilon=args["norm_epsilon"], hidden_dropout=0.0,
        attention_dropout=0.0, params_dtype=torch.float32, num_moe_experts=args["num_experts"],
        moe_layer_freq=args["moe_layer_freq"], moe_ffn_hidden_size=args["moe_ffn_hidden_size"],
        moe_shared_expert_intermediate_size=args["moe_shared_expert_intermediate_size"],
        moe_router_topk=args["moe_router_topk"], moe_router_score_function=args["moe_router_score_function"],
        moe_router_enable_expert_bias=args["moe_router_enable_expert_bias"],
        moe_router_topk_scaling_factor=args["moe_router_topk_scaling_factor"],
        moe_router_num_groups=args["moe_router_num_groups"], moe_router_group_topk=args["moe_router_group_topk"],
        moe_router_pre_softmax=args["moe_router_pre_softmax"], moe_router_dtype=args["moe_router_dtype"],
        mtp_num_layers=args["mtp_num_layers"] if mtp else None, moe_token_dispatcher_type="allgather",
        moe_aux_loss_coeff=0.0, moe_grouped_gemm=False, bias_activation_fusion=False, use_cpu_initialization=True,
        perform_initialization=False)
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=args["normalization"])
    mtp_spec = get_gpt_mtp_block_spec(config, spec.layer_specs[-1], use_transformer_engine=False) if mtp else None
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args["padded_vocab_size"],
                    max_sequence_length=args["max_position_embeddings"],
                    share_embeddings_and_output_weights=not args["untie_embeddings_and_output_weights"],
                    position_embedding_type="rope", rotary_percent=args["rotary_percent"],
                    rotary_base=args["rotary_base"], mtp_block_spec=mtp_spec).eval()


@pytest.fixture(scope="module")
def mcore_loaded(dist_dir):
    """(model, logits) of a fresh megatron-core GLM-4.5 without MTP (whose forward needs labels) that
    loaded ``dist_dir`` (parameters NaN first, so anything not loaded shows)."""
    holder = {}

    def build(args):
        holder["model"] = _mcore_model(args)
        return holder["model"]

    _, _, logits = mcore_load(dist_dir, build, TOKENS, DIMS["vocab_size"])
    return holder["model"], logits


def test_megatron_core_logits_equal_transformers(mcore_loaded, hf_logits):
    _, logits = mcore_loaded
    assert torch.isfinite(logits).all()
    diff = (logits - hf_logits).abs().max().item()
    assert diff <= 1e-5, diff


def test_torch_dist_keys_and_shapes_are_megatron_cores_with_mtp(dist_dir, hf_dir):
    """Built with its MTP block, the real model's ``sharded_state_dict()`` asks for exactly the stored keys
    (shapes equal; a layer's experts stacked under one key), loads with nothing missing or unexpected, and
    the MTP modules hold the HF tensors."""
    mcore_reference.allow_router_without_te()
    gen = generators()
    gen.ensure_single_rank_world()
    with gen.cpu_megatron():
        model = _mcore_model(megatron_args(dist_dir), mtp=True)
        load_strictly(model, dist_dir / "iter_0000000")
    hf = load_file(hf_dir / "model.safetensors")
    state = model.state_dict()
    for mc, name in (("enorm.weight", "enorm.weight"), ("eh_proj.weight", "eh_proj.weight"),
                     ("final_layernorm.weight", "shared_head.norm.weight"),
                     ("transformer_layer.mlp.router.expert_bias", "mlp.gate.e_score_correction_bias"),
                     ("transformer_layer.self_attention.k_layernorm.weight", "self_attn.k_norm.weight")):
        assert torch.equal(state[f"mtp.layers.0.{mc}"], hf[MTP + name]), mc


# --- each pitfall, seen by megatron-core --------------------------------------------------------------------


def _mcore_logits(model):
    gen = generators()
    with gen.cpu_megatron():
        return gen.mcore_model_logits(model, TOKENS)[..., :DIMS["vocab_size"]]


def _perturbed_logits(model, name, value):
    """megatron-core logits with one loaded parameter or buffer replaced."""
    return perturbed_logits(model, name, value, _mcore_logits)


def _grouped_qkv(q, k, v):
    """megatron-core's fused QKV rows, written out independently: per query group, its queries, key, value."""
    groups, head = DIMS["num_key_value_heads"], DIMS["head_dim"]
    per = DIMS["num_attention_heads"] // groups
    parts = []
    for g in range(groups):
        parts += [q[g * per * head:(g + 1) * per * head], k[g * head:(g + 1) * head], v[g * head:(g + 1) * head]]
    return torch.cat(parts)


def test_qkv_bias_is_fused_per_group_and_matters(mcore_loaded, hf_dir, hf_logits):
    model, _ = mcore_loaded
    hf = load_file(hf_dir / "model.safetensors")
    for i in range(DIMS["num_hidden_layers"]):
        a = f"model.layers.{i}.self_attn."
        got = model.decoder.layers[i].self_attention.linear_qkv.bias
        assert torch.equal(got, _grouped_qkv(hf[a + "q_proj.bias"], hf[a + "k_proj.bias"], hf[a + "v_proj.bias"]))
    naive = torch.cat([hf[f"model.layers.1.self_attn.{p}_proj.bias"] for p in "qkv"])  # [q; k; v], not per group
    name = "decoder.layers.1.self_attention.linear_qkv.bias"
    for wrong in (torch.zeros_like, lambda _: naive, lambda b: b.flip(0)):
        assert (_perturbed_logits(model, name, wrong) - hf_logits).abs().max().item() > 1e-3


def test_router_bias_is_the_score_correction_bias_and_matters(mcore_loaded, hf_dir, hf_logits):
    model, _ = mcore_loaded
    hf = load_file(hf_dir / "model.safetensors")
    for i in (1, 2):
        got = model.decoder.layers[i].mlp.router.expert_bias
        assert torch.equal(got, hf[f"model.layers.{i}.mlp.gate.e_score_correction_bias"])
    name = "decoder.layers.1.mlp.router.expert_bias"
    for wrong in (torch.zeros_like, lambda b: b.flip(0)):
        assert (_perturbed_logits(model, name, wrong) - hf_logits).abs().max().item() > 1e-3


def test_first_layer_is_dense_and_the_rest_moe_with_shared_experts(mcore_loaded, hf_dir):
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.moe.moe_layer import MoELayer

    model, _ = mcore_loaded
    layers = model.decoder.layers
    assert type(layers[0].mlp) is MLP and all(isinstance(layer.mlp, MoELayer) for layer in layers[1:])
    hf = load_file(hf_dir / "model.safetensors")
    h = "model.layers.2.mlp.shared_experts."
    assert torch.equal(layers[2].mlp.shared_experts.linear_fc1.weight,
                       torch.cat([hf[h + "gate_proj.weight"], hf[h + "up_proj.weight"]]))
    assert torch.equal(layers[0].pre_mlp_layernorm.weight, hf["model.layers.0.post_attention_layernorm.weight"])
    assert torch.equal(layers[1].self_attention.q_layernorm.weight, hf["model.layers.1.self_attn.q_norm.weight"])


# --- what has no Megatron equivalent, and Megatron sources that are not GLM-4.5 -----------------------------


@pytest.mark.parametrize("change,message", [({"norm_topk_prob": False}, "norm_topk_prob"),
                                            ({"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                                  "rope_theta": 10000.0}}, "rope type")])
def test_settings_megatron_cannot_express_are_refused(hf_dir, tmp_path, change, message):
    assert_hf_config_refused(hf_dir, tmp_path, change, message)


@pytest.mark.parametrize("key,value", [("moe_router_score_function", "softmax"), ("rotary_interleaved", True),
                                       ("rotary_percent", 1.0)])
def test_megatron_source_that_computes_something_else_is_refused(dist_dir, tmp_path, key, value):
    edited = rewrite_args(dist_dir, tmp_path, **{key: value})
    result = run_cli("convert", str(edited), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and key in result.err, result.err
    assert not (tmp_path / "out").exists()


def test_megatron_args_without_hf_config_extra_still_give_glm45(dist_dir, hf_dir, hf_logits, tmp_path):
    """A Megatron run that never saw an HF config (no ``hf_config_extra``): the arch comes from the router's
    expert bias, the GLM keys from the Megatron facts (moe_layer_freq, rotary_percent, scaling factor)."""
    edited = rewrite_args(dist_dir, tmp_path, hf_config_extra=None)
    back = convert(edited, tmp_path / "back", to="hf")
    got = json.loads((back / "config.json").read_text())
    assert got["model_type"] == "glm4_moe" and got["first_k_dense_replace"] == 1
    assert got["rope_parameters"]["partial_rotary_factor"] == 0.5 and got["routed_scaling_factor"] == 2.5
    assert torch.equal(_logits(back), hf_logits)


def test_transformers_v5_fused_experts_convert_like_per_expert_ones(hf_dir, hf_logits, tmp_path):
    """``save_pretrained(save_original_format=False)`` keeps transformers v5's fused expert tensors."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.save_pretrained(tmp_path / "fused", save_original_format=False)
    assert "model.layers.1.mlp.experts.gate_up_proj" in load_file(tmp_path / "fused" / "model.safetensors")
    back = convert(convert(tmp_path / "fused", tmp_path / "mcore", to="mcore"), tmp_path / "hf", to="hf")
    assert torch.equal(_logits(back), hf_logits)
    src, got = load_file(hf_dir / "model.safetensors"), load_file(back / "model.safetensors")
    assert all(torch.equal(got[n], src[n]) for n in got)


def test_a_megatron_bridge_save_converts_from_its_run_config(dist_dir, hf_logits, tmp_path):
    """Megatron-Bridge's layout (tests/test_bridge_run_config.py has the sources): no ``args`` in common.pt,
    the GLM-4.5 provider's fields in ``run_config.yaml`` under megatron-core's TransformerConfig names
    (glm45_provider.py's ``GLMMoEModelProvider``), no HF config anywhere. The export to HF gets everything from
    that file and computes transformers' logits exactly."""
    yaml = pytest.importorskip("yaml")
    import shutil

    save = tmp_path / "bridge"
    shutil.copytree(dist_dir, save)
    common = save / "iter_0000000" / "common.pt"
    state = torch.load(common, map_location="cpu", weights_only=False)
    args = vars(state.pop("args"))
    torch.save(state, common)
    same = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
            "vocab_size", "make_vocab_size_divisible_by", "normalization", "add_qkv_bias", "qk_layernorm",
            "add_bias_linear", "position_embedding_type", "rotary_base", "rotary_percent", "rotary_interleaved",
            "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_router_topk", "moe_layer_freq",
            "moe_router_score_function", "moe_router_enable_expert_bias", "moe_router_topk_scaling_factor",
            "moe_router_num_groups", "moe_router_group_topk", "moe_router_pre_softmax", "mtp_num_layers", "bf16", "fp16")
    model = {key: args[key] for key in same}
    model.update({"_target_": "megatron.bridge.models.glm.glm45_provider.GLMMoEModelProvider",
                  "num_moe_experts": args["num_experts"], "layernorm_epsilon": args["norm_epsilon"],
                  "seq_length": args["max_position_embeddings"], "share_embeddings_and_output_weights": False,
                  "gated_linear_unit": True, "layernorm_zero_centered_gamma": False,
                  "activation_func": {"_target_": "torch.nn.functional.silu", "_call_": False},
                  "params_dtype": {"_target_": "torch.float32", "_call_": False}})
    with open(save / "iter_0000000" / "run_config.yaml", "w") as handle:
        yaml.safe_dump({"_target_": "megatron.bridge.training.config.ConfigContainer", "model": model}, handle,
                       default_flow_style=False)
    back = convert(save, tmp_path / "hf", to="hf")
    config = json.loads((back / "config.json").read_text())
    assert config["model_type"] == "glm4_moe" and config["first_k_dense_replace"] == 1
    assert config["num_nextn_predict_layers"] == 1 and config["use_qk_norm"] is True
    assert torch.equal(_logits(back), hf_logits)
