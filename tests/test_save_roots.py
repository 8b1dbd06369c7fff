"""Save roots of the three trainers (Megatron iter_*, verl global_step_*, torchtitan step-*) and
``--iteration`` on ``inspect`` / ``open``. Roots are assembled from the shipped samples, each
written by its real writer (megatron-core, verl-style FSDP2 save, torch DCP); a crashed save is a
copy with the file that is written last taken away."""

from __future__ import annotations

import json
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
