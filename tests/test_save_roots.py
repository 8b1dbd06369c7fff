"""Save roots as trainers leave them (Megatron iter_* and release/, verl global_step_*, torchtitan
step-*; HF Trainer checkpoint-* is in test_hf_trainer_root.py), each checked by its own completeness
markers and named by ``check`` / ``inspect``, and ``--iteration N`` / ``--step N`` on every command
that takes a root. Roots are assembled from the shipped samples, each written by its real writer
(megatron-core, verl-style FSDP2 save, torch DCP); a crashed save is a copy with the file that is
written last taken away."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from dist_reference import MEGATRON_ITER, SAMPLES

from ckptscope.cli import main as cli_main
from ckptscope.ops.roots import discover_iterations, pick_iteration

VERL_ACTOR = SAMPLES / "verl_run" / "global_step_2" / "actor"
TRACKER = "latest_checkpointed_iteration.txt"


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.fixture
def megatron_root(tmp_path) -> Path:
    root = tmp_path / "megatron"
    shutil.copytree(MEGATRON_ITER, root / "iter_0000010")
    shutil.copytree(MEGATRON_ITER, root / "iter_0000020")
    shutil.copytree(MEGATRON_ITER, root / "iter_0000030")
    for last in (".metadata", "metadata.json"):  # the save of 30 crashed before DCP and Megatron finished
        (root / "iter_0000030" / last).unlink()
    (root / TRACKER).write_text("20")
    return root


@pytest.fixture
def verl_root(tmp_path) -> Path:
    root = tmp_path / "verl"
    shutil.copytree(VERL_ACTOR, root / "global_step_1" / "actor")
    shutil.copytree(VERL_ACTOR, root / "global_step_2" / "actor")
    shutil.copytree(VERL_ACTOR, root / "global_step_2" / "critic")
    shutil.copytree(VERL_ACTOR, root / "global_step_3" / "critic")
    shutil.copytree(VERL_ACTOR, root / "global_step_4" / "actor")
    (root / "global_step_4" / "actor" / "model_world_size_2_rank_1.pt").unlink()  # crashed mid-save
    (root / TRACKER).write_text("2")
    return root


@pytest.fixture
def titan_root(tmp_path) -> Path:
    root = tmp_path / "outputs" / "checkpoint"
    shutil.copytree(SAMPLES / "dcp_fsdp2", root / "step-100")
    shutil.copytree(SAMPLES / "dcp_fsdp2", root / "step-200")
    shutil.copytree(SAMPLES / "dcp_fsdp2", root / "step-300")
    (root / "step-300" / ".metadata").unlink()  # DCP renames .metadata into place last
    return root


def test_megatron_root(megatron_root):
    found = discover_iterations(megatron_root)
    assert [(i.iteration, i.complete, i.latest, i.kind) for i in found] == [
        (30, False, False, "megatron"), (20, True, True, "megatron"), (10, True, False, "megatron")]
    assert all(i.size == du(Path(i.path)) for i in found)
    assert pick_iteration(megatron_root, found).iteration == 20


def test_verl_root(verl_root):
    found = discover_iterations(verl_root)
    by_iter = {i.iteration: i for i in found}
    assert [i.iteration for i in found] == [4, 3, 2, 1]
    assert [i.iteration for i in found if not i.complete] == [4]
    assert by_iter[2].latest and by_iter[2].roles == ("actor", "critic")
    assert Path(by_iter[2].path) == verl_root / "global_step_2" / "actor"  # actor by default
    assert Path(by_iter[3].path) == verl_root / "global_step_3" / "critic"  # critic-only step
    assert by_iter[4].size == du(verl_root / "global_step_4" / "actor")
    assert {i.kind for i in found} == {"verl"}
    assert pick_iteration(verl_root, found).iteration == 2


def test_torchtitan_root(titan_root):
    found = discover_iterations(titan_root)
    assert [(i.iteration, i.complete, i.latest, i.kind) for i in found] == [
        (300, False, False, "torchtitan"), (200, True, True, "torchtitan"), (100, True, False, "torchtitan")]
    assert found[1].size == du(SAMPLES / "dcp_fsdp2")
    assert pick_iteration(titan_root, found).iteration == 200
    assert discover_iterations(titan_root / "step-200") is None  # an iteration is not a root


def test_stale_tracker_falls_back_to_newest_complete(megatron_root):
    (megatron_root / TRACKER).write_text("30")  # names the crashed save
    assert pick_iteration(megatron_root, discover_iterations(megatron_root)).iteration == 20


@pytest.mark.parametrize("kind", ["megatron", "verl", "torchtitan"])
def test_inspect_root_lists_iterations_and_opens_latest_complete(kind, megatron_root, verl_root, titan_root, cli):
    root, latest, fmt = {"megatron": (megatron_root, 20, "megatron_dist"), "verl": (verl_root, 2, "verl_fsdp"),
                         "torchtitan": (titan_root, 200, "dcp")}[kind]
    result = cli("inspect", str(root), "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    found = discover_iterations(root)
    assert doc["root"] == str(root) and doc["format"] == fmt
    assert [(i["iteration"], i["complete"], i["size"]) for i in doc["iterations"]] == \
        [(i.iteration, i.complete, i.size) for i in found]
    assert [i["iteration"] for i in doc["iterations"] if i["opened"]] == [latest]
    opened = next(i for i in found if i.iteration == latest)
    assert doc["path"] == opened.path
    human = cli("inspect", str(root))
    assert human.code == 0
    assert "incomplete" in human.out and "opened" in human.out
    assert str(Path(opened.path).relative_to(root)) in human.out


def test_iteration_option_picks_another(verl_root, megatron_root, cli):
    doc = json.loads(cli("inspect", str(megatron_root), "--iteration", "10", "--json").out)
    assert doc["path"] == str(megatron_root / "iter_0000010")
    assert [i["iteration"] for i in doc["iterations"] if i["opened"]] == [10]
    crashed = cli("inspect", str(verl_root), "--iteration", "4", "--json")  # asked for: opened, with warnings
    assert crashed.code == 0
    assert json.loads(crashed.out)["path"] == str(verl_root / "global_step_4" / "actor")
    assert "model_world_size_2_rank_1.pt: missing" in crashed.err


@pytest.mark.parametrize("command", ["inspect", "open"])
def test_missing_iteration_lists_the_available_ones(command, verl_root, cli):
    result = cli(command, str(verl_root), "--iteration", "9")
    assert result.code == 2
    assert result.err.strip().splitlines() == [
        f"ckptscope: error: {verl_root}: no iteration 9; available: 4 (incomplete), 3, 2 (latest), 1"]


def test_iteration_on_a_plain_checkpoint_is_an_error(cli):
    result = cli("inspect", str(VERL_ACTOR), "--iteration", "2")
    assert result.code == 2 and "not a save directory" in result.err and result.err.count("\n") == 1


def test_root_without_complete_iteration(tmp_path, cli):
    root = tmp_path / "verl"
    (root / "global_step_5" / "actor").mkdir(parents=True)
    (root / TRACKER).write_text("5")
    result = cli("inspect", str(root))
    assert result.code == 2
    assert "without a complete iteration; found: 5 (latest, incomplete)" in result.err


def test_open_iteration_hands_the_tui_that_directory(verl_root, monkeypatch):
    """``open --iteration N`` starts the TUI on the iteration dir itself (no picker)."""
    import sys

    from ckptscope import tui

    opened = []
    monkeypatch.setattr(tui, "run_tui", lambda path, **kw: opened.append(path) or 0)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    cli_main(["open", str(verl_root), "--iteration", "1"])
    assert opened == [str(verl_root / "global_step_1" / "actor")]
    assert discover_iterations(opened[0]) is None  # so the TUI opens it straight away


# --- Megatron release/ --------------------------------------------------------------------------------


@pytest.fixture
def release_root(tmp_path) -> Path:
    """What Megatron's converters leave: ``release/`` and a tracker that says ``release``."""
    root = tmp_path / "release_root"
    shutil.copytree(MEGATRON_ITER, root / "release")
    (root / TRACKER).write_text("release\n")
    return root


