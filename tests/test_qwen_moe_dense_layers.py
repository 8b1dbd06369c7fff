"""Qwen2-MoE / Qwen3-MoE with dense layers among the MoE ones (HF ``mlp_only_layers``, ``decoder_sparse_step``;
Megatron ``moe_layer_freq``), between HF and Megatron-Core.

transformers builds those layers with a dense MLP of ``intermediate_size`` (no router); megatron-core builds a
dense MLP of ``ffn_hidden_size`` for a 0 in ``moe_layer_freq``. Before, convert refused such models ("dense
MLP layers among the MoE layers ... are not supported yet").

The fixtures are written by transformers itself (random weights, routers far from uniform); the Megatron side
is judged by megatron-core 0.16.1 on CPU: a ``GPTModel`` from the export's own args and megatron-core's
``get_gpt_decoder_block_spec`` (local implementations, which build a dense or an MoE layer per
``moe_layer_freq``) loads the torch_dist output strictly through ``dist_checkpointing.load``, and its logits
are compared with transformers'. The way back is judged by transformers' logits, bitwise.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

from tests.arch_roundtrip import convert, megatron_args, mcore_load, rewrite_args  # noqa: E402
from tests.conftest import load_sample_module, run_cli  # noqa: E402
from tests.mcore_reference import hf_logits, tokens_for  # noqa: E402

CASES = {
    # kind, what makes layer 1 of 3 dense, the Megatron pattern
    "qwen3_moe_mlp_only": ("qwen3_moe", {"mlp_only_layers": [1]}, [1, 0, 1]),
    "qwen2_moe_sparse_step": ("qwen2_moe", {"decoder_sparse_step": 2}, [0, 1, 0]),
}


def _write_hf(kind: str, change: dict, out):
    moe = load_sample_module("make_moe_samples")
    cls_name, kwargs = moe.HF_MOE[kind]
    cls = getattr(transformers, cls_name)
    torch.manual_seed(0)
    model = cls(cls.config_class(**{**kwargs, "num_hidden_layers": 3, **change})).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.3)
            else:
                param.normal_(0, 1.0 if name.endswith("gate.weight") else 0.1)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    kind, change, pattern = CASES[request.param]
    hf = _write_hf(kind, change, tmp_path_factory.mktemp(request.param) / "hf")
    return kind, hf, convert(hf, hf.parent / "dist", to="mcore"), pattern


def _mcore_model(args: dict):
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=args["num_layers"], hidden_size=args["hidden_size"], ffn_hidden_size=args["ffn_hidden_size"],
        num_attention_heads=args["num_attention_heads"], num_query_groups=args["num_query_groups"],
        kv_channels=args["kv_channels"], gated_linear_unit=args["swiglu"], activation_func=F.silu,
        add_bias_linear=args["add_bias_linear"], add_qkv_bias=args["add_qkv_bias"],
        qk_layernorm=args["qk_layernorm"], normalization=args["normalization"], layernorm_epsilon=args["norm_epsilon"],
        hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float32, num_moe_experts=args["num_experts"],
        moe_layer_freq=args["moe_layer_freq"], moe_ffn_hidden_size=args["moe_ffn_hidden_size"],
        moe_shared_expert_intermediate_size=args.get("moe_shared_expert_intermediate_size"),
        moe_shared_expert_gate=args.get("moe_shared_expert_gate", False), moe_router_topk=args["moe_router_topk"],
        moe_router_pre_softmax=args["moe_router_pre_softmax"], moe_token_dispatcher_type="allgather",
        moe_aux_loss_coeff=0.0, moe_grouped_gemm=False, bias_activation_fusion=False, use_cpu_initialization=True,
        perform_initialization=False)
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=args["normalization"])
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args["padded_vocab_size"],
                    max_sequence_length=args["max_position_embeddings"],
                    share_embeddings_and_output_weights=not args["untie_embeddings_and_output_weights"],
                    position_embedding_type="rope", rotary_base=args["rotary_base"]).eval()


def test_megatron_core_builds_the_dense_layer_and_gives_transformers_logits(case):
    kind, hf, dist, pattern = case
    args = megatron_args(dist)
    assert args["moe_layer_freq"] == pattern
    vocab = json.loads((hf / "config.json").read_text())["vocab_size"]
    tokens = tokens_for(vocab)
    holder = {}

    def build(a):
        holder["model"] = _mcore_model(a)
        return holder["model"]

    _, _, logits = mcore_load(dist, build, tokens, vocab)
    layers = holder["model"].decoder.layers
    assert [type(layer.mlp).__name__ == "MoELayer" for layer in layers] == [bool(p) for p in pattern]
    assert torch.isfinite(logits).all()  # every parameter came from the checkpoint (NaN first)
    assert (logits - hf_logits(hf, tokens)).abs().max().item() <= 1e-4


def test_the_way_back_is_the_same_model(case, tmp_path):
    kind, hf, dist, pattern = case
    back = convert(dist, tmp_path / "back", to="hf")  # from the Megatron args alone
    tokens = tokens_for(json.loads((hf / "config.json").read_text())["vocab_size"])
    assert torch.equal(hf_logits(back, tokens), hf_logits(hf, tokens))
    got = json.loads((back / "config.json").read_text())
    assert got["mlp_only_layers"] == [i for i, moe in enumerate(pattern) if not moe]
    model, info = transformers.AutoModelForCausalLM.from_pretrained(back, output_loading_info=True)
    assert not any(info.values()), info
    result = run_cli("diff", "--plain", str(hf), str(dist))  # HF names against Megatron's, through the mapping
    assert result.code == 0, result.out + result.err


def test_an_hf_config_with_other_dense_layers_is_refused(case, tmp_path):
    """--hf-config whose dense layers are not the ones the Megatron args say would export another model."""
    kind, hf, dist, pattern = case
    config = json.loads((hf / "config.json").read_text())
    config.update(mlp_only_layers=[0], decoder_sparse_step=1)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(config))
    result = run_cli("convert", str(dist), str(tmp_path / "out"), "--to", "hf", "--hf-config", str(tmp_path / "cfg"))
    assert result.code == 2 and "moe_layer_freq" in result.err and not (tmp_path / "out").exists(), result.err


def test_megatron_moe_layer_freq_as_an_int_reads_as_its_pattern(case, tmp_path):
    """Megatron-LM's ``--moe-layer-freq 2``: every second layer from layer 0 is MoE (TransformerConfig's rule)."""
    kind, hf, dist, pattern = case
    if pattern != [1, 0, 1]:
        pytest.skip("the int spells 1,0,1 only")
    edited = rewrite_args(dist, tmp_path, moe_layer_freq=2)
    back = convert(edited, tmp_path / "back", to="hf")
    assert json.loads((back / "config.json").read_text())["mlp_only_layers"] == [1]


def test_per_rank_torch_format_over_tp2_and_ep2_round_trips(case, tmp_path):
    """Megatron-LM's ``--ckpt-format torch``: every rank file keys its layers the same way, dense or MoE."""
    kind, hf, dist, pattern = case
    mcore = convert(hf, tmp_path / "mcore", to="mcore", ckpt_format="torch", tp=2, ep=2)
    back = convert(mcore, tmp_path / "back", to="hf")
    tokens = tokens_for(json.loads((hf / "config.json").read_text())["vocab_size"])
    assert torch.equal(hf_logits(back, tokens), hf_logits(hf, tokens))


@pytest.mark.parametrize("key, value", [("decoder_sparse_step", "x"), ("mlp_only_layers", "1"),
                                        ("mlp_only_layers", [1.5])])
def test_a_malformed_dense_layer_key_is_one_line(case, tmp_path, key, value):
    """transformers fails on these too; ckptscope said "internal error: ValueError"."""
    kind, hf, dist, pattern = case
    bad = tmp_path / "bad"
    bad.mkdir()
    for file in hf.iterdir():
        (bad / file.name).write_bytes(file.read_bytes())
    config = json.loads((hf / "config.json").read_text())
    config[key] = value
    (bad / "config.json").write_text(json.dumps(config))
    result = run_cli("convert", str(bad), str(tmp_path / "out"), "--to", "mcore")
    assert result.code == 2 and f"config.json: {key} is" in result.err and "internal error" not in result.err
    assert len(result.err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_moe_layer_freq_of_another_length_is_refused(case, tmp_path):
    kind, hf, dist, pattern = case
    edited = rewrite_args(dist, tmp_path, moe_layer_freq=pattern + [1])
    result = run_cli("convert", str(edited), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and "moe_layer_freq has 4 entries for 3 layers" in result.err, result.err
