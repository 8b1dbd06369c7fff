"""The HF <-> Megatron-Core reference pairs: equal logits through the saved files, and a check with teeth.

sample_ckpts/make_mcore_pair_samples.py writes each pair into a temp dir (the generator itself refuses
to save unless the in-memory logits match). Here the round trip goes through the files: transformers
loads the HF dir, a fresh megatron-core GPTModel loads the torch_dist dir with dist_checkpointing, and
both predict the same logits. A naive ``cat([q, k, v])`` conversion written the same way must not.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from dist_reference import torch_dcp_tensors
from mcore_reference import (
    SAMPLES,
    common_state,
    generators,
    hf_logits,
    iteration_dir,
    mcore_logits_from_dist,
    reference_args,
    tokens_for,
)

# Apex/TE-missing fallbacks and torch's ShardedTensor deprecation, from the libraries, not from us.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")

ARCHS = ("llama_gqa", "qwen2_tied", "qwen3")
VOCAB = 250  # true vocab of every tiny arch; Megatron pads it to 256


@pytest.fixture(scope="module")
def gen():
    return generators()


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, gen) -> dict:
    """{arch: (hf_dir, mcore_root)} for every tiny architecture, TP=1."""
    out = tmp_path_factory.mktemp("mcore_pairs")
    return {name: gen.write_pair(name, out) for name in ARCHS}


@pytest.fixture(scope="module")
def tokens():
    return tokens_for(VOCAB)


def _max_diff(a, b) -> float:
    return float((a[..., :VOCAB] - b[..., :VOCAB]).abs().max())


@pytest.mark.parametrize("name", ARCHS)
def test_saved_pair_gives_equal_logits(pairs, gen, tokens, name):
    hf_dir, root = pairs[name]
    want = hf_logits(hf_dir, tokens)
    got = mcore_logits_from_dist(iteration_dir(root), hf_dir, tokens)
    assert got.shape == (*tokens.shape, 256)
    assert _max_diff(want, got) <= gen.LOGITS_ATOL
    assert float(got[..., VOCAB:].abs().max()) == 0.0  # zero padding rows -> zero padding logits
    assert float(want.abs().max()) > 1.0  # the logits are not trivially tiny


@pytest.mark.parametrize("name", ARCHS)
def test_args_in_common_pt_rebuild_the_same_model(pairs, tokens, name):
    hf_dir, root = pairs[name]
    from_hf = mcore_logits_from_dist(root, hf_dir, tokens)
    from_common = mcore_logits_from_dist(root, None, tokens)
    assert float((from_hf - from_common).abs().max()) == 0.0


@pytest.mark.parametrize("name", ARCHS)
def test_naive_qkv_concat_gives_different_logits(pairs, gen, tokens, tmp_path, name):
    hf_dir, _ = pairs[name]
    naive = gen.save_mcore_from_hf(hf_dir, tmp_path / "naive", qkv_layout="naive", check=False)
    diff = _max_diff(hf_logits(hf_dir, tokens), mcore_logits_from_dist(naive, hf_dir, tokens))
    assert diff > 0.1, diff


def test_common_state_is_what_megatron_training_saves(pairs):
    _, root = pairs["qwen3"]
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "0"
    state = common_state(root)
    assert state["iteration"] == 0 and state["checkpoint_version"] == 3.0
    args = state["args"]
    assert isinstance(args, argparse.Namespace)
    assert (args.num_layers, args.hidden_size, args.ffn_hidden_size) == (2, 64, 96)
    assert (args.num_attention_heads, args.num_query_groups, args.kv_channels) == (8, 2, 16)
    assert args.group_query_attention and args.swiglu and args.qk_layernorm and not args.add_qkv_bias
    assert (args.vocab_size, args.padded_vocab_size, args.make_vocab_size_divisible_by) == (VOCAB, 256, 128)
    assert args.normalization == "RMSNorm" and args.position_embedding_type == "rope"
    assert args.rotary_base == 1000000 and args.ckpt_format == "torch_dist"
    assert args.tensor_model_parallel_size == 1 and args.pipeline_model_parallel_size == 1
    assert common_state(pairs["qwen2_tied"][1])["args"].add_qkv_bias


def test_stored_tensors_follow_the_documented_layout(pairs):
    """Independent of the generator's own code path: on-disk tensors vs the HF safetensors."""
    from safetensors.numpy import load_file

    for name in ARCHS:
        hf_dir, root = pairs[name]
        hf = load_file(hf_dir / "model.safetensors")
        stored = torch_dcp_tensors(iteration_dir(root))
        emb = stored["embedding.word_embeddings.weight"]
        assert emb.shape == (256, 64)
        np.testing.assert_array_equal(emb[:VOCAB], hf["model.embed_tokens.weight"])
        assert not emb[VOCAB:].any()
        assert ("output_layer.weight" in stored) == (name != "qwen2_tied")  # tied: no output layer (§1.5)
        fc1 = stored["decoder.layers.mlp.linear_fc1.weight"][1]  # stacked [L, 2F, H]; layer 1
        gate_up = np.concatenate([hf["model.layers.1.mlp.gate_proj.weight"], hf["model.layers.1.mlp.up_proj.weight"]])
        np.testing.assert_array_equal(fc1, gate_up)
        norm = stored["decoder.layers.self_attention.linear_qkv.layer_norm_weight"][0]  # local spec -> TE name
        np.testing.assert_array_equal(norm, hf["model.layers.0.input_layernorm.weight"])


