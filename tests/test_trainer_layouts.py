"""Real trainers' checkpoints: the model's weights told apart from the training state beside them.

Fixtures come from sample_ckpts/make_trainer_samples.py, each written by the real framework on CPU: a
transformers ``Trainer`` output dir (``checkpoint-2/``, ``checkpoint-4/``), accelerate's
``save_state`` of an FSDP2 run (``pytorch_model_fsdp_0/`` DCP + ``optimizer_0/``), and a tied-embedding
Llama as transformers 5 saves it (safetensors, no ``lm_head.weight``) and as 4.x saved it
(``pytorch_model.bin`` with both names on one storage). Ground truth: the weights the Trainer's
``on_save`` callback and the FSDP2 ranks' ``full_tensor()`` saw, written outside the sample dirs.
Everything goes through the real CLI (``python -m ckptscope``) and is checked with transformers'
``from_pretrained`` and safetensors' ``safe_open``.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from tests.conftest import load_sample_module, run_cli

OPTIMIZER_WORDS = ("exp_avg", "exp_avg_sq", "optimizer", "rng", "scheduler")


# --- fixtures: each sample written once per test run (shared by xdist workers) -------------------------


@pytest.fixture(scope="session")
def gen():
    return load_sample_module("make_trainer_samples")


def _write_once(tmp_path_factory, worker: str, name: str, write) -> Path:
    """Run ``write(out_dir)`` once per test run: xdist workers share one dir under a file lock."""
    if worker == "master":
        return write(tmp_path_factory.mktemp(name))
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / f"trainer_samples_{name}"
    with FileLock(str(shared) + ".lock"):
        done = shared / ".done"
        if not done.exists():
            if shared.exists():
                shutil.rmtree(shared)
            shared.mkdir()
            result = write(shared)
            done.write_text(str(result.relative_to(shared)))
        return shared / done.read_text()


@pytest.fixture(scope="session")
def worker(request) -> str:
    """pytest-xdist's worker id ("master" without xdist), session-scoped for the session fixtures."""
    return getattr(request.config, "workerinput", {}).get("workerid", "master")


@pytest.fixture(scope="session")
def trainer_run(tmp_path_factory, worker, gen) -> Path:
    return _write_once(tmp_path_factory, worker, "hf_trainer_run",
                       lambda out: gen.write_hf_trainer_run(out, reference=True))


@pytest.fixture(scope="session")
def accelerate_run(tmp_path_factory, worker, gen) -> Path:
    return _write_once(tmp_path_factory, worker, "accelerate_fsdp2",
                       lambda out: gen.write_accelerate_fsdp2(out, reference=True))


@pytest.fixture(scope="session")
def tied(tmp_path_factory, gen) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("tied")
    return {"bin": gen.write_hf_tied_bin(out), "safetensors": gen.write_hf_tied_safetensors(out)}


def trainer_reference(gen, run: Path, step: int) -> dict:
    return gen.load_reference(gen.reference_dir(run) / f"checkpoint-{step}.safetensors")


def accelerate_reference(gen, run: Path) -> dict:
    return gen.load_reference(gen.reference_dir(run) / "model.safetensors")


# --- helpers ---------------------------------------------------------------------------------------


def bits(tensor) -> tuple:
    """dtype, shape and the raw bytes: equal bits, not merely equal values."""
    import torch

    return str(tensor.dtype), tuple(tensor.shape), tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def read_out(out: Path) -> dict:
    """Every tensor of every ``*.safetensors`` in an exported dir, read with safetensors itself."""
    from safetensors import safe_open

    tensors = {}
    files = sorted(out.glob("*.safetensors"))
    assert files, f"no .safetensors in {out}: {sorted(p.name for p in out.iterdir())}"
    for path in files:
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                assert name not in tensors, f"{name} stored twice in {out}"
                tensors[name] = f.get_tensor(name)
    return tensors


def assert_bitwise(out: Path, reference: dict) -> None:
    got = read_out(out)
    assert sorted(got) == sorted(reference), (
        f"extra: {sorted(set(got) - set(reference))}, missing: {sorted(set(reference) - set(got))}")
    for name, want in reference.items():
        assert bits(got[name]) == bits(want), f"{name} differs from the reference"


def assert_loads_in_transformers(out: Path) -> None:
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info[key], f"from_pretrained({out}): {key} = {sorted(info[key])}"


def ok(result, what: str) -> None:
    assert result.code == 0, f"{what}: exit {result.code}\nstderr: {result.err.strip()}\nstdout: {result.out[-2000:]}"


