"""Save roots: discover_iterations on directories built from the sample files, and the picker."""

from __future__ import annotations

import shutil
from pathlib import Path

from textual.widgets import DataTable
from tui_helpers import settle, sync

from ckptscope.ops.roots import discover_iterations
from ckptscope.tui.app import make_app
from ckptscope.tui.screens.browse import BrowseScreen
from ckptscope.tui.screens.iterations import IterationPickerScreen
from ckptscope.tui.widgets.summary_header import SummaryHeader


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def megatron_root(base: Path, samples: dict[str, Path]) -> Path:
    root = base / "save"
    shutil.copytree(samples["hf_llama_sharded"], root / "iter_0000010")
    (root / "iter_0000020" / "mp_rank_00").mkdir(parents=True)
    shutil.copy(samples["megatron_style.pt"], root / "iter_0000020" / "mp_rank_00" / "model_optim_rng.pt")
    (root / "iter_0000030").mkdir()  # crashed while saving: nothing written
    (root / "iter_0000030" / "half_written.tmp").write_bytes(b"\0" * 10)
    (root / "latest_checkpointed_iteration.txt").write_text("20\n")
    (root / "unrelated").mkdir()
    return root


def root_app(tmp_path: Path, samples: dict[str, Path], monkeypatch):
    """The app on ``megatron_root``'s save root, run from the dir holding it (so the title shows ``save``)."""
    megatron_root(tmp_path, samples)
    monkeypatch.chdir(tmp_path)
    return make_app("save", keymap={})


def test_discover_megatron_root(tmp_path, samples):
    root = megatron_root(tmp_path, samples)
    found = discover_iterations(root)
    assert [i.iteration for i in found] == [30, 20, 10]
    by_iter = {i.iteration: i for i in found}
    assert by_iter[10].complete and by_iter[20].complete and not by_iter[30].complete
    assert [i.iteration for i in found if i.latest] == [20]
    assert by_iter[10].size == du(root / "iter_0000010")
    assert by_iter[20].size == samples["megatron_style.pt"].stat().st_size
    assert Path(by_iter[10].path) == root / "iter_0000010"


def test_discover_verl_root_and_non_roots(tmp_path, samples):
    root = tmp_path / "verl"
    shutil.copytree(samples["hf_llama_single"], root / "global_step_5" / "actor")
    (root / "global_step_9" / "actor").mkdir(parents=True)
    found = discover_iterations(root)
    assert [(i.iteration, i.complete) for i in found] == [(9, False), (5, True)]
    assert found[1].path == str(root / "global_step_5" / "actor")
    assert discover_iterations(samples["hf_llama_sharded"]) is None
    assert discover_iterations(samples["dtypes.safetensors"]) is None
    assert discover_iterations(tmp_path / "missing") is None
    only_tracker = tmp_path / "fresh"
    only_tracker.mkdir()
    (only_tracker / "latest_checkpointed_iteration.txt").write_text("release")
    assert discover_iterations(only_tracker) == []


@sync
async def test_picker_opens_the_chosen_iteration(tmp_path, samples, monkeypatch):
    root = megatron_root(tmp_path, samples)
    monkeypatch.chdir(tmp_path)
    app = make_app("save", keymap={})
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, IterationPickerScreen)
        table = app.screen.query_one(DataTable)
        assert table.row_count == 3
        statuses = [str(table.get_row_at(i)[2]) for i in range(3)]
        assert statuses == ["✗ incomplete", "✓ complete", "✓ complete"]
        await pilot.press("j", "j", "k", "j", "enter")  # vim keys as in every list: iteration 10
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, BrowseScreen)
        index = screen.query_one(SummaryHeader).index
        assert index is not None and Path(index.path).name == "iter_0000010"
        from ckptscope.formats import open_checkpoint

        with open_checkpoint(root / "iter_0000010") as reader:
            assert len(index) == len(reader.index())
        await pilot.press("i")  # back to the picker
        await settle(pilot)
        assert isinstance(app.screen, IterationPickerScreen)


