"""verl's Megatron checkpoint layout schema v2 (``model/``, ``optimizer/``, ``extra/``, ``ckpt_contents.json``).

Fixtures: sample_ckpts/make_verl_v2_samples.py lays the dirs out as verl's manager does (verl is not
installed) around real writers: megatron-core ``dist_checkpointing.save`` on 2 gloo ranks (TP=2) for
every torch_dist tree, transformers ``save_pretrained`` for config/tokenizer and safetensors'
``save_file`` for mbridge's weights. The model is ``hf_llama_gqa`` (its GPTModel logits were checked
against transformers before saving). Judges: torch DCP's own loader for the torch_dist trees,
safetensors' loader for the mbridge file, transformers ``from_pretrained(output_loading_info=True)``
for what ``convert`` / ``merge`` write.
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys

import numpy as np
import pytest
from dist_reference import SAMPLES, assert_no_torch_on_metadata_path, torch_dcp_tensors, values

from ckptscope.formats import open_checkpoint
from ckptscope.formats.registry import detect_format
from ckptscope.formats.verl.reader import verl_complete
from ckptscope.formats.verl.v2_reader import VerlMegatronV2Reader
from ckptscope.ops.model import model_entries
from ckptscope.ops.roots import discover_iterations
from tests.conftest import run_cli


def generator():
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    return importlib.import_module("make_verl_v2_samples")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return generator().write_verl_v2_runs(tmp_path_factory.mktemp("verl_v2"))


def actor(run):
    return generator().actor_dir(run)


def hf_state(path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path / "model.safetensors"))


def test_dist_actor_is_the_torch_dist_model_plus_training_state(runs):
    path = actor(runs["verl_v2_dist"])
    assert detect_format(path) is VerlMegatronV2Reader
    assert verl_complete(path) is True
    model = torch_dcp_tensors(path / "model" / "dist_ckpt")
    optim = torch_dcp_tensors(path / "optimizer" / "dist_ckpt")
    with open_checkpoint(path) as reader:
        index = reader.index()
        assert index.format == "verl_megatron" and index.metadata["iteration"] == 2
        verl = index.metadata["verl"]
        assert (verl["layout"], verl["model"], verl["model_format"], verl["complete"]) == \
            ("v2", "model/dist_ckpt", "megatron_dist", True)
        assert set(index.tensors) == set(model) | set(optim)
        for name, want in {**model, **optim}.items():
            np.testing.assert_array_equal(values(reader.read(name)), want, err_msg=name)
        entries = model_entries(index)
        assert set(entries.stored.values()) == set(model)
        assert set(entries.training["optimizer"]) == set(optim)
        objects = {o.name: o.value for o in index.objects}
        manifest = json.loads((path / "ckpt_contents.json").read_text())
        assert objects["ckpt_contents"] == manifest
        assert objects["transformer_config"] == json.loads((path / "transformer_config.json").read_text())
        assert objects["lr_scheduler"]["num_steps"] == 2
        assert any(name.startswith("rng_state/") for name in objects)
        assert {"ckpt_contents.json", "model/dist_ckpt/metadata.json", "extra/dist_ckpt/.metadata"} <= \
            {f.path for f in index.files}
        assert not index.issues and not index.warnings
    assert_no_torch_on_metadata_path(path, read="decoder.layers.1.mlp.linear_fc1.weight")


def test_mbridge_actor_is_the_hf_safetensors_model(runs):
    path = actor(runs["verl_v2_mbridge"])
    assert not any((path / "model" / "dist_ckpt").iterdir())  # verl's path helper made it; mbridge left it empty
    assert detect_format(path) is VerlMegatronV2Reader
    want = hf_state(path / "model" / "huggingface")
    reference = hf_state(runs["hf"])
    with open_checkpoint(path) as reader:
        index = reader.index()
        assert index.metadata["verl"]["model"] == "model/huggingface"
        entries = model_entries(index)
        assert set(entries.tensors) == set(want) == set(reference)
        for name in want:
            got = reader.read(entries.stored[name])
            np.testing.assert_array_equal(got, want[name], err_msg=name)
            np.testing.assert_array_equal(got, reference[name], err_msg=name)
        assert "optimizer" in entries.training
        assert "model/huggingface/tokenizer.json" in {f.path for f in index.files}
    assert_no_torch_on_metadata_path(path, read="model.embed_tokens.weight")


@pytest.mark.parametrize("run", ["verl_v2_dist", "verl_v2_mbridge"])
def test_inspect_check_and_diff_against_the_hf_model(runs, run):
    root = runs[run]
    shown = run_cli("inspect", str(root))
    assert shown.code == 0, shown.err
    assert "verl checkpoint dir (Megatron, tracker: step 2)" in shown.out
    checked = run_cli("check", str(root))
    assert checked.code == 0, checked.out + checked.err
    diff = run_cli("diff", str(actor(root)), str(runs["hf"]), "--json")
    assert diff.code == 0, diff.err
    report = json.loads(diff.out)
    assert report["identical"] is True
    assert report["summary"]["equal"] == report["summary"]["compared"] == len(hf_state(runs["hf"]))


@pytest.mark.parametrize("run,command", [("verl_v2_dist", "convert"), ("verl_v2_mbridge", "convert"),
                                         ("verl_v2_dist", "merge"), ("verl_v2_mbridge", "merge")])
def test_export_to_hf_loads_in_transformers(runs, tmp_path, run, command):
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    args = [command, str(runs[run]), str(out)] + (["--to", "hf"] if command == "convert" else [])
    if run == "verl_v2_dist":  # verl saves no HF config without a bridge: the user names one
        args += ["--hf-config", str(runs["hf"])]
    done = run_cli(*args)
    assert done.code == 0, done.err
    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True, dtype=torch.float32)
    assert not any(info.values()), info
    reference = hf_state(runs["hf"])
    state = model.state_dict()
    assert set(state) == set(reference)
    for name, want in reference.items():
        np.testing.assert_array_equal(state[name].numpy(), want, err_msg=name)


def test_missing_manifest_is_an_incomplete_save(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["verl_v2_mbridge"], run)
    path = actor(run)
    (path / "ckpt_contents.json").unlink()
    assert verl_complete(path) is False
    [step] = discover_iterations(run)
    assert step.complete is False
    with open_checkpoint(path) as reader:  # still browsable: the parts that are there
        index = reader.index()
        assert [(i.kind, i.file) for i in index.issues] == [("missing-marker", "ckpt_contents.json")]
        assert index.metadata["verl"]["complete"] is False
        assert "model.embed_tokens.weight" in index.tensors
    checked = run_cli("check", str(path))
    assert checked.code == 1 and "missing-marker: ckpt_contents.json: missing: verl writes it last" in checked.out
    opened = run_cli("inspect", str(run))
    assert opened.code == 2 and "without a complete iteration" in opened.err and "incomplete" in opened.err


def test_model_tree_cut_short_is_reported(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["verl_v2_dist"], run)
    path = actor(run)
    (path / "ckpt_contents.json").unlink()
    (path / "model" / "dist_ckpt" / "metadata.json").unlink()  # dist_checkpointing writes it last
    with open_checkpoint(path) as reader:
        index = reader.index()
        assert {(i.kind, i.file) for i in index.issues} == {("missing-marker", "ckpt_contents.json"),
                                                            ("missing-marker", "model/dist_ckpt/metadata.json")}
        assert not model_entries(index).tensors and "optimizer" in model_entries(index).training
    refused = run_cli("convert", str(path), str(tmp_path / "out"), "--to", "hf", "--hf-config", str(runs["hf"]))
    assert refused.code == 2 and "Traceback" not in refused.err


def test_hybrid_save_follows_the_manifest(runs, tmp_path):
    """``use_dist_checkpointing`` and mbridge together: both model/dist_ckpt and model/huggingface hold
    weights; the manifest's ``contents.model`` (the torch_dist tree) is the model shown, the HF export
    is listed beside it."""
    run = tmp_path / "run"
    shutil.copytree(runs["verl_v2_dist"], run)
    path = actor(run)
    shutil.copytree(actor(runs["verl_v2_mbridge"]) / "model" / "huggingface", path / "model" / "huggingface",
                    dirs_exist_ok=True)
    manifest = json.loads((path / "ckpt_contents.json").read_text())
    manifest["contents"]["hf_model"] = {"path": "model/huggingface", "format": "huggingface",
                                        "note": "HF export alongside Megatron model shards under model/dist_ckpt/"}
    manifest["save_contents"] = ["model", "hf_model", "optimizer", "extra"]
    (path / "ckpt_contents.json").write_text(json.dumps(manifest))
    with open_checkpoint(path) as reader:
        index = reader.index()
        assert index.metadata["verl"]["model"] == "model/dist_ckpt"
        assert set(model_entries(index).stored.values()) == set(torch_dcp_tensors(path / "model" / "dist_ckpt"))
        assert "model/huggingface/model.safetensors" in {f.path for f in index.files}
        assert "open it to browse them" in index.metadata["verl"]["hf_weights"]


def test_opens_in_the_tui_with_its_iteration_picker(runs):
    """The run root opens on its picker (global_step_N, complete by ckpt_contents.json); picking the
    step browses the model with the optimizer apart."""
    import asyncio

    from ckptscope.tui.app import make_app
    from ckptscope.tui.screens.browse import BrowseScreen
    from ckptscope.tui.screens.iterations import IterationPickerScreen
    from ckptscope.tui.widgets.summary_header import SummaryHeader

    async def run() -> None:
        app = make_app(str(runs["verl_v2_dist"]), keymap={})
        async with app.run_test(size=(140, 45)) as pilot:
            for _ in range(3):
                await app.workers.wait_for_complete()
                await pilot.pause()
            assert isinstance(app.screen, IterationPickerScreen)
            assert all(info.complete for info in app.screen.iterations)
            await pilot.press("enter")
            for _ in range(5):
                await app.workers.wait_for_complete()
                await pilot.pause()
            assert isinstance(app.screen, BrowseScreen)
            index = app.screen.query_one(SummaryHeader).index
            assert index is not None and index.format == VerlMegatronV2Reader.format_name

    asyncio.run(run())


def test_diff_takes_an_hf_config_when_neither_side_says_the_model(runs, tmp_path):
    """A verl dist-only actor (no Megatron args, no HF config) against its own weights in a safetensors file
    under local-spec Megatron names (``input_layernorm``, as a per-rank save spells them): pairing them goes
    through HF names; the query groups come from the actor's transformer_config.json, or from --hf-config
    (diff once asked for that option without having it; a probe)."""
    from safetensors.numpy import save_file

    local = {".self_attention.linear_qkv.layer_norm_weight": ".input_layernorm.weight",
             ".mlp.linear_fc1.layer_norm_weight": ".pre_mlp_layernorm.weight"}
    source = actor(runs["verl_v2_dist"])
    with open_checkpoint(source) as reader:
        model = model_entries(reader.index(), logical=True)
        flat = {}
        for name, stored in model.stored.items():
            for te, spelled in local.items():
                name = name.replace(te, spelled)
            flat[name] = np.ascontiguousarray(reader.read(stored))
    assert any(".input_layernorm." in name for name in flat)
    save_file(flat, str(tmp_path / "local_names.safetensors"))
    args = ("diff", str(source), str(tmp_path / "local_names.safetensors"), "--json")
    # the actor's transformer_config.json says the query groups: paired without --hf-config (asked for before
    # that file was read; a probe with verl's MegatronCheckpointManager)
    paired = run_cli(*args)
    assert paired.code == 0, paired.out + paired.err
    assert json.loads(paired.out)["mapping"] == "mcore->hf" and json.loads(paired.out)["identical"]
    result = run_cli(*args, "--hf-config", str(runs["hf"]))
    assert result.code == 0, result.out + result.err
    report = json.loads(result.out)
    # every HF tensor, plus the real-vocabulary rows of the two padded vocab tensors as pairs of their own
    assert report["mapping"] == "mcore->hf" and report["summary"]["equal"] == len(hf_state(runs["hf"])) + 2
    assert report["identical"] and report["summary"]["compared"] == report["summary"]["equal"]


def test_a_migrated_mbridge_save_keeps_its_hf_model(runs, tmp_path):
    """An mbridge save of the pre-v2 layout (the HF weights in ``huggingface/``, optimizer and RNG in
    ``dist_ckpt/``) after verl's migration script: the model is ``model/huggingface``, the mirrored tree the
    training state (a reviewer: the tree was taken for the model, 0 parameters, check ok)."""
    import importlib

    source = actor(runs["verl_v2_mbridge"])
    old = tmp_path / "run" / "global_step_2" / "actor"
    shutil.copytree(source / "optimizer" / "dist_ckpt", old / "dist_ckpt")
    shutil.copytree(source / "model" / "huggingface", old / "huggingface")
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    importlib.import_module("make_verl_samples").migrate_like_verl(old)
    with open_checkpoint(old) as reader:
        index = reader.index()
        entries = model_entries(index)
        assert not index.issues and index.metadata["verl"]["migrated"]
        assert set(entries.stored.values()) == set(hf_state(runs["hf"]))
        assert entries.training.get("optimizer")
    out = tmp_path / "hf"
    assert run_cli("convert", str(old), "--to", "hf", str(out)).code == 0
    got, want = hf_state(out), hf_state(runs["hf"])
    assert set(got) == set(want) and all(got[n].tobytes() == want[n].tobytes() for n in want)


def test_transformer_config_is_the_model_an_hf_config_must_agree_with(runs, tmp_path):
    """verl's transformer_config.json (its TransformerConfig) says the heads, groups and epsilon: an
    --hf-config that splits the same QKV another way, or another epsilon, exported with exit 0 (a probe
    with verl 0.9.1's MegatronCheckpointManager: logits off by 4.9) and is now refused."""
    config = json.loads((runs["hf"] / "config.json").read_text())
    for change in ({"rms_norm_eps": 1e-2},
                   {"num_attention_heads": 2 * config["num_attention_heads"],
                    "num_key_value_heads": 2 * config["num_key_value_heads"],
                    "head_dim": config["hidden_size"] // config["num_attention_heads"] // 2}):
        wrong = tmp_path / f"wrong-{next(iter(change))}"
        shutil.copytree(runs["hf"], wrong)
        (wrong / "config.json").write_text(json.dumps({**config, **change}))
        out = tmp_path / f"out-{next(iter(change))}"
        refused = run_cli("convert", str(runs["verl_v2_dist"]), str(out), "--to", "hf", "--hf-config", str(wrong))
        assert refused.code == 2 and "describes another model than this checkpoint's Megatron args" in refused.err
        assert not out.exists()
    without = run_cli("convert", str(runs["verl_v2_dist"]), str(tmp_path / "none"), "--to", "hf")
    assert without.code == 2 and "transformer_config.json" in without.err and "--hf-config" in without.err


def test_parts_the_manifest_lists_must_be_there(runs, tmp_path):
    """verl's load_checkpoint opens the optimizer and extra trees the manifest lists: gone or emptied, the
    save cannot resume (check said ok); the model itself still exports, and says what is missing."""
    run = tmp_path / "run"
    shutil.copytree(runs["verl_v2_dist"], run)
    path = actor(run)
    for file in (path / "optimizer" / "dist_ckpt").iterdir():
        file.unlink()
    shutil.rmtree(path / "extra")
    (path / "transformer_config.json").unlink()
    checked = run_cli("check", str(path), "--json")
    assert checked.code == 1
    problems = {(p["kind"], p["file"]) for p in json.loads(checked.out)["problems"]}
    assert problems == {("missing-state-file", "optimizer/dist_ckpt"), ("missing-state-file", "extra/dist_ckpt"),
                        ("missing-file", "transformer_config.json")}
    out = tmp_path / "hf"
    done = run_cli("convert", str(path), str(out), "--to", "hf", "--hf-config", str(runs["hf"]))
    assert done.code == 0, done.err
    assert "optimizer/dist_ckpt: missing" in done.err and "extra/dist_ckpt: missing" in done.err


def test_verify_comes_back_at_the_tp_size_transformer_config_records(runs):
    """verify's return leg writes the source's layout: a verl save records it in transformer_config.json
    (no Megatron args), and a probe's TP2 save came back at TP 1."""
    from ckptscope.ops.verify import source_facts

    family, tp, pp, _ = source_facts(actor(runs["verl_v2_dist"]))
    config = json.loads((actor(runs["verl_v2_dist"]) / "transformer_config.json").read_text())
    assert (family, tp, pp) == ("mcore", config["tensor_model_parallel_size"], config["pipeline_model_parallel_size"])
    assert tp == 2
