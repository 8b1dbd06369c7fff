"""Review fixes, checked as a person sees them: the text of the terminal after keys are pressed
(the compositor's strips: what a terminal of that size shows), at 80x24 and at 200x50.

The diff of the shipped HF and Megatron-Core samples, a renamed copy written by ``ckptscope rename``,
the help and the modals, the objects tab of a Megatron save, the timeline of a run trained by the
real transformers Trainer (sample_ckpts/make_timeline_samples.py) and the header of a safetensors
file with nine dtypes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Input
from test_timeline_screen import hf_run, until  # noqa: F401 - hf_run: the Trainer-written run, a fixture
from tui_helpers import settle, sync

from ckptscope.ops.diff.engine import DiffOptions
from ckptscope.tui.app import make_app
from ckptscope.tui.diff_app import make_diff_app
from ckptscope.tui.screens.confirm import ConfirmScreen
from ckptscope.tui.screens.diff import DiffScreen
from ckptscope.tui.screens.diff_with import DiffWithDialog
from ckptscope.tui.screens.help import HelpScreen
from ckptscope.tui.screens.iterations import IterationPickerScreen
from ckptscope.tui.screens.timeline import TimelineScreen
from ckptscope.tui.widgets.objects_table import ObjectsTable

REPO = Path(__file__).resolve().parents[2]
NARROW = (80, 24)
WIDE = (200, 50)


def screen_text(app) -> list[str]:
    """Every line of the terminal as drawn (modal screens over what lies beneath them)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def footer_text(app) -> str:
    return screen_text(app)[-1]


async def diff_finished(pilot) -> DiffScreen:
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, DiffScreen) and app.screen.progress.state == "finished")
    await pilot.pause(0.3)
    await settle(pilot)
    return app.screen


# --- 2: the diff at 80 columns ----------------------------------------------------------------


def gqa_diff():
    """The shipped HF and Megatron-Core saves of one model (names differ, values equal)."""
    return make_diff_app("sample_ckpts/hf_llama_gqa", "sample_ckpts/mcore_llama_gqa",
                         options=DiffOptions(device="cpu"), keymap={})


@sync
async def test_diff_at_80_columns_shows_whole_names_and_the_detail_inside_the_screen(in_repo):
    app = gqa_diff()
    async with app.run_test(size=NARROW) as pilot:
        screen = await diff_finished(pilot)
        for _ in range(7):
            await pilot.press("j")
        await settle(pilot)
        lines = screen_text(app)
        table = screen.query_one("#diff-table", DataTable)
        top, bottom = table.region.y + 1, table.region.bottom  # under the column labels
        rows = [line.split("  ")[0].strip() for line in lines[top:bottom] if line.strip()]
        rows = [row for row in rows if row.startswith(("model.", "lm_head", "…"))]
        assert len(rows) >= 4 and len(set(rows)) == len(rows), rows
        assert "model.layers.0.self_attn.k_proj.weight" in "\n".join(lines[top:bottom])
        # the detail pane lies below the table, as wide as the screen, and its text wraps inside it
        box = screen.query_one("#diff-detail-box")
        assert box.region.y >= table.region.bottom and box.region.right <= NARROW[0]
        detail = "\n".join(lines[box.region.y:box.region.bottom])
        assert screen.current == "model.layers.0.self_attn.k_proj.weight"
        # A is stored under the pair's name (the pane's title): its line gives dtype and shape; B's names its source
        assert " model.layers.0.self_attn.k_proj.weight" in detail and "A float32  [16, 64]" in detail
        assert "decoder.layers.self_attention.linear_qkv.weight[0, 32:40, :] +" in detail


@sync
async def test_diff_beside_the_table_on_a_wide_screen(in_repo):
    app = gqa_diff()
    async with app.run_test(size=WIDE) as pilot:
        screen = await diff_finished(pilot)
        table, box = screen.query_one("#diff-table"), screen.query_one("#diff-detail-box")
        assert box.region.x >= table.region.right and box.region.right <= WIDE[0]
        await pilot.resize_terminal(*NARROW)
        await settle(pilot)
        assert screen.has_class("-narrow") and box.region.y >= table.region.bottom


