"""Rename from the browser, end to end: r / x / u / R / A driven with Pilot on a real sample copy,
the result checked with the safetensors library (not ckptscope's reader), the source by hashes."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from textual.widgets import DataTable, Input, Static
from tui_helpers import settle, sync, text_of

from ckptscope.tui.app import make_app
from ckptscope.tui.screens.browse import BrowseScreen
from ckptscope.tui.screens.rename_apply import RenameApplyScreen
from ckptscope.tui.screens.rename_dialog import RenameDialog
from ckptscope.tui.screens.rename_pending import PendingRenamesScreen
from ckptscope.tui.widgets.summary_header import SummaryHeader
from ckptscope.tui.widgets.tensor_tree import TensorTree

SIZE = (140, 45)
TYPING = 0.25
"""Longer than the dialog's preview delay."""


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def load_dir(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


@pytest.fixture
def src(samples, tmp_path) -> Path:
    target = tmp_path / "src_hf"
    shutil.copytree(samples["hf_llama_sharded"], target)
    return target


async def cursor_to(pilot, text: str) -> None:
    """Put the tree cursor on the first visible row whose label contains ``text``."""
    tree = pilot.app.screen.query_one(TensorTree)
    row = next(i for i in range(tree.last_line + 1) if text in tree.get_node_at_line(i).label.plain)
    tree.move_cursor_to_line(row)
    await settle(pilot)


def row_label(app, text: str) -> str:
    tree = app.screen.query_one(TensorTree)
    return next(tree.get_node_at_line(i).label.plain for i in range(tree.last_line + 1)
                if text in tree.get_node_at_line(i).label.plain)


async def type_into(pilot, value: str) -> None:
    """Type ``value`` into the focused field and wait for the preview (debounce timer, then worker)."""
    await pilot.press("ctrl+u", *value)
    for _ in range(2):
        await pilot.pause(TYPING)
        await settle(pilot)


@sync
async def test_rename_flow_end_to_end(src, tmp_path):
    before = tree_hashes(src)
    original = load_dir(src)
    app = make_app(src, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, BrowseScreen)

        # 1. r on a tensor: its full name, a collision with an existing name first, then a good name
        await cursor_to(pilot, "embed_tokens.weight")
        assert screen.current.name == "model.embed_tokens.weight"
        await pilot.press("r")
        await settle(pilot)
        dialog = app.screen
        assert isinstance(dialog, RenameDialog) and not dialog.regex_mode
        assert dialog.query_one("#rename-new", Input).value == "model.embed_tokens.weight"
        await type_into(pilot, "lm_head.weight")
        problems = {row.old: row.problem for row in dialog.last.rows}
        assert "collides with the existing name" in problems["model.embed_tokens.weight"]
        assert "lm_head.weight" in problems  # the untouched name it would collide with is listed too
        assert "names would collide" in dialog.last.error
        await pilot.press("enter")  # refused: the dialog stays, the reason is shown
        await settle(pilot)
        assert app.screen is dialog
        assert "not added" in text_of(dialog.query_one("#rename-status", Static))
        await type_into(pilot, "model.tok_embeddings.weight")
        assert [(r.old, r.new, r.problem) for r in dialog.last.rows] == [
            ("model.embed_tokens.weight", "model.tok_embeddings.weight", "")]
        preview_text = text_of(dialog.query_one("#rename-preview", Static))
        assert "model.embed_tokens.weight" in preview_text and "model.tok_embeddings.weight" in preview_text
        await pilot.press("enter")
        await settle(pilot)
        assert app.screen is screen
        assert len(screen.pending_renames()) == 1
        assert "→ tok_embeddings.weight" in row_label(app, "embed_tokens.weight")
        assert "1 rule pending" in text_of(screen.query_one(SummaryHeader))

        # 2. r on the layer range: regex over the four copies; a conflict is shown, then fixed
        await cursor_to(pilot, "[0-3]")
        await pilot.press("r")
        await settle(pilot)
        dialog = app.screen
        assert isinstance(dialog, RenameDialog) and dialog.regex_mode
        pattern = dialog.query_one("#rename-pattern", Input).value
        layer_names = [n for n in original if n.startswith("model.layers.")]
        assert all(re.search(pattern, n) for n in layer_names)
        assert not any(re.search(pattern, n) for n in original if n not in layer_names)
        await pilot.press("tab")  # to the replacement
        await type_into(pilot, "model.blocks.")
        assert dialog.last.changed == len(layer_names)
        assert dialog.last.conflicts == len(layer_names)
        assert all(row.problem.startswith("same new name as") for row in dialog.last.rows)
        assert "⚠ same new name as" in text_of(dialog.query_one("#rename-preview", Static))
        await pilot.press("enter")
        await settle(pilot)
        assert app.screen is dialog  # not added
        await type_into(pilot, r"model.blocks.\g<1>.")
        assert dialog.last.conflicts == 0 and dialog.last.changed == len(layer_names)
        await pilot.press("enter")
        await settle(pilot)
        assert app.screen is screen and len(screen.pending_renames()) == 2
        assert f"✎ {len(layer_names)} pending" in row_label(app, "[0-3]")

        # 3. x drops norm.weight; R lists three rules; u undoes the drop
        await cursor_to(pilot, "norm.weight")
        await pilot.press("x")
        await settle(pilot)
        assert "dropped" in row_label(app, "norm.weight")
        await pilot.press("R")
        await settle(pilot)
        panel = app.screen
        assert isinstance(panel, PendingRenamesScreen)
        table = panel.query_one(DataTable)
        assert table.row_count == 3
        assert "--drop" in str(table.get_row_at(2)[3])
        await pilot.press("G")  # (vim keys) the highlighted rule in full under the table (its CLI column may be off screen)
        await settle(pilot)
        assert "--drop" in text_of(panel.query_one("#pending-rule", Static))
        await pilot.press("u")
        await settle(pilot)
        assert table.row_count == 2
        assert f"{len(layer_names) + 1} renamed" in text_of(panel.query_one("#pending-status", Static))
        await pilot.press("escape")
        await settle(pilot)
        assert app.screen is screen
        assert "dropped" not in row_label(app, "norm.weight")

        # 4. x drops lm_head.weight (kept this time)
        await cursor_to(pilot, "lm_head.weight")
        await pilot.press("x")
        await settle(pilot)
        assert len(screen.pending_renames()) == 3

        # 5. A: an existing destination is refused in the dialog, then a free one is planned and written
        await pilot.press("A")
        await settle(pilot)
        apply = app.screen
        assert isinstance(apply, RenameApplyScreen)
        assert apply.query_one("#apply-dst", Input).value == str(src.with_name("src_hf-renamed"))
        # nothing typed yet: the opening line, not "destination changed" (said on first open, a person testing)
        assert "destination changed" not in text_of(apply.query_one("#apply-status", Static))
        taken = tmp_path / "taken"
        taken.mkdir()
        await type_into(pilot, str(taken))
        await pilot.press("enter")
        await settle(pilot)
        assert apply.stage == "destination"
        assert "destination exists" in text_of(apply.query_one("#apply-status", Static))
        await type_into(pilot, str(src.with_name("src_hf-renamed")))  # back to the offered value: a change all the same
        await settle(pilot)
        assert "destination changed" in text_of(apply.query_one("#apply-status", Static))
        dst = tmp_path / "dst_hf"
        await type_into(pilot, str(dst))
        await pilot.press("enter")
        await settle(pilot)
        assert apply.stage == "planned" and apply.plan is not None
        summary = text_of(apply.query_one("#apply-status", Static))
        assert f"{len(layer_names) + 1} renamed · 1 dropped" in summary
        assert not dst.exists()  # nothing written before the plan is confirmed
        await pilot.press("enter")  # focus is on "Write"
        await settle(pilot)
        assert apply.stage == "done", text_of(apply.query_one("#apply-status", Static))
        assert "wrote" in text_of(apply.query_one("#apply-status", Static))

        # 6. open the result: the browser now shows DST
        await pilot.press("enter")
        await settle(pilot)
        reopened = app.screen
        assert isinstance(reopened, BrowseScreen) and reopened is not screen
        assert reopened.path == str(dst)
        assert "model.tok_embeddings.weight" in reopened.index.tensors

    def expected_name(name: str) -> str | None:
        if name == "lm_head.weight":
            return None
        if name == "model.embed_tokens.weight":
            return "model.tok_embeddings.weight"
        if name.startswith("model.layers."):
            return "model.blocks." + name[len("model.layers."):]
        return name

    renamed = load_dir(dst)
    expected = {expected_name(n): t for n, t in original.items() if expected_name(n) is not None}
    assert set(renamed) == set(expected)
    for name, tensor in expected.items():
        assert same_bits(renamed[name], tensor), name
    weight_map = json.loads((dst / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(weight_map) == set(expected)
    assert tree_hashes(src) == before, "the source changed"


@sync
async def test_plan_error_is_shown_in_the_apply_dialog(src, tmp_path):
    """Removing a rule another one builds on leaves a rule that matches nothing: apply explains it."""
    before = tree_hashes(src)
    app = make_app(src, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        await cursor_to(pilot, "norm.weight")
        await pilot.press("r")
        await settle(pilot)
        await type_into(pilot, "model.final_norm.weight")
        await pilot.press("enter")
        await settle(pilot)
        # the dialog now starts from the pending name
        await pilot.press("r")
        await settle(pilot)
        assert app.screen.query_one("#rename-new", Input).value == "model.final_norm.weight"
        await type_into(pilot, "model.norm_f.weight")
        await pilot.press("enter")
        await settle(pilot)
        assert "→ norm_f.weight" in row_label(app, "norm.weight")
        # remove the first rule in the panel: the second one now matches nothing
        await pilot.press("R")
        await settle(pilot)
        panel = app.screen
        panel.query_one(DataTable).move_cursor(row=0)
        await pilot.press("delete")
        await settle(pilot)
        assert "pattern matches no tensor" in text_of(panel.query_one("#pending-status", Static))
        await pilot.press("escape")
        await settle(pilot)
        assert "pattern matches no tensor" in text_of(screen.query_one(SummaryHeader))
        await pilot.press("A")
        await settle(pilot)
        await type_into(pilot, str(tmp_path / "never"))
        await pilot.press("enter")
        await settle(pilot)
        apply = app.screen
        assert isinstance(apply, RenameApplyScreen) and apply.stage == "destination"
        status = text_of(apply.query_one("#apply-status", Static))
        assert "cannot plan the rename" in status and "pattern matches no tensor" in status
        await pilot.press("escape")
        await settle(pilot)
        assert app.screen is screen
    assert not (tmp_path / "never").exists()
    assert tree_hashes(src) == before


@sync
async def test_prefix_rename_keys_palette_and_keymap(src):
    app = make_app(src, keymap={"rename.selection": "E"})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        # a module: the prefix is edited; the remapped key opens the dialog
        await cursor_to(pilot, "model")
        await pilot.press("E")
        await settle(pilot)
        dialog = app.screen
        assert isinstance(dialog, RenameDialog)
        assert dialog.query_one("#rename-new", Input).value == "model"
        await type_into(pilot, "backbone")
        names = list(screen.index.tensors)
        model_names = [n for n in names if n.startswith("model.")]
        assert {(r.old, r.new) for r in dialog.last.rows} == {(n, "backbone." + n[6:]) for n in model_names}
        await pilot.press("enter")
        await settle(pilot)
        assert f"✎ {len(model_names)} pending" in row_label(app, "model")
        # a rule on a module inside the renamed one starts from the new prefix
        await cursor_to(pilot, "[0-3]")
        await pilot.press("E")
        await settle(pilot)
        assert app.screen.query_one("#rename-pattern", Input).value.startswith(r"^backbone\.layers\.")
        await pilot.press("escape")
        await settle(pilot)
        # the palette reaches the pending list and undo
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"rename: undo the last rule")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await settle(pilot)
        assert len(screen.pending_renames()) == 0
        assert "pending" not in row_label(app, "model")
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"rename: pending rules")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await settle(pilot)
        assert isinstance(app.screen, PendingRenamesScreen)
        assert "No pending renames" in text_of(app.screen.query_one("#pending-status", Static))
        await pilot.press("escape")
        # A with nothing pending only says so
        await pilot.press("A")
        await settle(pilot)
        assert app.screen is screen


@sync
async def test_help_lists_rename_keys(in_repo):
    from ckptscope.tui.screens.help import HelpScreen

    app = make_app("sample_ckpts/hf_llama_single", keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = " ".join(text_of(s) for s in app.screen.query(".help-group"))
        for binding_id in ("rename.selection", "rename.drop", "rename.undo", "rename.apply", "ops.rename"):
            assert binding_id in text


def test_rename_bindings_have_ids_and_tooltips():
    from textual.binding import Binding

    from ckptscope.tui.app import CkptScopeApp
    from ckptscope.tui.screens.error import ErrorScreen
    from ckptscope.tui.screens.help import HelpScreen
    from ckptscope.tui.screens.iterations import IterationPickerScreen

    ids = []
    for owner in (CkptScopeApp, BrowseScreen, ErrorScreen, HelpScreen, IterationPickerScreen, TensorTree,
                  RenameDialog, PendingRenamesScreen, RenameApplyScreen):
        for binding in owner.BINDINGS:
            assert isinstance(binding, Binding) and binding.id and binding.tooltip, (owner.__name__, binding)
            ids.append(binding.id)
    assert len(ids) == len(set(ids))


def _rename_dialog_keys():
    async def run_before(pilot) -> None:
        await settle(pilot)
        for key in ("down", "down", "down"):  # model, embed_tokens, then the layers.[0-3] range
            await pilot.press(key)
            await settle(pilot, rounds=1)
        await pilot.press("r")
        await settle(pilot)
        await pilot.press("tab", "ctrl+u", *"model.blocks.")  # every layer onto one name: conflicts
        await pilot.pause(0.4)
        await settle(pilot)

    return run_before


def test_rename_dialog_snapshot(snap_compare, in_repo):
    assert snap_compare(make_app("sample_ckpts/hf_llama_sharded", keymap={}), terminal_size=SIZE,
                        run_before=_rename_dialog_keys())


@sync
async def test_quit_with_pending_renames_asks_first(tmp_path):
    """q with a pending rule asks; n keeps the plan and the app; y quits. Without rules q quits."""
    from ckptscope.tui.screens.confirm import ConfirmScreen

    src = tmp_path / "hf"
    shutil.copytree("sample_ckpts/hf_llama_single", src)
    app = make_app(src, keymap={})
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        screen = app.screen
        await cursor_to(pilot, "norm.weight")
        await pilot.press("x")
        await settle(pilot)
        assert len(screen.pending_renames()) == 1
        await pilot.press("q")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmScreen) and "1 pending rename rule" in app.screen.question
        await pilot.press("n")
        await settle(pilot)
        assert app.screen is screen and app.is_running and len(screen.pending_renames()) == 1
        await pilot.press("q")
        await settle(pilot)
        await pilot.press("y")
        await settle(pilot)
    assert not app.is_running and app.return_code == 0


@sync
async def test_preview_refuses_moving_a_torch_files_tensor_out_of_its_dict(samples, tmp_path):
    """A torch file keeps its tensors in nested dicts ({"model": {...}}): a new name outside the dict
    cannot be written. The preview says so as the rule is typed, and enter does not add it (before, the
    rule was accepted and only applying it failed)."""
    src = tmp_path / "megatron_style.pt"
    shutil.copy(samples["megatron_style.pt"], src)
    before = tree_hashes(tmp_path)
    app = make_app(src, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        await cursor_to(pilot, "model  ")  # the module: the "model" dict's state dict
        await pilot.press("r")
        await settle(pilot)
        dialog = app.screen
        assert isinstance(dialog, RenameDialog)
        await type_into(pilot, "net")
        assert dialog.last.changed > 1 and "must keep the 'model' prefix" in dialog.last.error
        assert "must keep the 'model' prefix" in text_of(dialog.query_one("#rename-status", Static))
        await pilot.press("enter")
        await settle(pilot)
        assert app.screen is dialog and "not added" in text_of(dialog.query_one("#rename-status", Static))
        await type_into(pilot, "model.net")  # new keys inside the same dict
        assert dialog.last.changed > 1 and not dialog.last.error
        await pilot.press("enter")
        await settle(pilot)
        assert app.screen is screen and len(screen.pending_renames()) == 1
    assert tree_hashes(tmp_path) == before


@sync
async def test_overwrite_says_what_it_replaces_before_writing(src, tmp_path):
    """A probe ticked "overwrite" on an existing folder holding an unrelated file: the refusal stayed on
    screen after ticking, and the confirm step said only where it would write; the file was gone after
    enter. The stale refusal gives way, and the plan says what is replaced before anything is written."""
    from textual.widgets import Checkbox

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "marker.txt").write_text("keep me?")
    app = make_app(src, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await cursor_to(pilot, "lm_head.weight")
        await pilot.press("x")
        await settle(pilot)
        await pilot.press("A")
        await settle(pilot)
        apply = app.screen
        await type_into(pilot, str(taken))
        await pilot.press("enter")
        await settle(pilot)
        assert "destination exists" in text_of(apply.query_one("#apply-status", Static))
        apply.query_one("#apply-overwrite", Checkbox).value = True
        await settle(pilot)
        status = text_of(apply.query_one("#apply-status", Static))
        assert "destination exists" not in status and "checks the plan again" in status
        apply.action_go()
        await settle(pilot)
        assert apply.stage == "planned"
        status = text_of(apply.query_one("#apply-status", Static))
        assert f"replaces the existing folder {taken} (1 file, 8 B)" in status, status
        assert (taken / "marker.txt").is_file()  # nothing written before the plan is confirmed