def one_line_error(result) -> bool:
    lines = result.err.strip().splitlines()
    return result.code == 2 and len(lines) == 1 and "Traceback" not in result.err


EXPORTS = {"merge": ("merge",), "convert --to hf": ("convert", "--to", "hf")}


def export(command: str, src: Path, out: Path, *extra: str):
    verb, *opts = EXPORTS[command]
    return run_cli(verb, str(src), str(out), *opts, *extra)


# --- HF Trainer output dir ---------------------------------------------------------------------------


def test_sample_is_what_the_trainer_wrote(trainer_run):
    """The fixture itself: both checkpoints, each with the files ``_save_checkpoint`` writes."""
    assert sorted(p.name for p in trainer_run.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    for step in (2, 4):
        names = sorted(p.name for p in (trainer_run / f"checkpoint-{step}").iterdir())
        assert names == ["config.json", "generation_config.json", "model.safetensors", "optimizer.pt",
                         "rng_state.pth", "scheduler.pt", "trainer_state.json", "training_args.bin"]
        assert json.loads((trainer_run / f"checkpoint-{step}" / "trainer_state.json").read_text())["global_step"] == step


def test_inspect_trainer_checkpoint_counts_only_the_model(trainer_run, gen):
    ckpt = trainer_run / "checkpoint-4"
    reference = trainer_reference(gen, trainer_run, 4)
    result = run_cli("inspect", str(ckpt), "--json")
    ok(result, "inspect checkpoint-4 --json")
    doc = json.loads(result.out)
    assert sorted(t["name"] for t in doc["tensors"]) == sorted(reference)
    assert doc["metadata"]["num_params"] == sum(t.numel() for t in reference.values())  # no Adam moments


def test_inspect_trainer_root_lists_both_checkpoints_and_opens_the_newest(trainer_run):
    result = run_cli("inspect", str(trainer_run), "--json")
    ok(result, "inspect <Trainer output_dir> --json")
    doc = json.loads(result.out)
    assert sorted(i["iteration"] for i in doc["iterations"]) == [2, 4]
    assert [i["iteration"] for i in doc["iterations"] if i["opened"]] == [4]
    assert doc["path"] == str(trainer_run / "checkpoint-4")
    human = run_cli("inspect", str(trainer_run))
    ok(human, "inspect <Trainer output_dir>")
    assert "checkpoint-2" in human.out and "checkpoint-4" in human.out


def test_iteration_option_selects_checkpoint_2(trainer_run, gen):
    result = run_cli("inspect", str(trainer_run), "--iteration", "2", "--json")
    ok(result, "inspect <Trainer output_dir> --iteration 2 --json")
    doc = json.loads(result.out)
    assert doc["path"] == str(trainer_run / "checkpoint-2")
    assert [i["iteration"] for i in doc["iterations"] if i["opened"]] == [2]
    assert sorted(t["name"] for t in doc["tensors"]) == sorted(trainer_reference(gen, trainer_run, 2))


def test_checkpoint_without_trainer_state_is_incomplete(trainer_run, tmp_path):
    """``_save_checkpoint`` writes trainer_state.json last: without it the save did not finish."""
    root = tmp_path / "run"
    shutil.copytree(trainer_run, root)
    shutil.copytree(root / "checkpoint-4", root / "checkpoint-6")
    (root / "checkpoint-6" / "trainer_state.json").unlink()
    result = run_cli("inspect", str(root), "--json")
    ok(result, "inspect <output_dir with a crashed checkpoint-6> --json")
    doc = json.loads(result.out)
    status = {i["iteration"]: (i["complete"], i["opened"]) for i in doc["iterations"]}
    assert status == {6: (False, False), 4: (True, True), 2: (True, False)}
    assert doc["path"] == str(root / "checkpoint-4")


@pytest.mark.parametrize("which", ["root", "checkpoint-4"])
def test_check_needs_no_megatron_tracker(trainer_run, which):
    path = trainer_run if which == "root" else trainer_run / "checkpoint-4"
    result = run_cli("check", str(path))
    ok(result, f"check <{which}>")
    assert "latest_checkpointed_iteration" not in result.out + result.err


@pytest.mark.parametrize("command", list(EXPORTS))
def test_export_trainer_checkpoint_is_the_model_only(trainer_run, gen, tmp_path, command):
    out = tmp_path / "out"
    ok(export(command, trainer_run / "checkpoint-4", out), f"{command} checkpoint-4")
    got = read_out(out)
    assert not [n for n in got if any(w in n for w in OPTIMIZER_WORDS) or n.endswith(".step")]
    assert_bitwise(out, trainer_reference(gen, trainer_run, 4))
    assert_loads_in_transformers(out)


# --- accelerate FSDP2 SHARDED_STATE_DICT ------------------------------------------------------------------


def test_sample_is_what_accelerate_wrote(accelerate_run):
    names = sorted(p.name for p in accelerate_run.iterdir())
    assert names == ["optimizer_0", "pytorch_model_fsdp_0", "random_states_0.pkl", "random_states_1.pkl",
                     "scheduler.bin"]
    for dcp_dir in ("optimizer_0", "pytorch_model_fsdp_0"):
        assert sorted(p.name for p in (accelerate_run / dcp_dir).iterdir()) == [".metadata", "__0_0.distcp",
                                                                                 "__1_0.distcp"]


@pytest.mark.parametrize("command", list(EXPORTS))
def test_export_accelerate_dcp_is_bitwise_and_loads(accelerate_run, gen, tmp_path, command):
    out = tmp_path / "out"
    config = gen.reference_dir(accelerate_run)  # the tiny config.json (+ generation_config.json)
    ok(export(command, accelerate_run / "pytorch_model_fsdp_0", out, "--hf-config", str(config)),
       f"{command} pytorch_model_fsdp_0")
    assert_bitwise(out, accelerate_reference(gen, accelerate_run))
    assert_loads_in_transformers(out)


def test_accelerate_save_state_dir_is_read_as_its_model(accelerate_run, gen, tmp_path):
    """Beyond the DCP dir itself: the ``save_state`` output dir a user points at."""
    reference = accelerate_reference(gen, accelerate_run)
    result = run_cli("inspect", str(accelerate_run), "--json")
    ok(result, "inspect <accelerate save_state dir> --json")
    assert json.loads(result.out)["metadata"]["num_params"] == sum(t.numel() for t in reference.values())
    out = tmp_path / "out"
    ok(run_cli("merge", str(accelerate_run), str(out), "--hf-config", str(gen.reference_dir(accelerate_run))),
       "merge <accelerate save_state dir>")
    assert_bitwise(out, reference)


def test_accelerate_per_rank_save_is_assembled_into_its_model(accelerate_run, gen, tmp_path):
    """``save_fsdp_model`` / ``save_fsdp_optimizer`` with ``use_dcp=False``: one torch.save per rank. It read
    as an HF model of 0 tensors and ``check`` said ok (a probe). Ground truth: the ranks' ``full_tensor()``."""
    ranks = accelerate_run.parent / gen.ACCELERATE_RANKS
    assert sorted(p.name for p in ranks.iterdir()) == [
        "optimizer_0_rank0.bin", "optimizer_0_rank1.bin", "pytorch_model_fsdp_0_rank0.bin", "pytorch_model_fsdp_0_rank1.bin"]
    reference = accelerate_reference(gen, accelerate_run)
    result = run_cli("inspect", str(ranks), "--json")
    ok(result, "inspect <accelerate per-rank dir> --json")
    data = json.loads(result.out)
    assert data["format"] == "accelerate_fsdp_ranks"
    assert {t["name"] for t in data["tensors"]} == set(reference)
    assert data["metadata"]["num_params"] == sum(t.numel() for t in reference.values())
    assert data["metadata"]["accelerate_fsdp"]["world_size_from"] == "the saved values' mesh"
    check = run_cli("check", str(ranks))
    ok(check, "check <accelerate per-rank dir>")
    out = tmp_path / "out"
    ok(run_cli("convert", str(ranks), str(out), "--to", "hf", "--hf-config", str(gen.reference_dir(accelerate_run))),
       "convert <accelerate per-rank dir> --to hf")
    assert_bitwise(out, reference)
    assert_loads_in_transformers(out)


def test_accelerate_per_rank_save_missing_its_last_rank_is_refused(accelerate_run, gen, tmp_path):
    """Without rank 1's file the names alone say world size 1: the DTensors' mesh says 2, so rank 1's
    parts are holes (check exits 1) and exports refuse, instead of a model of half-tensors."""
    damaged = tmp_path / "ranks"
    shutil.copytree(accelerate_run.parent / gen.ACCELERATE_RANKS, damaged)
    (damaged / "pytorch_model_fsdp_0_rank1.bin").unlink()
    check = run_cli("check", str(damaged))
    assert check.code == 1 and "pytorch_model_fsdp_0_rank1.bin" in check.out + check.err, (check.out, check.err)
    out = tmp_path / "out"
    refused = run_cli("convert", str(damaged), str(out), "--to", "hf", "--hf-config", str(gen.reference_dir(accelerate_run)))
    assert one_line_error(refused) and not out.exists(), (refused.code, refused.err)


# --- tied embeddings: 4.x pytorch_model.bin vs 5.x safetensors ---------------------------------------------


def test_tied_samples_are_what_transformers_wrote(tied, gen):
    import torch
    from safetensors import safe_open

    state = torch.load(tied["bin"] / "pytorch_model.bin", weights_only=True)
    assert state["lm_head.weight"].untyped_storage().data_ptr() == \
        state["model.embed_tokens.weight"].untyped_storage().data_ptr()
    with safe_open(str(tied["safetensors"] / "model.safetensors"), "pt") as f:
        assert sorted(f.keys()) == sorted(set(state) - {"lm_head.weight"})


def test_tied_bin_converts_to_mcore(tied, tmp_path):
    out = tmp_path / "mcore"
    ok(run_cli("convert", str(tied["bin"]), str(out), "--to", "mcore"), "convert hf_tied_bin --to mcore")
    ok(run_cli("diff", str(tied["bin"]), str(out)), "diff hf_tied_bin <its mcore conversion>")


@pytest.mark.parametrize("order", ["bin-first", "safetensors-first"])
def test_diff_tied_bin_and_safetensors_is_the_same_model(tied, order):
    a, b = (tied["bin"], tied["safetensors"]) if order == "bin-first" else (tied["safetensors"], tied["bin"])
    ok(run_cli("diff", str(a), str(b)), f"diff {a.name} {b.name}")


def test_tied_parameter_count_does_not_depend_on_the_file_format(tied):
    counts = {}
    for kind, path in tied.items():
        result = run_cli("inspect", str(path), "--json")
        ok(result, f"inspect {path.name} --json")
        counts[kind] = json.loads(result.out)["metadata"]["num_params"]
    assert counts["bin"] == counts["safetensors"], counts


# --- smuggled entries never reach an export -------------------------------------------------------------


def _dcp_with(accelerate_run: Path, dst: Path, extra: dict) -> Path:
    """The accelerate model DCP, read back in full and saved again (1 process) with ``extra`` added."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = dst.parent / f"{dst.name}.pt"
    dcp_to_torch_save(str(accelerate_run / "pytorch_model_fsdp_0"), str(flat))
    state = torch.load(flat, weights_only=True)
    flat.unlink()
    assert sorted(state) == ["model"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to save in a single process"
        dcp.save({**state, **extra}, checkpoint_id=str(dst), no_dist=True)
    return dst


def _checkpoint_with(trainer_run: Path, dst: Path, *, extra_in_model: dict | None = None,
                     extra_file: tuple[str, dict] | None = None) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(trainer_run / "checkpoint-4", dst)
    if extra_in_model:
        weights = load_file(str(dst / "model.safetensors"))
        save_file({**weights, **extra_in_model}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if extra_file:
        save_file(extra_file[1], str(dst / extra_file[0]), metadata={"format": "pt"})
    return dst


SMUGGLED_UNKNOWN = ["dcp+ema", "dcp+foo.bar", "checkpoint+ema.safetensors", "checkpoint+foo.bar"]
SMUGGLED_OPTIMIZER = ["dcp+optimizer", "checkpoint+optimizer"]


@pytest.fixture(scope="session")
def smuggled(tmp_path_factory, trainer_run, accelerate_run, gen) -> dict[str, tuple[Path, str]]:
    """name -> (source dir, the smuggled tensor name)."""
    import torch

    out = tmp_path_factory.mktemp("smuggled")
    embed = accelerate_reference(gen, accelerate_run)["model.embed_tokens.weight"]
    moment = torch.full_like(embed, 0.25)
    return {
        "dcp+ema": (_dcp_with(accelerate_run, out / "dcp_ema", {"ema": {"model.embed_tokens.weight": embed * 0.5}}),
                    "ema.model.embed_tokens.weight"),
        "dcp+foo.bar": (_dcp_with(accelerate_run, out / "dcp_foo", {"foo": {"bar": torch.arange(3.0)}}), "foo.bar"),
        "dcp+optimizer": (_dcp_with(accelerate_run, out / "dcp_opt", {
            "optimizer": {"state": {"model.embed_tokens.weight": {"exp_avg": moment}}}}),
            "optimizer.state.model.embed_tokens.weight.exp_avg"),
        "checkpoint+ema.safetensors": (_checkpoint_with(trainer_run, out / "ckpt_ema", extra_file=(
            "ema.safetensors", {"ema.model.embed_tokens.weight": embed.clone()})), "ema.model.embed_tokens.weight"),
        "checkpoint+foo.bar": (_checkpoint_with(trainer_run, out / "ckpt_foo",
                                                extra_in_model={"foo.bar": torch.arange(3.0)}), "foo.bar"),
        "checkpoint+optimizer": (_checkpoint_with(trainer_run, out / "ckpt_opt",
                                                  extra_in_model={"optimizer.state.0.exp_avg": moment}),
                                 "optimizer.state.0.exp_avg"),
    }


def _export_smuggled(case, command, smuggled, tmp_path, trainer_run, accelerate_run, gen):
    src, name = smuggled[case]
    out = tmp_path / "out"
    if case.startswith("dcp"):
        result = export(command, src, out, "--hf-config", str(gen.reference_dir(accelerate_run)))
        reference = accelerate_reference(gen, accelerate_run)
    else:
        result = export(command, src, out)
        reference = trainer_reference(gen, trainer_run, 4)
    if out.exists() and list(out.glob("*.safetensors")):
        assert name not in read_out(out), f"{name} reached the export"
    return result, out, reference, name


@pytest.mark.parametrize("command", list(EXPORTS))
@pytest.mark.parametrize("case", SMUGGLED_UNKNOWN)
def test_unknown_entry_is_left_out_and_said_or_refused(case, command, smuggled, tmp_path, trainer_run,
                                                       accelerate_run, gen):
    result, out, reference, name = _export_smuggled(case, command, smuggled, tmp_path, trainer_run,
                                                    accelerate_run, gen)
    if result.code == 0:
        assert_bitwise(out, reference)
        assert name in result.out + result.err, f"{name} was left out silently: {result.out + result.err!r}"
    else:
        assert one_line_error(result), f"exit {result.code}, stderr: {result.err!r}"
        assert not out.exists() or not list(out.glob("*.safetensors"))


@pytest.mark.parametrize("command", list(EXPORTS))
@pytest.mark.parametrize("case", SMUGGLED_OPTIMIZER)
def test_optimizer_state_never_reaches_the_export(case, command, smuggled, tmp_path, trainer_run, accelerate_run,
                                                  gen):
    result, out, reference, name = _export_smuggled(case, command, smuggled, tmp_path, trainer_run,
                                                    accelerate_run, gen)
    if result.code == 0:
        assert_bitwise(out, reference)
    else:
        assert one_line_error(result), f"exit {result.code}, stderr: {result.err!r}"


# --- diff --training-state: the trainers' own optimizer / scheduler / rng files ------------------------


def _mixed_checkpoint(trainer_run: Path, tmp_path: Path) -> Path:
    """checkpoint-2's model with checkpoint-4's optimizer.pt, scheduler.pt and rng_state.pth: the same
    model, different training state (a resume that picked up the wrong files)."""
    mixed = tmp_path / "mixed"
    shutil.copytree(trainer_run / "checkpoint-2", mixed)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        shutil.copy2(trainer_run / "checkpoint-4" / name, mixed / name)
    return mixed


def test_diff_training_state_compares_the_trainers_optimizer_file(trainer_run, tmp_path):
    import torch

    mixed = _mixed_checkpoint(trainer_run, tmp_path)
    ckpt2 = trainer_run / "checkpoint-2"
    models_only = run_cli("diff", str(ckpt2), str(mixed), "--json")
    assert models_only.code == 0, models_only.err
    notes = json.loads(models_only.out)["notes"]
    assert any("optimizer.pt" in n and "--training-state" in n for n in notes), notes

    result = run_cli("diff", str(ckpt2), str(mixed), "--training-state", "--json")
    assert result.code == 1, result.err
    by = {t["name"]: t for t in json.loads(result.out)["tensors"]}
    old = torch.load(ckpt2 / "optimizer.pt", weights_only=True)["state"]
    new = torch.load(mixed / "optimizer.pt", weights_only=True)["state"]
    assert old.keys() == new.keys()
    for index, state in old.items():
        for key in ("exp_avg", "exp_avg_sq"):
            entry = by[f"optimizer.pt/state.{index}.{key}"]
            differing = int((state[key] != new[index][key]).sum())
            assert entry["num_diff"] == differing > 0, (index, key)
            assert entry["status"] == "different"
    assert by["scheduler.pt/<root>"]["status"] == "different"  # last_epoch 2 against 4
    assert all(by[n]["status"] == "equal" for n in by if "/" not in n)  # the model is the same

    same = run_cli("diff", str(ckpt2), str(ckpt2), "--training-state", "--json")
    assert same.code == 0, same.err
    names = [t["name"] for t in json.loads(same.out)["tensors"]]
    assert any(n.startswith("optimizer.pt/state.") for n in names) and "rng_state.pth/cpu" in names


def test_diff_training_state_reports_a_missing_optimizer_file(trainer_run, tmp_path):
    lacking = tmp_path / "lacking"
    shutil.copytree(trainer_run / "checkpoint-2", lacking)
    (lacking / "optimizer.pt").unlink()
    result = run_cli("diff", str(trainer_run / "checkpoint-2"), str(lacking), "--training-state", "--json")
    assert result.code == 1, result.err
    by = {t["name"]: t for t in json.loads(result.out)["tensors"]}
    assert by["optimizer.pt"]["status"] == "only_a"


def test_diff_training_state_of_accelerate_fsdp_reads_its_optimizer_dir(accelerate_run, tmp_path):
    same = run_cli("diff", str(accelerate_run), str(accelerate_run), "--training-state", "--json")
    assert same.code == 0, same.err
    names = [t["name"] for t in json.loads(same.out)["tensors"]]
    assert any(n.startswith("optimizer_0/optimizer.state.") and n.endswith(".exp_avg") for n in names), names
    lacking = tmp_path / "lacking"
    shutil.copytree(accelerate_run, lacking)
    shutil.rmtree(lacking / "optimizer_0")
    result = run_cli("diff", str(accelerate_run), str(lacking), "--training-state", "--json")
    assert result.code == 1, result.err
    assert {t["name"]: t["status"] for t in json.loads(result.out)["tensors"]}["optimizer_0"] == "only_a"


def test_check_and_rename_take_the_accelerate_save_state_dir(accelerate_run, tmp_path):
    ok(run_cli("check", str(accelerate_run)), "check <save_state dir>")
    damaged = tmp_path / "damaged"
    shutil.copytree(accelerate_run, damaged)
    shard = sorted((damaged / "optimizer_0").glob("*.distcp"))[-1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    result = run_cli("check", str(damaged))
    assert result.code == 1, result.out + result.err
    assert f"truncated: optimizer_0/{shard.name}" in result.out, result.out
    refused = run_cli("rename", str(accelerate_run), str(tmp_path / "out"), "--sub", "model", "m")
    assert refused.code == 2 and "pytorch_model_fsdp_0" in refused.err and not (tmp_path / "out").exists()


def test_fsdp1_local_state_dict_is_refused_in_one_line(gen, tmp_path):
    """accelerate's FSDP1 LOCAL_STATE_DICT save (written by accelerate + FSDP1 on 2 gloo ranks): each
    rank's flattened parameters, no named weights. Before: an unpickler error about
    ``Stub[__builtin__.getattr]``, and check called it an HF model dir. Now one line that names the
    layout and what to save instead, for inspect, check and merge."""
    save = gen.write_accelerate_fsdp1_local(tmp_path / "run")
    assert sorted(p.name for p in save.glob("pytorch_model_fsdp_rank*.bin")) == [
        "pytorch_model_fsdp_rank0.bin", "pytorch_model_fsdp_rank1.bin"]
    for command in (["inspect", str(save)], ["check", str(save)],
                    ["merge", str(save), str(tmp_path / "out"), "--hf-config", str(tmp_path)]):
        result = run_cli(*command)
        assert result.code == 2, (command, result.out, result.err)
        assert "FSDP LOCAL_STATE_DICT" in result.err and "SHARDED_STATE_DICT" in result.err, result.err
        assert result.err.count("\n") == 1 and "Unpickling" not in result.err
    assert not (tmp_path / "out").exists()
    # one rank's file alone, as a plain torch.save of the local state dict is named by hand
    alone = tmp_path / "local_rank0.pt"
    alone.write_bytes((save / "pytorch_model_fsdp_rank0.bin").read_bytes())
    result = run_cli("inspect", str(alone))
    assert result.code == 2 and "FSDP1 LOCAL_STATE_DICT" in result.err and result.err.count("\n") == 1, result.err


def test_accelerate_save_model_of_a_tied_model_in_bin_shards(tmp_path, gen):
    """accelerate's ``save_model(safe_serialization=False, max_shard_size=...)`` of a tied model writes
    the shared storage once and says so in ``total_size``; inspect warned that total_size disagreed
    (it summed the tied pair twice)."""
    from accelerate import Accelerator

    model = gen.tied_model()
    out = tmp_path / "saved"
    Accelerator(cpu=True).save_model(model, str(out), max_shard_size="20KB", safe_serialization=False)
    model.config.save_pretrained(str(out))
    index = json.loads((out / "pytorch_model.bin.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded, as the layout under test
    result = run_cli("inspect", "--json", str(out))
    ok(result, "inspect")
    data = json.loads(result.out)
    assert not [w for w in data["metadata"]["warnings"] if "total_size" in w], data["metadata"]["warnings"]
    assert data["metadata"]["num_params"] == sum(p.numel() for p in model.parameters())


def test_accelerate_save_state_of_two_models(tmp_path, gen):
    """accelerate's ``save_state`` with two prepared models writes ``model.safetensors`` and
    ``model_1.safetensors`` side by side: read as shards of one model, every command stopped at "tensor
    ... is stored in both". The first model is shown (the other named), exports refuse the dir, and
    each model opens by its file."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    first, second = accelerator.prepare(gen.tiny_model(seed=1), gen.tiny_model(seed=2))
    out = tmp_path / "state"
    accelerator.save_state(str(out))
    assert (out / "model.safetensors").is_file() and (out / "model_1.safetensors").is_file()
    result = run_cli("inspect", "--json", str(out))
    ok(result, "inspect")
    data = json.loads(result.out)
    assert data["metadata"]["num_params"] == sum(p.numel() for p in first.parameters())
    assert any("model_1.safetensors" in w for w in data["metadata"]["warnings"])
    assert run_cli("check", str(out)).code == 0
    assert run_cli("diff", str(out), str(out / "model.safetensors")).code == 0
    refused = run_cli("convert", str(out), str(tmp_path / "hf"), "--to", "hf")
    assert refused.code == 2 and "2 models" in refused.err and refused.err.count("\n") == 1, refused.err
    other = json.loads(run_cli("inspect", "--json", str(out / "model_1.safetensors")).out)
    assert other["metadata"]["num_params"] == sum(p.numel() for p in second.parameters())


# --- the Trainer under FSDP with SHARDED_STATE_DICT ----------------------------------------------------


@pytest.fixture(scope="session")
def trainer_fsdp2(tmp_path_factory, worker, gen) -> Path:
    return _write_once(tmp_path_factory, worker, "hf_trainer_fsdp2", gen.write_hf_trainer_fsdp2)


def test_trainer_fsdp_sharded_output_dir_opens_as_a_root(trainer_fsdp2, gen, tmp_path):
    """A Trainer run under FSDP with SHARDED_STATE_DICT saves through accelerate: each ``checkpoint-N/`` holds
    ``pytorch_model_fsdp_0/`` and ``optimizer_0/`` (DCP), no HF weights. A probe found inspect and timeline
    refusing the output dir ("checkpoint-4: not a checkpoint ckptscope can read") and check calling it
    incomplete. The root lists both saves, opens the newest, and its model is the Trainer's own (diff against
    the on_save reference, bitwise)."""
    result = run_cli("inspect", str(trainer_fsdp2))
    assert result.code == 0, result.err
    assert "HF Trainer output dir with FSDP sharded models (newest complete: checkpoint-4)" in result.out
    assert run_cli("check", str(trainer_fsdp2)).code == 0
    assert run_cli("timeline", str(trainer_fsdp2)).code == 0
    ref = tmp_path / "ref"
    ref.mkdir()
    shutil.copy(gen.reference_dir(trainer_fsdp2) / "checkpoint-4.safetensors", ref / "model.safetensors")
    assert run_cli("diff", str(trainer_fsdp2), str(ref)).code == 0
    assert run_cli("diff", "--iteration", "2", str(trainer_fsdp2), str(ref)).code == 1


def test_checking_a_root_checks_every_part_of_its_newest_save(trainer_fsdp2, tmp_path):
    """The root's check took the newest save's model dir only: a probe truncated its ``optimizer_0/`` (a resume
    would fail) and ``check ROOT`` said ok. Every part of that save is checked now."""
    root = tmp_path / "run"
    shutil.copytree(trainer_fsdp2, root)
    shard = root / "checkpoint-4" / "optimizer_0" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    result = run_cli("check", str(root))
    assert result.code == 1 and "truncated: checkpoint-4/optimizer_0/__1_0.distcp" in result.out, result.out


@pytest.fixture(scope="session")
def trainer_fsdp2_full_tied(tmp_path_factory, worker, gen) -> Path:
    return _write_once(tmp_path_factory, worker, "hf_trainer_fsdp2_full_tied",
                       lambda out: gen.write_hf_trainer_fsdp2(out, full=True))


def test_a_tied_model_saved_with_both_copies_counts_its_parameters_once(trainer_fsdp2_full_tied):
    """The Trainer under FSDP2 with FULL_STATE_DICT writes a tied model's ``lm_head.weight`` beside
    ``model.embed_tokens.weight`` (equal values, separate storage). inspect counted both (a probe: 6,736 where
    ``model.parameters()`` gives 5,712); the config's tie makes it one parameter, as transformers builds it.
    The bytes line still counts what is stored."""
    from transformers import AutoModelForCausalLM

    checkpoint = trainer_fsdp2_full_tied / "checkpoint-4"
    doc = json.loads(run_cli("inspect", "--json", str(checkpoint)).out)
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint))
    assert doc["metadata"]["num_params"] == sum(p.numel() for p in model.parameters())
    stored = sum(t["nbytes"] for t in doc["tensors"] if t["role"] == "model")
    assert doc["metadata"]["roles"]["model"]["bytes"] == stored
    assert not any("pytorch_model" in w for w in doc["metadata"]["warnings"]), doc["metadata"]["warnings"]


