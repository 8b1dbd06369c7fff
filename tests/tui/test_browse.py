"""Pilot tests: open real sample checkpoints, navigate, filter, compute stats and check numbers
against values computed independently with torch / safetensors in the test."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from textual.widgets import DataTable, Static, TabbedContent
from tui_helpers import settle, sync, text_of

from ckptscope.tui.app import make_app
from ckptscope.tui.screens.browse import BrowseScreen
from ckptscope.tui.widgets.chunk_table import ChunkTable
from ckptscope.tui.widgets.shard_map import ShardMap
from ckptscope.tui.widgets.summary_header import SummaryHeader
from ckptscope.tui.widgets.tensor_tree import PAGE, TensorTree

SIZE = (140, 45)


def hf_tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def safetensors_byte_range(file: Path, name: str) -> tuple[int, int]:
    """Absolute byte range of ``name`` straight from the file's header (not via ckptscope)."""
    raw = file.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8: 8 + header_len])
    start, stop = header[name]["data_offsets"]
    return 8 + header_len + start, 8 + header_len + stop


def browse(app) -> BrowseScreen:
    screen = app.screen
    assert isinstance(screen, BrowseScreen), type(screen)
    return screen


def tree_lines(app) -> list[str]:
    tree = app.screen.query_one(TensorTree)
    return [tree.get_node_at_line(i).label.plain for i in range(tree.last_line + 1)]


