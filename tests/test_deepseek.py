"""DeepSeek-V3 between HF and Megatron-Core: multi-latent attention (with and without ``q_lora_rank``),
a first dense layer, routed + shared experts, the router's ``e_score_correction_bias`` and an MTP layer.

Fixtures are written by transformers itself (``AutoModelForCausalLM.from_config(...).save_pretrained``)
with random norms and a random score-correction bias, so a dropped bias, a swapped norm or a lost
shared expert changes the logits. transformers does not build MTP layers, so the fixture appends MTP
layer 0 as the DeepSeek-V3 release stores it (``model.layers.{num_hidden_layers}.``: ``enorm``,
``hnorm``, ``eh_proj``, ``shared_head.norm``, ``embed_tokens`` and ``shared_head.head`` copies of the
main embedding and head, and a full MoE decoder layer).

The Megatron side is judged by megatron-core 0.16.1 itself, on CPU: a ``GPTModel`` built from the
checkpoint's own args with megatron-core's layer specs (tests/mla_reference.py, which also says which
three shims make it run without TransformerEngine) loads the torch_dist output through
``dist_checkpointing.load`` and its logits are compared with transformers'; on 2 gloo ranks it loads
the output into a TP=2 model and each rank's state must be the legacy TP=2 file of that rank.
"""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

from safetensors.torch import load_file  # noqa: E402

from ckptscope.ops.convert.execute import execute_convert  # noqa: E402
from ckptscope.ops.convert.plan import plan_convert  # noqa: E402
from tests.arch_roundtrip import append_mtp_layer, assert_hf_config_refused, load_strictly, perturbed_logits  # noqa: E402
from tests.conftest import run_cli  # noqa: E402
from tests import mcore_reference  # noqa: E402
from tests.mcore_reference import generators  # noqa: E402
from tests.mla_reference import gpt_model, megatron_on_cpu  # noqa: E402

DIMS = dict(vocab_size=300, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
            first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
            topk_group=1, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=8,
            qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=64)
"""qk head 24 (16 nope + 8 rope) != v head 16; one dense layer, two MoE layers; 4 experts in 2 groups."""
TOKENS = generators().tokens_for(DIMS["vocab_size"])
MTP = "model.layers.3."


def _write_fixture(out, q_lora_rank):
    torch.manual_seed(0)
    config = transformers.DeepseekV3Config(**DIMS, q_lora_rank=q_lora_rank)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.3)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # zeros by default: make a lost bias change the routing
                buffer.normal_(0.0, 1.0)
    model.save_pretrained(out)
    append_mtp_layer(out, DIMS["num_hidden_layers"], DIMS["hidden_size"])
    return out


@pytest.fixture(scope="module", params=[48, None], ids=["q_lora", "no_q_lora"])
def hf_dir(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("deepseek")
    return _write_fixture(root / "hf", request.param)


@pytest.fixture(scope="module")
def dist_dir(hf_dir):
    """The default conversion's output: torch_dist, local-spec names."""
    return _convert(hf_dir, hf_dir.parent / "dist", to="mcore")


def _convert(src, dst, **kw):
    execute_convert(plan_convert(src, dst, **kw))
    return dst


def _logits(hf):
    return mcore_reference.hf_logits(hf, TOKENS)  # transformers, fp32, eager attention


@pytest.fixture(scope="module")
def hf_logits(hf_dir):
    return _logits(hf_dir)


# --- HF -> Megatron -> HF ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,tp,ep,spec", [("torch_dist", 1, 1, "local"), ("torch_dist", 1, 1, "te"),
                                            ("torch", 2, 2, "local"), ("torch", 2, 1, "te")])
def test_round_trip_gives_bitwise_equal_logits_tensors_and_config(hf_dir, hf_logits, tmp_path, fmt, tp, ep, spec):
    mcore = _convert(hf_dir, tmp_path / "mcore", to="mcore", ckpt_format=fmt, tp=tp, ep=ep, spec=spec)
    back = _convert(mcore, tmp_path / "hf", to="hf")  # no --hf-config: everything from the Megatron args
    assert torch.equal(_logits(back), hf_logits)
    src, got = load_file(hf_dir / "model.safetensors"), load_file(back / "model.safetensors")
    assert sorted(got) == sorted(src)  # MTP layer included: transformers ignores it, so only this sees it
    for name, value in src.items():
        assert torch.equal(got[name], value), name
    src_cfg, got_cfg = (json.loads((d / "config.json").read_text()) for d in (hf_dir, back))
    for key in ("model_type", "architectures", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                "v_head_dim", "first_k_dense_replace", "n_routed_experts", "n_shared_experts", "moe_intermediate_size",
                "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob", "rope_interleave",
                "num_nextn_predict_layers", "intermediate_size", "num_experts_per_tok"):
        assert got_cfg.get(key) == src_cfg.get(key), key


