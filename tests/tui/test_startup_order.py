"""What the browser draws first: the tree, then the tabs; and quitting in between is clean."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from safetensors.numpy import save_file
from tui_helpers import settle, sync

from ckptscope.tui.app import make_app
from ckptscope.tui.screens.browse import BrowseScreen, DetailTabs
from ckptscope.tui.widgets.stats_view import StatsView
from ckptscope.tui.widgets.tensor_tree import TensorTree



@pytest.fixture(scope="module")
def many_tensors(tmp_path_factory) -> str:
    """20,000 small tensors in one file (row 9's shape): opening takes long enough that the
    order of the first frames shows; a small sample opens before the first frame is drawn."""
    tensors = {f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight": np.zeros((2, 4), np.float16)
               for layer in range(32) for expert in range(208) for proj in ("gate_proj", "up_proj", "down_proj")}
    path = tmp_path_factory.mktemp("many") / "model.safetensors"
    save_file(dict(list(tensors.items())[:20_000]), str(path), metadata={"format": "pt"})
    return str(path)


def watch_first_paint(monkeypatch) -> list[bool]:
    """For the tree's first paint with rows: whether the tabs were mounted by then."""
    seen: list[bool] = []
    original = TensorTree.render_lines

    def render_lines(self, crop):
        if not seen and self.root.children and not self.loading:
            seen.append(bool(self.screen.query(DetailTabs)))
        return original(self, crop)

    monkeypatch.setattr(TensorTree, "render_lines", render_lines)
    return seen


@sync
async def test_the_tree_is_drawn_before_the_tabs_are_mounted(many_tensors, monkeypatch):
    """Mounting the tabs took ~40 ms that came before the tree's first rows (row 9 of
    bench/run_all.py): ``call_after_refresh`` ran them before the frame that drew the tree."""
    seen = watch_first_paint(monkeypatch)
    app = make_app(many_tensors, keymap={})
    async with app.run_test(size=(140, 45)) as pilot:
        await settle(pilot)
        assert seen == [False]
        screen = app.screen
        assert isinstance(screen, BrowseScreen) and screen.panes_ready  # and then the tabs came
        assert screen.query_one(StatsView)
        await pilot.press("s")  # the tabs work as before: stats of the tensor under the cursor
        await settle(pilot)
        assert screen.query_one("#tabs").active == "stats"


@sync
async def test_closing_as_the_tree_appears_is_clean(many_tensors, monkeypatch):
    """The app shut down right after the tree's first rows, while the tabs are being mounted (row 9's
    probe does that): no traceback."""
    seen = watch_first_paint(monkeypatch)
    app = make_app(many_tensors, keymap={})
    async with app.run_test(size=(140, 45)):
        while not seen:
            await asyncio.sleep(0.005)
    # leaving run_test shut the app down in the middle of mounting the tabs: it raised NoMatches
    assert seen and not app.is_running


@sync
async def test_the_tabs_come_even_when_the_tree_has_no_room_to_draw(many_tensors, monkeypatch):
    """A terminal too short for any tree row: the tabs are mounted anyway, after ``PANES_AT_THE_LATEST``."""
    seen = watch_first_paint(monkeypatch)
    app = make_app(many_tensors, keymap={})
    async with app.run_test(size=(100, 4)) as pilot:
        await settle(pilot)
        for _ in range(100):
            if app.screen.panes_ready:
                break
            await asyncio.sleep(0.02)
        assert app.screen.panes_ready and app.screen.query_one(StatsView)
    assert not seen  # the tree never drew a row


@sync
async def test_the_chosen_theme_shows_from_the_start_without_a_second_pass_over_the_css(in_repo, monkeypatch):
    """Setting ``App.theme`` made Textual re-parse every stylesheet (and then parse it once more,
    its cache cold): ~25 ms of start-up. The theme is applied before the first parse instead; it must
    still be the one shown, and ctrl+t still switches."""
    from textual.color import Color
    from textual.css.stylesheet import Stylesheet

    from ckptscope.tui.app import DARK, LIGHT

    reparses: list[int] = []
    original = Stylesheet.reparse

    def reparse(self):
        reparses.append(1)
        return original(self)

    monkeypatch.setattr(Stylesheet, "reparse", reparse)
    for theme, other in ((LIGHT, DARK), (DARK, LIGHT)):
        reparses.clear()
        app = make_app("sample_ckpts/hf_llama_single", keymap={}, theme=theme.name)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot)
            assert reparses == []
            assert app.theme == theme.name and app.has_class(f"-theme-{theme.name}")
            assert app.has_class("-dark-mode") is theme.dark and app.has_class("-light-mode") is not theme.dark
            assert app.screen.styles.background == Color.parse(theme.background)
            await pilot.press("ctrl+t")
            await settle(pilot)
            assert app.theme == other.name and reparses
            assert app.screen.styles.background == Color.parse(other.background)


@sync
async def test_a_quick_open_shows_no_spinner_and_a_slow_one_does(in_repo, monkeypatch):
    """The loading indicator comes only after ``SPINNER_AFTER`` seconds of reading: a spinner
    flashing for a fraction of a second said nothing and took the UI thread's time from the reader."""
    import time

    import ckptscope.tui.opening as opening
    from ckptscope.tui.screens import browse

    shown: list[bool] = []
    monkeypatch.setattr(TensorTree, "watch_loading", lambda self, loading: shown.append(loading), raising=False)
    app = make_app("sample_ckpts/hf_llama_single", keymap={})
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.pause(browse.SPINNER_AFTER + 0.1)
        assert app.screen.index is not None and True not in shown

    real_open = opening.open_path

    def slow_open(*args, **kwargs):
        time.sleep(browse.SPINNER_AFTER + 0.4)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(opening, "open_path", slow_open)
    shown.clear()
    app = make_app("sample_ckpts/hf_llama_single", keymap={})
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(browse.SPINNER_AFTER + 0.2)
        assert shown == [True] and app.screen.query_one(TensorTree).loading
        await settle(pilot)
        assert shown == [True, False] and not app.screen.query_one(TensorTree).loading
        assert app.screen.index is not None
