"""The timeline screen, as a person uses it: t in the iteration picker of a run trained for real
(transformers Trainer, planted faults), the heatmap cells show the relative change that torch
computes from the saved tensors, the planted flags are listed, enter on a cell opens the diff of
that module between the two iterations of its step."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from textual.widgets import DataTable, Static
from tui_helpers import settle, sync, text_of

from ckptscope.tui.app import make_app
from ckptscope.tui.screens.diff import DiffScreen
from ckptscope.tui.screens.iterations import IterationPickerScreen
from ckptscope.tui.screens.timeline import TimelineScreen

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory) -> Path:
    samples = str(REPO / "sample_ckpts")
    if samples not in sys.path:
        sys.path.insert(0, samples)
    gen = importlib.import_module("make_timeline_samples")
    return gen.write_timeline_hf(tmp_path_factory.mktemp("timeline_tui"))


async def until(pilot, condition, rounds: int = 200) -> None:
    for _ in range(rounds):
        await settle(pilot, rounds=1)
        if condition():
            return
        await pilot.pause(0.05)
    raise AssertionError("the screen never got there")


@sync
async def test_timeline_screen_from_the_picker(hf_run):
    steps = sorted(int(p.name.split("-")[1]) for p in hf_run.glob("checkpoint-*"))
    app = make_app(str(hf_run), keymap={})
    async with app.run_test(size=(160, 45)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, IterationPickerScreen))
        await pilot.press("t")
        await until(pilot, lambda: isinstance(app.screen, TimelineScreen) and app.screen.result is not None)
        screen = app.screen
        heat = screen.query_one("#tl-heat", DataTable)
        names = [str(heat.get_row_at(r)[0]) for r in range(heat.row_count)]
        assert "model.layers.0.self_attn" in names and "model.layers.1.mlp" in names
        # the change in one cell equals torch on the two saves, over the module's tensors taken as one vector
        row, step = names.index("model.layers.0.self_attn"), 1
        a = load_file(hf_run / f"checkpoint-{steps[step]}" / "model.safetensors")
        b = load_file(hf_run / f"checkpoint-{steps[step + 1]}" / "model.safetensors")
        keys = [k for k in a if k.startswith("model.layers.0.self_attn.")]
        diff = torch.sqrt(sum(((b[k].double() - a[k].double()) ** 2).sum() for k in keys))
        norm = torch.sqrt(sum((a[k].double() ** 2).sum() for k in keys))
        shown = str(heat.get_cell_at((row, step + 1)))
        assert float(shown) == pytest.approx((diff / norm).item(), rel=0.06)  # shown in 1 significant digit
        frozen = names.index("model.layers.1.mlp")
        assert all(str(heat.get_cell_at((frozen, c))).strip() == "0" for c in range(1, len(steps)))
        flags = screen.query_one("#tl-flags", DataTable)
        kinds = {str(flags.get_row_at(r)[0]) for r in range(flags.row_count)}
        assert {"frozen", "nan", "exploding"} <= kinds
        heat.focus()
        heat.move_cursor(row=row, column=step + 1)
        await settle(pilot)
        detail = text_of(screen.query_one("#tl-detail", Static))
        assert "model.layers.0.self_attn" in detail and f"{steps[step]} → {steps[step + 1]}" in detail
        assert "of the largest)" in text_of(screen.query_one("#tl-spark-title", Static))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DiffScreen))
        assert app.screen.include == ("model.layers.0.self_attn",)
        assert Path(app.screen.a).name == f"checkpoint-{steps[step]}"
        assert Path(app.screen.b).name == f"checkpoint-{steps[step + 1]}"


def test_a_module_holding_nan_still_shows_its_finite_change():
    """A bare "NaN" cell hid that the rest of the module kept training, which the CLI says as
    ``2.10e-02 nan`` (a probe): the cell keeps the change, marked and red."""
    from ckptscope.tui.screens.timeline import change_cell

    marked = change_cell(0.021, nan=3)
    assert "2e-2!" in marked.plain and "red" in str(marked.style)
    assert change_cell(0.021).plain.strip() == "2e-2"
    assert "NaN" in change_cell(float("nan"), nan=5).plain


def test_the_sparkline_caption_gives_its_scale():
    """The bars always span lowest to highest norm: a norm that moved by 1e-5 drew the same full swing as one
    that doubled (a person testing). The caption says how far apart the ends are, in digits that tell them apart."""
    from ckptscope.tui.screens.timeline import spark_caption

    assert spark_caption([1.0, 1.00001, 1.000005]).plain.endswith("1 … 1.00001 (bars span 1e-05 of the largest)")
    assert spark_caption([1.0, 2.0]).plain.endswith("1 … 2 (bars span 0.5 of the largest)")
    assert spark_caption([3.0, 3.0]).plain.endswith("flat at 3")
    assert spark_caption([float("nan"), 1.0]).plain == "norm over the iterations"


@sync
async def test_names_take_the_width_the_steps_leave(hf_run):
    """At 80 columns the name column had 40 % of the width whatever the steps needed: with a few iterations
    tensor names were cut to ``…layers.0.…t_attention_layernorm`` beside blank columns (a person testing).
    The names now get what the step columns leave, and the table still never scrolls sideways."""
    app = make_app(str(hf_run), keymap={})
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, IterationPickerScreen))
        await pilot.press("t")
        await until(pilot, lambda: isinstance(app.screen, TimelineScreen) and app.screen.result is not None)
        await pilot.press("T")
        await settle(pilot)
        heat = app.screen.query_one("#tl-heat", DataTable)
        name = heat.columns["name"]  # type: ignore[index]
        longest = max(len(str(heat.get_row_at(r)[0])) for r in range(heat.row_count))
        steps = sum(c.get_render_width(heat) for k, c in heat.columns.items() if k != "name")
        assert name.width == min(longest, heat.size.width - steps - 2 * heat.cell_padding
                                 - heat.styles.scrollbar_size_vertical) > 0.4 * 80
        assert heat.max_scroll_x == 0