def test_diff_across_naming_is_clean(hf_dir, dist_dir):
    result = run_cli("diff", str(hf_dir), str(dist_dir), "--plain")
    assert result.code == 0, result.out + result.err


def test_convert_says_what_the_mtp_layer_shares(hf_dir, tmp_path):
    plan = plan_convert(hf_dir, tmp_path / "out", to="mcore")
    assert sorted(plan.dropped) == [MTP + "embed_tokens.weight", MTP + "shared_head.head.weight"]
    assert any("MTP copies of the embedding / output head not written" in note for note in plan.notes)
    names = {t.name for t in plan.tensors}
    assert {"mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight", "mtp.layers.0.eh_proj.weight",
            "mtp.layers.0.final_layernorm.weight", "mtp.layers.0.transformer_layer.mlp.router.expert_bias"} <= names
    assert plan.megatron_args["mtp_num_layers"] == 1


# --- megatron-core itself ----------------------------------------------------------------------------------


def _args(dist_dir):
    return torch.load(dist_dir / "iter_0000000" / "common.pt", map_location="cpu", weights_only=False)["args"]


@pytest.fixture(scope="module")
def mcore_model(dist_dir):
    """A GPTModel without MTP (whose forward needs labels) that loaded the torch_dist output."""
    from megatron.core import dist_checkpointing

    with megatron_on_cpu():
        model = gpt_model(_args(dist_dir), mtp=False)
        with torch.no_grad():
            for param in model.parameters():
                param.fill_(float("nan"))  # anything the checkpoint does not provide shows as NaN logits
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(dist_dir / "iter_0000000"),
                                         strict="assume_ok_unexpected")
        model.load_state_dict(loaded["model"], strict=True)
    return model


def _mcore_logits(model):
    with megatron_on_cpu():
        return generators().mcore_model_logits(model, TOKENS)[..., :DIMS["vocab_size"]]


def test_megatron_core_logits_equal_transformers(mcore_model, hf_logits):
    diff = (_mcore_logits(mcore_model) - hf_logits).abs().max().item()
    assert diff <= 1e-5, diff


def test_megatron_core_reads_the_same_args_the_converter_wrote(dist_dir, hf_dir):
    args = _args(dist_dir)
    src = json.loads((hf_dir / "config.json").read_text())
    assert args.multi_latent_attention is True and args.rotary_interleaved is False  # = HF rope_interleave
    assert args.moe_layer_freq == [0, 1, 1]  # first_k_dense_replace = 1
    assert args.moe_router_enable_expert_bias is True and args.moe_router_score_function == "sigmoid"
    assert (args.q_lora_rank, args.kv_lora_rank) == (src["q_lora_rank"], src["kv_lora_rank"])
    assert (args.qk_head_dim, args.qk_pos_emb_head_dim, args.v_head_dim) == (16, 8, 16)
    assert args.moe_shared_expert_intermediate_size == src["n_shared_experts"] * src["moe_intermediate_size"]
    assert args.mtp_num_layers == 1 and args.transformer_impl == "local"


def test_mtp_layer_loads_strictly_into_megatron_core(dist_dir, hf_dir):
    """Built with its MTP block, the real model's sharded_state_dict asks for exactly the stored keys (weights
    and the linears' extra states, shapes equal), loads with nothing missing or unexpected, and the MTP
    modules hold the HF tensors."""
    with megatron_on_cpu():
        model = gpt_model(_args(dist_dir), mtp=True)
        load_strictly(model, dist_dir / "iter_0000000")
    hf = load_file(hf_dir / "model.safetensors")
    state = model.state_dict()
    for mc, name in (("enorm.weight", "enorm.weight"), ("hnorm.weight", "hnorm.weight"),
                     ("eh_proj.weight", "eh_proj.weight"), ("final_layernorm.weight", "shared_head.norm.weight"),
                     ("transformer_layer.mlp.router.expert_bias", "mlp.gate.e_score_correction_bias"),
                     ("transformer_layer.self_attention.kv_layernorm.weight", "self_attn.kv_a_layernorm.weight"),
                     ("transformer_layer.mlp.shared_experts.linear_fc2.weight", "mlp.shared_experts.down_proj.weight")):
        assert torch.equal(state[f"mtp.layers.0.{mc}"], hf[MTP + name]), mc