def test_release_root_is_an_iteration(release_root):
    found = discover_iterations(release_root)
    assert [(i.iteration, i.label, i.complete, i.latest, i.kind) for i in found] == [
        ("release", "release", True, True, "megatron")]
    assert pick_iteration(release_root, found).path == str(release_root / "release")
    assert pick_iteration(release_root, found, "release") is found[0]


def test_release_beside_iterations(release_root):
    shutil.copytree(MEGATRON_ITER, release_root / "iter_0000010")
    found = discover_iterations(release_root)
    assert [(i.label, i.latest) for i in found] == [("10", False), ("release", True)]
    assert pick_iteration(release_root, found).iteration == "release"  # the tracker says so
    (release_root / TRACKER).write_text("10")
    found = discover_iterations(release_root)
    assert [(i.label, i.latest) for i in found] == [("10", True), ("release", False)]
    assert pick_iteration(release_root, found, "release").path == str(release_root / "release")


def test_release_without_tracker_needs_megatron_files(tmp_path):
    root = tmp_path / "r"
    (root / "release").mkdir(parents=True)
    (root / "release" / "notes.txt").write_text("not a checkpoint")
    assert discover_iterations(root) is None
    shutil.copytree(MEGATRON_ITER, root / "release", dirs_exist_ok=True)
    assert [i.label for i in discover_iterations(root)] == ["release"]


