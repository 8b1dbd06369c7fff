"""GPT-OSS (bf16 layout) between HF and Megatron-Core: attention sinks, biases on attention, router and
experts, the transposed fused expert tensors with gate/up interleaved, and the clamped SwiGLU.

The HF side is written by transformers itself (``AutoModelForCausalLM.from_config(GptOssConfig).
save_pretrained``), with every bias and sink randomised so a dropped one changes the logits. The Megatron
side is judged by megatron-core: a GPTModel built from megatron-core's own local layer spec with
GPT-OSS's settings (``softmax_type="learnable"``, ``add_bias_linear``, ``quick_gelu`` with
``glu_linear_offset=1`` and ``activation_func_clamp_value``, YaRN) loads our torch_dist output through
``dist_checkpointing.load`` (parameters NaN first) and its logits match transformers' within 1e-5.
That is what catches symmetric mistakes a round trip cannot (MAPPING.md P2): a test below converts with
the interleave replaced by ``[gate; up]`` and shows the round trip still passes while megatron-core
disagrees. The sliding window (4 tokens, shorter than the test sequence) reaches megatron-core through the
exported ``window_size`` / ``window_attn_skip_freq``; only its mask helper is replaced by a CPU copy.
"""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.conftest import run_cli  # noqa: E402
from tests.arch_roundtrip import assert_round_trip, convert, eager_logits, hf_tensors, mcore_load, rewrite_args  # noqa: E402

DIMS = dict(vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
            max_position_embeddings=256)
"""GQA (2 groups of 2 heads), 4 experts (top 2), one sliding (4 tokens) and one full layer; the default YaRN RoPE."""
TOKENS = torch.tensor([[5, 17, 99, 3, 42, 7, 12, 100, 9, 1, 77, 12], [2, 8, 19, 120, 127, 4, 60, 33, 5, 91, 6, 0]])
CARRIED = ("model_type", "swiglu_alpha", "swiglu_limit", "sliding_window", "layer_types", "rope_parameters",
           "attention_bias", "num_local_experts", "num_experts_per_tok", "intermediate_size", "head_dim",
           "num_key_value_heads", "tie_word_embeddings")
I = DIMS["intermediate_size"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.GptOssConfig(**DIMS))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "bias" in name or "sinks" in name:  # HF initialises some to 0: make a lost one visible
                param.normal_(0.0, 0.5)
            elif "experts" in name:
                param.normal_(0.0, 0.2)
    out = tmp_path_factory.mktemp("gpt_oss") / "hf"
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
    assert_round_trip(hf_dir, tmp_path, TOKENS, CARRIED, "GptOssForCausalLM", ckpt_format=fmt, tp=tp, ep=ep)


@pytest.mark.parametrize("fmt", ["torch_dist", "torch"])
def test_diff_across_naming_is_clean(hf_dir, dist_dir, tmp_path, fmt):
    mcore = dist_dir if fmt == "torch_dist" else convert(hf_dir, tmp_path / "leg", to="mcore", ckpt_format="torch",
                                                          tp=2, ep=2)
    result = run_cli("diff", str(hf_dir), str(mcore), "--plain")
    assert result.code == 0, result.out + result.err
    assert ": identical" in result.out and " 0 different" in result.out, result.out


def test_diff_reports_a_swapped_gate_and_up_column(hf_dir, dist_dir, tmp_path):
    """The pairing is real: gate and up of one intermediate unit swapped in HF is a difference."""
    from safetensors.torch import save_file

    broken = tmp_path / "broken"
    shutil.copytree(hf_dir, broken)
    state = hf_tensors(hf_dir)
    gate_up = state["model.layers.1.mlp.experts.gate_up_proj"].clone()
    gate_up[2, :, [6, 7]] = gate_up[2, :, [7, 6]]
    state["model.layers.1.mlp.experts.gate_up_proj"] = gate_up
    save_file(state, broken / "model.safetensors", metadata={"format": "pt"})
    result = run_cli("diff", str(broken), str(dist_dir), "--plain")
    assert result.code == 1 and "model.layers.1.mlp.experts.gate_up_proj" in result.out, result.out + result.err