def test_a_trainer_checkpoint_with_a_cut_optimizer_file_is_damage(trainer_run, tmp_path):
    """The Trainer's ``optimizer.pt`` (torch's zip format) cut short: ``torch.load`` fails, so a resume would;
    check said ok (a probe). The zip's central directory is read now; an intact save stays clean."""
    import torch

    run = tmp_path / "run"
    shutil.copytree(trainer_run, run)
    assert run_cli("check", str(run / "checkpoint-4")).code == 0
    optimizer = run / "checkpoint-4" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:1000])
    with pytest.raises(Exception):
        torch.load(str(optimizer), weights_only=True)
    for target in (run / "checkpoint-4", run):
        result = run_cli("check", str(target))
        assert result.code == 1 and "unreadable-file" in result.out and "optimizer.pt" in result.out, result.out


def test_empty_or_foreign_training_state_files_are_damage(trainer_run, tmp_path):
    """An emptied ``optimizer.pt`` / ``rng_state.pth`` or a text file in its place: check said ok (only torch's zip
    format was opened), while torch.load, and a resume, fail on each (a probe)."""
    import torch

    run = tmp_path / "run"
    shutil.copytree(trainer_run, run)
    step = run / "checkpoint-4"
    (step / "optimizer.pt").write_bytes(b"")
    (step / "rng_state.pth").write_text("garbage\n")
    for name in ("optimizer.pt", "rng_state.pth"):
        with pytest.raises(Exception):
            torch.load(str(step / name), weights_only=True)
    result = run_cli("check", str(step))
    assert result.code == 1, result.out
    assert "unreadable-file: optimizer.pt: optimizer state file is empty" in result.out
    assert "unreadable-file: rng_state.pth: rng state file is neither torch's zip format nor a pickle" in result.out