@pytest.mark.parametrize("iteration", [(), ("--iteration", "release"), ("--step", "release")])
def test_release_root_inspect(release_root, cli, iteration):
    result = cli("inspect", str(release_root), *iteration, "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["path"] == str(release_root / "release") and doc["format"] == "megatron_dist"
    assert doc["layout"] == "Megatron-LM save root (torch_dist, tracker: release)"
    assert doc["iteration_layout"] == "Megatron-LM release checkpoint (torch_dist)"
    assert [(i["iteration"], i["opened"]) for i in doc["iterations"]] == [("release", True)]
    human = cli("inspect", str(release_root), *iteration)
    assert human.code == 0
    assert "release │ opened, latest │ complete" in human.out


def test_release_root_check_convert_diff(release_root, tmp_path, cli):
    result = cli("check", str(release_root))
    assert result.code == 0, result.out
    assert result.out.splitlines()[0] == ("Megatron-LM save root (torch_dist, tracker: release): "
                                          "checking release (release)")
    doc = json.loads(cli("check", str(release_root), "--json").out)
    assert (doc["iteration"], doc["target"], doc["ok"]) == ("release", "release", True)
    assert cli("diff", str(release_root), str(MEGATRON_ITER), "--json").code == 0
    assert cli("diff", str(MEGATRON_ITER), str(release_root), "--iteration", "release", "--json").code == 0
    merged = cli("merge", str(release_root), str(tmp_path / "hf"))
    assert merged.code == 0, merged.err
    assert cli("diff", str(release_root), str(tmp_path / "hf"), "--json").code == 0
    plan = json.loads(cli("convert", str(release_root), str(tmp_path / "x"), "--to", "hf", "--iteration", "release",
                          "--dry-run", "--json").out)
    assert plan["src"] == str(release_root / "release")


def test_open_release_root(release_root, monkeypatch):
    """``open ROOT --iteration release`` starts on release/; without it the TUI's discovery lists it."""
    import sys

    from ckptscope import tui
    from ckptscope.tui.opening import open_path

    opened = []
    monkeypatch.setattr(tui, "run_tui", lambda path, **kw: opened.append((path, kw["iterations_root"])) or 0)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    cli_main(["open", str(release_root), "--iteration", "release"])
    assert opened == [(str(release_root / "release"), str(release_root))]
    listed = open_path(release_root)
    assert [i.label for i in listed.iterations] == ["release"]
    assert open_path(listed.iterations[0].path, discover=False).index.format == "megatron_dist"


# --- torchtitan: no tracker, .metadata is the marker ---------------------------------------------------


def test_check_torchtitan_root_needs_no_tracker(titan_root, cli):
    """torchtitan resumes from the newest step with .metadata (crashed step-300 is skipped by
    torchtitan itself), and never writes Megatron's tracker: a clean run checks clean."""
    result = cli("check", str(titan_root), "--json")
    assert result.code == 0, result.out
    doc = json.loads(result.out)
    assert doc["layout"] == "torchtitan checkpoint folder (DCP, newest complete: step-200)"
    assert (doc["target"], doc["iteration"], doc["format"], doc["problems"]) == ("step-200", 200, "dcp", [])
    human = cli("check", str(titan_root))
    assert human.code == 0 and TRACKER not in human.out
    assert human.out.splitlines()[0] == ("torchtitan checkpoint folder (DCP, newest complete: step-200): "
                                         "checking iteration 200 (step-200)")
    crashed = json.loads(cli("check", str(titan_root), "--step", "300", "--json").out)
    assert [(p["kind"], p["file"]) for p in crashed["problems"]] == [("missing-marker", "step-300/.metadata")]
    for step in ("step-100", "step-200"):
        (titan_root / step / ".metadata").unlink()
    none_whole = cli("check", str(titan_root), "--json")
    assert none_whole.code == 1
    assert ("missing-marker", "step-300/.metadata") in [(p["kind"], p["file"])
                                                         for p in json.loads(none_whole.out)["problems"]]


def test_titan_inspect_and_step_layout(titan_root, cli):
    doc = json.loads(cli("inspect", str(titan_root), "--json").out)
    assert doc["layout"] == "torchtitan checkpoint folder (DCP, newest complete: step-200)"
    assert doc["iteration_layout"] == "torchtitan step dir (DCP, step 200)"
    direct = json.loads(cli("inspect", str(titan_root / "step-100"), "--json").out)
    assert direct["layout"] == "torchtitan step dir (DCP, step 100)"


# --- each root kind named by check and inspect, with its own markers ------------------------------------


@pytest.mark.parametrize("kind", ["megatron", "verl", "torchtitan"])
def test_check_names_each_layout(kind, megatron_root, verl_root, titan_root, cli):
    root, layout, target = {
        "megatron": (megatron_root, "Megatron-LM save root (torch_dist, tracker: iteration 20)", "iter_0000020"),
        # step 2 holds actor/ and critic/: the step is checked whole, both roles
        "verl": (verl_root, "verl checkpoint dir (FSDP, tracker: step 2)", "global_step_2"),
        "torchtitan": (titan_root, "torchtitan checkpoint folder (DCP, newest complete: step-200)", "step-200"),
    }[kind]
    result = cli("check", str(root), "--json")
    assert result.code == 0, result.out
    doc = json.loads(result.out)
    assert (doc["layout"], doc["target"]) == (layout, target)
    assert json.loads(cli("inspect", str(root), "--json").out)["layout"] == layout


def test_check_tracked_roots_demand_their_tracker(megatron_root, verl_root, cli):
    for root in (megatron_root, verl_root):
        (root / TRACKER).unlink()
        doc = json.loads(cli("check", str(root), "--json").out)
        assert [(p["kind"], p["file"]) for p in doc["problems"]][:1] == [("missing-marker", TRACKER)]
        assert "no tracker" in doc["layout"]


def test_verl_check_by_its_rank_files(verl_root, cli):
    doc = json.loads(cli("check", str(verl_root), "--iteration", "4", "--json").out)
    assert doc["target"] == "global_step_4/actor"
    assert ("missing-file", "global_step_4/actor/model_world_size_2_rank_1.pt") in [
        (p["kind"], p["file"]) for p in doc["problems"]]


def test_single_checkpoint_layouts(cli):
    """A trainer's save dir is named by ``inspect`` and ``check``; a plain checkpoint by its format."""
    cases = {MEGATRON_ITER: "Megatron-LM iteration dir (torch_dist, iteration 10)",
             VERL_ACTOR: "verl actor (FSDP, step 2)"}
    for path, layout in cases.items():
        assert json.loads(cli("inspect", str(path), "--json").out)["layout"] == layout, path
        assert json.loads(cli("check", str(path), "--json").out)["layout"] == layout, path
        assert cli("inspect", str(path)).out.splitlines()[0].split(None, 1) == ["layout", layout]
    plain = {SAMPLES / "dcp_fsdp2": "PyTorch DCP dir", SAMPLES / "hf_llama_gqa": "Hugging Face model dir"}
    for path, layout in plain.items():
        assert json.loads(cli("inspect", str(path), "--json").out)["layout"] == layout, path
        assert json.loads(cli("check", str(path), "--json").out)["layout"] == layout, path
        assert cli("check", str(path)).out.splitlines()[0] == layout


# --- --iteration N / --step N on every command that takes a root -----------------------------------------


COMMANDS = {
    "inspect": lambda root, out: ["inspect", root],
    "open": lambda root, out: ["open", root],
    "check": lambda root, out: ["check", root],
    "diff": lambda root, out: ["diff", root, str(MEGATRON_ITER), "--plain"],
    "convert": lambda root, out: ["convert", root, out, "--to", "hf"],
    "merge": lambda root, out: ["merge", root, out],
    "verify": lambda root, out: ["verify", root],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("option", ["--iteration", "--step"])
def test_missing_iteration_on_every_command(command, option, megatron_root, tmp_path, cli):
    result = cli(*COMMANDS[command](str(megatron_root), str(tmp_path / "out")), option, "99")
    assert result.code == 2, (result.out, result.err)
    assert result.err.strip().splitlines() == [
        f"ckptscope: error: {megatron_root}: no iteration 99; available: 30 (incomplete), 20 (latest), 10"]
    assert not (tmp_path / "out").exists()


def test_iteration_option_on_every_command(megatron_root, tmp_path, cli):
    assert json.loads(cli("check", str(megatron_root), "--iteration", "10", "--json").out)["target"] == "iter_0000010"
    crashed = json.loads(cli("check", str(megatron_root), "--step", "30", "--json").out)
    assert crashed["target"] == "iter_0000030" and not crashed["ok"]
    same = cli("diff", str(megatron_root), str(megatron_root), "--iteration", "10", "--iteration-b", "20", "--json")
    assert same.code == 0, same.err
    doc = json.loads(same.out)
    assert (doc["a"], doc["b"]) == (str(megatron_root / "iter_0000010"), str(megatron_root / "iter_0000020"))
    one_side = json.loads(cli("diff", str(MEGATRON_ITER), str(megatron_root), "--step", "10", "--json").out)
    assert one_side["b"] == str(megatron_root / "iter_0000010")
    plan = json.loads(cli("convert", str(megatron_root), str(tmp_path / "a"), "--to", "hf", "--iteration", "10",
                          "--dry-run", "--json").out)
    assert plan["src"] == str(megatron_root / "iter_0000010")
    plan = json.loads(cli("merge", str(megatron_root), str(tmp_path / "b"), "--step", "10", "--dry-run",
                          "--json").out)
    assert plan["src"] == str(megatron_root / "iter_0000010")
    mcore = tmp_path / "mcore"  # a root verify can round-trip (config in its args)
    shutil.copytree(SAMPLES / "mcore_llama_gqa" / "iter_0000000", mcore / "iter_0000005")
    shutil.copytree(SAMPLES / "mcore_llama_gqa" / "iter_0000000", mcore / "iter_0000009")
    (mcore / TRACKER).write_text("9")
    verified = cli("verify", str(mcore), "--via", "hf", "--iteration", "5", "--json")
    assert verified.code == 0, verified.err
    assert json.loads(verified.out)["a"] == str(mcore / "iter_0000005")


@pytest.mark.parametrize("args", [
    ["check", str(MEGATRON_ITER), "--iteration", "10"],
    ["diff", str(MEGATRON_ITER), str(MEGATRON_ITER), "--iteration", "10"],
    ["diff", str(MEGATRON_ITER), str(MEGATRON_ITER), "--iteration-b", "10"],
    ["convert", str(MEGATRON_ITER), "/nonexistent/x", "--to", "hf", "--step", "10"],
    ["verify", str(MEGATRON_ITER), "--iteration", "10"],
])
def test_iteration_on_a_plain_checkpoint_is_an_error_everywhere(args, cli):
    result = cli(*args)
    assert result.code == 2 and "not a save directory" in result.err and result.err.count("\n") == 1
    assert "Traceback" not in result.err


def test_iterations_say_when_each_save_was_written(tmp_path, samples, cli):
    """inspect --json on a root gives each iteration's newest file time; the picker shows it."""
    root = tmp_path / "run"
    shutil.copytree(samples["hf_llama_single"], root / "iter_0000010")
    shutil.copytree(samples["hf_llama_single"], root / "iter_0000020")
    (root / "latest_checkpointed_iteration.txt").write_text("20")
    for step, when in ((10, 1_700_000_000), (20, 1_700_000_600)):
        for path in (root / f"iter_{step:07d}").iterdir():
            os.utime(path, (when, when))
    doc = json.loads(cli("inspect", str(root), "--json").out)
    assert {i["iteration"]: i["saved"] for i in doc["iterations"]} == {10: 1_700_000_000, 20: 1_700_000_600}


@pytest.mark.parametrize("tracker", ["30", "40"])  # 30 crashed mid-save, 40 was never written
def test_export_says_when_the_tracker_iteration_is_not_what_it_reads(megatron_root, tmp_path, cli, tracker):
    """Megatron resumes from the tracker's iteration; when that save is incomplete or missing, the
    export falls back to the newest complete one (documented), and says so on stderr."""
    (megatron_root / TRACKER).write_text(tracker)
    out = tmp_path / "hf"
    result = cli("convert", str(megatron_root), str(out), "--to", "hf")
    assert result.code == 0, result.err
    # (the sample's args have no vocab_size: that warning is said too, and is not this test's)
    warning = [line for line in result.err.splitlines() if "warning" in line and "vocabulary" not in line]
    assert len(warning) == 1 and f"names iteration {tracker}" in warning[0] and "using iteration 20" in warning[0]
    (megatron_root / TRACKER).write_text("20")
    quiet = cli("convert", str(megatron_root), str(tmp_path / "hf2"), "--to", "hf")
    assert quiet.code == 0 and not [line for line in quiet.err.splitlines()
                                    if "warning" in line and "vocabulary" not in line], quiet.err


def test_deepspeed_root_without_a_valid_latest_is_a_problem(tmp_path, cli):
    """DeepSpeed's load_checkpoint resumes from the tag in ``latest`` only: without it (or with a tag
    that is not there) nothing is resumed, so ``check`` reports it and no save is labelled latest."""
    root = tmp_path / "ds"
    shutil.copytree(SAMPLES / "deepspeed_zero" / "zero2", root)
    assert cli("check", str(root)).code == 0
    (root / "latest").write_text("global_step99")
    bad = cli("check", str(root))
    assert bad.code == 1 and "'latest' names 'global_step99'" in bad.out, bad.out
    (root / "latest").unlink()
    missing = cli("check", str(root))
    assert missing.code == 1 and "no 'latest' file" in missing.out, missing.out
    listed = json.loads(cli("inspect", str(root), "--json").out)["iterations"]
    assert not any(i["latest"] for i in listed)


def test_a_save_without_dcp_metadata_is_incomplete_whatever_metadata_json_says(megatron_root, cli):
    (megatron_root / "iter_0000020" / ".metadata").unlink()
    listed = {i["iteration"]: i for i in json.loads(cli("inspect", str(megatron_root), "--json").out)["iterations"]}
    assert listed[20]["complete"] is False and listed[10]["complete"] is True


def test_convert_names_a_missing_common_pt(tmp_path, cli):
    """common.pt holds the Megatron args (the model's shape): without it the mapping lacks head
    counts, and the error must say the save is damaged, not only that the config is silent."""
    iteration = tmp_path / "iter_0000010"
    shutil.copytree(MEGATRON_ITER, iteration)
    (iteration / "common.pt").unlink()
    result = cli("convert", str(iteration), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
    assert "common.pt" in result.err and "damaged" in result.err


def test_a_non_gated_megatron_mlp_is_refused_with_its_reason(tmp_path, cli):
    """args.swiglu=False (a GELU fc1): no mapped HF architecture has such an MLP. The args are the
    sample's own, re-saved by torch with that one field changed."""
    import torch

    iteration = tmp_path / "iter_0000010"
    shutil.copytree(MEGATRON_ITER, iteration)
    common = torch.load(iteration / "common.pt", weights_only=False)
    assert common["args"].swiglu is True
    common["args"].swiglu = False
    torch.save(common, iteration / "common.pt")
    result = cli("convert", str(iteration), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 2 and "not gated" in result.err and "swiglu=False" in result.err, result.err
    assert not (tmp_path / "hf").exists()


def test_check_reports_a_rank_file_cut_short_as_a_problem(tmp_path, cli):
    """DeepSpeed's per-rank optimizer file cut mid-write: the format is recognised, the file does not
    parse; check names it (exit 1) as it names a short .distcp, instead of 'cannot read' (exit 2)."""
    root = tmp_path / "ds"
    shutil.copytree(SAMPLES / "deepspeed_zero" / "zero2", root)
    rank_file = sorted(root.glob("global_step*/*zero_pp_rank_1_*optim_states.pt"))[0]
    rank_file.write_bytes(rank_file.read_bytes()[:1000])
    result = cli("check", str(root))
    assert result.code == 1, result.out + result.err
    assert f"unreadable-file: {rank_file.parent.name}/{rank_file.name}:" in result.out, result.out


def test_a_verl_step_dir_stands_for_its_roles(verl_root, cli):
    """``global_step_N/`` (the dir above ``actor/``): inspect opens the actor; check checks every role."""
    step = verl_root / "global_step_2"
    doc = json.loads(cli("inspect", str(step), "--json").out)
    assert doc["layout"] == "verl step dir (actor/ of global_step_2)" and Path(doc["path"]).name == "actor"
    assert cli("check", str(step)).code == 0
    rank_file = sorted((step / "critic").glob("model_world_size_*_rank_1.pt"))[0]
    rank_file.unlink()
    result = cli("check", str(step))
    assert result.code == 1 and f"critic/{rank_file.name}" in result.out, result.out


def test_diff_include_of_one_megatron_layer_selects_its_per_layer_views(megatron_root, cli):
    """Megatron stores decoder layers stacked (``decoder.layers.self_attention...``); a pattern naming
    one layer (what the timeline's per-layer cells pass) compares that layer's views."""
    result = cli("diff", str(megatron_root), str(megatron_root), "--iteration", "10", "--iteration-b", "20",
                 "--include", "decoder.layers.0.self_attention", "--json")
    assert result.code == 0, result.err
    names = [t["name"] for t in json.loads(result.out)["tensors"]]
    assert names and all(n.startswith("decoder.layers.0.self_attention.") for n in names), names
    stacked = cli("diff", str(megatron_root), str(megatron_root), "--iteration", "10", "--iteration-b", "20",
                  "--include", "decoder.layers.self_attention*", "--json")
    assert stacked.code == 0 and all(".layers.self_attention" in t["name"]
                                     for t in json.loads(stacked.out)["tensors"])


def _accelerate_project(path: Path, saves: int = 3) -> Path:
    """A project dir accelerate writes with ``ProjectConfiguration(automatic_checkpoint_naming=True)``:
    ``checkpoints/checkpoint_{0..saves-1}/``, each a ``save_state`` dir (model.safetensors, optimizer.bin,
    random_states_0.pkl), written by accelerate itself on CPU."""
    import torch
    import transformers
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed

    set_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    model = transformers.AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=str(path), automatic_checkpoint_naming=True))
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(saves):
        ids = torch.randint(0, 64, (2, 8))
        accelerator.backward(model(input_ids=ids, labels=ids).loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.save_state()
    return path


def test_accelerate_project_dir_is_a_save_root(tmp_path, cli):
    """accelerate's automatic checkpoint naming: the project dir (through checkpoints/) and checkpoints/
    itself list the saves, open the newest, and timeline runs over them (before: "not a checkpoint").
    A save without its rng states (save_state writes them after the model and optimizer) is incomplete."""
    project = _accelerate_project(tmp_path / "proj")
    for root in (project, project / "checkpoints"):
        found = discover_iterations(root)
        assert [(i.label, i.complete, i.kind) for i in found] == [
            ("2", True, "accelerate"), ("1", True, "accelerate"), ("0", True, "accelerate")]
        assert pick_iteration(root, found).path == str(project / "checkpoints" / "checkpoint_2")
    (project / "checkpoints" / "checkpoint_2" / "random_states_0.pkl").unlink()
    found = discover_iterations(project)
    assert [(i.label, i.complete) for i in found][0] == ("2", False)
    assert pick_iteration(project, found).path.endswith("checkpoint_1")
    result = cli("timeline", str(project), "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["iterations"] == [0, 1]  # the incomplete save is left out


def _nemo_checkpoint(path: Path, step: int) -> Path:
    """A NeMo 2.0 checkpoint dir as NeMo's ModelCheckpoint names and lays it out: ``weights/`` a
    Megatron-Core torch_dist save (here the shipped one, written by megatron-core; NeMo's own keys carry
    a ``module.`` prefix, which the model split peels like any wrapper) beside ``context/`` (io.json,
    model.yaml)."""
    target = path / f"llama--reduced_train_loss=5.09-epoch=0-step={step}-consumed_samples={step * 8}.0"
    shutil.copytree(MEGATRON_ITER, target / "weights")
    (target / "context").mkdir()
    (target / "context" / "io.json").write_text("{}")
    (target / "context" / "model.yaml").write_text("_target_: nemo.collections.llm.gpt.model.llama.LlamaModel\n")
    return target


def test_nemo2_checkpoints_dir_and_one_checkpoint(tmp_path, cli):
    """A NeMo run's checkpoints/ (step-named dirs and NeMo's -last copy of the newest) is a save root,
    and one checkpoint dir stands for its weights/ (before: "not a checkpoint", for both)."""
    root = tmp_path / "checkpoints"
    for step in (9, 19):
        newest = _nemo_checkpoint(root, step)
    shutil.copytree(newest, root / (newest.name + "-last"))
    found = discover_iterations(root)
    assert [(i.label, i.kind, i.complete) for i in found] == [("19", "nemo", True), ("9", "nemo", True)]
    assert pick_iteration(root, found).path == str(newest / "weights")
    for target in (root, newest):
        result = cli("inspect", "--json", str(target))
        assert result.code == 0, result.err
        assert json.loads(result.out)["format"] == "megatron_dist"
    result = cli("check", str(newest))
    assert result.code == 0 and "NeMo 2.0 checkpoint" in result.out, result.out + result.err
    (newest / "weights" / ".metadata").unlink()  # a save cut short
    assert [(i.label, i.complete) for i in discover_iterations(root)] == [("19", False), ("9", True)]