# --- megatron-core ---------------------------------------------------------------------------------


def _mcore_model(args: dict):
    """A GPTModel from megatron-core's local spec with GPT-OSS's settings, read from the Megatron args our
    export wrote (so an arg it forgot or got wrong shows up here, in megatron-core's own computation)."""
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    assert args["quick_geglu"] and args["gated_linear_unit"] and not args["swiglu"]
    config = TransformerConfig(
        num_layers=args["num_layers"], hidden_size=args["hidden_size"], ffn_hidden_size=args["ffn_hidden_size"],
        num_attention_heads=args["num_attention_heads"], num_query_groups=args["num_query_groups"],
        kv_channels=args["kv_channels"], gated_linear_unit=True, activation_func=quick_gelu,
        glu_linear_offset=args["glu_linear_offset"], activation_func_clamp_value=args["activation_func_clamp_value"],
        bias_activation_fusion=False, add_bias_linear=args["add_bias_linear"], add_qkv_bias=args["add_qkv_bias"],
        softmax_type=args["softmax_type"], normalization="RMSNorm", layernorm_epsilon=args["norm_epsilon"],
        hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float32,
        num_moe_experts=args["num_experts"], moe_ffn_hidden_size=args["moe_ffn_hidden_size"],
        moe_router_topk=args["moe_router_topk"], moe_router_pre_softmax=args["moe_router_pre_softmax"],
        moe_router_score_function=args["moe_router_score_function"], moe_token_dispatcher_type="allgather",
        moe_aux_loss_coeff=0.0, moe_router_load_balancing_type=args["moe_router_load_balancing_type"],
        moe_grouped_gemm=False, use_cpu_initialization=True, perform_initialization=False)
    # GPTModel reads the YaRN settings with getattr (Megatron-Bridge's provider declares them as fields)
    for key in ("yarn_rotary_scaling_factor", "yarn_original_max_position_embeddings", "yarn_beta_fast",
                "yarn_beta_slow", "yarn_correction_range_round_to_int"):
        setattr(config, key, args[key])
    config.yarn_mscale = config.yarn_mscale_all_dim = None
    config.window_size = tuple(args["window_size"]) if args["window_size"] else None
    config.window_attn_skip_freq = args["window_attn_skip_freq"]
    spec = get_gpt_layer_local_spec(num_experts=args["num_experts"], moe_grouped_gemm=False, normalization="RMSNorm")
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args["padded_vocab_size"],
                    max_sequence_length=args["max_position_embeddings"],
                    share_embeddings_and_output_weights=not args["untie_embeddings_and_output_weights"],
                    position_embedding_type=args["position_embedding_type"], rotary_base=args["rotary_base"]).eval()


def _cpu_sliding_window_mask(sq, skv, window_size):
    """megatron.core.transformer.utils.get_sliding_window_causal_mask allocates on "cuda"; the same mask on CPU
    (True = masked: keys before ``i - window_size[0]`` or after ``i + window_size[1]``)."""
    keep = torch.ones(sq, skv, dtype=torch.bool)
    return ~torch.tril(torch.triu(keep, diagonal=skv - sq - window_size[0]), diagonal=skv - sq + window_size[1])


def _mcore_load(dist_dir):
    """(model state, sharded state dict, logits) of a fresh megatron-core GPT-OSS that loaded ``dist_dir``."""
    from unittest import mock

    with mock.patch("megatron.core.fusions.fused_softmax.get_sliding_window_causal_mask", _cpu_sliding_window_mask):
        return mcore_load(dist_dir, _mcore_model, TOKENS, DIMS["vocab_size"])


@pytest.fixture(scope="module")
def mcore_loaded(dist_dir):
    return _mcore_load(dist_dir)


def test_megatron_core_loads_it_and_computes_the_same_logits(mcore_loaded, hf_logits):
    state, _, logits = mcore_loaded
    assert torch.isfinite(logits).all()  # every parameter came from the checkpoint (NaN otherwise)
    assert (logits - hf_logits).abs().max().item() <= 1e-5