@sync
async def test_open_shows_header_and_collapsed_tree(in_repo):
    path = Path("sample_ckpts/hf_llama_sharded")
    expected = hf_tensors(path)
    app = make_app(path, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        index = screen.query_one(SummaryHeader).index
        assert index is not None and len(index) == len(expected)
        assert index.num_params == sum(t.numel() for t in expected.values())
        lines = tree_lines(app)
        # top level plus "model" opened one level; the four identical layers are one range
        assert any(line.startswith("lm_head.weight") or "lm_head.weight" in line for line in lines)
        layer_ids = sorted({int(n.split(".")[2]) for n in expected if n.startswith("model.layers.")})
        range_label = f"[{layer_ids[0]}-{layer_ids[-1]}] ×{len(layer_ids)}"
        assert any(range_label in line for line in lines), lines
        # lazily built: the range's children are not widgets until expanded
        assert len(lines) < 10


@sync
async def test_select_tensor_detail_and_byte_range(in_repo):
    path = Path("sample_ckpts/hf_llama_sharded")
    expected = hf_tensors(path)
    weight_map = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    app = make_app(path, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        # expand the layer range and walk down to self_attn.q_proj.weight with the keyboard
        tree = screen.query_one(TensorTree)
        row = next(i for i in range(tree.last_line + 1) if "[0-3]" in tree.get_node_at_line(i).label.plain)
        tree.move_cursor_to_line(row)
        await pilot.press("right")
        await pilot.pause()
        row = next(i for i in range(tree.last_line + 1) if "self_attn" in tree.get_node_at_line(i).label.plain)
        tree.move_cursor_to_line(row)
        await pilot.press("right", "down")
        await settle(pilot)
        first_child = tree.cursor_node.data
        meta = screen.current
        assert meta is not None and meta is first_child.tensor
        assert meta.name.startswith("model.layers.0.self_attn.")
        tensor = expected[meta.name]
        assert meta.shape == tuple(tensor.shape)
        assert meta.numel == tensor.numel()
        assert meta.nbytes == tensor.numel() * tensor.element_size()
        assert meta.files == (weight_map[meta.name],)
        facts = text_of(screen.query_one("#facts", Static))
        # the range note says it stands for four identical tensors
        assert "one of 4" in facts
        table = screen.query_one(ChunkTable)
        assert table.row_count == 1
        start, stop = safetensors_byte_range(path / weight_map[meta.name], meta.name)
        assert str(table.get_row_at(0)[4]) == f"{start:,}–{stop:,}"
        assert screen.query_one(ShardMap).meta is meta


@sync
async def test_stats_match_torch(in_repo):
    path = Path("sample_ckpts/hf_llama_sharded")
    expected = hf_tensors(path)
    app = make_app(path, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        await pilot.press("down")  # onto model... then back to lm_head.weight (first line)
        await pilot.press("up")
        await settle(pilot)
        assert screen.current is not None
        name = screen.current.name
        await pilot.press("s")
        await settle(pilot)
        assert screen.query_one(TabbedContent).active == "stats"
        stats = screen._stats[name]
        ref = expected[name].float().double()
        assert stats.count == ref.numel()
        assert stats.min == pytest.approx(ref.min().item())
        assert stats.max == pytest.approx(ref.max().item())
        assert stats.mean == pytest.approx(ref.mean().item(), rel=1e-9, abs=1e-12)
        assert stats.std == pytest.approx(ref.std(unbiased=False).item(), rel=1e-9)
        assert stats.abs_mean == pytest.approx(ref.abs().mean().item(), rel=1e-9)
        assert stats.zeros == int((ref == 0).sum())
        assert stats.nan == 0 and stats.inf == 0
        assert sum(stats.hist_counts) == ref.numel()
        rendered = text_of(screen.query_one("#stats-view", Static))
        assert "histogram" in rendered and name in rendered


def pager_values(app) -> np.ndarray:
    """The numbers the Values table shows, parsed back from its cells."""
    table = app.screen.query_one("#values-table", DataTable)
    return np.array([[float(table.get_cell_at((r, c)).plain) for c in range(1, len(table.columns))]
                     for r in range(table.row_count)])


@sync
async def test_value_pager_slice_box_and_exact_cell(in_repo):
    """v shows the first page; a NumPy slice typed in the box shows exactly that slice; the cell
    line gives the stored bf16 bits and the float they encode; x shows bits in the table."""
    path = Path("sample_ckpts/hf_llama_single")
    expected = load_file(path / "model.safetensors")
    app = make_app(path, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        name = screen.current.name
        ref = expected[name]
        await pilot.press("v")
        await settle(pilot)
        assert screen.query_one(TabbedContent).active == "values"
        shown = pager_values(app)
        np.testing.assert_allclose(shown, ref.float().numpy()[:shown.shape[0], :shown.shape[1]], rtol=1e-3)
        assert shown.shape[0] == min(64, ref.shape[0])
        await pilot.press("colon")
        assert app.focused.id == "values-slice"
        app.focused.value = ""
        await pilot.press(*"[7:9, 30:34]", "enter")
        await settle(pilot)
        np.testing.assert_allclose(pager_values(app), ref.float().numpy()[7:9, 30:34], rtol=1e-3)
        assert text_of(screen.query_one("#values-title", Static)).startswith(f"{name}[7:9, 30:34]")
        await pilot.press("j", "l")  # the cursor to [8, 31]
        await settle(pilot)
        cell = text_of(screen.query_one("#values-cell", Static))
        bits = int(ref[8, 31].view(torch.int16).item()) & 0xFFFF
        assert "[8, 31]" in cell and f"stored 0x{bits:04x}" in cell and f"= {repr(ref[8, 31].item())}" in cell
        await pilot.press("x")
        await settle(pilot)
        table = screen.query_one("#values-table", DataTable)
        assert table.get_cell_at((1, 2)).plain == f"0x{bits:04x}"
        await pilot.press("colon")
        app.focused.value = "[0:1:2]"
        await pilot.press("enter")
        await settle(pilot)
        assert "steps are not supported" in text_of(screen.query_one("#values-cell", Static))


@sync
async def test_esc_in_the_slice_box_puts_the_slice_back_and_keeps_the_filter(in_repo):
    """Esc left invalid text in the box and fell through to the browser, clearing the filter too (a person
    testing): now it restores the slice shown, clears the error and returns to the table, filter kept; the
    footer says enter and esc while typing."""
    app = make_app(Path("sample_ckpts/hf_llama_gqa"), keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        await pilot.press("slash", *"q_proj", "enter")
        await settle(pilot)
        await pilot.press("v")
        await settle(pilot)
        await pilot.press("colon")
        box = app.focused
        assert box.id == "values-slice" and box.value == "[:, :]"
        shown = [b.binding.description for b in app.active_bindings.values() if b.binding.show]
        assert "apply slice" in shown and "cancel" in shown
        box.value = ""
        await pilot.press(*"abc", "enter")
        await settle(pilot)
        assert "neither an index nor a slice" in text_of(screen.query_one("#values-cell", Static))
        await pilot.press("escape")
        await settle(pilot)
        assert box.value == "[:, :]" and app.focused.id == "values-table"
        assert "neither" not in text_of(screen.query_one("#values-cell", Static))
        assert screen._pattern == "q_proj"  # the filter is still on


@sync
async def test_value_pager_steps_layers_of_a_stacked_tensor(in_repo):
    """On a Megatron stacked tensor [L, out, in], ] shows the next layer's values."""
    from torch.distributed.checkpoint import FileSystemReader
    import torch.distributed.checkpoint as dcp

    path = Path("sample_ckpts/megatron_torch_dist/iter_0000010")
    name = "decoder.layers.self_attention.linear_proj.weight"
    meta = FileSystemReader(str(path)).read_metadata().state_dict_metadata[name]
    state = {name: torch.empty(tuple(meta.size), dtype=torch.bfloat16)}
    dcp.load(state, storage_reader=FileSystemReader(str(path)), no_dist=True)
    ref = state[name].float().numpy()
    app = make_app(path, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        await pilot.press("v")
        await settle(pilot)
        pager = screen.query_one("#values-view")
        pager.start(name, tuple(meta.size))
        await settle(pilot)
        screen.query_one("#values-table").focus()
        shown = pager_values(app)
        np.testing.assert_allclose(shown, ref[0, :shown.shape[0], :shown.shape[1]], rtol=1e-3)
        await pilot.press("right_square_bracket")
        await settle(pilot)
        shown = pager_values(app)
        np.testing.assert_allclose(shown, ref[1, :shown.shape[0], :shown.shape[1]], rtol=1e-3)
        assert not np.allclose(ref[0], ref[1])
        assert text_of(screen.query_one("#values-title", Static)).startswith(f"{name}[1, 0:")


async def type_filter(pilot, text: str) -> None:
    """``/`` then ``text``, and wait for the filter's debounce and the tree it shows."""
    await pilot.press("slash", *text)
    await pilot.pause(0.3)
    await settle(pilot)


@sync
async def test_filter_narrows_live_and_jumps(in_repo):
    path = Path("sample_ckpts/hf_llama_sharded")
    names = list(hf_tensors(path))
    app = make_app(path, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        await type_filter(pilot, "up_proj")
        matching = [n for n in names if "up_proj" in n]
        status = text_of(screen.query_one("#filter-status", Static))
        assert status.startswith(f"{len(matching)} tensors match")
        lines = tree_lines(app)
        assert all("gate_proj" not in line and "lm_head" not in line for line in lines), lines
        await pilot.press("enter")
        await settle(pilot)
        assert screen.current is not None and screen.current.name in matching
        # a glob narrows too, and n jumps between its matches
        await pilot.press("slash", "ctrl+u", *"*.norm.weight")
        await pilot.pause(0.3)
        await settle(pilot)
        await pilot.press("enter")
        await settle(pilot)
        assert screen.current.name == "model.norm.weight"
        await pilot.press("escape")
        await settle(pilot)
        assert "match" not in text_of(screen.query_one("#filter-status", Static))
        assert any("lm_head" in line for line in tree_lines(app))


@sync
async def test_a_filter_that_matches_nothing_clears_the_tensor_panes(in_repo):
    """A probe filtered for a name no tensor has: the tree emptied and the status said "no tensor matches",
    but the detail pane still showed the tensor the cursor had left. It says to move onto a tensor now,
    and esc brings the tree (and a tensor under the cursor) back."""
    from ckptscope.tui.widgets.tensor_detail import TensorDetail

    app = make_app(Path("sample_ckpts/hf_llama_sharded"), keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        await pilot.press("j", "j")
        await settle(pilot)
        assert screen.current is not None
        await type_filter(pilot, "no_such_tensor")
        assert text_of(screen.query_one("#filter-status", Static)).strip() == "no tensor matches"
        facts = text_of(screen.query_one(TensorDetail).query_one("#facts", Static))
        assert screen.current is None and "Move the cursor onto a tensor" in facts, facts
        screen._jump(1)  # what n does: the line names the filter, not "press / to filter" (a person testing)
        await settle(pilot)
        said = [n.message for n in app._notifications]
        assert any("'no_such_tensor' matches no tensor" in m for m in said), said
        await pilot.press("escape")
        await settle(pilot)
        assert any("lm_head" in line for line in tree_lines(app))


@sync
async def test_filter_jump_cycles_through_matches(in_repo):
    path = Path("sample_ckpts/dtypes.safetensors")
    app = make_app(path, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        await pilot.press("slash", *"float")
        await pilot.pause(0.3)
        await settle(pilot)
        await pilot.press("enter")
        await settle(pilot)
        seen = [screen.current.name]
        for _ in range(4):
            await pilot.press("n")
            await settle(pilot)
            seen.append(screen.current.name)
        with safe_open(str(path), "np") as handle:
            floats = [k for k in handle.keys() if "float" in k]  # noqa: SIM118 (safe_open is not iterable)
        assert set(seen) == set(floats) and len(seen) == len(floats)


@sync
async def test_objects_panel_shows_args_without_unpickling(in_repo):
    path = Path("sample_ckpts/megatron_style.pt")
    loaded = torch.load(path, weights_only=False)
    app = make_app(path, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        await pilot.press("o")
        await settle(pilot)
        assert screen.query_one(TabbedContent).active == "objects"
        table = screen.query_one("#objects-table", DataTable)
        rows = {str(table.get_row_at(i)[0]): str(table.get_row_at(i)[2]) for i in range(table.row_count)}
        for key, value in vars(loaded["args"]).items():
            assert rows[f"args.{key}"] == repr(value)
        assert rows["iteration"] == str(loaded["iteration"])
        assert rows["optimizer.param_groups.0.lr"] == repr(loaded["optimizer"]["param_groups"][0]["lr"])
        assert "iteration 20" in text_of(screen.query_one(SummaryHeader))
    import sys
    assert "argparse" in sys.modules  # (stdlib; the point is no class from the file was constructed)


def test_objects_of_torch_file_never_imports_torch_in_tui(in_repo):
    """The TUI reads pickles through the safe stub unpickler: opening must not import torch."""
    import subprocess
    import sys

    code = (
        "import asyncio, sys\n"
        "from ckptscope.tui.app import make_app\n"
        "async def main():\n"
        "    app = make_app('sample_ckpts/megatron_style.pt', keymap={})\n"
        "    async with app.run_test(size=(120, 40)) as pilot:\n"
        "        for _ in range(3):\n"
        "            await app.workers.wait_for_complete(); await pilot.pause()\n"
        "        await pilot.press('s'); await app.workers.wait_for_complete(); await pilot.pause()\n"
        "        assert app.screen.index is not None\n"
        "asyncio.run(main())\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path.cwd(), timeout=120)


@sync
async def test_unreadable_path_error_screen_exit_code(tmp_path):
    from ckptscope.tui.screens.error import ErrorScreen

    bad = tmp_path / "not_a_checkpoint.bin"
    bad.write_bytes(b"hello, I am not a checkpoint")
    app = make_app(bad, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, ErrorScreen)
        reason = app.screen.reason
        assert "\n" not in reason and "not a checkpoint ckptscope can read" in reason
        shown = text_of(app.screen.query_one("#error-reason", Static))
        assert reason.split() == shown.split()  # the whole reason, wrapped to the screen width
        await pilot.press("q")
    assert app.return_code == 2


def test_cli_open_without_terminal_fails_cleanly(in_repo, cli):
    """Bare ``ckptscope PATH`` routes to ``open``; without a terminal it says so (exit 2), no hang."""
    for args in (("open", "sample_ckpts/hf_llama_single"), ("sample_ckpts/hf_llama_single",)):
        result = cli(*args, cwd=in_repo)
        assert result.code == 2, result
        assert "needs an interactive terminal" in result.err
        assert "Traceback" not in result.err + result.out


@sync
async def test_help_palette_theme_and_mouse(in_repo):
    from ckptscope.tui.screens.help import HelpScreen

    app = make_app("sample_ckpts/hf_llama_sharded", keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = " ".join(text_of(s) for s in app.screen.query(".help-group"))
        assert "browse.stats" in text and "app.quit" in text
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is screen
        assert app.theme == "ckptscope-dark"
        await pilot.press("ctrl+t")
        assert app.theme == "ckptscope-light"
        # the palette lists scoped commands and runs them
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"view: files")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await settle(pilot)
        assert screen.query_one(TabbedContent).active == "files"
        # mouse: clicking a tree row highlights that tensor
        tree = screen.query_one(TensorTree)
        row = next(i for i in range(tree.last_line + 1) if "embed_tokens" in tree.get_node_at_line(i).label.plain)
        await pilot.click(TensorTree, offset=(8, row))
        await settle(pilot)
        assert screen.current is not None and screen.current.name == "model.embed_tokens.weight"


@sync
async def test_keymap_remaps_binding_by_id(in_repo):
    app = make_app("sample_ckpts/hf_llama_single", keymap={"browse.stats": "S"})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        await pilot.press("S")
        await settle(pilot)
        assert screen.query_one(TabbedContent).active == "stats"
        assert screen.current.name in screen._stats


def test_every_binding_has_id_and_tooltip():
    from textual.binding import Binding

    from ckptscope.tui.app import CkptScopeApp
    from ckptscope.tui.screens.error import ErrorScreen
    from ckptscope.tui.screens.help import HelpScreen
    from ckptscope.tui.screens.iterations import IterationPickerScreen
    from ckptscope.tui.widgets.filter_bar import FilterBar

    ids = []
    for owner in (CkptScopeApp, BrowseScreen, ErrorScreen, HelpScreen, IterationPickerScreen, TensorTree, FilterBar):
        for binding in owner.BINDINGS:
            assert isinstance(binding, Binding), (owner, binding)
            assert binding.id and binding.tooltip, (owner.__name__, binding.key)
            ids.append(binding.id)
    assert len(ids) == len(set(ids))


@sync
async def test_large_checkpoint_tree_is_lazy(tmp_path):
    """2,000 distinct tensors: the tree builds widget nodes only for what is shown."""
    from safetensors.numpy import save_file

    tensors = {f"blocks.{i}.w{i % 7}.weight": np.full((2, i % 5 + 1), i, dtype=np.float32) for i in range(2000)}
    save_file(tensors, str(tmp_path / "big.safetensors"))
    app = make_app(tmp_path / "big.safetensors", keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        tree = screen.query_one(TensorTree)
        assert screen.index is not None and len(screen.index) == 2000
        assert len(tree._by_node) <= 1 + PAGE  # "blocks" and one page, not 2,000 widget nodes
        await pilot.press("slash", *"blocks.1234.")
        await pilot.pause(0.3)
        await settle(pilot)
        await pilot.press("enter")
        await settle(pilot)
        assert screen.current.name == "blocks.1234.w2.weight"
        await pilot.press("s")
        await settle(pilot)
        assert screen._stats[screen.current.name].mean == 1234.0


def test_keymap_file_is_read_and_bad_files_ignored(tmp_path, monkeypatch):
    from ckptscope.tui.app import keymap_path, load_keymap

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    path = keymap_path()
    assert path == tmp_path / "ckptscope" / "keymap.toml"
    assert load_keymap() == {}
    path.parent.mkdir()
    path.write_text('[keymap]\n"browse.filter" = "ctrl+f"\n"browse.stats" = "S"\n')
    assert load_keymap() == {"browse.filter": "ctrl+f", "browse.stats": "S"}
    path.write_text("[keymap\nnot toml")
    assert load_keymap() == {}


@sync
async def test_f1_opens_help_from_a_form_where_question_mark_is_typed(in_repo):
    from textual.widgets import Input

    from ckptscope.tui.screens.help import HelpScreen

    app = make_app("sample_ckpts/hf_llama_sharded", keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("C")  # the convert form
        await settle(pilot)
        form = app.screen
        form.query_one("#convert-dst", Input).focus()  # typing a destination path
        await pilot.pause()
        await pilot.press("question_mark")  # a character in the input, not help
        assert app.screen is form and "?" in app.focused.value
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = " ".join(text_of(s) for s in app.screen.query(".help-group"))
        assert "convert.run" in text and "app.help_f1" in text
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is form


@sync
async def test_enter_opens_and_closes_a_module(in_repo):
    """The help says enter expands: pressing it on a module shows its children, again hides them."""
    app = make_app(Path("sample_ckpts/hf_llama_sharded"), keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        tree = app.screen.query_one(TensorTree)
        row = next(i for i in range(tree.last_line + 1) if "[0-3]" in tree.get_node_at_line(i).label.plain)
        tree.move_cursor_to_line(row)
        before = tree_lines(app)
        await pilot.press("enter")
        await settle(pilot)
        opened = tree_lines(app)
        assert tree.cursor_node.is_expanded and len(opened) > len(before)
        assert any(line.startswith("self_attn") for line in opened), opened
        await pilot.press("enter")
        await settle(pilot)
        assert not tree.cursor_node.is_expanded and tree_lines(app) == before


@sync
async def test_long_object_keys_keep_the_value_on_screen_and_show_whole(in_repo, tmp_path):
    """A Megatron-style args key of 70 characters is cut in the middle in its cell; the row under
    the cursor shows the whole key and the whole (long) value below the table."""
    import argparse

    long_key = "moe_router_load_balancing_type_for_every_expert_group_in_the_pipeline"
    long_value = "x" * 300
    path = tmp_path / "args.pt"
    torch.save({"args": argparse.Namespace(**{long_key: long_value}), "w": torch.zeros(2)}, path)
    app = make_app(path, keymap={})
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("o")
        await settle(pilot)
        screen = browse(app)
        table = screen.query_one("#objects-table", DataTable)
        row = next(i for i in range(table.row_count) if "…" in str(table.get_row_at(i)[0]))
        cell = str(table.get_row_at(row)[0])
        assert cell.startswith("args.moe") and cell.endswith("pipeline") and len(cell) <= 36
        table.move_cursor(row=row)
        await settle(pilot)
        detail = text_of(screen.query_one("#object-detail", Static))
        assert f"args.{long_key}" in detail and long_value in detail.replace("\n", "")


@sync
async def test_vim_keys_move_in_the_tree_and_the_tables(in_repo):
    """j/k move, G jumps to the last row and g back to the first, in the tree and in a table."""
    app = make_app(Path("sample_ckpts/hf_llama_sharded"), keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        tree = app.screen.query_one(TensorTree)
        tree.focus()
        tree.move_cursor_to_line(0)
        await pilot.press("j", "j")
        assert tree.cursor_line == 2
        await pilot.press("k")
        assert tree.cursor_line == 1
        await pilot.press("G")
        assert tree.cursor_line == tree.last_line
        await pilot.press("g")
        assert tree.cursor_line == 0
        await pilot.press("o")
        await settle(pilot)
        table = app.screen.query_one("#objects-table", DataTable)
        table.focus()
        await pilot.press("j", "j", "k")
        assert table.cursor_row == 1
        await pilot.press("G")
        assert table.cursor_row == table.row_count - 1


@sync
async def test_slash_searches_the_focused_table_and_n_walks_matches(in_repo):
    """In the Objects tab, / searches full keys and values (not the tree), n / N walk the matches."""
    app = make_app(Path("sample_ckpts/megatron_style.pt"), keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("o")
        await settle(pilot)
        table = app.screen.query_one("#objects-table", DataTable)
        assert app.focused is table  # o hands the keys to the objects table
        await pilot.press("slash")
        await settle(pilot)
        await pilot.press(*"rng", "enter")
        await settle(pilot)
        keys = [table.full_row(r)[0] for r in range(table.row_count)]
        hits = [r for r, key in enumerate(keys) if "rng" in " ".join(table.full_row(r)).lower()]
        assert len(hits) >= 2 and table.cursor_row == hits[0]
        await pilot.press("n")
        assert table.cursor_row == hits[1]
        await pilot.press("N", "N")
        assert table.cursor_row == hits[-1]  # wraps around
        assert app.screen.query_one(TensorTree).has_focus is False  # the tree filter never opened
        await pilot.press("escape")
        assert isinstance(app.focused, TensorTree)  # esc: back to the tree


@sync
async def test_filter_n_visits_every_match_and_esc_keeps_the_place(in_repo):
    """/k_proj matches one tensor per layer: n visits each of them (not one range row); esc then
    clears the filter with the cursor still on the tensor n led to."""
    path = Path("sample_ckpts/hf_llama_sharded")
    names = sorted(n for n in hf_tensors(path) if "k_proj" in n)
    app = make_app(path, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("slash", *"k_proj", "enter")
        await pilot.pause(0.3)
        await settle(pilot)
        screen = browse(app)
        seen = [screen.current.name]
        for _ in names[1:]:
            await pilot.press("n")
            await settle(pilot)
            seen.append(screen.current.name)
        assert sorted(seen) == names
        await pilot.press("escape")
        await pilot.pause(0.1)
        await settle(pilot)
        tree = screen.query_one(TensorTree)
        assert screen._pattern == ""
        node = tree.cursor_node
        here = node.data.node
        assert here.path == seen[-1] or seen[-1] in [f"{m}.self_attn.k_proj.weight" for m in here.members] or \
            any(seen[-1].startswith(m + ".") for m in (here.members or (here.path,)))



@sync
async def test_value_pager_g_and_G_reach_the_ends_of_the_slice(in_repo):
    """G is the last row of the tensor (a later page is read), g the first; ] is offered only where
    the slice has an axis to step."""
    path = Path("sample_ckpts/hf_llama_single")
    expected = load_file(path / "model.safetensors")
    app = make_app(path, keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        name = screen.current.name
        ref = expected[name].float().numpy()
        await pilot.press("v")
        await settle(pilot)
        shown = [b.description for _, b, on, _ in app.screen.active_bindings.values() if on]
        assert "next layer" not in shown  # a 2-D tensor: nothing to step
        await pilot.press("G")
        await settle(pilot)
        table = screen.query_one("#values-table", DataTable)
        cell = text_of(screen.query_one("#values-cell", Static))
        assert cell.startswith(f"[{ref.shape[0] - 1}, ")
        assert float(table.get_cell_at((table.cursor_row, 1)).plain) == pytest.approx(ref[-1, 0], rel=1e-3)
        await pilot.press("g")
        await settle(pilot)
        assert text_of(screen.query_one("#values-cell", Static)).startswith("[0, ")


@sync
async def test_keys_typed_at_once_after_slash_all_reach_the_filter(in_repo):
    """A paste or a fast typist: "/k_proj" arrives as one burst of key events before the screen
    refreshes. Every key after "/" belongs to the filter; none may reach the tree, where r renames
    and x drops a tensor."""
    from textual import events

    from ckptscope.tui.widgets.filter_bar import FilterBar

    app = make_app(Path("sample_ckpts/hf_llama_sharded"), keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        for key, char in [("slash", "/"), *[(c, c) for c in "k_proj"], ("r", "r"), ("x", "x")]:
            app.post_message(events.Key(key, char))  # queued together, no refresh in between
        await pilot.pause(0.3)
        await settle(pilot)
        assert app.screen is screen  # no rename dialog opened
        assert screen.query_one(FilterBar).value == "k_projrx"


def test_value_cells_are_never_cut_by_their_column():
    """The pager's columns are CELL wide: an int32 of 11 characters lost its last digit (-1533429141 read
    as -153342914, a wrong number shown as right). Too long for the column, a value is written with an
    exponent and fewer digits, never cut; shorter ones are exact."""
    import numpy as np

    from ckptscope.tui.widgets.values_view import CELL, cell_text

    for value, shown in [(np.int32(-1533429141), "-1.533e+09"), (np.int32(1854673841), "1854673841"),
                         (np.int64(-2**62), "-4.612e+18"), (np.float64(-1.2345678e-05), "-1.235e-05"),
                         (np.float64(-1.5e300), "-1.5e+300"), (np.int8(-7), "-7")]:
        assert cell_text(value) == shown and len(shown) <= CELL
    assert float(cell_text(np.int32(-1533429141))) == pytest.approx(-1533429141, rel=1e-3)


@sync
async def test_escape_while_typing_a_filter_closes_it_and_gives_the_tree_the_keys(samples):
    """esc in the filter field cleared the text but left the field open and focused (the close action
    was a coroutine never awaited), so the next tree key (j, r ...) was typed in as a new filter."""
    from ckptscope.tui.widgets.filter_bar import FilterBar

    app = make_app(samples["hf_llama_sharded"], keymap={})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = browse(app)
        await type_filter(pilot, "norm")
        assert "tensors match" in text_of(screen.query_one("#filter-status", Static))
        await pilot.press("escape")
        await settle(pilot)
        bar = screen.query_one(FilterBar)
        assert bar.value == "" and not bar.has_focus and not bar.display
        assert isinstance(app.focused, TensorTree)
        await pilot.press("j")
        await settle(pilot)
        assert bar.value == "" and "match" not in text_of(screen.query_one("#filter-status", Static))
