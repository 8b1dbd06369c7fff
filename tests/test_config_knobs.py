"""Config knobs that change what a model computes, found exported with exit 0 by a probe that compared
megatron-core's forward and transformers' logits (HF <-> Megatron-Core in both directions).

Megatron -> HF: the args of a real megatron-core save (``sample_ckpts/mcore_llama_gqa``) are edited as
runs record them; each knob a Llama has no spelling for must be refused, naming the arg. HF -> Megatron:
tiny transformers models with the knob set; the export must carry it (checked with transformers on
the way back and in the args megatron-core reads) or refuse.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli
from tests.mcore_reference import iteration_dir

MCORE = Path(__file__).resolve().parents[1] / "sample_ckpts" / "mcore_llama_gqa"


def _with_args(tmp_path: Path, **changes) -> Path:
    src = tmp_path / "src"
    shutil.copytree(MCORE, src)
    common_file = iteration_dir(src) / "common.pt"
    common = torch.load(common_file, weights_only=False)
    for key, value in changes.items():
        setattr(common["args"], key, value)
    torch.save(common, common_file)
    return src


@pytest.mark.parametrize("changes, reason", [
    ({"rotary_percent": 0.5}, "rotary_percent"),
    ({"rotary_interleaved": True}, "rotary_interleaved"),
    ({"qk_l2_norm": True}, "qk_l2_norm"),
    ({"no_rope_freq": [0, 1]}, "no_rope_freq"),
    ({"position_embedding_type": "none"}, "position_embedding_type"),
    ({"position_embedding_type": "mrope"}, "position_embedding_type"),
    ({"softmax_type": "off-by-one"}, "softmax_type"),
    ({"glu_linear_offset": 1.0}, "glu_linear_offset"),
    ({"activation_func_clamp_value": 0.5}, "activation_func_clamp_value"),
    ({"softmax_scale": 0.5}, "softmax_scale"),
    ({"normalization": "LayerNorm"}, "normalization"),
])
def test_megatron_attention_a_llama_cannot_spell_is_refused(tmp_path, changes, reason):
    src = _with_args(tmp_path, **changes)
    result = run_cli("convert", str(src), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 2 and reason in result.err and "would not compute llama" in result.err, result.err
    assert result.err.count("\n") == 1 and not (tmp_path / "hf").exists()


def test_the_default_softmax_scale_and_rope_still_convert(tmp_path):
    head_dim = json.loads((Path(__file__).resolve().parents[1] / "sample_ckpts" / "hf_llama_gqa" /
                           "config.json").read_text())
    scale = (head_dim["hidden_size"] // head_dim["num_attention_heads"]) ** -0.5
    src = _with_args(tmp_path, softmax_scale=scale, position_embedding_type="rope", rotary_percent=1.0)
    result = run_cli("convert", str(src), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 0, result.err


def _tiny(cls_name: str, tmp_path: Path, **config) -> tuple[Path, torch.nn.Module]:
    import transformers

    config_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
    model = getattr(transformers, cls_name)(config_cls(**config)).float().eval()
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.randn(param.shape, generator=gen) / param.shape[-1] ** 0.5
                        if param.dim() > 1 else 1.0 + 0.1 * torch.randn(param.shape, generator=gen))
    out = tmp_path / "hf"
    model.save_pretrained(out)
    return out, model


MOE = dict(hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, vocab_size=96, max_position_embeddings=64, num_experts=4,
           num_experts_per_tok=2, shared_expert_intermediate_size=24)


def test_qwen2_moe_without_qkv_bias_round_trips(tmp_path):
    """Qwen2-MoE spells it ``qkv_bias`` (default true): read as true, the args said add_qkv_bias with no
    bias tensors (megatron-core could not load it) and the way back lost the knob (6 missing keys)."""
    from transformers import AutoModelForCausalLM

    hf, model = _tiny("Qwen2MoeForCausalLM", tmp_path, qkv_bias=False, **MOE)
    mcore = tmp_path / "mcore"
    assert run_cli("convert", str(hf), str(mcore), "--to", "mcore").code == 0
    common = torch.load(iteration_dir(mcore) / "common.pt", weights_only=False)
    assert common["args"].add_qkv_bias is False
    back = tmp_path / "back"
    result = run_cli("convert", str(mcore), str(back), "--to", "hf")
    assert result.code == 0, result.err
    assert json.loads((back / "config.json").read_text())["qkv_bias"] is False
    again, info = AutoModelForCausalLM.from_pretrained(str(back), output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tokens = torch.arange(20).reshape(2, 10)
    with torch.no_grad():
        assert torch.equal(again(tokens).logits, model(tokens).logits)


@pytest.mark.parametrize("cls_name, config", [
    ("MixtralForCausalLM", dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, vocab_size=96, num_local_experts=4, num_experts_per_tok=1)),
    ("Qwen3MoeForCausalLM", dict(hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=96, num_experts=4,
                                 num_experts_per_tok=1, norm_topk_prob=True)),
])
def test_top1_routing_with_renormalised_weights_is_refused(tmp_path, cls_name, config):
    """megatron-core refuses top-1 softmax routing without moe_router_pre_softmax ("Please use
    --moe-router-pre-softmax when topk is 1"), and with it the weights differ (logits off 0.65-2.7)."""
    hf, _ = _tiny(cls_name, tmp_path, **config)
    result = run_cli("convert", str(hf), str(tmp_path / "mcore"), "--to", "mcore")
    assert result.code == 2 and "top-1" in result.err and result.err.count("\n") == 1, result.err
    assert not (tmp_path / "mcore").exists()


def test_gpt_oss_without_attention_bias_is_refused(tmp_path):
    hf, _ = _tiny("GptOssForCausalLM", tmp_path, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=96, num_local_experts=4,
                  num_experts_per_tok=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                  attention_bias=False)
    result = run_cli("convert", str(hf), str(tmp_path / "mcore"), "--to", "mcore")
    assert result.code == 2 and "attention_bias false" in result.err, result.err


def test_gemma2_export_says_what_the_megatron_args_lack(tmp_path):
    """Gemma 2's soft-capping, attention scale and window travel only in hf_config_extra: a real
    convert (not only --dry-run) now says so on stderr."""
    hf, _ = _tiny("Gemma2ForCausalLM", tmp_path, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=96,
                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=16)
    result = run_cli("convert", str(hf), str(tmp_path / "mcore"), "--to", "mcore")
    assert result.code == 0, result.err
    warning = [line for line in result.err.splitlines() if line.startswith("warning: gemma2:")]
    assert len(warning) == 1 and "soft-capping" in warning[0] and "attention scale" in warning[0], result.err


HF_SAMPLE = Path(__file__).resolve().parents[1] / "sample_ckpts" / "hf_llama_gqa"


def _hf_config(tmp_path: Path, **changes) -> Path:
    out = tmp_path / "hf_config"
    out.mkdir()
    config = json.loads((HF_SAMPLE / "config.json").read_text())
    config.update(changes)
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("args, config, said", [
    ({"rotary_base": 500000}, {}, "rotary_base 500000"),
    ({"norm_epsilon": 1e-3}, {}, "norm_epsilon 0.001"),
    ({}, {"tie_word_embeddings": True}, "tie_word_embeddings True"),
])
def test_an_hf_config_that_disagrees_with_the_megatron_args_is_refused(tmp_path, args, config, said):
    """``--hf-config`` (needed to strip a Megatron-LM run's vocabulary padding) used to win over the args:
    a run trained with another RoPE base or norm epsilon, or untied, came out as the config's model
    with exit 0 (a probe measured logits off by 0.005-4.5 against megatron-core)."""
    src = _with_args(tmp_path, **args)
    result = run_cli("convert", str(src), str(tmp_path / "hf"), "--to", "hf", "--hf-config",
                     str(_hf_config(tmp_path, **config)))
    assert result.code == 2 and said in result.err and "describes another model" in result.err, result.err
    assert result.err.count("\n") == 1 and not (tmp_path / "hf").exists()


def test_the_matching_hf_config_still_converts(tmp_path):
    result = run_cli("convert", str(MCORE), str(tmp_path / "hf"), "--to", "hf", "--hf-config", str(HF_SAMPLE))
    assert result.code == 0, result.err


def test_a_trained_output_layer_is_not_dropped_for_a_tied_config(tmp_path):
    """Args that say tied beside a stored output layer of its own (and a config that says tied): the
    export dropped output_layer.weight (logits off 4.5). It differs from the embedding, so it is refused."""
    src = _with_args(tmp_path, untie_embeddings_and_output_weights=False)
    result = run_cli("convert", str(src), str(tmp_path / "hf"), "--to", "hf", "--hf-config",
                     str(_hf_config(tmp_path, tie_word_embeddings=True)))
    assert result.code == 2 and "output layer of its own" in result.err, result.err


@pytest.mark.parametrize("changes, said", [({"moe_router_pre_softmax": True}, "moe_router_pre_softmax"),
                                           ({"window_attn_skip_freq": None}, "every layer")])
def test_gpt_oss_routing_and_window_args_are_checked_on_export(tmp_path, changes, said):
    """A GPT-OSS Megatron save whose args route with the full softmax or slide every layer was exported
    as GPT-OSS (logits off 0.3-2.7)."""
    hf, _ = _tiny("GptOssForCausalLM", tmp_path, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=96, num_local_experts=4,
                  num_experts_per_tok=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    mcore = tmp_path / "mcore"
    assert run_cli("convert", str(hf), str(mcore), "--to", "mcore").code == 0
    assert run_cli("convert", str(mcore), str(tmp_path / "back"), "--to", "hf").code == 0
    common_file = iteration_dir(mcore) / "common.pt"
    common = torch.load(common_file, weights_only=False)
    for key, value in changes.items():
        setattr(common["args"], key, value)
    torch.save(common, common_file)
    result = run_cli("convert", str(mcore), str(tmp_path / "hf2"), "--to", "hf")
    assert result.code == 2 and said in result.err and "would not compute gpt_oss" in result.err, result.err


@pytest.mark.parametrize("changes, said", [({"num_experts": 8}, "4 experts per layer"),
                                           ({"moe_ffn_hidden_size": 24}, "config.json implies [24, 32]")])
def test_megatron_expert_args_that_contradict_the_tensors_are_refused(tmp_path, changes, said):
    """The config derived from Megatron args that state another expert count or size than the stored
    experts loaded in transformers with mismatched (or randomly initialised) experts, exit 0."""
    hf, _ = _tiny("Qwen3MoeForCausalLM", tmp_path, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=96,
                  num_experts=4, num_experts_per_tok=2)
    mcore = tmp_path / "mcore"
    assert run_cli("convert", str(hf), str(mcore), "--to", "mcore").code == 0
    common_file = iteration_dir(mcore) / "common.pt"
    common = torch.load(common_file, weights_only=False)
    for key, value in changes.items():
        setattr(common["args"], key, value)
    common["args"].hf_config_extra = None  # as a Megatron-LM run records them: no HF keys beside the args
    torch.save(common, common_file)
    result = run_cli("convert", str(mcore), str(tmp_path / "back"), "--to", "hf", "--arch", "qwen3_moe")
    assert result.code == 2 and said in result.err and "do not fit" in result.err, result.err


def test_args_without_the_true_vocabulary_say_the_padding_is_kept(tmp_path):
    """Megatron-LM records vocab_size None when the tokenizer gives it: the export keeps every padded row
    as a token the model can emit. It said so only in --dry-run (a probe); now on stderr too."""
    src = _with_args(tmp_path, vocab_size=None)
    result = run_cli("convert", str(src), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 0 and "warning: the true vocabulary size is unknown" in result.err, result.err


def test_special_token_ids_survive_a_round_trip(tmp_path):
    """bos/eos/pad token ids were dropped by HF -> Megatron -> HF for Llama, Mistral and Mixtral (a probe):
    generation no longer knew its stop token. They travel in hf_config_extra now."""
    config = json.loads((HF_SAMPLE / "config.json").read_text())
    assert config.get("eos_token_id") is not None
    assert run_cli("convert", str(HF_SAMPLE), str(tmp_path / "mcore"), "--to", "mcore").code == 0
    assert run_cli("convert", str(tmp_path / "mcore"), str(tmp_path / "hf"), "--to", "hf").code == 0
    back = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert all(back.get(k) == config.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id"))


@pytest.mark.parametrize("ckpt_format", ["torch_dist", "torch"])
def test_generation_config_survives_a_round_trip(tmp_path, ckpt_format):
    """generation_config.json (sampling settings, extra stop tokens) was lost by HF -> Megatron -> HF (a
    probe): transformers then generated greedily with the config's single eos. It travels in the Megatron
    args (hf_generation_config) now, through a re-shard too; transformers' GenerationConfig reads it back
    the same. Megatron's own loader (torch.load of the args) sees a plain dict beside hf_config_extra."""
    from transformers import GenerationConfig

    src = tmp_path / "src"
    shutil.copytree(HF_SAMPLE, src)
    written = {"bos_token_id": 1, "eos_token_id": [2, 7], "do_sample": True, "temperature": 0.6, "top_p": 0.9,
               "max_new_tokens": 77}
    (src / "generation_config.json").write_text(json.dumps(written))
    assert run_cli("convert", str(src), str(tmp_path / "mcore"), "--to", "mcore", "--ckpt-format", ckpt_format).code == 0
    assert run_cli("convert", str(tmp_path / "mcore"), str(tmp_path / "tp2"), "--to", "mcore", "--tp", "2").code == 0
    result = run_cli("convert", str(tmp_path / "tp2"), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 0, result.err
    want = GenerationConfig.from_pretrained(str(src)).to_diff_dict()
    got = GenerationConfig.from_pretrained(str(tmp_path / "hf")).to_diff_dict()
    assert got == want and got["eos_token_id"] == [2, 7] and got["temperature"] == 0.6
    common = torch.load(str(tmp_path / "tp2" / "iter_0000000" / "common.pt"), weights_only=False)
    assert vars(common["args"])["hf_generation_config"]["top_p"] == 0.9


def test_generation_config_given_beside_the_export_wins(tmp_path):
    """--hf-config DIR with its own generation_config.json: that file is copied, not the carried one."""
    src = tmp_path / "src"
    shutil.copytree(HF_SAMPLE, src)
    (src / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "do_sample": True}))
    assert run_cli("convert", str(src), str(tmp_path / "mcore"), "--to", "mcore").code == 0
    other = tmp_path / "other"
    shutil.copytree(HF_SAMPLE, other)
    (other / "generation_config.json").write_text(json.dumps({"temperature": 0.2, "do_sample": True}))
    assert run_cli("convert", str(tmp_path / "mcore"), str(tmp_path / "hf"), "--to", "hf",
                   "--hf-config", str(other)).code == 0
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text())["temperature"] == 0.2