def test_timeline_reads_the_adam_state_beside_each_fsdp_save(trainer_fsdp2, tmp_path):
    """Under FSDP the Trainer's (and accelerate's) Adam state is the DCP dir ``optimizer_0/`` beside the model,
    keyed by parameter name. timeline said "no Adam exp_avg_sq saved" (a probe). Its per-module mean now equals
    torch's own reading of that dir (``dcp_to_torch_save``), and the step size uses the Trainer's scheduler.pt."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    result = run_cli("timeline", "--json", str(trainer_fsdp2))
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    module = next(m for m in doc["optimizer"]["modules"] if m["name"] == "model.layers.0.self_attn")
    dcp_to_torch_save(str(trainer_fsdp2 / "checkpoint-4" / "optimizer_0"), str(tmp_path / "opt.pt"))
    state = torch.load(str(tmp_path / "opt.pt"), weights_only=False)["optimizer"]["state"]
    moments = [v["exp_avg_sq"].double() for k, v in state.items() if k.startswith("model.layers.0.self_attn.")]
    want = float(sum(m.sum() for m in moments) / sum(m.numel() for m in moments))
    assert module["iterations"] == [2, 4]
    assert abs(module["exp_avg_sq_mean"][1] - want) <= 1e-12 + 1e-9 * abs(want), (module, want)
    assert module["step_size_mean"][0] is not None and module["step_size_mean"][0] > 0