def test_torch_dist_keys_and_shapes_are_megatron_cores(dist_dir, mcore_loaded):
    """Every key the real model asks for is stored with its global shape, and nothing else is stored."""
    from torch.distributed.checkpoint import FileSystemReader

    _, wanted, _ = mcore_loaded
    stored = FileSystemReader(str(dist_dir / "iter_0000000")).read_metadata().state_dict_metadata
    keys = {sh.key for sh in wanted.values() if "_extra_state" not in sh.key}
    assert keys == {k for k in stored if "_extra_state" not in k and hasattr(stored[k], "size")}
    for sh in wanted.values():
        if "_extra_state" not in sh.key and hasattr(sh, "global_shape"):
            assert tuple(stored[sh.key].size) == tuple(sh.global_shape), sh.key


def test_megatron_core_holds_sinks_biases_and_deinterleaved_experts(hf_dir, mcore_loaded):
    """What megatron-core loaded, against the HF tensors as GptOssExperts uses them (``x @ W + b``, gate
    at even and up at odd columns): one assertion per pitfall, independent of ckptscope's reader."""
    state, _, _ = mcore_loaded
    hf = hf_tensors(hf_dir)
    for i in range(DIMS["num_hidden_layers"]):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        assert torch.equal(state[m + "self_attention.core_attention.softmax_offset"], hf[h + "self_attn.sinks"])
        assert torch.equal(state[m + "self_attention.linear_proj.bias"], hf[h + "self_attn.o_proj.bias"])
        assert torch.equal(state[m + "mlp.router.bias"], hf[h + "mlp.router.bias"])
        qkv_bias = state[m + "self_attention.linear_qkv.bias"]
        assert torch.equal(qkv_bias[:32], hf[h + "self_attn.q_proj.bias"][:32])  # group 0: its 2 query heads
        assert torch.equal(qkv_bias[32:48], hf[h + "self_attn.k_proj.bias"][:16])
        for e in range(DIMS["num_local_experts"]):
            x = f"{m}mlp.experts.local_experts.{e}."
            gate_up, bias = hf[h + "mlp.experts.gate_up_proj"][e], hf[h + "mlp.experts.gate_up_proj_bias"][e]
            assert torch.equal(state[x + "linear_fc1.weight"], torch.cat([gate_up[:, ::2].T, gate_up[:, 1::2].T]))
            assert torch.equal(state[x + "linear_fc1.bias"], torch.cat([bias[::2], bias[1::2]]))
            assert torch.equal(state[x + "linear_fc2.weight"], hf[h + "mlp.experts.down_proj"][e].T)
            assert torch.equal(state[x + "linear_fc2.bias"], hf[h + "mlp.experts.down_proj_bias"][e])


def _contiguous_halves(mapping):
    """The mistake to catch: GPT-OSS's fused gate/up read as ``[gate; up]`` halves instead of interleaved."""
    from ckptscope.mappings.links import Link

    def weight(cfg, mname, mshape, hf_names, hf_shapes):
        rows, cols = mshape
        return [Link(mname, ((r, r + 1), (0, cols)), hf_names[0], ((0, cols), (r, r + 1)), "wrong") for r in range(rows)]

    def bias(cfg, mname, mshape, hf_names, hf_shapes):
        return [Link(mname, ((0, mshape[0]),), hf_names[0], ((0, mshape[0]),), "wrong")]

    return {"gate_up_interleaved_t": weight, "gate_up_interleaved": bias}[mapping]


def test_a_symmetric_interleave_mistake_round_trips_but_megatron_core_catches_it(hf_dir, hf_logits, tmp_path,
                                                                                  monkeypatch):
    """Why the megatron-core check exists: with gate/up read as halves both ways, HF -> mcore -> HF is still
    bit-exact, but megatron-core computes another model."""
    import dataclasses

    from ckptscope.mappings import transforms

    for name in ("gate_up_interleaved_t", "gate_up_interleaved"):
        monkeypatch.setitem(transforms.TRANSFORMS, name,
                            dataclasses.replace(transforms.TRANSFORMS[name], links=_contiguous_halves(name)))
    mcore = convert(hf_dir, tmp_path / "mcore", to="mcore")
    assert torch.equal(eager_logits(convert(mcore, tmp_path / "hf", to="hf"), TOKENS), hf_logits)
    _, _, logits = _mcore_load(mcore)
    assert (logits - hf_logits).abs().max().item() > 1e-3


