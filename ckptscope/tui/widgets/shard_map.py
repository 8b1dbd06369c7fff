"""The shard layout map: a drawing of the global tensor showing which chunk stores which block.

This is ckptscope's signature view. The geometry (bands, owners, panels, file colours) comes
from ``ops.layout``; this widget only paints it: one colour per file, a second shade so two
neighbouring chunks of the same file stay apart, ``#k`` labels that match the chunk table,
offsets along both axes, hatching for regions no chunk stores, and one small multiple per
block of the leading axes (stacked layers, experts) with ``[`` / ``]`` to page through them.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ckptscope.core.tensor import TensorMeta
from ckptscope.core.units import human_bytes, shape_str
from ckptscope.ops.layout import Panel, ShardLayout, shard_layout
from ckptscope.tui.colors import HOLE_COLOR, file_fill

LABEL_STYLE = "bold #ffffff"


def _chunk_shades(meta: TensorMeta, layout: ShardLayout) -> list[int]:
    """Checkerboard parity per chunk from the rank of its offsets on each axis."""
    ranks: list[dict[int, int]] = []
    for axis in range(len(meta.shape)):
        offsets = sorted({c.offsets[axis] for c in meta.chunks if len(c.offsets) > axis})
        ranks.append({o: i for i, o in enumerate(offsets)})
    out = []
    for chunk in meta.chunks:
        out.append(sum(ranks[a].get(o, 0) for a, o in enumerate(chunk.offsets[: len(ranks)])) % 2)
    return out


def _ticks(positions: list[tuple[int, str]], width: int) -> Text:
    """One line with each label starting at its column, skipping labels that would collide."""
    line = [" "] * width
    last_end = -1
    for x, label in positions:
        x = min(x, width - len(label))
        if x <= last_end or x < 0:
            continue
        line[x: x + len(label)] = list(label)
        last_end = x + len(label)
    return Text("".join(line), style="dim")


def render_panel(meta: TensorMeta, layout: ShardLayout, panel: Panel, shades: list[int]) -> list[Text]:
    """The lines of one panel: title (3-D+), column ticks, the coloured grid with row ticks."""
    row_size = meta.shape[-2] if len(meta.shape) >= 2 else 1
    col_size = meta.shape[-1] if meta.shape else 1
    one_d = len(meta.shape) <= 1
    heights = [2 if one_d else s.cells for s in panel.rows]
    grid: list[list[tuple[int, ...]]] = []
    for span_i, height in enumerate(heights):
        line = [cell for cell, span in zip(panel.owners[span_i], panel.cols) for _ in range(span.cells)]
        grid.extend(list(line) for _ in range(height))
    width = len(grid[0]) if grid else 0
    gutter = max(len(str(row_size)), 1) + 1

    # Fill: one style per character cell.
    cells: list[list[tuple[str, str]]] = []
    for row in grid:
        out = []
        for owners in row:
            if not owners:
                out.append(("░", HOLE_COLOR))
                continue
            first = owners[0]
            fill = file_fill(layout.file_colors[meta.chunks[first].file], shades[first])
            if len(owners) == 1:
                out.append((" ", f"on {fill}"))
            else:
                other = file_fill(layout.file_colors[meta.chunks[owners[1]].file], shades[owners[1]] + 1)
                out.append(("▚" if panel.sampled else "▒", f"{other} on {fill}"))
        cells.append(out)

    # Labels: "#k" centred in each chunk's block (its bounding box of single-owner cells).
    boxes: dict[int, list[int]] = {}
    for y, row in enumerate(grid):
        for x, owners in enumerate(row):
            if len(owners) == 1:
                box = boxes.setdefault(owners[0], [y, x, y, x])
                box[0], box[1] = min(box[0], y), min(box[1], x)
                box[2], box[3] = max(box[2], y), max(box[3], x)
    for k, (y0, x0, y1, x1) in boxes.items():
        labels = [f"#{k}"]
        if y1 - y0 >= 2:
            labels.append(_short_file(meta.chunks[k].file, x1 - x0 + 1))
        top = (y0 + y1) // 2 - (len(labels) - 1) // 2
        for i, label in enumerate(labels):
            y = top + i
            if not label or len(label) > x1 - x0 + 1 or y > y1:
                continue
            x = x0 + (x1 - x0 + 1 - len(label)) // 2
            for j, ch in enumerate(label):
                _, style = cells[y][x + j]
                cells[y][x + j] = (ch, f"{LABEL_STYLE} {style}")

    lines: list[Text] = []
    if panel.lead:
        title = ", ".join(f"{a}:{b}" if b - a > 1 else f"{a}" for a, b in panel.lead) + ", :, :"
        lines.append(Text.assemble((" " * gutter), (f"[{title}]", "bold")))
    col_ticks, x = [], 0
    for span in panel.cols:
        col_ticks.append((x, str(span.start)))
        x += span.cells
    col_ticks.append((max(0, width - len(str(col_size))), str(col_size)))
    lines.append(Text(" " * gutter) + _ticks(col_ticks, width + 1))
    y = 0
    row_starts = {}
    for span, height in zip(panel.rows, heights):
        row_starts[y] = "" if one_d else str(span.start)
        y += height
    for y, row in enumerate(cells):
        line = Text(f"{row_starts.get(y, ''):>{gutter - 1}} ", style="dim")
        for ch, style in row:
            line.append(ch, style=style)
        lines.append(line)
    if not one_d:
        lines.append(Text(f"{row_size:>{gutter - 1}}", style="dim"))
    return lines


GENERIC_FILE_NAMES = frozenset({"model_optim_rng.pt", "distrib_optim.pt", "model.safetensors", "common.pt"})
"""File names every rank dir repeats: the dir is what tells two of them apart."""


def _short_file(path: str, room: int) -> str:
    """What a chunk's box is labelled with: the file name, or ``rank dir/name`` when the name is
    the one every rank repeats (Megatron's ``mp_rank_01/model_optim_rng.pt``); the front is cut
    with an ellipsis, never the part that tells files apart."""
    head, _, name = path.rpartition("/")
    rank_dir = head.rsplit("/", 1)[-1] if head and name in GENERIC_FILE_NAMES else ""
    label = f"{rank_dir}/{name}" if rank_dir else name
    if len(label) <= room:
        return label
    if rank_dir and len(rank_dir) + 2 <= room:
        return rank_dir + "/…"
    return "…" + label[-(room - 1):] if room > 4 else ""


def legend(meta: TensorMeta, layout: ShardLayout, limit: int = 12) -> list[Text]:
    """One line per file: colour swatch, file, the chunks it holds and their bytes."""
    per_file: dict[str, list[int]] = {}
    for k, chunk in enumerate(meta.chunks):
        per_file.setdefault(chunk.file, []).append(k)
    lines = []
    for f in layout.files[:limit]:
        ids = per_file[f]
        fill = file_fill(layout.file_colors[f])
        shown = " ".join(f"#{k}" for k in ids[:8]) + (" …" if len(ids) > 8 else "")
        size = sum(meta.chunks[k].byte_length for k in ids)
        line = Text.assemble(("██", fill), " ", (f, "bold"), "  ", (shown, "dim"))
        if len(ids) == 1 and size:
            start, stop = meta.chunks[ids[0]].byte_range
            line.append(f"  bytes {start:,}–{stop:,}", style="dim")
        if size:
            line.append(f"  ({human_bytes(size)})", style="dim italic")
        lines.append(line)
    if len(layout.files) > limit:
        lines.append(Text(f"   … {len(layout.files) - limit} more files", style="dim"))
    return lines


def summary(meta: TensorMeta, layout: ShardLayout) -> Text:
    n, f = layout.num_chunks, len(layout.files)
    text = Text()
    text.append(f"global {shape_str(meta.shape)}", style="bold")
    text.append(f"  ·  {n} chunk{'s' if n != 1 else ''} in {f} file{'s' if f != 1 else ''}")
    if layout.splits:
        text.append("  ·  split " + ", ".join(f"×{k} on dim {a}" for a, k in layout.splits.items()))
    elif n == 1:
        text.append("  ·  stored whole")
    numel = layout.numel
    if numel and layout.stored_elems < numel:
        text.append(f"  ·  ⚠ only {100 * layout.stored_elems / numel:.1f}% stored", style="bold yellow")
    elif numel and layout.replicated:
        text.append(f"  ·  stored {layout.stored_elems / numel:.2g}× (replicas)", style="yellow")
    if layout.holes and layout.stored_elems >= numel:
        text.append("  ·  ⚠ holes", style="bold yellow")
    return text


class ShardMap(Widget):
    """Draws ``meta``'s chunks over its global shape. Set ``meta``; page panels with ``panel_offset``."""

    DEFAULT_CSS = """
    ShardMap { height: auto; }
    """

    meta: reactive[TensorMeta | None] = reactive(None, layout=True)
    """The tensor drawn; None draws a hint."""
    panel_offset: reactive[int] = reactive(0, layout=True)
    """First leading-axis panel shown (the selector for 3-D+ tensors)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._cache: tuple[tuple[object, ...], ShardLayout] | None = None

    def watch_meta(self) -> None:
        self.panel_offset = 0

    def _layout(self, meta: TensorMeta, max_rows: int, max_cols: int) -> ShardLayout:
        key = (meta.name, meta.shape, len(meta.chunks), max_rows, max_cols)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, shard_layout(meta, max_rows=max_rows, max_cols=max_cols))
        return self._cache[1]

    def page_count(self) -> int:
        meta = self.meta
        if meta is None or len(meta.shape) <= 2 or self._cache is None:
            return 1
        return self._cache[1].total_panels

    def render(self) -> RenderableType:
        meta = self.meta
        if meta is None:
            return Text("Select a tensor to see how it is stored.", style="dim")
        if not meta.chunks:
            return Text("No stored chunks: this tensor has no bytes on disk.", style="yellow")
        if meta.numel == 0:
            return Text.assemble((f"global {shape_str(meta.shape)}", "bold"),
                                 ("  ·  empty: no elements, nothing to draw", "dim"))
        width = max(24, (self.size.width or 80) - 1)
        gutter = len(str(meta.shape[-2] if len(meta.shape) >= 2 else 1)) + 2
        several = len(meta.shape) > 2
        if several:
            guess = shard_layout(meta, max_rows=1, max_cols=1, max_panels=1).total_panels
            across = min(guess, 3)
            max_cols = max(12, min(40, (width - across * (gutter + 3)) // across))
            layout = self._layout(meta, 8 if guess <= across * 2 else 5, max_cols)
        else:
            layout = self._layout(meta, 6 if len(meta.chunks) == 1 else 12, max(16, min(64, width - gutter - 2)))
        shades = _chunk_shades(meta, layout)
        blocks = [render_panel(meta, layout, p, shades) for p in layout.panels]
        lines: list[Text] = [summary(meta, layout), Text()]
        if several:
            lines.extend(self._arrange(blocks, width, layout))
        else:
            lines.extend(blocks[0])
        lines.append(Text())
        lines.extend(legend(meta, layout))
        return Group(*lines)

    def _arrange(self, blocks: list[list[Text]], width: int, layout: ShardLayout) -> list[Text]:
        """Small multiples side by side, a window of them when there are many."""
        block_width = max(line.cell_len for line in blocks[0]) + 3
        across = max(1, min(len(blocks), width // block_width))
        visible = across * 2
        start = min(self.panel_offset, max(0, len(blocks) - visible))
        shown = blocks[start: start + visible]
        out: list[Text] = []
        for i in range(0, len(shown), across):
            row = shown[i: i + across]
            height = max(len(b) for b in row)
            for y in range(height):
                line = Text()
                for block in row:
                    part = block[y] if y < len(block) else Text()
                    line.append_text(part)
                    line.append(" " * (block_width - part.cell_len))
                out.append(line)
            out.append(Text())
        if layout.total_panels > len(shown):
            end = start + len(shown)
            more = f"panels {start + 1}-{end} of {layout.total_panels}  ·  [ ] to page"
            if layout.total_panels > len(layout.panels):
                more += f" (first {len(layout.panels)} computed)"
            out.append(Text(more, style="italic dim"))
        return out
