"""Megatron-LM ``--ckpt-format torch_dcp`` and ``fsdp_dtensor`` save roots (FORMATS.md §4.10).

The fixtures (sample_ckpts/make_megatron_dcp_samples.py) hold hf_llama_gqa's weights in a real
megatron-core GPTModel, saved with torch's own ``dcp.save`` in the layout Megatron-LM's
checkpointing.py gives each format. Every claim is judged by an independent client: torch's DCP
loader (``dcp_to_torch_save``) for what is stored, transformers ``from_pretrained`` for exports.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from tests.conftest import REPO
from dist_reference import assert_no_torch_on_metadata_path

from ckptscope.core.errors import CkptError
from ckptscope.core.tensor import Chunk, TensorMeta
from ckptscope.formats import open_checkpoint
from ckptscope.formats.megatron.dcp_layout import ckpt_format_of, fuse_pair, fuse_split_fc1, split_fc1_pairs
from ckptscope.formats.megatron.dcp_reader import MegatronDcpReader
from ckptscope.formats.registry import detect_format
from ckptscope.ops.model import model_entries

KINDS = ("torch_dcp", "fsdp_dtensor")
ITER = "iter_0000003"
HF_SAMPLE = REPO / "sample_ckpts" / "hf_llama_gqa"


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    """Both save roots, freshly written next to a copy of the HF original they hold."""
    out = tmp_path_factory.mktemp("megatron_dcp")
    shutil.copytree(HF_SAMPLE, out / "hf_llama_gqa")
    if str(REPO / "sample_ckpts") not in sys.path:  # importable by name, so spawned ranks can unpickle
        sys.path.insert(0, str(REPO / "sample_ckpts"))
    gen = importlib.import_module("make_megatron_dcp_samples")
    return {kind: gen.WRITERS[f"megatron_{kind}"](out) for kind in KINDS}


@pytest.fixture(scope="module")
def torch_view(roots, tmp_path_factory) -> dict[str, dict]:
    """Each iteration dir as torch itself loads it: ``dcp_to_torch_save`` then ``torch.load``."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = {}
    for kind, root in roots.items():
        target = tmp_path_factory.mktemp(kind) / "full.pt"
        dcp_to_torch_save(str(root / ITER), str(target))
        out[kind] = torch.load(target, weights_only=False)  # our own fixture: it holds an argparse.Namespace
    return out


@pytest.fixture(scope="module")
def hf_reference():
    """transformers' model of the HF original and its logits on a fixed batch."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(HF_SAMPLE), attn_implementation="eager").float().eval()
    tokens = torch.arange(24).reshape(2, 12) * 7 % model.config.vocab_size
    with torch.no_grad():
        return model.state_dict(), tokens, model(input_ids=tokens).logits


def _flat(tree: dict | list, prefix: str = "") -> dict:
    """Dotted names as DCP's ``flatten_state_dict`` spells them (lists by position)."""
    out = {}
    for key, value in (tree.items() if isinstance(tree, dict) else enumerate(tree)):
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list)):
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


# --- the fixtures are what torch and Megatron say they are -----------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_torch_dcp_loader_reads_the_fixture(torch_view, kind):
    full = torch_view[kind]
    assert full["iteration"] == 3 and full["checkpoint_version"] == 3.0
    assert full["args"].ckpt_format == kind
    model = full["model"]
    if kind == "torch_dcp":
        assert "decoder.layers.1.mlp.linear_fc1.weight" in model
        # torch's own optimizer state_dict, keyed by parameter index (DCP keeps the keys as text)
        assert sorted(full["optimizer"]["state"], key=int) == [str(i) for i in range(15)]
    else:
        assert "module.decoder.layers.1.mlp.linear_fc1.weight_w" in model
        assert "module.decoder.layers.1.mlp.linear_fc1.weight" not in model
        state = full["optimizer"]["state"]
        assert "module.module.module.decoder.layers.0.mlp.linear_fc1.weight_v" in state
        assert set(full["rng_state"]) == {"(0, 0)"}


