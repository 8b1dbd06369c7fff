"""The diff screen end to end: two safetensors dirs written by ``safetensors.torch.save_file`` (one
element perturbed in one tensor, one tensor saved in another dtype), driven with Pilot; expected
metrics are computed here with numpy from the tensors themselves."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from textual.app import App
from textual.widgets import Input
from tui_helpers import settle, sync, text_of

from ckptscope.ops.diff.engine import DiffOptions
from ckptscope.tui import run_diff_tui
from ckptscope.tui.app import make_app
from ckptscope.tui.diff_app import DiffApp, make_diff_app
from ckptscope.tui.screens.diff import DiffScreen
from ckptscope.tui.screens.diff_with import DiffWithDialog
from ckptscope.tui.widgets.diff_table import DiffTable
from ckptscope.tui.widgets.pair_detail import PairDetailView

SIZE = (150, 45)
PERTURBED = "model.layers.0.mlp.up_proj.weight"
AT = (70, 5)
RECAST = "model.layers.0.self_attn.q_proj.weight"
REPO = Path(__file__).resolve().parents[2]


def base_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(64, 32, generator=g),
        "model.layers.0.input_layernorm.weight": torch.randn(32, generator=g),
        PERTURBED: torch.randn(96, 32, generator=g),
        RECAST: torch.randn(32, 32, generator=g),
        "model.layers.1.mlp.up_proj.weight": torch.randn(96, 32, generator=g),
        "lm_head.weight": torch.randn(64, 32, generator=g),
    }


def write_pair(root: Path) -> tuple[dict, dict]:
    """``root/base`` and ``root/tuned``: the same tensors, one element moved, one tensor in bf16."""
    base = base_tensors()
    tuned = {k: v.clone() for k, v in base.items()}
    tuned[PERTURBED][AT] += 0.5
    tuned[RECAST] = base[RECAST].to(torch.bfloat16)
    for name, tensors in (("base", base), ("tuned", tuned)):
        (root / name).mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(root / name / "model.safetensors"))
    return base, tuned


@pytest.fixture
def pair_dir(tmp_path, monkeypatch):
    """Run from the dir holding ``base`` and ``tuned``, so the header shows those short paths."""
    base, tuned = write_pair(tmp_path)
    monkeypatch.chdir(tmp_path)
    return base, tuned


def numpy_metrics(a: torch.Tensor, b: torch.Tensor) -> dict:
    x, y = a.double().numpy().ravel(), b.double().numpy().ravel()
    d = np.abs(x - y)
    return {"max_abs_diff": float(d.max()), "mean_abs_diff": float(d.mean()),
            "rel_l2": float(np.linalg.norm(x - y) / np.linalg.norm(x)),
            "cosine": float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))), "num_diff": int((x != y).sum())}


def diff_app(a: str = "base", b: str = "tuned") -> DiffApp:
    return make_diff_app(a, b, options=DiffOptions(device="cpu"), keymap={})


async def finished(pilot) -> DiffScreen:
    for _ in range(50):
        await settle(pilot)
        screen = pilot.app.screen
        if isinstance(screen, DiffScreen) and screen.progress.state in ("finished", "failed"):
            await pilot.pause(0.3)  # the detail pane's delay before it computes
            await settle(pilot)
            return screen
    raise AssertionError("the diff did not finish")


def rows(screen: DiffScreen) -> list[str]:
    table = screen.query_one(DiffTable)
    return [table.coordinate_to_cell_key((i, 0)).row_key.value for i in range(table.row_count)]


def cell(screen: DiffScreen, name: str, column: str) -> str:
    return screen.query_one(DiffTable).get_cell(name, column).plain


@sync
async def test_results_metrics_and_detail_match_numpy(pair_dir):
    base, tuned = pair_dir
    app = diff_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await finished(pilot)
        assert screen.progress.state == "finished" and screen.progress.done == len(base)
        assert set(rows(screen)) == set(base)
        assert screen.results[PERTURBED].status == "different"
        assert screen.results[RECAST].status == "dtype_mismatch"
        assert {n for n, r in screen.results.items() if r.status == "equal"} == set(base) - {PERTURBED, RECAST}
        for name in (PERTURBED, RECAST):
            expected = numpy_metrics(base[name], tuned[name])
            got = screen.results[name].metrics
            for key, value in expected.items():
                assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-15), (name, key)
            assert cell(screen, name, "max_abs") == f"{expected['max_abs_diff']:.3g}"
            assert cell(screen, name, "num_diff") == f"{expected['num_diff']:,}"
        assert screen.results[PERTURBED].max_diff_at == AT
        header = text_of(screen.query_one("#diff-header"))
        assert "different" in header and "1 different" in header and "1 dtype" in header and "4 equal" in header
        assert "mapping none" in header and "device cpu" in header and f"{len(base)}/{len(base)} tensors" in header


@sync
async def test_sort_by_max_abs_key_and_header_click(pair_dir):
    base, tuned = pair_dir
    expected = {n: numpy_metrics(base[n], tuned[n]) for n in (PERTURBED, RECAST)}
    largest = {key: max(expected, key=lambda n: expected[n][key]) for key in ("mean_abs_diff", "rel_l2")}
    app = diff_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await finished(pilot)
        plan_order = [p.name for p in screen.plan.pairs]
        assert rows(screen) == plan_order
        await pilot.press("3")
        await settle(pilot)
        assert rows(screen)[:2] == [PERTURBED, RECAST]
        assert screen.sort_column == "max_abs"
        assert "max_abs ▼" in screen.query_one(DiffTable).columns["max_abs"].label.plain
        await pilot.press("3")  # again: reversed, the largest last
        await settle(pilot)
        assert rows(screen)[-1] == PERTURBED
        await pilot.press("s")  # next column after max_abs
        await settle(pilot)
        assert screen.sort_column == "mean_abs" and rows(screen)[0] == largest["mean_abs_diff"]
        table = screen.query_one(DiffTable)
        x = sum(table.columns[k].get_render_width(table) for k in ("name", "status", "max_abs", "mean_abs")) + 2
        await pilot.click(DiffTable, offset=(x, 0))  # the rel_l2 header
        await settle(pilot)
        assert screen.sort_column == "rel_l2" and rows(screen)[0] == largest["rel_l2"]


@sync
async def test_filters_by_status_and_name(pair_dir):
    base, _ = pair_dir
    app = diff_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await finished(pilot)
        await pilot.press("d")
        await settle(pilot)
        assert sorted(rows(screen)) == sorted([PERTURBED, RECAST])
        await pilot.press("f")  # differing -> equal
        await settle(pilot)
        assert screen.status_filter == "equal" and set(rows(screen)) == set(base) - {PERTURBED, RECAST}
        await pilot.press("f", "f")  # close (none), different
        await settle(pilot)
        assert screen.status_filter == "different" and rows(screen) == [PERTURBED]
        await pilot.press("a", "slash")
        await pilot.pause(0.1)
        await pilot.press(*"mlp.up")
        await pilot.pause(0.3)
        await settle(pilot)
        assert sorted(rows(screen)) == sorted(n for n in base if "mlp.up" in n)
        screen.query_one("#diff-filter", Input).value = "*layers.0.*"
        await pilot.pause(0.3)
        await settle(pilot)
        assert sorted(rows(screen)) == sorted(n for n in base if n.startswith("model.layers.0."))
        await pilot.press("escape")  # closes and clears the name filter
        await settle(pilot)
        assert len(rows(screen)) == len(base)
        assert "of 6 shown" in text_of(screen.query_one("#diff-status"))


@sync
async def test_selecting_the_perturbed_pair_shows_its_heatmap(pair_dir):
    base, tuned = pair_dir
    app = diff_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await finished(pilot)
        await pilot.press("d", "3")
        await pilot.pause(0.3)
        await settle(pilot)
        view = screen.query_one(PairDetailView)
        assert view.result is not None and view.result.name == PERTURBED
        detail = view.detail
        assert detail is not None and detail.num_diff == 1
        delta = abs(float(tuned[PERTURBED][AT]) - float(base[PERTURBED][AT]))
        heat = detail.heatmap
        i, j = heat.cell_of(*AT)
        assert heat.row_edges[i] <= AT[0] < heat.row_edges[i + 1] and heat.col_edges[j] <= AT[1] < heat.col_edges[j + 1]
        assert heat.max_abs[i][j] == delta and heat.counts[i][j] == 1
        assert sum(map(sum, heat.counts)) == 1
        assert detail.histogram.counts[detail.histogram.bin_of(delta)] == 1
        shown = text_of(view)
        assert "where they differ" in shown and "histogram" in shown
        assert f"{delta:.6g}" in shown and "at [70, 5]" in shown
        lines = shown.splitlines()
        side_a = next(i for i, line in enumerate(lines) if line.startswith("A "))
        # a side stored under the pair's own name (the pane's title) shows its dtype and shape only
        assert lines[side_a].split() == ["A", "float32", "[96,", "32]"] and shown.count(PERTURBED) == 1
        await pilot.press("down")  # the bf16 copy: every element differs somewhere
        await pilot.pause(0.3)
        await settle(pilot)
        assert view.result.name == RECAST and view.detail is not None
        assert sum(map(sum, view.detail.heatmap.counts)) == screen.results[RECAST].metrics["num_diff"]
        assert "bfloat16" in text_of(view)


@sync
async def test_quit_gives_diff_exit_codes(tmp_path):
    write_pair(tmp_path)
    for b, code in (("tuned", 1), ("base", 0)):
        app = diff_app(str(tmp_path / "base"), str(tmp_path / b))
        async with app.run_test(size=SIZE) as pilot:
            await finished(pilot)
            await pilot.press("q")
        assert app.return_code == code, b


def _headless_run(monkeypatch, keys=("q",)):
    async def drive(pilot) -> None:
        for _ in range(50):
            await settle(pilot)
            screen = pilot.app.screen
            if not isinstance(screen, DiffScreen) or screen.progress.state != "comparing":
                break
        await settle(pilot)
        await pilot.press(*keys)

    monkeypatch.setattr(DiffApp, "run", lambda self, **kw: App.run(self, headless=True, size=SIZE, auto_pilot=drive))


def test_run_diff_tui_exit_codes(tmp_path, monkeypatch, capsys):
    write_pair(tmp_path)
    _headless_run(monkeypatch)
    base, tuned = str(tmp_path / "base"), str(tmp_path / "tuned")
    options = DiffOptions(device="cpu")
    assert run_diff_tui(base, tuned, options=options) == 1
    assert run_diff_tui(base, base, options=options) == 0
    assert run_diff_tui(base, str(tmp_path / "missing"), options=options) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ckptscope: error:") and "missing" in err


@sync
async def test_diff_with_from_the_browser(pair_dir):
    app = make_app("base", keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("D")
        await settle(pilot)
        assert isinstance(app.screen, DiffWithDialog)
        await pilot.press(*"nowhere", "enter")
        await settle(pilot)
        assert isinstance(app.screen, DiffWithDialog)
        assert "no such file" in text_of(app.screen.query_one("#diff-with-status"))
        # a path that is no checkpoint stays in the box with the reason (the dialog closed and the diff failed)
        (Path("notes.txt")).write_text("not a checkpoint")
        app.screen.query_one(Input).value = ""
        await pilot.press(*"notes.txt", "enter")
        await settle(pilot)
        assert isinstance(app.screen, DiffWithDialog) and app.screen.query_one(Input).value == "notes.txt"
        assert "not a checkpoint" in text_of(app.screen.query_one("#diff-with-status"))
        app.screen.query_one(Input).value = ""
        await pilot.press(*"tun", "right", "enter")  # → completes the path
        screen = await finished(pilot)
        assert (screen.a, screen.b) == ("base", "tuned" + os.sep)
        assert screen.results[PERTURBED].status == "different" and not screen.standalone
        await pilot.press("escape")  # back to the browser, which is still open
        await settle(pilot)
        assert type(app.screen).__name__ == "BrowseScreen"
        await pilot.press("q")
    assert app.return_code == 0


@sync
async def test_palette_lists_diff_commands(pair_dir):
    app = diff_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await finished(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause(0.3)
        await pilot.press(*"differing only")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await settle(pilot)
        assert app.screen is screen and screen.status_filter == "differing"


def test_snapshot(snap_compare, pair_dir):
    async def run_before(pilot) -> None:
        await finished(pilot)
        await pilot.press("d", "3")
        await pilot.pause(0.3)
        await settle(pilot)

    assert snap_compare(diff_app(), terminal_size=SIZE, run_before=run_before)


def test_cli_in_a_terminal_runs_the_tui(tmp_path):
    """``ckptscope diff A B`` on a real pseudo-terminal: the screen comes up, q quits with code 1."""
    write_pair(tmp_path)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "ckptscope", "diff", "base", "tuned", "--device", "cpu"],
                            stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path, env=env, close_fds=True)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 90
    try:
        while b"6/6 tensors" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    break
        assert b"6/6 tensors" in seen, seen[-2000:]
        os.write(master, b"q")
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    os.read(master, 65536)
                except OSError:
                    pass
        assert proc.wait(timeout=10) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


def test_names_are_whole_unless_the_column_is_too_narrow():
    """Whole names when they fit; otherwise start and end around one middle ellipsis, never the
    first-letter abbreviations that made q_proj/k_proj rows of two layers look alike."""
    from ckptscope.tui.widgets.diff_table import shorten

    name = "model.layers.12.self_attn.q_proj.weight"
    assert shorten(name, len(name)) == name
    cut = shorten(name, 30)
    assert len(cut) == 30 and cut.count("…") == 1
    assert cut.startswith("model.layers") and cut.endswith("q_proj.weight")
    assert shorten("model.layers.12.self_attn.k_proj.weight", 30) != cut


@sync
async def test_renamed_tensor_is_one_row(tmp_path, monkeypatch):
    """The screen streams only_a / only_b rows as they come; once every pair is seen, a renamed
    identical tensor becomes one 'renamed' row and the header counts it so."""
    torch.manual_seed(1)
    weight = torch.randn(6, 4)
    for name, tensors in (("base", {"old.weight": weight, "same": torch.ones(3)}),
                          ("tuned", {"new.weight": weight.clone(), "same": torch.ones(3)})):
        (tmp_path / name).mkdir()
        save_file(tensors, str(tmp_path / name / "model.safetensors"))
    monkeypatch.chdir(tmp_path)
    app = diff_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await finished(pilot)
        assert set(screen.results) == {"old.weight", "same"}
        assert screen.results["old.weight"].status == "renamed"
        assert screen.results["old.weight"].renamed_to == "new.weight"
        assert "renamed" in cell(screen, "old.weight", "status")
        assert screen.progress.counts.get("only_a", 0) == 0 and screen.progress.counts.get("only_b", 0) == 0


@sync
async def test_header_names_the_iteration_a_save_root_opened(pair_dir, tmp_path):
    """B given as a save root opens its default iteration; the header kept the root, and a person comparing
    iterations could not tell which one B was."""
    import shutil

    root = tmp_path / "run"
    for step in (1, 2):
        shutil.copytree(tmp_path / "tuned", root / f"checkpoint-{step}")
        (root / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    app = diff_app("base", str(root))
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await finished(pilot)
        assert screen.progress.b == str(root / "checkpoint-2")
        assert screen.progress.a == "base"


def test_a_cosine_just_below_one_reads_as_one_minus_not_a_range():
    from ckptscope.tui.diff_rows import fmt_cell

    assert fmt_cell(1.0 - 2e-12, 7) == "1−2e-12"
    assert "-" not in fmt_cell(1.0 - 2e-12, 7)[:2]


@sync
async def test_a_config_fact_the_dirs_disagree_on_is_a_row_with_both_values(tmp_path, monkeypatch):
    """Two HF dirs with equal tensors whose config.json says another activation: the CLI diff exits 1
    (``ops.config_check``); the screen lists the fact as a row and its pane says what each side says."""
    import json
    import shutil

    for name in ("base", "tuned"):
        shutil.copytree(REPO / "sample_ckpts" / "hf_llama_gqa", tmp_path / name)
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())
    config["hidden_act"] = "gelu"
    (tmp_path / "tuned" / "config.json").write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    app = diff_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await finished(pilot)
        fact = "config.json: activation"
        assert screen.results[fact].status == "different"
        assert fact in rows(screen)
        assert [n for n, r in screen.results.items() if r.status != "equal"] == [fact]
        screen._select(fact)
        await settle(pilot)
        shown = " ".join(text_of(screen.query_one(PairDetailView)).split())
        assert 'The config.json files disagree on activation: A says "silu", B says "gelu".' in shown
        assert "1 different" in text_of(screen.query_one("#diff-header"))


@sync
async def test_a_megatron_arg_the_saves_disagree_on_is_a_row_with_both_values(tmp_path, monkeypatch):
    """Two Megatron saves of equal tensors whose args say another RoPE base (``common.pt`` edited as a run
    with ``--rotary-base 500000`` writes it): the screen lists the arg as a row, as the CLI does."""
    import shutil

    for name in ("base", "tuned"):
        shutil.copytree(REPO / "sample_ckpts" / "mcore_llama_gqa", tmp_path / name)
    common = tmp_path / "tuned" / "iter_0000000" / "common.pt"
    state = torch.load(common, weights_only=False)
    state["args"].rotary_base = 500000
    torch.save(state, common)
    monkeypatch.chdir(tmp_path)
    app = diff_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await finished(pilot)
        fact = "Megatron args: rotary_base"
        assert [n for n, r in screen.results.items() if r.status != "equal"] == [fact]
        assert fact in rows(screen)
        screen._select(fact)
        await settle(pilot)
        shown = " ".join(text_of(screen.query_one(PairDetailView)).split())
        assert "disagree on the Megatron arg rotary_base: A says 10000, B says 500000." in shown
        assert "1 different" in text_of(screen.query_one("#diff-header"))
