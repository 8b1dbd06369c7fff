"""Tree rows at 80 columns: a row that does not fit shows ``…`` where it was cut (details first,
then the middle of the name, keeping its end), and the whole row is in the hover tooltip."""

from __future__ import annotations

from rich.text import Text
from tui_helpers import settle, sync

from ckptscope.tui.app import make_app
from ckptscope.tui.widgets.row_fit import Row
from ckptscope.tui.widgets.tensor_tree import TensorTree


def sample_row() -> Row:
    row = Row()
    row.append("● ", style="green")
    row.append_name("embedding.word_embeddings.weight", style="bold")
    row.start_detail()
    row.append("  [256, 64]", style="dim")
    row.start_detail()
    row.append("  32.0 KiB", style="dim")
    return row


def test_row_fit_drops_details_before_cutting_the_name():
    row = sample_row()
    full = row.plain
    assert row.fit(len(full)) is row
    assert row.fit(len(full) - 1).plain == "● embedding.word_embeddings.weight  [256, 64]  …"
    assert row.fit(37).plain == "● embedding.word_embeddings.weight  …"
    assert row.fit(36).plain == "● embedding.word_embeddings.weight …"
    assert row.fit(35).plain == "● embedding.word_embeddings.weight"  # whole name, no room for a mark
    cut = row.fit(20).plain
    assert cut == "● …embeddings.weight" and len(cut) == 20  # the end tells weight from bias
    assert row.fit(40).spans and any(s.style == "bold" for s in row.fit(20).spans)
    for width in range(3, len(full)):
        shown = row.fit(width)
        assert shown.cell_len <= width and "…" in shown.plain or shown.plain == full[: shown.cell_len]


def test_plain_text_rows_are_left_to_the_tree():
    assert isinstance(Row("x"), Text) and Row("x").fit(0).plain == "x"


def screen_rows(tree: TensorTree) -> list[str]:
    return ["".join(seg.text for seg in tree.render_line(y)).rstrip() for y in range(tree.last_line + 1)]


@sync
async def test_rows_at_80_columns_show_where_they_are_cut(in_repo):
    app = make_app("sample_ckpts/megatron_torch_dist/iter_0000010", keymap={})
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        tree = app.screen.query_one(TensorTree)
        await pilot.press("e")
        await settle(pilot)
        width = tree.scrollable_content_region.width
        cut = 0
        for y, shown in enumerate(screen_rows(tree)):
            node = tree.get_node_at_line(y)
            assert len(shown) <= width, shown
            if node.label.plain not in shown:
                cut += 1
                assert "…" in shown, f"cut without a mark: {shown!r} (row {node.label.plain!r})"
        assert cut >= 5
        embed = next(y for y in range(tree.last_line + 1)
                     if tree.get_node_at_line(y).label.plain.startswith("● embedding.word_embeddings.weight"))
        assert screen_rows(tree)[embed].endswith("word_embeddings.weight")
        # the whole row under the mouse, with the full path
        await pilot.hover(TensorTree, offset=(3, embed))
        await pilot.pause()
        assert tree.tooltip is not None and "embedding.word_embeddings.weight  [256, 64]" in str(tree.tooltip)
        # the detail pane has the whole name too
        await pilot.click(TensorTree, offset=(3, embed))
        await settle(pilot)
        assert app.screen.current is not None and app.screen.current.name == "embedding.word_embeddings.weight"
        # at 200 columns nothing is cut
        await pilot.resize_terminal(200, 50)
        await settle(pilot)
        assert all(tree.get_node_at_line(y).label.plain in row for y, row in enumerate(screen_rows(tree)))
        await pilot.hover(TensorTree, offset=(3, 0))
        await pilot.pause()
        assert tree.tooltip is None


def test_detail_pane_shows_a_long_name_whole():
    """At 80 columns the detail pane is ~46 wide: a long tensor name folds onto a second line instead
    of ending in an ellipsis (the tree cuts it too, so it was shown whole nowhere)."""
    from rich.console import Console

    from ckptscope.core.tensor import raw_tensor
    from ckptscope.tui.widgets.tensor_detail import facts

    name = "model.layers.0.post_attention_layernorm.weight"
    meta = raw_tensor(name, "bfloat16", (64,), "model-00001-of-00004.safetensors", 0, 128)
    console = Console(width=40, record=True, color_system=None)
    console.print(facts(meta))
    text = console.export_text()
    assert name in "".join(line.strip() for line in text.splitlines() if not line.startswith(("dtype", "shape")))


def test_per_layer_names_stay_apart_when_cut():
    """The timeline's tensor rows: two layers' copies of one long name must not both read
    ``…_attention.linear_qkv.layer_norm_weight``; the layer index survives the cut."""
    from ckptscope.core.units import index_ellipsis

    names = [f"decoder.layers.{i}.self_attention.linear_qkv.layer_norm_weight" for i in (0, 1, 11)]
    for width in range(10, 61):
        cut = [index_ellipsis(n, width) for n in names]
        assert all(len(c) <= width for c in cut), cut
        assert len(set(cut)) == len(names), (width, cut)
    assert index_ellipsis("embedding.word_embeddings", 40) == "embedding.word_embeddings"
    assert index_ellipsis("embedding.word_embeddings", 12) == "…_embeddings"  # no index: the tail


def test_training_state_is_listed_after_the_model():
    """A Megatron save's ``distrib_optim`` sorted in between ``decoder`` and ``embedding``: the model's
    modules come first now, the training state after them (each group in its own order)."""
    from pathlib import Path

    from ckptscope.tui.opening import open_path

    save = Path(__file__).resolve().parents[2] / "sample_ckpts" / "megatron_legacy_tp2" / "iter_0000020"
    opened = open_path(save, discover=False)
    labels = [child.label for child in opened.tree.children]
    assert labels == ["decoder", "embedding", "distrib_optim"], labels
    opened.reader.close()