def test_tp2_save_loads_into_tp1_with_equal_logits(tmp_path, gen, pairs, tokens):
    """2 gloo ranks (TP=2) save; the TP=1 reference model reloads it: same logits, same global tensors."""
    import shutil

    hf_dir, root_tp1 = pairs["llama_gqa"]
    shutil.copytree(hf_dir, tmp_path / "hf_llama_gqa")  # write_mcore converts the HF dir beside it
    root_tp2 = gen.write_mcore("llama_gqa", tmp_path, tp=2)
    assert common_state(root_tp2)["args"].tensor_model_parallel_size == 2
    got = mcore_logits_from_dist(root_tp2, None, tokens)
    assert _max_diff(hf_logits(hf_dir, tokens), got) <= gen.LOGITS_ATOL
    tp1, tp2 = torch_dcp_tensors(iteration_dir(root_tp1)), torch_dcp_tensors(iteration_dir(root_tp2))
    assert set(tp1) == set(tp2)
    for key in tp1:
        np.testing.assert_array_equal(tp1[key], tp2[key], err_msg=key)


def test_shipped_samples_match_the_writer(pairs, gen, tokens):
    shipped_hf, shipped_root = SAMPLES / "hf_llama_gqa", SAMPLES / "mcore_llama_gqa"
    hf_dir, root = pairs["llama_gqa"]
    from safetensors.numpy import load_file

    fresh, ship = load_file(hf_dir / "model.safetensors"), load_file(shipped_hf / "model.safetensors")
    assert set(fresh) == set(ship)
    for key in fresh:
        np.testing.assert_array_equal(fresh[key], ship[key], err_msg=key)
    fresh_dist, ship_dist = torch_dcp_tensors(iteration_dir(root)), torch_dcp_tensors(iteration_dir(shipped_root))
    assert set(fresh_dist) == set(ship_dist)
    for key in fresh_dist:
        np.testing.assert_array_equal(fresh_dist[key], ship_dist[key], err_msg=key)
    assert _max_diff(hf_logits(shipped_hf, tokens), mcore_logits_from_dist(shipped_root, None, tokens)) <= gen.LOGITS_ATOL


