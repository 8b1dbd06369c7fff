"""RoPE scaling (YaRN, llama3) through HF <-> Megatron-Core conversion: kept, translated to the args
megatron-core reads, or refused; never dropped.

Fixtures are written by transformers' own config and model classes (DeepSeek-V3 with its release-style
``rope_scaling: {type: yarn, ...}``, GPT-OSS with YaRN and ``truncate: false``, Llama 3 with ``llama3``
scaling, Qwen3 with YaRN). YaRN's ``original_max_position_embeddings`` is 16 and every forward runs 40
tokens, so the scaling decides the logits (``test_*_without_scaling_*`` show it does). The Megatron side is
judged by megatron-core 0.16.1 on CPU: a ``GPTModel`` built from the args our export wrote loads the
torch_dist output through ``dist_checkpointing.load`` and must give transformers' logits, and its rotary
module must hold the frequencies transformers computes.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

from ckptscope.core.errors import CkptError  # noqa: E402
from ckptscope.mappings import rope as rope_map  # noqa: E402
from ckptscope.mappings.bridge_config import from_run_config  # noqa: E402
from ckptscope.mappings.config import from_megatron_args  # noqa: E402
from tests.arch_roundtrip import convert, eager_logits, megatron_args, mcore_load, rewrite_args  # noqa: E402
from tests.conftest import run_cli  # noqa: E402

SEQ = 40
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32.0,
        "beta_slow": 1.0}
SMALL = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=64)
CASES = {
    "deepseek_v3": ("DeepseekV3Config", dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1,
        topk_group=1, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=24,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=64,
        num_nextn_predict_layers=0), {**YARN, "mscale": 1.0, "mscale_all_dim": 1.0}),
    "gpt_oss": ("GptOssConfig", dict(SMALL, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                                     sliding_window=4), {**YARN, "truncate": False}),
    "llama": ("LlamaConfig", dict(SMALL, intermediate_size=96, max_position_embeddings=16384),
              {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}),
    "qwen3": ("Qwen3Config", dict(SMALL, intermediate_size=96), dict(YARN)),
    "llama_linear": ("LlamaConfig", dict(SMALL, intermediate_size=96), {"rope_type": "linear", "factor": 2.0}),
}
"""Per arch: the transformers config class, its dims and the RoPE scaling under test. Llama's llama3 values
are the ones megatron-core has built in (anything else is refused, see below)."""


def _write(name: str, out: Path) -> Path:
    cls, dims, scaling = CASES[name]
    torch.manual_seed(0)
    config = getattr(transformers, cls)(**dims, rope_scaling=dict(scaling), rope_theta=10000.0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if "bias" in pname or "sinks" in pname:
                param.normal_(0.0, 0.5)
            elif "norm" in pname:
                param.normal_(1.0, 0.3)
            elif "experts" in pname:
                param.normal_(0.0, 0.2)
            elif name.startswith("llama") and ("q_proj" in pname or "k_proj" in pname):
                param.normal_(0.0, 0.5)  # llama3 slows only the slowest pairs: sharp attention makes that show
    model.save_pretrained(out)
    if name == "deepseek_v3":  # DeepSeek-V3 / Kimi-K2 release spelling: rope_theta + rope_scaling {type: yarn}
        path = out / "config.json"
        written = json.loads(path.read_text())
        written.pop("rope_parameters")
        written.update(rope_theta=10000.0, rope_scaling={"type": "yarn", **{k: v for k, v in scaling.items()
                                                                            if k != "rope_type"}})
        path.write_text(json.dumps(written, indent=2))
    return out


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 128, (2, SEQ), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory, tokens):
    """(name, HF dir, torch_dist dir, transformers logits at SEQ tokens)."""
    root = tmp_path_factory.mktemp(request.param)
    hf = _write(request.param, root / "hf")
    dist = convert(hf, root / "mcore", to="mcore")
    return request.param, hf, dist, eager_logits(hf, tokens)


def _rope_entry(hf_dir: Path) -> tuple[str, dict]:
    return rope_map.hf_rope(json.loads((Path(hf_dir) / "config.json").read_text()))


# --- HF -> Megatron-Core -> HF ------------------------------------------------------------------------------


def test_round_trip_keeps_the_rope_dict_and_bitwise_logits(case, tokens, tmp_path):
    name, hf, dist, hf_logits = case
    back = convert(dist, tmp_path / "hf", to="hf")
    assert _rope_entry(back) == _rope_entry(hf)
    assert torch.equal(eager_logits(back, tokens), hf_logits)


def test_megatron_args_say_the_scaling_as_megatron_core_reads_it(case):
    name, _, dist, _ = case
    args = megatron_args(dist)
    scaling = CASES[name][2]
    if name == "deepseek_v3":
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        config = MLATransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, multi_latent_attention=True,
                                      rope_type=args["rope_type"], rotary_scaling_factor=args["rotary_scaling_factor"],
                                      original_max_position_embeddings=args["original_max_position_embeddings"],
                                      beta_fast=args["beta_fast"], beta_slow=args["beta_slow"], mscale=args["mscale"],
                                      mscale_all_dim=args["mscale_all_dim"])
        assert (config.rope_type, config.rotary_scaling_factor, config.original_max_position_embeddings) == \
            ("yarn", scaling["factor"], scaling["original_max_position_embeddings"])
        assert (config.mscale, config.mscale_all_dim, config.beta_fast, config.beta_slow) == (1.0, 1.0, 32.0, 1.0)
        assert args["position_embedding_type"] == "rope"  # MLA builds its own rotary module from rope_type
    elif name == "llama":
        assert args["use_rope_scaling"] is True and args["rope_scaling_factor"] == 8.0
        assert args["position_embedding_type"] == "rope"
    elif name == "llama_linear":  # Megatron-LM's --rotary-seq-len-interpolation-factor
        assert args["rotary_seq_len_interpolation_factor"] == 2.0 and args["position_embedding_type"] == "rope"
    else:
        assert args["position_embedding_type"] == "yarn"
        assert (args["yarn_rotary_scaling_factor"], args["yarn_original_max_position_embeddings"],
                args["yarn_beta_fast"], args["yarn_beta_slow"]) == (4.0, 16, 32.0, 1.0)
        assert args["yarn_correction_range_round_to_int"] is scaling.get("truncate", True)
        assert args["yarn_mscale"] is None and args["yarn_mscale_all_dim"] is None  # HF: get_mscale(factor)
        assert args["rotary_scaling_factor"] == 4.0  # Megatron-LM's CLI spelling of the factor


# --- megatron-core ------------------------------------------------------------------------------------------


def _gpt_model(args: dict):
    """megatron-core's GPTModel (local spec) for a dense Llama / Qwen3 checkpoint's own args, with the RoPE
    settings as Megatron-LM hands them over: ``rope_scaling`` / ``rope_scaling_factor`` to ``GPTModel``, the
    ``yarn_*`` values onto the config (megatron.training's ``_apply_yarn_config_from_args``)."""
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=args["num_layers"], hidden_size=args["hidden_size"], ffn_hidden_size=args["ffn_hidden_size"],
        num_attention_heads=args["num_attention_heads"], num_query_groups=args["num_query_groups"],
        kv_channels=args["kv_channels"], gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        add_qkv_bias=args["add_qkv_bias"], qk_layernorm=args["qk_layernorm"], normalization="RMSNorm",
        layernorm_epsilon=args["norm_epsilon"], hidden_dropout=0.0, attention_dropout=0.0,
        params_dtype=torch.float32, use_cpu_initialization=True, perform_initialization=False)
    for key in ("yarn_rotary_scaling_factor", "yarn_original_max_position_embeddings", "yarn_beta_fast",
                "yarn_beta_slow", "yarn_mscale", "yarn_mscale_all_dim", "yarn_correction_range_round_to_int"):
        if key in args:
            setattr(config, key, args[key])
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=args["qk_layernorm"])
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args["padded_vocab_size"],
                    max_sequence_length=args["max_position_embeddings"],
                    share_embeddings_and_output_weights=not args["untie_embeddings_and_output_weights"],
                    position_embedding_type=args["position_embedding_type"], rotary_base=args["rotary_base"],
                    rope_scaling=bool(args.get("use_rope_scaling")),
                    rope_scaling_factor=args.get("rope_scaling_factor", 8.0),
                    seq_len_interpolation_factor=args.get("rotary_seq_len_interpolation_factor")).eval()