# --- detection, metadata, bytes ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_detected_as_megatron_with_iteration_and_format(roots, kind):
    path = roots[kind] / ITER
    assert detect_format(path) is MegatronDcpReader
    index = open_checkpoint(path).index()
    assert index.format == "megatron_dcp"
    assert index.metadata["megatron"] == {"ckpt_format": kind}
    assert index.metadata["iteration"] == 3 and index.metadata["checkpoint_version"] == 3.0
    assert not index.issues and not index.warnings
    args = next(o.value for o in index.objects if o.name == "args")
    assert args["num_query_groups"] == 2 and args["ckpt_format"] == kind
    model = [m for n, m in index.tensors.items() if n.startswith("model.")]
    if kind == "torch_dcp":  # FSDP2 on 2 ranks: every parameter is a DTensor in two row shards
        assert sorted(f.path for f in index.files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        assert all(len(m.chunks) == 2 and m.chunks[1].offsets[0] > 0 for m in model)


@pytest.mark.parametrize("kind", KINDS)
def test_every_tensor_equals_what_torch_loads(roots, torch_view, kind):
    reader = open_checkpoint(roots[kind] / ITER)
    index = reader.index()
    expected = _flat(torch_view[kind])
    for name, meta in index.tensors.items():
        stored_as = meta.attr("stored_as")
        if stored_as:  # fsdp_dtensor fc1, fused from its two stored halves
            want = torch.cat([expected[name + "_w"], expected[name + "_v"]])
        else:
            want = expected[name]
        got = torch.from_numpy(reader.read(name).copy()) if meta.dtype != "bfloat16" else None
        assert got is not None and torch.equal(got, want.reshape(got.shape)), name


def test_fsdp_dtensor_fc1_is_fused_model_side_only(roots):
    index = open_checkpoint(roots["fsdp_dtensor"] / ITER).index()
    fused = index.tensors["model.module.decoder.layers.0.mlp.linear_fc1.weight"]
    assert fused.shape == (192, 64) and len(fused.chunks) == 2
    assert "weight_w (rows 0-95)" in fused.attr("stored_as")
    assert not any(n.startswith("model.") and n.endswith(("_w", "_v")) for n in index.tensors)
    assert "optimizer.state.module.module.module.decoder.layers.0.mlp.linear_fc1.weight_w.exp_avg" in index.tensors


@pytest.mark.parametrize("kind,prefix", [("torch_dcp", "model."), ("fsdp_dtensor", "model.module.")])
def test_model_and_optimizer_are_split(roots, kind, prefix):
    entries = model_entries(open_checkpoint(roots[kind] / ITER).index())
    assert entries.prefix == prefix and entries.naming == "mcore"
    assert len(entries.tensors) == 15 and not entries.unknown
    assert entries.num_params == 90432
    assert set(entries.training) == {"optimizer", "rng"}
    assert len(entries.training["optimizer"]) == (45 if kind == "torch_dcp" else 51)


def test_metadata_path_imports_no_torch(roots):
    fused = "model.module.decoder.layers.1.mlp.linear_fc1.weight"
    assert_no_torch_on_metadata_path(roots["fsdp_dtensor"] / ITER, fused)


def test_format_from_keys():
    assert ckpt_format_of(["model.decoder.layers.0.mlp.linear_fc1.weight"]) == "torch_dcp"
    assert ckpt_format_of(["model.module.decoder.final_layernorm.weight"]) == "fsdp_dtensor"
    # a converter run with another --output-model-weight-prefix still splits SwiGLU fc1
    fc1 = "w.decoder.layers.0.mlp.experts.linear_fc1.weight3"
    split = [fc1 + "_w", fc1 + "_v"]
    assert ckpt_format_of(split) == "fsdp_dtensor"
    assert split_fc1_pairs(split) == {fc1: tuple(split)}


def test_fuse_refuses_halves_that_do_not_stack():
    chunk = Chunk(offsets=(0, 0), shape=(4, 8), file="f")
    gate = TensorMeta("a.linear_fc1.weight_w", "float32", (4, 8), (chunk,))
    up = TensorMeta("a.linear_fc1.weight_v", "bfloat16", (4, 8), (chunk,))
    assert fuse_pair("a.linear_fc1.weight", gate, up) is None
    tensors, warnings = fuse_split_fc1({gate.name: gate, up.name: up})
    assert set(tensors) == {gate.name, up.name} and len(warnings) == 1


# --- CLI: inspect, check, convert, merge, diff, rename, open ----------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_inspect_and_check(roots, cli, kind):
    result = cli("inspect", str(roots[kind]))
    assert result.code == 0, result.err
    assert f"Megatron-LM save root ({kind}, tracker: iteration 3)" in result.out
    assert f"Megatron-LM iteration dir ({kind}, iteration 3)" in result.out
    data = json.loads(cli("inspect", "--json", str(roots[kind] / ITER)).out)
    assert data["format"] == "megatron_dcp"
    checked = cli("check", str(roots[kind]))
    assert checked.code == 0 and "ok:" in checked.out, checked.out + checked.err


@pytest.mark.parametrize("kind,command", [("torch_dcp", "convert"), ("fsdp_dtensor", "merge")])
def test_export_to_hf_loads_in_transformers_with_equal_logits(roots, cli, tmp_path, hf_reference, kind, command):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    args = [command, str(roots[kind]), str(out)] + (["--to", "hf"] if command == "convert" else [])
    result = cli(*args)
    assert result.code == 0, result.err
    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True,
                                                       attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    reference, tokens, logits = hf_reference
    for name, value in model.state_dict().items():
        assert torch.equal(value, reference[name]), name
    with torch.no_grad():
        assert torch.equal(model.float().eval()(input_ids=tokens).logits, logits)


@pytest.mark.parametrize("kind", KINDS)
def test_diff_against_the_hf_original_across_naming(roots, cli, kind):
    result = cli("diff", str(roots[kind]), str(HF_SAMPLE))
    assert result.code == 0, result.out + result.err
    assert "identical" in result.out and "Megatron-Core names mapped to HF" in result.out


def test_diff_between_the_two_formats(roots, cli):
    result = cli("diff", str(roots["fsdp_dtensor"]), str(roots["torch_dcp"]))
    assert result.code == 0 and "identical" in result.out, result.out + result.err


def test_rename_torch_dcp_but_refuse_fused_fsdp_dtensor(roots, cli, tmp_path):
    ok = cli("rename", str(roots["torch_dcp"] / ITER), str(tmp_path / "renamed"), "--drop", "^optimizer")
    assert ok.code == 0, ok.err
    index = open_checkpoint(tmp_path / "renamed").index()
    assert index.format == "megatron_dcp" and not any(n.startswith("optimizer") for n in index.tensors)
    refused = cli("rename", str(roots["fsdp_dtensor"] / ITER), str(tmp_path / "no"), "--drop", "^optimizer")
    assert refused.code == 2 and len(refused.err.strip().splitlines()) == 1
    assert "fsdp_dtensor" in refused.err and not (tmp_path / "no").exists()


@pytest.mark.parametrize("damage", ["truncate", "metadata"])
def test_damage_is_one_line_and_exit_2(roots, cli, tmp_path, damage):
    root = tmp_path / "root"
    shutil.copytree(roots["fsdp_dtensor"], root)
    if damage == "truncate":
        os.truncate(root / ITER / "__0_0.distcp", 100_000)  # the model's bytes are cut too
    else:
        (root / ITER / ".metadata").write_bytes(b"\x80\x05garbage")
    result = cli("convert", str(root), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2, result.out + result.err
    assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err
    assert not (tmp_path / "out").exists()
    if damage == "truncate":
        checked = cli("check", str(root))
        assert checked.code != 0 and "truncated" in checked.out


def test_opens_in_the_tui(roots):
    from ckptscope.tui.app import make_app
    from ckptscope.tui.screens.browse import BrowseScreen
    from ckptscope.tui.widgets.summary_header import SummaryHeader

    async def run() -> None:
        app = make_app(roots["fsdp_dtensor"] / ITER, keymap={})
        async with app.run_test(size=(140, 45)) as pilot:
            for _ in range(3):
                await app.workers.wait_for_complete()
                await pilot.pause()
            assert isinstance(app.screen, BrowseScreen)
            index = app.screen.query_one(SummaryHeader).index
            assert index is not None and index.format == "megatron_dcp"

    asyncio.run(run())


def test_unreadable_dir_is_not_claimed(tmp_path):
    (tmp_path / ".metadata").write_bytes(b"")
    assert not MegatronDcpReader.supports(tmp_path)
    with pytest.raises(CkptError):
        open_checkpoint(tmp_path).index()


def test_export_missing_a_layer_is_refused(roots, cli, tmp_path):
    """What a pipeline-parallel save leaves (one stage's stage-local layers) must not export as a
    model whose config promises every layer: transformers would re-initialise the rest silently."""
    part = tmp_path / "one_layer"
    assert cli("rename", str(roots["torch_dcp"] / ITER), str(part), "--drop", r"layers\.1\.").code == 0
    result = cli("convert", str(part), str(tmp_path / "out"), "--to", "hf")
    assert result.code == 2 and "decoder layers 0 but config.json implies 2" in result.err, result.err
    assert not (tmp_path / "out").exists()


def test_pipeline_parallel_save_is_flagged(tmp_path):
    import argparse

    import torch.distributed.checkpoint as dcp

    args = argparse.Namespace(num_layers=4, pipeline_model_parallel_size=2, ckpt_format="torch_dcp")
    state = {"args": args, "checkpoint_version": 3.0, "iteration": 7,
             "model": {"decoder.layers.0.mlp.linear_fc2.weight": torch.ones(2, 2)}}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "iter_0000007")))
    index = open_checkpoint(tmp_path / "iter_0000007").index()
    assert index.format == "megatron_dcp" and index.metadata["iteration"] == 7
    assert any("pipeline parallelism 2" in w for w in index.warnings)


def test_converted_checkpoint_keeps_its_source_args(tmp_path):
    """checkpoint_inspector's torch_dist -> fsdp_dtensor converter copies the torch_dist run's args:
    the keys decide the format, the disagreement is shown."""
    import argparse

    import torch.distributed.checkpoint as dcp

    state = {"args": argparse.Namespace(num_layers=1, ckpt_format="torch_dist"), "checkpoint_version": 3.0,
             "iteration": 2, "model": {"module.decoder.final_layernorm.weight": torch.ones(4)}}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "iter_0000002")))
    index = open_checkpoint(tmp_path / "iter_0000002").index()
    assert index.metadata["megatron"] == {"ckpt_format": "fsdp_dtensor", "args_ckpt_format": "torch_dist"}
    assert any("--ckpt-format torch_dist" in w for w in index.warnings)