# --- each pitfall, seen by the oracles --------------------------------------------------------------------


def _perturbed_logits(model, name, value):
    """megatron-core logits with one loaded parameter or buffer replaced."""
    return perturbed_logits(model, name, value, _mcore_logits)


def test_router_bias_is_the_score_correction_bias_and_matters(mcore_model, hf_dir, hf_logits):
    hf = load_file(hf_dir / "model.safetensors")
    for i in (1, 2):
        got = mcore_model.decoder.layers[i].mlp.router.expert_bias
        assert torch.equal(got, hf[f"model.layers.{i}.mlp.gate.e_score_correction_bias"])
    dropped = _perturbed_logits(mcore_model, "decoder.layers.1.mlp.router.expert_bias", torch.zeros_like)
    assert (dropped - hf_logits).abs().max().item() > 1e-3  # the logits test would see a dropped bias


def test_latent_norms_are_not_swapped(mcore_model, hf_dir, hf_logits):
    hf = load_file(hf_dir / "model.safetensors")
    attention = mcore_model.decoder.layers[1].self_attention
    assert torch.equal(attention.kv_layernorm.weight, hf["model.layers.1.self_attn.kv_a_layernorm.weight"])
    if "model.layers.1.self_attn.q_a_layernorm.weight" in hf:
        assert torch.equal(attention.q_layernorm.weight, hf["model.layers.1.self_attn.q_a_layernorm.weight"])
    flipped = _perturbed_logits(mcore_model, "decoder.layers.1.self_attention.kv_layernorm.weight",
                                lambda w: w.flip(0))
    assert (flipped - hf_logits).abs().max().item() > 1e-3


def test_shared_experts_are_kept_and_matter(mcore_model, hf_dir, hf_logits):
    hf = load_file(hf_dir / "model.safetensors")
    shared = mcore_model.decoder.layers[2].mlp.shared_experts
    gate, up = hf["model.layers.2.mlp.shared_experts.gate_proj.weight"], hf["model.layers.2.mlp.shared_experts.up_proj.weight"]
    assert torch.equal(shared.linear_fc1.weight, torch.cat([gate, up]))
    dropped = _perturbed_logits(mcore_model, "decoder.layers.2.mlp.shared_experts.linear_fc2.weight",
                                torch.zeros_like)
    assert (dropped - hf_logits).abs().max().item() > 1e-3


def test_first_layer_is_dense_in_megatron_core(mcore_model, hf_dir):
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.moe.moe_layer import MoELayer

    layers = mcore_model.decoder.layers
    assert type(layers[0].mlp) is MLP and all(isinstance(layer.mlp, MoELayer) for layer in layers[1:])
    hf = load_file(hf_dir / "model.safetensors")
    assert torch.equal(layers[0].mlp.linear_fc1.weight,
                       torch.cat([hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]]))
    assert torch.equal(layers[0].pre_mlp_layernorm.weight, hf["model.layers.0.post_attention_layernorm.weight"])


def test_writer_refuses_a_layer_pattern_the_tensors_contradict(hf_dir, tmp_path):
    """Every layer MoE in the args (first_k_dense_replace lost) while layer 0 holds a dense MLP: refused."""
    from ckptscope.formats.megatron.dist_writer import write_torch_dist

    plan = plan_convert(hf_dir, tmp_path / "unused", to="mcore")
    args = dict(plan.megatron_args, moe_layer_freq=[1, 1, 1])
    tensors = [_Meta(t.name, t.shape, t.dtype) for t in plan.tensors]
    with pytest.raises(Exception, match="moe_layer_freq"):
        write_torch_dist(tmp_path / "out", tensors, args=args, iteration=0)
    assert not (tmp_path / "out" / ".metadata").exists()


