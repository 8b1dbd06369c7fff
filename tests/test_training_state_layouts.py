"""Real trainers' checkpoints (GitHub issue "Real trainers' checkpoints"): the model's weights must be
told apart from training state, found under the wrapper key the trainer used, and the save roots
the trainers leave must be accepted as they are.

Every layout is written by sample_ckpts/make_training_state_samples.py with the real writers
(megatron-core's optimizer and ``dist_checkpointing.save`` as Megatron-LM composes it, torchtitan's
flattened DCP state, ``torch.distributed.checkpoint`` of an FSDP2 transformers model). Each writer
keeps the model's weights in HF names next to the checkpoint (``<name>_ref/``, checked by the
generator against the trainer's own model), which is the oracle here; outputs are read with
safetensors and transformers, never with ckptscope. Everything goes through the real CLI.

The layouts are generated once per test session into a shared temp dir (one generation even under
``pytest -n 2``: workers take a file lock per layout), about a minute of CPU in all.
"""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from tests.conftest import run_cli
from safetensors import safe_open
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_ckpts"
TRACKER = "latest_checkpointed_iteration.txt"
MEGATRON = ("megatron_nondist_optim", "megatron_bf16_optim")
TRAINING_STATE_PREFIXES = ("train_state.", "optimizer.", "lr_scheduler.", "dataloader.", "optim.")


def generators():
    """The generator as an importable module: mp.spawn pickles its rank functions by module name."""
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    return importlib.import_module("make_training_state_samples")


@pytest.fixture(scope="session")
def layouts_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by the workers of this run
    out = base / "training_state_layouts"
    out.mkdir(exist_ok=True)
    return out


