"""The supported-architectures page, opened from the command palette as a person does, shows what
``ckptscope archs --json`` lists (both come from the mapping tables)."""

from __future__ import annotations

import json
from pathlib import Path

from textual.widgets import DataTable, OptionList, Static
from tui_helpers import settle, sync, text_of

from ckptscope.tui.app import make_app
from ckptscope.tui.screens.archs import ArchsScreen
from tests.conftest import run_cli


@sync
async def test_palette_opens_the_archs_page_with_the_cli_listing(in_repo):
    listed = {a["name"]: a for a in json.loads(run_cli("archs", "--json").out)["archs"]}
    app = make_app(Path("sample_ckpts/hf_llama_single"), keymap={})
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+p", *"supported arch")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, ArchsScreen)
        options = screen.query_one(OptionList)
        names = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert names == list(listed)
        for i, name in enumerate(names):
            options.highlighted = i
            await settle(pilot, rounds=1)
            table = screen.query_one("#archs-table", DataTable)
            assert table.row_count == len(listed[name]["tensors"])
            cells = [str(table.get_row_at(r)[1]).split("\n") for r in range(table.row_count)]
            assert {c[0] for c in cells} == {t["mcore"] for t in listed[name]["tensors"]}
            # rules for some layers only (dense vs MoE layers) say which, as the CLI does
            assert sorted(c[1] for c in cells if len(c) > 1) == sorted(
                f"only in {t['layers']}" for t in listed[name]["tensors"] if t["layers"])
            assert text_of(screen.query_one("#archs-facts", Static)).startswith(name)
        options.highlighted = 0
        await pilot.press("j")  # vim keys in the list
        await settle(pilot, rounds=1)
        assert text_of(screen.query_one("#archs-facts", Static)).startswith(names[1])
        await pilot.press("escape")
        assert not isinstance(app.screen, ArchsScreen)