# --- 3: renamed pairs counted once -------------------------------------------------------------


@pytest.fixture(scope="module")
def renamed_copy(tmp_path_factory) -> Path:
    """A copy of hf_llama_sharded whose layers.3.mlp is called layers.3.ffn (``ckptscope rename``)."""
    out = tmp_path_factory.mktemp("renamed") / "ren1"
    subprocess.run([sys.executable, "-m", "ckptscope", "rename", "sample_ckpts/hf_llama_sharded", str(out),
                    "--sub", r"layers\.3\.mlp", "layers.3.ffn"], cwd=REPO, check=True, capture_output=True)
    return out


@sync
async def test_renamed_pairs_are_counted_once_and_progress_reaches_the_total(in_repo, renamed_copy):
    cli = subprocess.run([sys.executable, "-m", "ckptscope", "diff", "--json", "sample_ckpts/hf_llama_sharded",
                          str(renamed_copy)], cwd=REPO, capture_output=True, text=True)
    summary = json.loads(cli.stdout)["summary"]  # the CLI's own count, the reference for the header
    pairs = summary["compared"] + summary["renamed"] + summary["only_a"] + summary["only_b"]
    assert (pairs, summary["equal"], summary["renamed"]) == (39, 36, 3)
    app = make_app("sample_ckpts/hf_llama_sharded", keymap={})
    async with app.run_test(size=NARROW) as pilot:
        await settle(pilot)
        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, DiffWithDialog))
        app.screen.query_one(Input).value = str(renamed_copy)
        await pilot.press("enter")
        screen = await diff_finished(pilot)
        text = "\n".join(screen_text(app))
        assert "39 pairs: 36 equal · 3 renamed" in text
        assert "39/39 tensors" in text and "39 of 39 shown" in text
        name = "model.layers.3.mlp.up_proj.weight"
        table = screen.query_one("#diff-table", DataTable)
        table.move_cursor(row=table.get_row_index(name))
        await settle(pilot)
        screen.query_one("#diff-detail-box", VerticalScroll).scroll_end(animate=False)
        await settle(pilot)
        detail = " ".join(line.strip() for line in screen_text(app))
        assert "Renamed: B holds the same dtype, shape and bytes as model.layers.3.ffn.up_proj.weight." in detail


# --- 8: help scrolls with vim keys; each modal shows its own keys ------------------------------


@sync
async def test_help_scrolls_with_vim_keys_and_shows_its_own_footer(in_repo):
    app = make_app("sample_ckpts/hf_llama_sharded", keymap={})
    async with app.run_test(size=NARROW) as pilot:
        await settle(pilot)
        assert "filter" in footer_text(app)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        box = app.screen.query_one("#help-box", VerticalScroll)
        assert box.max_scroll_y > 10
        first = screen_text(app)[3]
        await pilot.press("j", "j", "j")
        await settle(pilot)
        assert box.scroll_y == 3 and screen_text(app)[3] != first
        await pilot.press("k")
        await settle(pilot)
        assert box.scroll_y == 2
        await pilot.press("G")
        await settle(pilot)
        assert box.scroll_y == box.max_scroll_y
        assert "browse.stats" in "\n".join(screen_text(app)) or "keymap" in "\n".join(screen_text(app))
        await pilot.press("g")
        await settle(pilot)
        assert box.scroll_y == 0
        await pilot.press("ctrl+d")
        await settle(pilot)
        half = box.scroll_y
        assert half >= 5
        await pilot.press("ctrl+u")
        await settle(pilot)
        assert box.scroll_y == 0
        footer = footer_text(app)
        assert "esc close" in footer and "j/k scroll" in footer and "filter" not in footer
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen))
        assert "filter" in footer_text(app)