def _generated(out: Path, name: str) -> Path:
    """Write layout ``name`` into ``out`` unless a worker already did (file lock + done marker).

    A rank killed by a signal (seen once: SIGABRT in a gloo rank on a loaded 2-core machine, not
    reproducible) gets one more try, with a warning; a Python error in a rank fails at once."""
    from torch.multiprocessing.spawn import ProcessExitedException

    with open(out / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = out / f".{name}.done"
        if not done.exists():
            try:
                generators().WRITERS[name](out)
            except ProcessExitedException as exc:
                if not exc.signal_name:
                    raise
                warnings.warn(f"generating {name}: {exc}; trying once more", stacklevel=1)
                generators().WRITERS[name](out)
            done.touch()
    return out / name


@pytest.fixture(scope="session")
def megatron(layouts_dir) -> dict[str, Path]:
    return {name: _generated(layouts_dir, name) for name in MEGATRON}


@pytest.fixture(scope="session")
def release(layouts_dir, megatron) -> Path:
    return _generated(layouts_dir, "megatron_release")


@pytest.fixture(scope="session")
def titan(layouts_dir) -> Path:
    return _generated(layouts_dir, "torchtitan_run")


@pytest.fixture(scope="session")
def dcp_layout(layouts_dir) -> Path:
    return _generated(layouts_dir, "dcp_model_optim")


def _ref(root: Path, name: str | None = None) -> dict:
    return json.loads((root.parent / f"{name or root.name}_ref.json").read_text())


def _load_dir(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


def _stored_names(path: Path) -> list[str]:
    names: list[str] = []
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            names.extend(handle.keys())
    return names


def _assert_bitwise(got: dict, want: dict, what: str) -> None:
    assert sorted(got) == sorted(want), f"{what}: keys differ: {sorted(set(got) ^ set(want))}"
    for name, value in want.items():
        assert got[name].dtype == value.dtype, (what, name, got[name].dtype, value.dtype)
        assert got[name].shape == value.shape, (what, name, tuple(got[name].shape), tuple(value.shape))
        assert torch.equal(got[name], value), f"{what}: {name} differs from the reference"


def _from_pretrained(path: Path, dtype=None):
    from transformers import AutoModelForCausalLM

    kwargs = {"output_loading_info": True, "attn_implementation": "eager"}
    if dtype is not None:
        kwargs["dtype"] = dtype
    model, info = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    return model.eval(), info


def _assert_clean_load(info: dict) -> None:
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info.get(key), f"from_pretrained: {key} = {info.get(key)}"
    assert not info.get("error_msgs"), info.get("error_msgs")


def _one_line_error(result) -> None:
    assert result.code == 2, (result.code, result.out, result.err)
    assert result.err.count("\n") == 1 and result.err.endswith("\n"), result.err
    assert "Traceback" not in result.err


# --- Megatron-LM torch_dist roots with optimizer state --------------------------------------------------


@pytest.fixture(scope="session")
def megatron_hf(megatron, tmp_path_factory) -> dict[str, tuple]:
    """``convert ROOT OUT --to hf`` of each Megatron root, with and without optimizer state (run once)."""
    out = tmp_path_factory.mktemp("megatron_hf")
    results = {}
    for name, root in megatron.items():
        for suffix in ("", "_no_optim"):
            src = root.parent / f"{name}{suffix}"
            dst = out / f"{name}{suffix}"
            results[name + suffix] = (run_cli("convert", str(src), str(dst), "--to", "hf"), dst)
    return results


@pytest.mark.parametrize("name", MEGATRON)
def test_megatron_convert_keeps_exactly_the_model(megatron, megatron_hf, name):
    """The export holds the HF model and nothing else, bitwise the trained model's weights (the bf16
    parameters, not the optimizer's fp32 master copies), and equals the export of the same model
    saved without optimizer."""
    result, out = megatron_hf[name]
    assert result.code == 0, result.err
    ref = megatron[name].parent / f"{name}_ref"
    _assert_bitwise(_load_dir(out), _load_dir(ref), f"{name} -> hf")
    names = _stored_names(out)
    assert not [n for n in names if n.startswith(TRAINING_STATE_PREFIXES) or "exp_avg" in n or "fp32_param" in n]
    twin, twin_out = megatron_hf[f"{name}_no_optim"]
    assert twin.code == 0, twin.err
    _assert_bitwise(_load_dir(out), _load_dir(twin_out), f"{name} vs {name}_no_optim")


@pytest.mark.parametrize("name", MEGATRON)
def test_megatron_export_loads_in_transformers_with_the_trainers_logits(megatron, megatron_hf, name):
    result, out = megatron_hf[name]
    assert result.code == 0, result.err
    ref = _ref(megatron[name])
    model, info = _from_pretrained(out, dtype=torch.float32)
    _assert_clean_load(info)
    saved = load_file(str(megatron[name].parent / f"{name}_ref_logits.safetensors"))
    with torch.no_grad():
        logits = model(input_ids=saved["tokens"]).logits.float()
    assert torch.isfinite(logits).all()
    # fp32: the GPTModel's own logits; bf16: the GPTModel ran in bf16, transformers here in fp32.
    atol = 1e-5 if not ref["bf16"] else 0.25
    diff = float((logits - saved["logits"]).abs().max())
    assert diff <= atol, f"{name}: logits differ from Megatron's by {diff:.3g}"


@pytest.mark.parametrize("name", MEGATRON)
def test_megatron_merge_gives_the_same_model(megatron, cli, tmp_path, name):
    out = tmp_path / "merged"
    result = cli("merge", str(megatron[name]), str(out))
    assert result.code == 0, result.err
    _assert_bitwise(_load_dir(out), _load_dir(megatron[name].parent / f"{name}_ref"), f"merge {name}")


@pytest.mark.parametrize("name", MEGATRON)
def test_megatron_diff_with_and_without_optimizer_is_identical(megatron, cli, name):
    root = megatron[name]
    result = cli("diff", str(root), str(root.parent / f"{name}_no_optim"), "--plain")
    assert result.code == 0, result.out + result.err


@pytest.mark.parametrize("name", MEGATRON)
def test_megatron_verify(megatron, cli, name):
    """Megatron -> HF -> Megatron at the save's own TP (its vocabulary padded as before): every tensor comes
    back equal but the vocab padding rows megatron-core trained, which HF has no place for; the report
    says that this is all that differs."""
    result = cli("verify", str(megatron[name]), "--json")
    data = json.loads(result.out)
    differing = [t["name"] for t in data["tensors"] if t["status"] != "equal"]
    assert set(differing) <= {"embedding.word_embeddings.weight", "output_layer.weight"}, differing
    for name in differing:
        assert next(t for t in data["tensors"] if t["name"].startswith(name + "[:"))["status"] == "equal"
    assert any(n.startswith("only the vocab padding rows differ") for n in data["notes"]) == bool(differing)
    assert result.code == (1 if differing else 0), result.err


@pytest.mark.parametrize("name", MEGATRON)
def test_megatron_num_params_counts_the_model_only(megatron, cli, name):
    result = cli("inspect", str(megatron[name]), "--json")
    assert result.code == 0, result.err
    metadata = json.loads(result.out)["metadata"]
    assert metadata["num_params"] == _ref(megatron[name])["num_params"]  # padded vocab rows included


@pytest.mark.parametrize("name", MEGATRON)
def test_megatron_check(megatron, cli, name):
    result = cli("check", str(megatron[name]))
    assert result.code == 0, result.out + result.err


@pytest.mark.parametrize("name", ["megatron_nondist_optim"])
def test_megatron_timeline_counts_stacked_adam_state_as_followed(megatron, cli, tmp_path, name):
    """Megatron's non-distributed optimizer keeps ``exp_avg_sq`` stacked over layers, read per layer through
    views: the stacked entries are not state "of no tensor of the model" (a note said so while the table
    had their statistics; a probe with verl's Megatron saves)."""
    import shutil

    root = tmp_path / "root"
    shutil.copytree(megatron[name], root)
    [iteration] = [p for p in root.iterdir() if p.name.startswith("iter_")]
    shutil.copytree(iteration, root / f"iter_{int(iteration.name[5:]) + 1:07d}")
    (root / "latest_checkpointed_iteration.txt").write_text(str(int(iteration.name[5:]) + 1))
    result = cli("timeline", str(root), "--json")
    assert result.code in (0, 1), result.err
    doc = json.loads(result.out)
    assert doc["optimizer"]["modules"], doc["optimizer"]["note"]
    assert not any("name no tensor of the model" in note for note in doc["notes"]), doc["notes"]


# --- Megatron release root -----------------------------------------------------------------------------


def test_release_root_is_accepted_everywhere(release, megatron, cli, tmp_path):
    assert (release / TRACKER).read_text().strip() == "release"
    inspected = cli("inspect", str(release))
    assert inspected.code == 0, inspected.err
    as_json = cli("inspect", str(release), "--json")
    assert as_json.code == 0, as_json.err
    assert Path(json.loads(as_json.out)["path"]).name == "release"
    assert cli("check", str(release)).code == 0
    out = tmp_path / "hf"
    converted = cli("convert", str(release), str(out), "--to", "hf")
    assert converted.code == 0, converted.err
    ref = megatron["megatron_nondist_optim"].parent / "megatron_nondist_optim_ref"
    _assert_bitwise(_load_dir(out), _load_dir(ref), "release -> hf")
    diff = cli("diff", str(release), str(megatron["megatron_nondist_optim"]), "--plain")
    assert diff.code == 0, diff.out + diff.err


# --- torchtitan dump folder ----------------------------------------------------------------------------


def test_torchtitan_check_needs_no_megatron_tracker(titan, cli):
    folder = titan / "checkpoint"
    assert not (folder / TRACKER).exists() and not (titan / TRACKER).exists()
    result = cli("check", str(folder))
    assert result.code == 0, result.out + result.err
    assert "latest_checkpointed_iteration" not in result.out + result.err


def test_torchtitan_dump_folder_stands_for_its_checkpoint_folder(titan, cli):
    """Users point at the --job.dump_folder they passed; the saves are in its checkpoint/."""
    for command in ("check", "inspect"):
        result = cli(command, str(titan), "--json")
        assert result.code == 0, result.err
        doc = json.loads(result.out)
        opened = doc.get("target") or doc["path"]
        assert Path(opened).name == "step-4", doc


def test_torchtitan_inspect_picks_steps_and_counts_the_model(titan, cli):
    folder = titan / "checkpoint"
    assert cli("inspect", str(folder)).code == 0
    want = _ref(titan)["num_params"]
    latest = cli("inspect", str(folder), "--json")
    assert latest.code == 0, latest.err
    latest = json.loads(latest.out)
    assert Path(latest["path"]).name == "step-4"
    assert latest["metadata"]["num_params"] == want
    older = cli("inspect", str(folder), "--iteration", "2", "--json")
    assert older.code == 0, older.err
    older = json.loads(older.out)
    assert Path(older["path"]).name == "step-2"
    assert older["metadata"]["num_params"] == want


@pytest.mark.parametrize("how", ["merge-step", "merge-folder", "convert-folder"])
def test_torchtitan_export_never_carries_training_state(titan, cli, tmp_path, how):
    """torchtitan names are not HF names: refusing with one line is fine, a correct export is fine,
    an export with optimizer / scheduler / data-loader / train-state tensors in it is not."""
    folder = titan / "checkpoint"
    config = titan.parent / "torchtitan_run_hf_config"
    out = tmp_path / "out"
    if how == "merge-step":
        result = cli("merge", str(folder / "step-4"), str(out), "--hf-config", str(config))
    elif how == "merge-folder":
        result = cli("merge", str(folder), str(out), "--hf-config", str(config))
    else:
        result = cli("convert", str(folder), str(out), "--to", "hf", "--hf-config", str(config))
    if out.exists():
        names = _stored_names(out)
        assert not [n for n in names if n.startswith(TRAINING_STATE_PREFIXES)], names
    if result.code == 0:
        ref = titan.parent / "torchtitan_run_ref" / "step-4"
        _assert_bitwise(_load_dir(out), _load_dir(ref), f"torchtitan {how}")
    else:
        _one_line_error(result)
        assert not out.exists()


# --- plain DCP {"model": ..., "optim": ...} of an FSDP2 transformers model ------------------------------


def test_dcp_model_optim_merges_to_the_hf_model(dcp_layout, cli, tmp_path):
    out = tmp_path / "hf"
    config = dcp_layout.parent / "dcp_model_optim_hf_config"
    result = cli("merge", str(dcp_layout), str(out), "--hf-config", str(config))
    assert result.code == 0, result.err
    got = _load_dir(out)
    assert "model.embed_tokens.weight" in got and "lm_head.weight" in got
    assert not [n for n in got if n.startswith(("model.model.", "model.lm_head", "optim."))], sorted(got)
    _assert_bitwise(got, _load_dir(dcp_layout.parent / "dcp_model_optim_ref"), "dcp merge")
    _, info = _from_pretrained(out)
    _assert_clean_load(info)


def test_dcp_model_optim_diff_finds_the_model_under_its_wrapper(dcp_layout, cli):
    result = cli("diff", str(dcp_layout), str(dcp_layout.parent / "dcp_model_optim_ref"), "--plain")
    assert result.code == 0, result.out + result.err


def test_dcp_model_optim_num_params(dcp_layout, cli):
    result = cli("inspect", str(dcp_layout), "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["metadata"]["num_params"] == _ref(dcp_layout)["num_params"]


# --- parallel sizes the model cannot take ----------------------------------------------------------------


def test_tp_that_does_not_divide_the_heads_is_refused(dcp_layout, cli, tmp_path):
    hf_dir = dcp_layout.parent / "dcp_model_optim_ref"  # transformers save_pretrained of the tiny Llama
    assert json.loads((hf_dir / "config.json").read_text())["num_attention_heads"] == 4
    out = tmp_path / "mcore"
    result = cli("convert", str(hf_dir), str(out), "--to", "mcore", "--tp", "3")
    _one_line_error(result)
    assert "head" in result.err
    assert not out.exists()
