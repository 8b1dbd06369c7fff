"""The one split of a checkpoint into its model and its training state (core.roles, ops.model).

Unit cases cover every wrapper and training root real trainers write; the export cases push an
optimizer tensor and an unknown wrapper through each export path (HF, torch_dist, per-rank torch)
and check what comes out with independent loaders.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckptscope.core.roles import naming_family, split_entries
from tests.conftest import run_cli

HF_NAMES = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight",
            "model.norm.weight", "lm_head.weight"]


@pytest.mark.parametrize("wrap", ["", "model.", "module.", "_orig_mod.", "module.model.", "state_dict."])
def test_model_found_under_any_whole_model_wrapper(wrap):
    names = [wrap + n for n in HF_NAMES] + ["optim.state.0.exp_avg", "train_state.step"]
    split = split_entries(names)
    assert split.prefix == wrap.replace("_orig_mod.", "")
    assert split.naming == "hf"
    assert sorted(split.stored) == sorted(HF_NAMES)
    assert all(split.stored[n] == wrap + n for n in HF_NAMES)
    assert split.training == {"optimizer": ["optim.state.0.exp_avg"], "train_state": ["train_state.step"]}
    assert split.unknown == []


def test_tied_hf_model_keeps_its_own_model_prefix():
    """Every key of a tied HF Llama starts with ``model.``: that is its naming, not a wrapper."""
    names = [n for n in HF_NAMES if n != "lm_head.weight"]
    split = split_entries(names)
    assert split.prefix == "" and split.naming == "hf" and sorted(split.stored) == sorted(names)


def test_fsdp1_and_compile_wrappers_are_dropped_wherever_they_stand():
    names = ["_orig_mod.model.layers.0._fsdp_wrapped_module.self_attn.q_proj.weight",
             "_orig_mod.model.layers.0._fsdp_wrapped_module._checkpoint_wrapped_module.mlp.up_proj.weight",
             "_orig_mod.lm_head.weight"]
    split = split_entries(names)
    assert sorted(split.stored) == ["lm_head.weight", "model.layers.0.mlp.up_proj.weight",
                                    "model.layers.0.self_attn.q_proj.weight"]


def test_entries_outside_the_model_are_unknown_not_model():
    names = HF_NAMES + ["ema.model.embed_tokens.weight", "foo.bar"]
    split = split_entries(names)
    assert split.unknown == ["ema.model.embed_tokens.weight", "foo.bar"]
    assert sorted(split.stored) == sorted(HF_NAMES)


@pytest.mark.parametrize("name, kind", [
    ("optimizer.state.exp_avg.decoder.layers.mlp.linear_fc1.weight", "optimizer"),
    ("optimizer.optimizer.state.fp32_param.decoder.final_layernorm.weight", "optimizer"),
    ("chained_1.optimizer.state.exp_avg.decoder.layers.mlp.experts.weight", "optimizer"),
    ("distrib_optim.mp_rank_00.param", "optimizer"),
    ("rng_state/shard_0.0_1.2", "rng"),
    ("lr_scheduler.last_epoch", "lr_scheduler"),
    ("opt_param_scheduler.num_steps", "lr_scheduler"),
    ("dataloader.dp_rank_0", "dataloader"),
    ("train_state.step", "train_state"),
    ("num_floating_point_operations_so_far", "train_state"),
])
def test_training_roots_of_real_trainers(name, kind):
    split = split_entries(["decoder.layers.self_attention.linear_qkv.weight", name])
    assert split.training == {kind: [name]}
    assert list(split.stored) == ["decoder.layers.self_attention.linear_qkv.weight"]


def test_reader_tags_win_over_names():
    split = split_entries(["decoder.layers.mlp.linear_fc1.weight", "weird.bucket"], {"weird.bucket": "optimizer"})
    assert split.training == {"optimizer": ["weird.bucket"]}


@pytest.mark.parametrize("names, family", [
    (["decoder.layers.self_attention.linear_qkv.weight", "embedding.word_embeddings.weight"], "mcore"),
    (["model.layers.0.mlp.up_proj.weight", "lm_head.weight"], "hf"),
    (["tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.0.feed_forward.w1.weight"], "torchtitan"),
    (["model.layers.0.weight", "model.embed.weight"], "other"),  # a toy nn.Sequential, not transformers
])
def test_naming_families(names, family):
    assert naming_family(names) == family


# --- every export path, smuggled entries ------------------------------------------------------------


class _WithExtraState(torch.nn.Module):
    """A module whose ``get_extra_state()`` holds a tensor (as TE's fp8 metadata, or a custom counter)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 5)
        self.register_buffer("inv_freq", torch.arange(3, dtype=torch.float32))  # a persistent buffer

    def get_extra_state(self):
        return {"counter": 3, "t": torch.tensor([1.5, 2.5, 3.5])}

    def set_extra_state(self, state) -> None:
        pass


@pytest.mark.parametrize("value", ["dict", "tensor"])
def test_extra_state_is_not_counted_as_parameters(tmp_path, value):
    """``parameters`` counts what ``model.parameters()`` does: a probe's module of 35 parameters read 38
    (its ``_extra_state`` tensor). A persistent buffer is stored like a weight and stays counted; a RoPE
    ``rotary_emb.inv_freq`` (older transformers saved it) does not."""
    model = torch.nn.Module()
    model.block = _WithExtraState()
    model.rotary_emb = torch.nn.Module()
    model.rotary_emb.register_buffer("inv_freq", torch.ones(4))
    if value == "tensor":
        model.block.get_extra_state = lambda: torch.tensor([7.0, 8.0])
    state = model.state_dict()
    assert any("_extra_state" in name for name in state) and "rotary_emb.inv_freq" in state
    torch.save(state, tmp_path / "model.pt")
    result = run_cli("inspect", "--json", str(tmp_path / "model.pt"))
    assert result.code == 0, result.err
    buffers = model.block.inv_freq.numel()
    assert json.loads(result.out)["metadata"]["num_params"] == sum(p.numel() for p in model.parameters()) + buffers


def test_torchtitan_model_under_a_model_key_is_torchtitan_not_hf(tmp_path):
    """An older torchtitan (and any ``dcp.save({"model": ...})`` of its model) stores
    ``model.layers.0.attention.wq.weight``: transformers' pattern admits most of those names as they
    stand, but only under ``model.`` does every one follow a family. Inspect must count the whole
    model in torchtitan names, and convert must refuse it (no HF mapping), not export
    ``model.layers.0.attention.wq.weight`` as if it were an HF name. Written by ``dcp.save`` from the
    state dict of torchtitan's llama3 module tree (re-typed in make_training_state_samples.py)."""
    import importlib
    import sys

    import torch.distributed.checkpoint as dcp

    samples = Path(__file__).resolve().parents[1] / "sample_ckpts"
    if str(samples) not in sys.path:
        sys.path.insert(0, str(samples))
    gen = importlib.import_module("make_training_state_samples")
    model = gen._titan_modules()["Transformer"](gen.TITAN_ARGS)
    state = model.state_dict()
    step = tmp_path / "checkpoint" / "step-10"
    moments = {f"state.{n}.exp_avg": torch.zeros_like(t) for n, t in state.items()}
    dcp.save({"model": state, "optimizer": moments}, checkpoint_id=str(step), no_dist=True)

    result = run_cli("inspect", "--json", str(step))
    assert result.code == 0, result.err
    roles = json.loads(result.out)["metadata"]["roles"]
    assert (roles["prefix"], roles["naming"], roles["unknown"]) == ("model.", "torchtitan", [])
    assert roles["model"]["params"] == sum(t.numel() for t in state.values())
    assert roles["training_state"]["optimizer"]["tensors"] == len(state)

    out = tmp_path / "hf"
    for args in ((), ("--skip-unknown",)):
        refused = run_cli("convert", str(step), str(out), "--to", "hf", *args)
        assert refused.code == 2 and "torchtitan names" in refused.err, refused.err
        assert len(refused.err.strip().splitlines()) == 1 and not out.exists()


@pytest.fixture
def smuggled_hf(samples, tmp_path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The HF sample with an optimizer moment and an EMA copy added to its safetensors file."""
    src = tmp_path / "hf"
    shutil.copytree(samples["hf_llama_single"], src)
    weights = load_file(src / "model.safetensors")
    extra = {"optimizer.state.0.exp_avg": torch.ones(4), "ema.model.norm.weight": weights["model.norm.weight"].clone()}
    save_file({**weights, **extra}, src / "model.safetensors", metadata={"format": "pt"})
    return src, weights


@pytest.mark.parametrize("args", [("--to", "hf"), ("--to", "mcore"), ("--to", "mcore", "--ckpt-format", "torch")])
def test_unknown_wrapper_refuses_every_export_and_writes_nothing(smuggled_hf, tmp_path, args):
    src, _ = smuggled_hf
    out = tmp_path / "out"
    result = run_cli("convert", str(src), str(out), *args)
    assert result.code == 2 and result.err.count("\n") == 1 and "ema.model.norm.weight" in result.err
    assert not out.exists()


def test_skip_unknown_exports_exactly_the_model(smuggled_hf, tmp_path):
    src, weights = smuggled_hf
    out = tmp_path / "out"
    result = run_cli("convert", str(src), str(out), "--to", "hf", "--skip-unknown")
    assert result.code == 0, result.err
    exported = load_file(out / "model.safetensors")
    assert set(exported) == set(weights)
    assert all(torch.equal(exported[n], weights[n]) for n in weights)


def test_mcore_export_holds_no_optimizer_state(smuggled_hf, tmp_path):
    """torch_dist output, read back by torch's own DCP metadata: only model keys."""
    from torch.distributed.checkpoint import FileSystemReader

    src, _ = smuggled_hf
    out = tmp_path / "out"
    assert run_cli("convert", str(src), str(out), "--to", "mcore", "--skip-unknown").code == 0
    metadata = FileSystemReader(str(out / "iter_0000000")).read_metadata()
    keys = set(metadata.state_dict_metadata)
    assert keys and not any(k.startswith(("optimizer", "ema")) for k in keys)
    assert any(k.startswith("decoder.") for k in keys)


def test_dry_run_names_what_is_left_out(smuggled_hf, tmp_path):
    src, _ = smuggled_hf
    result = run_cli("convert", str(src), str(tmp_path / "out"), "--to", "hf", "--skip-unknown", "--dry-run", "--json")
    assert result.code == 0, result.err
    plan = json.loads(result.out)
    assert "ema.model.norm.weight" in plan["dropped"]
    assert any("training state left out" in note for note in plan["notes"])
    assert not any(t["name"].startswith(("optimizer", "ema")) for t in plan["tensors"])


@pytest.mark.parametrize("tp, what", [(3, "4 attention heads"), (8, "8 does not divide the model's 4 attention")])
def test_parallel_sizes_are_checked_before_anything_is_written(samples, tmp_path, tp, what):
    out = tmp_path / "out"
    result = run_cli("convert", str(samples["hf_llama_single"]), str(out), "--to", "mcore", "--tp", str(tp))
    assert result.code == 2 and what in result.err and result.err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("kv_heads, tp", [(1, 2), (2, 4), (1, 4)])
def test_fewer_query_groups_than_tp_ranks_convert_as_megatron_core_splits_them(tmp_path, kv_heads, tp):
    """megatron-core builds a model whose query groups divide TP (MQA at TP=2): each rank holds an even
    1/TP of the fused QKV rows (tests/test_megatron_write.py's tp2_mqa case checks those rank files
    against megatron-core's own). Per-rank files at that TP, and back to HF bit for bit."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=kv_heads, vocab_size=256)
    torch.manual_seed(0)
    src = tmp_path / "src"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(src)
    mcore, back = tmp_path / "mcore", tmp_path / "back"
    result = run_cli("convert", str(src), str(mcore), "--to", "mcore", "--tp", str(tp), "--ckpt-format", "torch")
    assert result.code == 0, result.err
    ranks = sorted(p.name for p in next(mcore.glob("iter_*")).iterdir())
    assert ranks == [f"mp_rank_{r:02d}" for r in range(tp)]
    qkv = torch.load(next(mcore.glob("iter_*")) / "mp_rank_01" / "model_optim_rng.pt", weights_only=False)[
        "model"]["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv.shape[0] == (4 + 2 * kv_heads) * 16 // tp
    result = run_cli("convert", str(mcore), str(back), "--to", "hf")
    assert result.code == 0, result.err
    result = run_cli("diff", str(src), str(back), "--json")
    assert result.code == 0 and json.loads(result.out)["summary"]["different"] == 0, result.out[-500:]


def test_diff_compares_models_and_training_state_only_on_request(samples, tmp_path):
    """Two saves of one model whose Adam moments differ: the same model (exit 0); with
    --training-state the moments are compared too (exit 1, at exactly that tensor)."""
    original = torch.load(samples["megatron_style.pt"], weights_only=False)
    original["optimizer"]["state"][0]["exp_avg"] = original["optimizer"]["state"][0]["exp_avg"] + 1.0
    changed = tmp_path / "changed.pt"
    torch.save(original, changed)
    same_model = run_cli("diff", str(samples["megatron_style.pt"]), str(changed), "--json")
    assert same_model.code == 0, same_model.err
    report = json.loads(same_model.out)
    assert not any(t["name"].startswith("optimizer") for t in report["tensors"])
    with_state = run_cli("diff", str(samples["megatron_style.pt"]), str(changed), "--json", "--training-state")
    assert with_state.code == 1
    differing = [t["name"] for t in json.loads(with_state.out)["tensors"] if t["status"] == "different"]
    assert differing == ["optimizer.state.0.exp_avg"]


def test_config_that_does_not_fit_the_tensors_is_refused(samples, tmp_path):
    """megatron_style.pt's args name num_query_groups=2 without group_query_attention, so Megatron
    itself would build 4 KV heads; the stored k/v projections hold 2. An HF export under a config
    derived from those args would load with re-initialised k/v weights: refused, nothing written."""
    out = tmp_path / "out"
    result = run_cli("convert", str(samples["megatron_style.pt"]), str(out), "--to", "hf", "--skip-unknown")
    assert result.code == 2 and result.err.count("\n") == 1
    assert "k_proj.weight is [32, 64] but config.json implies [64, 64]" in result.err and "--hf-config" in result.err
    assert not out.exists()
    # With a config that fits, the same source exports and loads with nothing missing or re-initialised.
    from transformers import AutoModelForCausalLM

    fitting = tmp_path / "config"
    shutil.copytree(samples["hf_llama_single"], fitting)
    result = run_cli("convert", str(samples["megatron_style.pt"]), str(out), "--to", "hf", "--skip-unknown",
                     "--hf-config", str(fitting))
    assert result.code == 0, result.err
    _, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))


def test_a_renamed_model_is_still_the_whole_model(samples, tmp_path):
    """``rename --sub '^model\\.' 'backbone.'`` of an HF Llama: lm_head.weight alone still looks like HF,
    the other names follow no family. The model is every tensor, not one tensor plus unknowns."""
    out = tmp_path / "renamed"
    assert run_cli("rename", str(samples["hf_llama_sharded"]), str(out), "--sub", r"^model\.", "backbone.").code == 0
    result = run_cli("inspect", "--json", str(out))
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    roles = doc["metadata"]["roles"]
    assert roles["unknown"] == [] and roles["model"]["tensors"] == len(doc["tensors"])
    assert doc["metadata"]["num_params"] == sum(math.prod(t["shape"]) for t in doc["tensors"])
