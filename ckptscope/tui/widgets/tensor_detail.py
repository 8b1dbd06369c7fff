"""The detail pane for one tensor: its facts, then how it is stored (map + chunk table).

A composite widget: the screen sets ``show(entry)`` and the children are updated from it
(attributes down). For a tensor inside a collapsed range it says which member is shown.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from ckptscope.core.roles import training_kind
from ckptscope.core.tensor import TensorMeta
from ckptscope.core.units import human_bytes, human_count, shape_str
from ckptscope.ops.tree import TreeNode
from ckptscope.tui.colors import DTYPE_ICON, dtype_color
from ckptscope.tui.widgets.chunk_table import ChunkTable
from ckptscope.tui.widgets.shard_map import ShardMap
from ckptscope.tui.widgets.tensor_tree import Entry


def facts(meta: TensorMeta, entry: Entry | None = None) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row("name", Text(meta.name, style="bold", overflow="fold"))  # whole, over two lines if need be
    if entry is not None and entry.repeat > 1:
        grid.add_row("range", Text.assemble(
            (f"one of {entry.repeat} identical tensors", "magenta"), " in ", (entry.range_path, "bold magenta"),
            ("  (showing the first; p on the range opens another layer)", "dim")))
    grid.add_row("dtype", Text.assemble((f"{DTYPE_ICON} ", dtype_color(meta.dtype)), meta.dtype))
    grid.add_row("shape", Text(shape_str(meta.shape)))
    grid.add_row("numel", f"{meta.numel:,}" + (f"  ({human_count(meta.numel)})" if meta.numel >= 1000 else ""))
    grid.add_row("bytes", f"{meta.nbytes:,}" + (f"  ({human_bytes(meta.nbytes)})" if meta.nbytes >= 1024 else ""))
    files = meta.files
    shown = ", ".join(files[:4]) + (f", … {len(files) - 4} more" if len(files) > 4 else "")
    grid.add_row("files", Text(shown or "—"))
    for key, value in meta.attrs:  # Text, not markup: "[gate; up]" and checkpoint strings stay as written
        grid.add_row(Text(key), Text(value))
    return grid


DTYPE_WALK_LIMIT = 5000
"""Modules with more tensors than this show no per-dtype breakdown (the header has it)."""


def module_facts(entry: Entry) -> Table:
    """What the cursor's module holds, when it is not on a tensor."""
    node = entry.node
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    path = entry.range_path if node.is_range else node.path
    grid.add_row("module", Text(path or "(root)", style="bold"))
    if node.is_range:
        grid.add_row("range", Text(f"{node.repeat} identical layers: {', '.join(node.members[:3])}"
                                   f"{', …' if len(node.members) > 3 else ''}", style="magenta"))
    grid.add_row("tensors", f"{node.num_tensors:,}")
    kind = training_kind(node.path) if node.path else None
    grid.add_row("params" if kind is None else "elements", f"{node.num_params:,}  ({human_count(node.num_params)})")
    if kind is not None:
        grid.add_row("role", Text(f"training state: {kind} (not model parameters)", style="yellow"))
    grid.add_row("bytes", f"{node.nbytes:,}  ({human_bytes(node.nbytes)})")
    dtypes: dict[str, int] = {}

    def count(sub: TreeNode, mult: int) -> None:  # ranges hold one member's children: weight them
        if sub.tensor is not None and not sub.children:
            dtypes[sub.tensor.dtype] = dtypes.get(sub.tensor.dtype, 0) + mult
        for child in sub.children:
            count(child, mult * (child.repeat if child.is_range else 1))

    if node.num_tensors <= DTYPE_WALK_LIMIT:  # a walk per highlight: skip it for the huge top modules
        count(node, node.repeat if node.is_range else 1)
    if dtypes:
        grid.add_row("dtypes", Text.assemble(*[part for d, n in dtypes.items() for part in
                                               ((f"{DTYPE_ICON} ", dtype_color(d)), f"{d} ×{n}  ")]))
    grid.add_row("", Text(""))
    grid.add_row("", Text("Move onto a tensor to see its shard layout, s for stats, v for values"
                          + (", p to open one layer or compare two." if node.is_range else "."), style="dim"))
    return grid


class TensorDetail(VerticalScroll):
    """Facts, shard layout map and chunk table of the highlighted tensor."""

    def compose(self) -> ComposeResult:
        yield Static(Text("Move the cursor onto a tensor in the tree.", style="dim"), id="facts")
        yield Static("SHARD LAYOUT", classes="section-title")
        yield ShardMap(id="shard-map")
        yield Static("CHUNKS", classes="section-title")
        yield ChunkTable(id="chunk-table")

    def show(self, meta: TensorMeta | None, entry: Entry | None = None) -> None:
        if meta is not None:
            shown: object = facts(meta, entry)
        elif entry is not None and entry.more_from < 0:
            shown = module_facts(entry)
        else:
            shown = Text("Move the cursor onto a tensor in the tree.", style="dim")
        self.query_one("#facts", Static).update(shown)  # type: ignore[arg-type]
        self.set_class(meta is None, "-no-tensor")
        self.query_one(ShardMap).meta = meta
        self.query_one(ChunkTable).show(meta)