def _mla_model(args: dict):
    from tests.mla_reference import _shim, _unshim, gpt_model

    saved = _shim()
    try:
        return gpt_model(argparse.Namespace(**args), mtp=False)
    finally:
        _unshim(saved)


def _megatron_logits(name: str, dist: Path, tokens):
    """(model state, logits) of megatron-core's model for ``name`` loaded from ``dist``."""
    if name == "gpt_oss":
        from unittest import mock

        from tests.test_gpt_oss import _cpu_sliding_window_mask, _mcore_model

        with mock.patch("megatron.core.fusions.fused_softmax.get_sliding_window_causal_mask",
                        _cpu_sliding_window_mask):
            state, _, logits = mcore_load(dist, _mcore_model, tokens, 128)
        return state, logits
    if name == "deepseek_v3":
        from tests.mla_reference import megatron_on_cpu

        with megatron_on_cpu():
            state, _, logits = mcore_load(dist, _mla_model, tokens, 128)
        return state, logits
    state, _, logits = mcore_load(dist, _gpt_model, tokens, 128)
    return state, logits


def test_megatron_core_computes_transformers_logits_beyond_the_original_context(case, tokens):
    name, _, dist, hf_logits = case
    _, logits = _megatron_logits(name, dist, tokens)
    assert torch.isfinite(logits).all()
    assert (logits - hf_logits).abs().max().item() <= 1e-5