@sync
async def test_confirm_and_diff_with_show_their_own_keys(in_repo):
    app = make_app("sample_ckpts/hf_llama_sharded", keymap={})
    answers: list[bool | None] = []
    async with app.run_test(size=NARROW) as pilot:
        await settle(pilot)
        app.push_screen(ConfirmScreen("Discard 2 pending renames?"), answers.append)
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        footer = footer_text(app)
        assert "y yes" in footer and "n/esc no" in footer and "filter" not in footer
        await pilot.press("n")
        await until(pilot, lambda: answers == [False])
        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, DiffWithDialog))
        footer = footer_text(app)
        assert "⏎ compare" in footer and "esc cancel" in footer and "filter" not in footer


# --- 19: object keys sized from the tab ----------------------------------------------------------


@sync
async def test_object_keys_get_the_room_the_tab_has(in_repo):
    app = make_app("sample_ckpts/megatron_torch_dist/iter_0000010", keymap={})
    async with app.run_test(size=WIDE) as pilot:
        await settle(pilot)
        await pilot.press("o")
        await settle(pilot)
        table = app.screen.query_one(ObjectsTable)
        longest = max(len(key) for key, _, _ in table.rows_full)
        assert longest > 36  # Megatron's args.untie_embeddings_and_output_weights and the like
        assert table.columns["key"].width == min(longest, int(table.size.width * 0.45))
        text = "\n".join(screen_text(app))
        assert "args.untie_embeddings_and_output_weights" in text
        await pilot.resize_terminal(*NARROW)
        await settle(pilot)
        assert table.columns["key"].width <= max(16, int(table.size.width * 0.45))
        width = table.columns["key"].width
        cut = [line for line in screen_text(app) if "▕  args.num_a…ion_heads  int" in line]
        assert width == 20 and cut, "long keys keep start and end around an ellipsis on a narrow tab"


# --- 20: the timeline at 80 columns ------------------------------------------------------------


@sync
async def test_timeline_at_80_columns(hf_run):
    steps = sorted(int(p.name.split("-")[1]) for p in hf_run.glob("checkpoint-*"))
    app = make_app(str(hf_run), keymap={})
    async with app.run_test(size=NARROW) as pilot:
        await until(pilot, lambda: isinstance(app.screen, IterationPickerScreen))
        await pilot.press("t")
        await until(pilot, lambda: isinstance(app.screen, TimelineScreen) and app.screen.result is not None)
        await settle(pilot)
        screen = app.screen
        heat, side = screen.query_one("#tl-heat"), screen.query_one("#tl-side")
        assert side.region.y >= heat.region.bottom and side.region.width == NARROW[0]
        lines = screen_text(app)
        header = lines[heat.region.y]
        assert all(f"{a}→{b}" in header for a, b in zip(steps, steps[1:])), header  # every step on screen
        names = [line.split("  ")[0].strip() for line in lines[heat.region.y + 1:heat.region.bottom]]
        # the names take what the steps leave; cut, they keep their layer (index_ellipsis)
        assert "model.layers.0.self_attn" in names
        assert "…layers.0.post_attention_layernorm" in names and "…layers.1.post_attention_layernorm" in names
        assert len(set(names)) == len(names)
        await pilot.press("F")
        await settle(pilot)
        flags = screen.query_one("#tl-flags", DataTable)
        flag_lines = "\n".join(lines[flags.region.y:flags.region.bottom] + screen_text(app)[flags.region.y:])
        first = screen.result.flags[0]
        assert first.kind in flag_lines and str(first.iteration) in flag_lines
        assert first.subject in flag_lines or first.subject[-20:] in flag_lines


# --- 22: the header's dtype list wraps between items --------------------------------------------


@sync
async def test_header_dtypes_wrap_between_items(in_repo):
    app = make_app("sample_ckpts/dtypes.safetensors", keymap={})
    async with app.run_test(size=WIDE) as pilot:
        await settle(pilot)
        header = app.screen.query_one("SummaryHeader")
        lines = screen_text(app)[header.region.y:header.region.bottom]
        items = [part.strip() for line in lines for part in line.split("●")[1:]]
        assert len(items) == 9, lines
        for item in items:
            dtype, size, unit, share = item.split()
            assert unit in ("B", "KiB") and share.startswith("(") and share.endswith("%)"), item
        assert any(line.strip().startswith("● ") for line in lines[1:]), "a second line starts with an item"