class _Meta:
    """An OutTensor whose values are never needed (the writer refuses before producing anything)."""

    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype, self.runs = name, shape, dtype, None

    def produce(self):  # pragma: no cover - must not be reached
        raise AssertionError("produced before the tensor list was checked")


TE_NAMES = {"self_attention.q_layernorm.weight": "self_attention.linear_q_up_proj.layer_norm_weight",
            "self_attention.kv_layernorm.weight": "self_attention.linear_kv_up_proj.layer_norm_weight"}
"""The TE spec fuses MLA's latent norms into the up projections (gpt_layer_specs.py, MLA branch; Megatron-Bridge
deepseek/common.py lists both spellings) and a dense layer's pre-MLP norm into fc1; MoE layers keep theirs."""


def test_te_spec_keys_are_the_real_models_keys_in_te_spelling(hf_dir, tmp_path):
    """No TransformerEngine here, so the TE-spec torch_dist output is judged by the real (local-spec) model's
    sharded_state_dict keys with the TE spec's fusions applied: dense layer 0's norm in fc1, the MoE layers'
    norm on its own, the latent norms in the up projections; shapes equal."""
    from torch.distributed.checkpoint import FileSystemReader

    out = _convert(hf_dir, tmp_path / "te", to="mcore", spec="te")
    stored = FileSystemReader(str(out / "iter_0000000")).read_metadata().state_dict_metadata
    args = _args(out)
    assert args.transformer_impl == "transformer_engine"
    expected = {}
    with megatron_on_cpu():
        for key, value in gpt_model(args, mtp=True).state_dict().items():
            if "_extra_state" in key:
                continue
            for local, te in TE_NAMES.items():
                key = key.replace(local, te)
            if key.startswith("decoder.layers.") and args.moe_layer_freq[int(key.split(".")[2])] == 0:
                key = key.replace("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight")
            if ".local_experts." in key:  # torch_dist stacks a layer's experts under one key
                head, _, rest = key.partition(".local_experts.")
                key, value = f"{head}.experts.{rest.partition('.')[2]}", None
            expected[key] = None if value is None else tuple(value.shape)
    assert set(expected) == {k for k in stored if "_extra_state" not in k}
    for key, shape in expected.items():
        assert shape is None or tuple(stored[key].size) == shape, key


def test_legacy_tp2_splits_mla_as_megatron_core_does(hf_dir, tmp_path):
    """Per-rank files against the HF tensors: up projections and ``eh_proj`` column-parallel, ``linear_proj``
    row-parallel, and with the local spec (ColumnParallelLinear) the down projections column-parallel too."""
    mcore = _convert(hf_dir, tmp_path / "mcore", to="mcore", ckpt_format="torch", tp=2)
    hf = load_file(hf_dir / "model.safetensors")
    for rank in (0, 1):
        model = torch.load(mcore / "iter_0000000" / f"mp_rank_0{rank}" / "model_optim_rng.pt", map_location="cpu",
                           weights_only=False)["model"]

        def rows(t):
            return t.chunk(2, dim=0)[rank]

        assert torch.equal(model["decoder.layers.1.self_attention.linear_kv_up_proj.weight"],
                           rows(hf["model.layers.1.self_attn.kv_b_proj.weight"]))
        assert torch.equal(model["decoder.layers.1.self_attention.linear_kv_down_proj.weight"],
                           rows(hf["model.layers.1.self_attn.kv_a_proj_with_mqa.weight"]))
        assert torch.equal(model["decoder.layers.1.self_attention.linear_proj.weight"],
                           hf["model.layers.1.self_attn.o_proj.weight"].chunk(2, dim=1)[rank])
        assert torch.equal(model["mtp.layers.0.eh_proj.weight"], rows(hf[MTP + "eh_proj.weight"]))


@pytest.mark.parametrize("change,message", [({"rope_interleave": False}, "rope_interleave"),
                                            ({"norm_topk_prob": False}, "norm_topk_prob"),
                                            ({"n_group": 4, "topk_group": 2}, "top 2 experts")])
def test_routing_and_rope_megatron_cannot_express_are_refused(hf_dir, tmp_path, change, message):
    """Settings where megatron-core's MLA or router would compute something else than transformers."""
    assert_hf_config_refused(hf_dir, tmp_path, change, message)


