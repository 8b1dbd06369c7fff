"""The iteration picker on the root kinds whose iterations are not all numbers: Megatron's
``release/`` (named by the tracker) next to an ``iter_*`` dir."""

from __future__ import annotations

import shutil
from pathlib import Path

from textual.widgets import DataTable
from tui_helpers import settle, sync

from ckptscope.tui.app import make_app
from ckptscope.tui.screens.browse import BrowseScreen
from ckptscope.tui.screens.iterations import IterationPickerScreen
from ckptscope.tui.widgets.summary_header import SummaryHeader

MEGATRON_ITER = Path(__file__).resolve().parents[2] / "sample_ckpts" / "megatron_torch_dist" / "iter_0000010"


@sync
async def test_picker_lists_and_opens_release(tmp_path):
    root = tmp_path / "save"
    shutil.copytree(MEGATRON_ITER, root / "release")
    shutil.copytree(MEGATRON_ITER, root / "iter_0000010")
    (root / "latest_checkpointed_iteration.txt").write_text("release")
    app = make_app(str(root), keymap={})
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, IterationPickerScreen)
        table = app.screen.query_one(DataTable)
        rows = [(str(table.get_row_at(i)[0]), str(table.get_row_at(i)[1])) for i in range(table.row_count)]
        assert rows == [("10", ""), ("release", "latest")]
        await pilot.press("down", "enter")
        await settle(pilot)
        assert isinstance(app.screen, BrowseScreen)
        index = app.screen.query_one(SummaryHeader).index
        assert index is not None and Path(index.path).name == "release"