def test_tp2_ep2_files_split_experts_sinks_and_biases_as_megatron_does(hf_dir, tmp_path):
    """Per-rank files against the HF tensors: expert e lives on EP rank e // 2 as local expert e % 2, its
    fc1 rows and bias split as [gate_t; up_t] over TP (the de-interleaved halves), fc2 by columns with a
    whole bias; the sinks split by heads like the attention."""
    mcore = convert(hf_dir, tmp_path / "mcore", to="mcore", ckpt_format="torch", tp=2, ep=2)
    hf = hf_tensors(hf_dir)
    half = I // 2
    for tp_rank in (0, 1):
        rows = slice(tp_rank * half, (tp_rank + 1) * half)
        for ep_rank in (0, 1):
            path = mcore / "iter_0000000" / f"mp_rank_0{tp_rank}_00{ep_rank}" / "model_optim_rng.pt"
            model = torch.load(path, map_location="cpu", weights_only=False)["model"]
            assert torch.equal(model["decoder.layers.1.self_attention.core_attention.softmax_offset"],
                               hf["model.layers.1.self_attn.sinks"][tp_rank * 2:(tp_rank + 1) * 2])
            for local in (0, 1):
                e = ep_rank * 2 + local
                gate_up = hf["model.layers.1.mlp.experts.gate_up_proj"][e]
                bias = hf["model.layers.1.mlp.experts.gate_up_proj_bias"][e]
                x = f"decoder.layers.1.mlp.experts.local_experts.{local}."
                assert torch.equal(model[x + "linear_fc1.weight"],
                                   torch.cat([gate_up[:, ::2].T[rows], gate_up[:, 1::2].T[rows]]))
                assert torch.equal(model[x + "linear_fc1.bias"], torch.cat([bias[::2][rows], bias[1::2][rows]]))
                assert torch.equal(model[x + "linear_fc2.weight"], hf["model.layers.1.mlp.experts.down_proj"][e].T[:, rows])
                assert torch.equal(model[x + "linear_fc2.bias"], hf["model.layers.1.mlp.experts.down_proj_bias"][e])


# --- refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize("changes,word", [(dict(glu_linear_offset=0.0), "glu_linear_offset"),
                                          (dict(activation_func_clamp_value=None), "activation_func_clamp_value"),
                                          (dict(softmax_type="vanilla"), "softmax_type"),
                                          (dict(quick_geglu=None), "quick_geglu")],
                         ids=["no-up-offset", "no-clamp", "no-sinks", "silu-gate"])
def test_export_refuses_megatron_args_that_compute_something_else(dist_dir, tmp_path, changes, word):
    edited = rewrite_args(dist_dir, tmp_path, **changes)
    for to in ("hf", "mcore"):
        result = run_cli("convert", str(edited), str(tmp_path / f"out_{to}"), "--to", to)
        assert result.code == 2 and word in result.err and "Traceback" not in result.err, result.err
        assert not (tmp_path / f"out_{to}").exists()


def test_import_refuses_an_alpha_megatron_cannot_compute(hf_dir, tmp_path):
    edited = tmp_path / "hf"
    shutil.copytree(hf_dir, edited)
    config = json.loads((edited / "config.json").read_text())
    config["swiglu_alpha"] = 1.5
    (edited / "config.json").write_text(json.dumps(config))
    result = run_cli("convert", str(edited), str(tmp_path / "out"), "--to", "mcore")
    assert result.code == 2 and "swiglu_alpha" in result.err, result.err
    assert not (tmp_path / "out").exists()


def test_archs_lists_gpt_oss():
    result = run_cli("archs", "gpt_oss")
    assert result.code == 0, result.err
    assert "softmax_offset" in result.out and "gate_up_interleaved" in result.out