@pytest.mark.parametrize("value", [[], "abc", {"a": 1}, True])
def test_routing_args_that_are_no_number_are_one_line(dist_dir, tmp_path, value):
    """A probe set a DeepSeek save's args.moe_router_group_topk to []: the comparison with the HF config
    said "internal error: TypeError" (and True passed as 1); now one line naming the arg, exit 2, nothing written."""
    src = tmp_path / "src"
    shutil.copytree(dist_dir, src)
    common = src / "iter_0000000" / "common.pt"
    state = torch.load(common, map_location="cpu", weights_only=False)
    state["args"].moe_router_group_topk = value
    torch.save(state, common)
    result = run_cli("convert", str(src), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and f"moe_router_group_topk is {value!r}, not a number" in result.err, result.err
    assert "internal error" not in result.err and not (tmp_path / "out").exists()


def test_legacy_tp2_rank_files_equal_megatron_core_per_rank(hf_dir, tmp_path):
    """megatron-core on 2 gloo ranks loads the torch_dist output into a TP=2 model with MTP (it reshards);
    what each rank then holds (``state_dict_for_save_checkpoint()``) is what the legacy TP=2 file of that
    rank must hold: the same names in the same order, the same values. This checks every MLA, MoE and
    MTP split (local spec: the down projections are column-parallel too) against megatron-core."""
    from tests.mla_reference import tp2_references

    if json.loads((hf_dir / "config.json").read_text())["q_lora_rank"] is None:
        pytest.skip("one variant is enough for the 2-rank reference (about 15 s)")
    dist = _convert(hf_dir, tmp_path / "dist", to="mcore", tp=2)  # vocabulary padded for TP=2
    legacy = _convert(hf_dir, tmp_path / "legacy", to="mcore", ckpt_format="torch", tp=2)
    padded = _args(dist).padded_vocab_size
    refs = tp2_references({"deepseek": dist / "iter_0000000"}, tmp_path / "refs", padded)
    for rank in ("mp_rank_00", "mp_rank_01"):
        mine = torch.load(legacy / "iter_0000000" / rank / "model_optim_rng.pt", weights_only=False)["model"]
        expected = torch.load(refs / "deepseek" / rank / "reference.pt", weights_only=False)["model"]
        assert list(mine) == list(expected), rank
        for name, value in expected.items():
            if value is None:
                assert mine[name] is None, (rank, name)
            else:
                assert torch.equal(mine[name], value), (rank, name)


def test_kimi_k2_config_maps_as_deepseek_v3_and_keeps_its_model_type(hf_dir, tmp_path):
    """Kimi-K2 ships DeepseekV3ForCausalLM weights under ``model_type: kimi_k2`` (remote code, which
    transformers cannot load here): the tensors map as DeepSeek-V3 and the model type comes back."""
    kimi = tmp_path / "kimi"
    shutil.copytree(hf_dir, kimi)
    config = json.loads((kimi / "config.json").read_text())
    config["model_type"] = "kimi_k2"
    (kimi / "config.json").write_text(json.dumps(config))
    mcore = _convert(kimi, tmp_path / "mcore", to="mcore")
    back = _convert(mcore, tmp_path / "back", to="hf")
    assert json.loads((back / "config.json").read_text())["model_type"] == "kimi_k2"
    src, got = load_file(kimi / "model.safetensors"), load_file(back / "model.safetensors")
    assert sorted(got) == sorted(src) and all(torch.equal(got[n], v) for n, v in src.items())


def test_transformers_v5_fused_experts_convert_like_per_expert_ones(hf_dir, hf_logits, tmp_path):
    """``save_pretrained(save_original_format=False)`` keeps transformers v5's fused expert tensors."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.save_pretrained(tmp_path / "fused", save_original_format=False)
    assert "model.layers.1.mlp.experts.gate_up_proj" in load_file(tmp_path / "fused" / "model.safetensors")
    mcore = _convert(tmp_path / "fused", tmp_path / "mcore", to="mcore")
    back = _convert(mcore, tmp_path / "hf", to="hf")
    assert torch.equal(_logits(back), hf_logits)
    src, got = load_file(hf_dir / "model.safetensors"), load_file(back / "model.safetensors")
    assert all(torch.equal(got[n], src[n]) for n in got if not n.startswith(MTP))