def test_missing_extra_state_fails_megatrons_default_strictness(pairs, gen, tokens, tmp_path):
    """A converter that drops ``_extra_state`` is rejected by Megatron's default load (MAPPING.md §1.3),
    and accepted (with the same logits) under ``strict="log_unexpected"``."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    hf_dir, root = pairs["llama_gqa"]
    args = reference_args(root, hf_dir)
    target = tmp_path / "no_extra_state"
    target.mkdir()
    gen.ensure_single_rank_world()
    with gen.cpu_megatron():
        model = gen.build_gpt_model(args)
        gen.load_params(model, gen.hf_to_mcore(gen.load_hf_model(hf_dir).state_dict(), args))
        sharded = {k: v for k, v in model.sharded_state_dict().items() if not isinstance(v, ShardedObject)}
        dist_checkpointing.save({"model": sharded, "args": args}, str(target))
    with pytest.raises(BaseException, match="_extra_state"):  # torch's CheckpointException is a BaseException
        mcore_logits_from_dist(target, hf_dir, tokens)
    got = mcore_logits_from_dist(target, hf_dir, tokens, strict="log_unexpected")
    assert _max_diff(hf_logits(hf_dir, tokens), got) <= gen.LOGITS_ATOL


def test_singleton_local_shards_save_reads_as_the_same_model(pairs, gen, tmp_path, cli):
    """megatron-core's ``singleton_local_shards`` layout (Megatron-LM 0.14/0.15 ``--dist-ckpt-save-pre-mcore-014``;
    0.16 still writes and loads it) stores the SwiGLU fc1 as ``linear_fc1.weight_w`` (gate) and ``weight_v``
    (up) under per-layer keys. A probe's save of it: diff against the same model said "renamed" and convert
    refused ("match no llama rule"). The halves are shown fused now: the HF export equals the HF source bit
    for bit, and diff says identical."""
    import torch
    from safetensors.torch import load_file

    hf_dir, _ = pairs["llama_gqa"]
    root = gen.save_mcore_from_hf(hf_dir, tmp_path / "single", singleton_local_shards=True)
    from torch.distributed.checkpoint import FileSystemReader

    stored = FileSystemReader(str(root / "iter_0000000")).read_metadata().state_dict_metadata
    assert any(key.endswith("linear_fc1.weight_w") for key in stored), sorted(stored)[:8]
    assert cli("diff", str(root), str(hf_dir)).code == 0
    result = cli("convert", str(root), str(tmp_path / "hf"), "--to", "hf", "--hf-config", str(hf_dir))
    assert result.code == 0, result.err
    got, want = load_file(tmp_path / "hf" / "model.safetensors"), load_file(hf_dir / "model.safetensors")
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("tp", [1, 2])
def test_llama_with_every_linear_biased_is_megatrons_add_bias_linear(gen, tmp_path, cli, tp):
    """Megatron-LM's default ``add_bias_linear`` puts a bias on every linear: that is HF Llama with
    ``attention_bias`` and ``mlp_bias``. Both directions were refused (a probe: "match no qwen2 rule",
    "match no llama rule"). HF -> Megatron-Core: megatron-core loads the save and computes transformers'
    logits; back to HF: every tensor bit for bit, the config's two flags set."""
    import json

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    tokens = tokens_for(128)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=True,
                         mlp_bias=True, tie_word_embeddings=False, max_position_embeddings=64)
    model = AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):  # transformers starts them at zero: random, so a misplaced one shows
                param.normal_(0, 0.5)
    hf = tmp_path / "hf"
    model.save_pretrained(hf)
    result = cli("convert", str(hf), str(tmp_path / "mcore"), "--to", "mcore", "--tp", str(tp))
    assert result.code == 0, result.err
    assert common_state(tmp_path / "mcore")["args"].add_bias_linear is True
    want = hf_logits(hf, tokens)
    args = argparse.Namespace(**{**vars(gen.megatron_args(config)), "add_bias_linear": True, "add_qkv_bias": True})
    got = mcore_logits_from_dist(tmp_path / "mcore", args, tokens)
    assert float((want[..., :128] - got[..., :128]).abs().max()) <= gen.LOGITS_ATOL
    result = cli("convert", str(tmp_path / "mcore"), str(tmp_path / "back"), "--to", "hf")
    assert result.code == 0, result.err
    back, orig = load_file(tmp_path / "back" / "model.safetensors"), load_file(hf / "model.safetensors")
    assert set(back) == set(orig) and all(torch.equal(back[k], orig[k]) for k in orig)
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written["attention_bias"] is True and written["mlp_bias"] is True


@pytest.mark.parametrize("flags", [{"attention_bias": True}, {"mlp_bias": True}])
def test_llama_with_some_linears_biased_has_no_megatron_spelling(tmp_path, cli, flags):
    """Megatron-Core biases every linear or none: a Llama with attention_bias but not mlp_bias (or the
    reverse) is refused. (With the bias rules in place, the first was written with its o_proj bias as
    linear_proj.bias for args without add_bias_linear, a key megatron-core ignores on load.)"""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, **flags)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "hf")
    result = cli("convert", str(tmp_path / "hf"), str(tmp_path / "mcore"), "--to", "mcore")
    assert result.code == 2 and "only some linears have biases" in result.err, result.err
    assert not (tmp_path / "mcore").exists()