def test_megatron_core_without_the_scaling_computes_another_model(case, tokens, tmp_path):
    """The pitfall: the same tensors with the scaling dropped from the args (what an exporter that ignores
    rope_scaling writes) give other logits at 40 tokens, and ckptscope refuses to export such a checkpoint
    back to HF while its carried HF config still says the scaling."""
    name, _, dist, hf_logits = case
    plain = {"deepseek_v3": dict(rope_type="rope"), "llama": dict(use_rope_scaling=False),
             "gpt_oss": dict(position_embedding_type="rope"), "qwen3": dict(position_embedding_type="rope"),
             "llama_linear": dict(rotary_seq_len_interpolation_factor=None)}[name]
    if name == "gpt_oss":  # its test model reads the YaRN fields unconditionally: scale by 1 instead
        plain = dict(yarn_rotary_scaling_factor=1.0, rotary_scaling_factor=1.0)
    dropped = rewrite_args(dist, tmp_path, **plain)
    _, logits = _megatron_logits(name, dropped, tokens)
    assert (logits - hf_logits).abs().max().item() > 1e-3
    result = run_cli("convert", str(dropped), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and "RoPE" in result.err and "Traceback" not in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert not (tmp_path / "out").exists()


def test_transformers_without_the_scaling_computes_another_model(case, tokens, tmp_path):
    name, hf, _, hf_logits = case
    edited = tmp_path / "plain"
    shutil.copytree(hf, edited)
    config = json.loads((edited / "config.json").read_text())
    key, _ = _rope_entry(hf)
    config[key] = {"rope_type": "default", "rope_theta": 10000.0}
    (edited / "config.json").write_text(json.dumps(config))
    assert (eager_logits(edited, tokens) - hf_logits).abs().max().item() > 1e-3


# --- a Megatron save with no HF config (Megatron-LM, Megatron-Bridge) ----------------------------------------


@pytest.mark.parametrize("name", ["llama", "qwen3", "llama_linear"])
def test_export_without_hf_config_extra_rebuilds_the_scaling_from_the_args(name, tmp_path, tokens):
    """A Megatron-LM run that never saw HF: no ``hf_config_extra``. config.json's rope_scaling comes from
    the args alone and transformers then computes the original model bit for bit."""
    hf = _write(name, tmp_path / "hf")
    dist = convert(hf, tmp_path / "mcore", to="mcore")
    bare = rewrite_args(dist, tmp_path, hf_config_extra=None)
    back = convert(bare, tmp_path / "back", to="hf", arch=name.split("_")[0])
    written = json.loads((back / "config.json").read_text())
    want = {**CASES[name][2], **({"truncate": True} if name == "qwen3" else {})}
    assert written["rope_scaling"] == want
    assert torch.equal(eager_logits(back, tokens), eager_logits(hf, tokens))


def test_bridge_and_megatron_lm_spellings_are_read():
    bridge_llama = {"model": {"num_layers": 2, "hidden_size": 64, "position_embedding_type": "rope",
                              "rope_scaling": True, "rope_scaling_factor": 32.0}}
    assert from_run_config(bridge_llama).megatron_rope == {"rope_type": "llama3", "factor": 32.0,
                                                           **rope_map.LLAMA3_FIXED}
    bridge_gpt_oss = {"model": {"num_layers": 2, "hidden_size": 64, "position_embedding_type": "yarn",
                                "yarn_rotary_scaling_factor": 32.0, "yarn_original_max_position_embeddings": 4096,
                                "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_mscale": None,
                                "yarn_correction_range_round_to_int": False}}
    assert from_run_config(bridge_gpt_oss).megatron_rope == {
        "rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
        "beta_slow": 1.0, "truncate": False}
    # Megatron-LM's MLA: --rope-type unset means MLATransformerConfig's yarn, with the CLI's factor 1 = plain
    assert from_megatron_args({"num_layers": 2, "multi_latent_attention": True, "rope_type": None,
                               "rotary_scaling_factor": 1.0}).megatron_rope == rope_map.PLAIN
    # Megatron-LM's non-MLA YaRN: --mscale 1 / --mscale-all-dim 0 defaults are transformers' get_mscale(factor)
    assert "mscale" not in from_megatron_args({"num_layers": 2, "position_embedding_type": "yarn",
                                               "rotary_scaling_factor": 4.0, "mscale": 1.0,
                                               "mscale_all_dim": 0.0}).megatron_rope
    # ... but --mscale 0.5 alone is a factor transformers would not derive from mscale: it is said explicitly
    odd = from_megatron_args({"num_layers": 2, "position_embedding_type": "yarn", "rotary_scaling_factor": 4.0,
                              "mscale": 0.5, "mscale_all_dim": 0.0}).megatron_rope
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import _yarn_get_concentration_factor

    assert odd["attention_factor"] == _yarn_get_concentration_factor(4.0, 0.5, 0.0) and "mscale" not in odd


# --- what megatron-core cannot compute is refused ------------------------------------------------------------


@pytest.mark.parametrize("arch,scaling,word", [
    ("llama", {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
               "original_max_position_embeddings": 8192}, "high_freq_factor"),
    ("llama", {"rope_type": "dynamic", "factor": 2.0}, "dynamic"),
    ("qwen3", {**YARN, "attention_factor": 0.8}, "attention_factor"),
    ("deepseek_v3", {"rope_type": "llama3", "factor": 8.0}, "llama3"),
    ("deepseek_v3", {**YARN, "truncate": False}, "truncate"),
])
def test_rope_megatron_core_cannot_compute_is_refused(arch, scaling, word):
    with pytest.raises(CkptError, match=word):
        rope_map.megatron_args(scaling, mla=arch == "deepseek_v3", arch=arch)


def test_convert_refuses_an_unmappable_scaling_with_one_line(tmp_path):
    hf = _write("qwen3", tmp_path / "hf")
    config = json.loads((hf / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
                                 "long_factor": [2.0] * 8, "original_max_position_embeddings": 16}
    (hf / "config.json").write_text(json.dumps(config))
    result = run_cli("convert", str(hf), str(tmp_path / "out"), "--to", "mcore")
    assert result.code == 2 and "longrope" in result.err and len(result.err.strip().splitlines()) == 1, result.err
    assert not (tmp_path / "out").exists()
