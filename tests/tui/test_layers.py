"""Inside a collapsed range: p picks one layer (its real tensors become reachable) or two layers
to compare, with metrics checked against torch on the loaded tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from textual.widgets import DataTable, Input, Static
from tui_helpers import settle, sync, text_of

from ckptscope.tui.app import make_app
from ckptscope.tui.screens.layers import LayerCompareScreen, LayerPickScreen, parse_pick
from ckptscope.tui.widgets.tensor_tree import TensorTree

PATH = Path("sample_ckpts/hf_llama_sharded")


def reference() -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(PATH.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


async def to_range(pilot) -> TensorTree:
    tree = pilot.app.screen.query_one(TensorTree)
    for _ in range(10):
        node = tree.cursor_node
        if node is not None and node.data is not None and node.data.node.is_range:
            return tree
        await pilot.press("down" if node is None or not node.allow_expand or node.is_expanded else "right")
        await settle(pilot, rounds=1)
    raise AssertionError("no range row reached")


@sync
async def test_pick_one_layer_opens_its_real_tensors(in_repo):
    app = make_app(PATH, keymap={})
    async with app.run_test(size=(140, 45)) as pilot:
        await settle(pilot)
        tree = await to_range(pilot)
        assert "pick layer" in [b.description for _, b, enabled, _ in app.screen.active_bindings.values() if enabled]
        await pilot.press("p")
        await settle(pilot)
        assert isinstance(app.screen, LayerPickScreen)
        await pilot.press("9", "enter")
        await settle(pilot)
        assert "9 is not a layer of this range (0-3)" in text_of(app.screen.query_one("#pick-error", Static))
        app.screen.query_one(Input).value = ""
        await pilot.press("2", "enter")
        await settle(pilot)
        assert tree.cursor_node.data.node.path == "model.layers.2"
        await pilot.press("down")
        await settle(pilot)
        name = app.screen.current.name
        assert name.startswith("model.layers.2.") and name in reference()


@sync
async def test_compare_two_layers_matches_torch(in_repo):
    ref = reference()
    app = make_app(PATH, keymap={})
    async with app.run_test(size=(140, 45)) as pilot:
        await settle(pilot)
        await to_range(pilot)
        await pilot.press("p")
        await settle(pilot)
        await pilot.press("0", "space", "3", "enter")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, LayerCompareScreen)
        table = screen.query_one(DataTable)
        rows = {table.get_row_at(i)[0]: table.get_row_at(i) for i in range(table.row_count)}
        suffixes = {n[len("model.layers.0."):] for n in ref if n.startswith("model.layers.0.")}
        assert set(rows) == suffixes
        for suffix, row in rows.items():
            a, b = ref[f"model.layers.0.{suffix}"].double(), ref[f"model.layers.3.{suffix}"].double()
            assert int(row[3]) == int((a != b).sum())
            assert float(row[4]) == pytest.approx((a - b).abs().max().item(), rel=1e-3)
            assert float(row[5]) == pytest.approx(((a - b).norm() / a.norm()).item(), rel=1e-3)
        await pilot.press("escape")
        assert not isinstance(app.screen, LayerCompareScreen)


def test_parse_pick():
    keys = [str(i) for i in range(32)]
    assert parse_pick("7", keys) == ("7",) and parse_pick(" 3, 17 ", keys) == ("3", "17")
    assert "not a layer" in parse_pick("32", keys) and "two different" in parse_pick("4 4", keys)
    assert "one layer" in parse_pick("", keys) and "one layer" in parse_pick("1 2 3", keys)
