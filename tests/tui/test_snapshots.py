"""SVG snapshots of the main views (pytest-textual-snapshot). Approve changes with
``pytest tests/tui/test_snapshots.py --snapshot-update`` after looking at the report.

Paths are relative to the repository root (or a temp dir we chdir into) so the header text is
the same on every machine; cursors do not blink (conftest)."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from tui_helpers import settle

from ckptscope.core.tensor import Chunk, TensorMeta
from ckptscope.tui.app import make_app

SIZE = (140, 45)


async def workers_done(pilot) -> None:
    """Wait for running workers (the value pager reading its page): a key pressed before the page is
    shown acts on the old one (``v`` then ``l``: the cursor move was lost under CI load)."""
    for _ in range(50):
        if not any(worker.is_running for worker in pilot.app.workers):
            break
        await pilot.pause(0.1)


def driver(*keys: str, pause_after_typing: bool = False):
    async def run_before(pilot) -> None:
        await settle(pilot)
        for key in keys:
            await pilot.press(key)
            if key == "enter" or pause_after_typing:
                await pilot.pause(0.25)
            await settle(pilot, rounds=1)
            # every key's work (the detail of the tensor moved to, the value page) finished before the
            # next key: under a loaded run a key pressed meanwhile was lost and the picture differed
            await workers_done(pilot)
            if key == "v":
                await settle(pilot)
        for _ in range(2):  # the filter's typing delay, then its worker (twice: a loaded CI machine is slow)
            await pilot.pause(0.3)
            await settle(pilot)
        await workers_done(pilot)
        await settle(pilot)

    return run_before


@pytest.mark.parametrize(
    ("name", "path", "keys"),
    [pytest.param(*case, id=case[0]) for case in [
        ("main", "sample_ckpts/hf_llama_sharded", ()),
        ("range_detail", "sample_ckpts/hf_llama_sharded", ("down", "down", "down", "right", "down")),
        ("stats", "sample_ckpts/hf_llama_sharded", ("down", "down", "s")),
        ("values", "sample_ckpts/hf_llama_single", ("v",)),
        ("filter", "sample_ckpts/hf_llama_sharded", ("slash", *"*proj.weight")),
        ("objects", "sample_ckpts/megatron_style.pt", ("o",)),
        ("help", "sample_ckpts/dtypes.safetensors", ("question_mark",)),
        ("error", "sample_ckpts/no_such_checkpoint", ()),
    ]],
)
def test_view(name, path, keys, snap_compare, in_repo):
    assert snap_compare(make_app(path, keymap={}), terminal_size=SIZE, run_before=driver(*keys))


def test_light_theme(snap_compare, in_repo):
    app = make_app("sample_ckpts/dtypes.safetensors", keymap={}, theme="ckptscope-light")
    assert snap_compare(app, terminal_size=SIZE, run_before=driver("down", "down"))


def test_iteration_picker(snap_compare, samples, tmp_path, monkeypatch):
    root = tmp_path / "save"
    shutil.copytree(samples["hf_llama_single"], root / "iter_0000100")
    (root / "iter_0000200").mkdir()
    (root / "latest_checkpointed_iteration.txt").write_text("100")
    saved = 1_790_000_000  # the picker shows when each save was written: a fixed time for the snapshot
    for path in root.rglob("*"):
        os.utime(path, (saved, saved))
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.chdir(tmp_path)
    try:
        assert snap_compare(make_app("save", keymap={}), terminal_size=(120, 20), run_before=driver())
    finally:
        monkeypatch.undo()
        time.tzset()


def test_shard_map_multi_chunk(snap_compare):
    """The signature view on data sharded readers produce: TP x PP over stacked layers, with a hole."""
    from textual.app import App, ComposeResult

    from ckptscope.tui.widgets.shard_map import ShardMap

    chunks = []
    for layer_block, (lo, hi) in enumerate([(0, 4), (4, 8)]):
        for tp in range(2):
            rank = layer_block * 2 + tp
            chunks.append(Chunk((lo, tp * 96, 0), (hi - lo, 96, 64), f"__{rank}_0.distcp", 0, (hi - lo) * 96 * 64 * 2))
    chunks.pop()  # one rank never wrote its piece: a hole
    meta = TensorMeta("decoder.layers.mlp.linear_fc1.weight", "bfloat16", (8, 192, 64), tuple(chunks))
    plain = TensorMeta("w2d", "float32", (512, 256), tuple(
        Chunk((r * 256, c * 64), (256, 64), f"rank_{r * 4 + c}.pt", 0, 256 * 64 * 4)
        for r in range(2) for c in range(4)))

    class MapApp(App[None]):
        CSS = "ShardMap { margin: 1 2; }"

        def compose(self) -> ComposeResult:
            yield ShardMap(id="a")
            yield ShardMap(id="b")

        def on_mount(self) -> None:
            self.query_one("#a", ShardMap).meta = meta
            self.query_one("#b", ShardMap).meta = plain

    assert snap_compare(MapApp(), terminal_size=(110, 50))


@pytest.mark.parametrize("size", [pytest.param((80, 24), id="80x24"), pytest.param((200, 50), id="200x50")])
@pytest.mark.parametrize(
    ("name", "path", "keys"),
    [pytest.param(*case, id=case[0]) for case in [
        ("main", "sample_ckpts/megatron_torch_dist/iter_0000010", ("down",)),
        ("values", "sample_ckpts/megatron_torch_dist/iter_0000010", ("down", "down", "down", "v", "l")),
        ("convert", "sample_ckpts/megatron_torch_dist/iter_0000010", ("C",)),
        ("diff", "sample_ckpts/hf_llama_gqa", ("D",)),
        ("help", "sample_ckpts/dtypes.safetensors", ("question_mark",)),
    ]],
)
def test_sizes(name, path, keys, size, snap_compare, in_repo):
    """The layout adapts from an 80x24 terminal to a wide one: nothing cut that a user needs."""
    base = driver(*keys)

    async def run_before(pilot) -> None:
        await base(pilot)
        for _ in range(100):  # the convert form plans on a timer: wait until its plan is shown
            if not getattr(pilot.app.screen, "planning", False):
                break
            await pilot.pause(0.1)
            await settle(pilot)

    assert snap_compare(make_app(path, keymap={}), terminal_size=size, run_before=run_before)