@sync
async def test_the_picker_starts_on_what_opening_the_root_picks(tmp_path, samples, monkeypatch):
    """The tracker names 20, below an incomplete 30: the cursor starts on 20, so Enter opens what the
    CLI opens (it started on the top row; a DeepSpeed tag named by 'latest' is listed last)."""
    app = root_app(tmp_path, samples, monkeypatch)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, IterationPickerScreen)
        assert app.screen.query_one(DataTable).cursor_row == 1
        await pilot.press("enter")
        await settle(pilot)
        index = app.screen.query_one(SummaryHeader).index
        assert index is not None and Path(index.path).name == "iter_0000020"


@sync
async def test_an_iteration_opened_directly_still_knows_its_root(tmp_path, samples):
    """``ckptscope open ROOT --iteration N`` opens N; ``i`` then offers ROOT's other iterations."""
    root = megatron_root(tmp_path, samples)
    app = make_app(root / "iter_0000010", keymap={}, iterations_root=str(root))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, BrowseScreen)
        assert Path(app.screen.query_one(SummaryHeader).index.path).name == "iter_0000010"
        await pilot.press("i")
        await settle(pilot)
        assert isinstance(app.screen, IterationPickerScreen)
        assert app.screen.query_one(DataTable).row_count == 3


@sync
async def test_escape_goes_back_and_only_q_quits(tmp_path, samples, monkeypatch):
    """Esc on the first picker neither quits nor leaves an empty screen (it says what to do); on a
    picker opened with ``i`` from a checkpoint it goes back to that checkpoint; q quits."""
    app = root_app(tmp_path, samples, monkeypatch)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, IterationPickerScreen)

        def offered() -> list[str]:
            return [b.description for _, b, on, _ in app.screen.active_bindings.values() if on and b.show]

        assert "back" not in offered() and "quit" in offered()  # nothing open yet: the footer says q, not esc
        await pilot.press("escape")
        await settle(pilot)
        assert isinstance(app.screen, IterationPickerScreen) and app.is_running
        await pilot.press("down", "enter")  # iteration 20
        await settle(pilot)
        assert isinstance(app.screen, BrowseScreen)
        opened = app.screen.query_one(SummaryHeader).index.path
        await pilot.press("i")
        await settle(pilot)
        assert isinstance(app.screen, IterationPickerScreen) and "back" in offered()
        await pilot.press("escape")
        await settle(pilot)
        assert isinstance(app.screen, BrowseScreen)
        assert app.screen.query_one(SummaryHeader).index.path == opened
        await pilot.press("i")
        await settle(pilot)
        await pilot.press("q")
        await settle(pilot)
    assert not app.is_running


@sync
async def test_backspace_goes_back_to_the_iterations_and_the_footer_leads_with_q(tmp_path, samples, monkeypatch):
    """Backspace in an iteration picked from a root goes back to the root's list (it did nothing; a
    person testing), and at 80 columns the footer still shows q and ? (they came last and were cut)."""
    from textual.widgets._footer import FooterKey

    app = root_app(tmp_path, samples, monkeypatch)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("enter")  # the tracker's iteration 20
        await settle(pilot)
        assert isinstance(app.screen, BrowseScreen)
        keys = [key for key in app.screen.query(FooterKey) if not key.has_class("-command-palette")]
        assert [key.key for key in keys[:2]] == ["q", "question_mark"]
        assert all(key.region.right <= 80 and key.region.width > 0 for key in keys[:2])
        assert any(key.action == "back" for key in keys)
        await pilot.press("backspace")
        await settle(pilot)
        assert isinstance(app.screen, IterationPickerScreen)
        shown = [key.description for key in app.screen.query(FooterKey)]
        assert "open" in shown  # enter was the table's hidden key: the footer said nothing about opening
        await pilot.press("escape")  # and back again to the checkpoint left open
        await settle(pilot)
        assert isinstance(app.screen, BrowseScreen)
        assert Path(app.screen.query_one(SummaryHeader).index.path).name == "iter_0000020"
