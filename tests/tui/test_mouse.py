"""The main things done with the mouse alone, at 80x24: open and select in the tree, switch the
detail tabs, scroll, press the buttons of the convert and rename forms and of the confirm modal.
Results are checked on disk with the safetensors library, not ckptscope's reader."""

from __future__ import annotations

import shutil
from pathlib import Path

from safetensors import safe_open
from textual.widgets import Button, Select, TabbedContent
from tui_helpers import settle, sync, wheel

from ckptscope.tui.app import make_app
from ckptscope.tui.screens.browse import BrowseScreen
from ckptscope.tui.screens.confirm import ConfirmScreen
from ckptscope.tui.screens.convert import PLAN_DELAY, ConvertScreen
from ckptscope.tui.screens.rename_apply import RenameApplyScreen
from ckptscope.tui.screens.rename_dialog import RenameDialog
from ckptscope.tui.screens.rename_pending import PendingRenamesScreen
from ckptscope.tui.widgets.tensor_tree import TensorTree

SAMPLES = Path(__file__).resolve().parents[2] / "sample_ckpts"
SIZE = (80, 24)


def line_of(tree: TensorTree, text: str) -> int:
    return next(i for i in range(tree.last_line + 1) if text in tree.get_node_at_line(i).label.plain)


async def click(pilot, target, offset=(2, 0)) -> None:
    await pilot.click(target, offset=offset)
    await settle(pilot)


async def wait_plan(pilot) -> None:
    for _ in range(2):
        await pilot.pause(PLAN_DELAY + 0.1)
        await settle(pilot)


def stored_names(folder: Path) -> set[str]:
    names: set[str] = set()
    for shard in folder.glob("*.safetensors"):
        with safe_open(str(shard), "np") as f:
            names.update(f.keys())
    return names


@sync
async def test_tree_tabs_scroll_and_rename_with_the_mouse(tmp_path):
    src = tmp_path / "hf"
    shutil.copytree(SAMPLES / "hf_llama_sharded", src)
    app = make_app(src, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        tree = screen.query_one(TensorTree)
        # a click on a module opens it, a second closes it; a click on a tensor selects it
        layers = tree.get_node_at_line(line_of(tree, "layers"))
        await click(pilot, TensorTree, (6, layers.line))
        assert layers.is_expanded and tree.cursor_node is layers
        await click(pilot, TensorTree, (6, line_of(tree, "mlp")))
        await click(pilot, TensorTree, (10, line_of(tree, "down_proj")))
        assert screen.current is not None and screen.current.name == "model.layers.0.mlp.down_proj.weight"
        await click(pilot, TensorTree, (6, layers.line))
        assert not layers.is_expanded
        # every tab of the detail pane by a click on its label
        tabs = screen.query_one(TabbedContent)
        for pane in ("stats", "values", "objects", "files", "tensor"):
            await click(pilot, f"#--content-tab-{pane}", (2, 0))
            assert tabs.active == pane
        # the wheel scrolls a tree longer than the screen
        await pilot.resize_terminal(80, 14)
        await pilot.press("e")
        await settle(pilot)
        assert tree.max_scroll_y > 0
        await wheel(pilot, tree, times=3)
        assert tree.scroll_y > 0
        await wheel(pilot, tree, down=False, times=10)
        assert tree.scroll_y == 0
        await pilot.resize_terminal(*SIZE)
        await settle(pilot)

        # rename dialog: Cancel, then a new name and Add to pending
        await click(pilot, TensorTree, (3, line_of(tree, "embed_tokens")))
        await pilot.press("r")
        await settle(pilot)
        assert isinstance(app.screen, RenameDialog)
        await click(pilot, "#rename-cancel")
        assert app.screen is screen and not screen.pending_renames()
        await pilot.press("r")
        await settle(pilot)
        await pilot.press("ctrl+u", *"model.tok_embeddings.weight")
        await pilot.pause(0.3)
        await settle(pilot)
        await click(pilot, "#rename-add")
        assert app.screen is screen and len(screen.pending_renames()) == 1
        # pending list: Close, then Apply… -> Check plan -> Write -> Close, all clicks, at 80x24
        await pilot.press("R")
        await settle(pilot)
        assert isinstance(app.screen, PendingRenamesScreen)
        await click(pilot, "#pending-close")
        assert app.screen is screen
        await pilot.press("R")
        await settle(pilot)
        await click(pilot, "#pending-apply")
        apply = app.screen
        assert isinstance(apply, RenameApplyScreen)
        await click(pilot, "#apply-go")  # Check plan
        assert apply.stage == "planned"
        go = apply.query_one("#apply-go", Button)
        assert go.region.bottom <= SIZE[1] - 1, "Write is off the screen"  # the plan must not push it out
        await wheel(pilot, apply.query_one("#apply-box"), times=5)  # the plan scrolls inside the dialog
        await click(pilot, go)  # Write
        await pilot.pause(0.5)
        await settle(pilot)
        assert apply.stage == "done"
        await click(pilot, "#apply-cancel")  # Close
        assert app.screen is screen
    names = stored_names(tmp_path / "hf-renamed")
    assert "model.tok_embeddings.weight" in names and "model.embed_tokens.weight" not in names
    assert "model.embed_tokens.weight" in stored_names(src)


@sync
async def test_convert_form_with_the_mouse(tmp_path):
    shutil.copytree(SAMPLES / "mcore_llama_gqa", tmp_path / "mcore")
    app = make_app(tmp_path / "mcore" / "iter_0000000", keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        browser = app.screen
        await pilot.press("C")
        await wait_plan(pilot)
        form = app.screen
        assert isinstance(form, ConvertScreen)
        await click(pilot, "#convert-cancel")
        assert app.screen is browser
        await pilot.press("C")
        await wait_plan(pilot)
        form = app.screen
        target = form.query_one("#convert-target", Select)
        assert target.value == "hf"
        # open the target list and pick mcore, then hf again, by clicks
        for line, value in ((1, "mcore"), (0, "hf")):
            await click(pilot, target)
            assert target.expanded
            await click(pilot, "SelectOverlay", (2, line))
            await wait_plan(pilot)
            assert target.value == value and form.plan is not None and form.plan.target == value
        await click(pilot, "#convert-go")
        await pilot.pause(0.5)
        await settle(pilot)
        assert form.stage == "done", form.stage
        await pilot.pause(0.5)  # the Open result button takes Convert's place
        await settle(pilot)
        opener = form.query_one("#convert-open", Button)
        assert app.get_widget_at(opener.region.x + 2, opener.region.y)[0] is opener, "Open result is hidden"
        await click(pilot, "#convert-open")
        assert isinstance(app.screen, BrowseScreen) and app.screen.path == str(tmp_path / "mcore-hf")
    assert "model.layers.0.self_attn.q_proj.weight" in stored_names(tmp_path / "mcore-hf")


@sync
async def test_confirm_buttons(tmp_path):
    src = tmp_path / "hf"
    shutil.copytree(SAMPLES / "hf_llama_single", src)
    app = make_app(src, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        tree = screen.query_one(TensorTree)
        await click(pilot, TensorTree, (3, line_of(tree, "norm.weight")))
        await pilot.press("x")
        await settle(pilot)
        await pilot.press("q")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmScreen)
        await click(pilot, "#confirm-no")
        assert app.screen is screen and app.is_running and len(screen.pending_renames()) == 1
        await pilot.press("q")
        await settle(pilot)
        await click(pilot, "#confirm-yes")
    assert not app.is_running and app.return_code == 0
