"""The header: what was opened, in two or three lines (path, format, iteration, size, warnings)."""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ckptscope.core.index import CheckpointIndex
from ckptscope.core.roles import MODEL, UNKNOWN
from ckptscope.core.units import human_bytes, human_count, plural
from ckptscope.ops.model import ModelEntries, role_totals
from ckptscope.tui.colors import dtype_color


class Flow:
    """Items on a line, separated by ``gap`` spaces, wrapping between items only: a dtype entry
    (``● int8 10 B (3%)``) never breaks in two. An item wider than the line wraps on its own."""

    def __init__(self, items: list[Text], gap: int = 3) -> None:
        self.items, self.gap = items, gap

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        line = Text()
        for item in self.items:
            if line.cell_len and line.cell_len + self.gap + item.cell_len > width:
                yield line
                line = Text()
            if line.cell_len:
                line.append(" " * self.gap)
            line.append_text(item)
        yield line

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widths = [cell_len(item.plain) for item in self.items]
        return Measurement(max(widths, default=0), sum(widths) + self.gap * max(0, len(widths) - 1))


def summary_renderable(index: CheckpointIndex, entries: ModelEntries | None = None) -> Table:
    """Rich grid for the header; pure function of the index so tests and screenshots agree."""
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(style="bold", no_wrap=True, width=10)
    grid.add_column(ratio=1)
    fmt = index.format + (f" ({index.metadata['weights']})" if "weights" in index.metadata else "")
    first = Text.assemble((index.path, "bold"), "   ", (fmt, "cyan"))
    if index.iteration is not None:
        first.append(f"   iteration {index.iteration:,}", style="bold magenta")
    arch = index.metadata.get("architectures")
    if arch:
        first.append("   " + (", ".join(arch) if isinstance(arch, list) else str(arch)), style="dim")
    grid.add_row("checkpoint", first)
    total_files = sum(f.size for f in index.files)
    roles = role_totals(index, entries)
    per_dtype = index.bytes_per_dtype()  # once: each call is passes over every tensor (20k: ~4 ms)
    total_bytes = sum(per_dtype.values())  # = index.total_bytes
    size = Text.assemble(
        (f"{len(index):,}", "bold"), " tensors · ",
        (human_count(roles[MODEL]["params"]), "bold"), " model params · ",
        (human_bytes(total_bytes), "bold"), " · ",
        f"{plural(len(index.files), 'file')} ({human_bytes(total_files)})",
    )
    total = total_bytes or 1
    items = [size]
    for dtype, nbytes in per_dtype.items():
        items.append(Text.assemble(("● ", dtype_color(dtype)), f"{dtype} {human_bytes(nbytes)} "
                                   f"({100 * nbytes / total:.0f}%)"))
    grid.add_row("contents", Flow(items))
    state = [(kind, totals) for kind, totals in roles.items() if kind != MODEL]
    if state:
        line = Text()
        for i, (kind, totals) in enumerate(state):
            line.append(" · " if i else "")
            line.append(kind, style="bold yellow" if kind == UNKNOWN else "bold")
            line.append(f" {human_bytes(totals['bytes'])} ({plural(totals['tensors'], 'tensor')})")
        line.append("   not counted as model parameters", style="dim")
        grid.add_row("training", line)
    for warning in index.warnings[:3]:
        grid.add_row(Text("warning", style="bold yellow"), Text(f"⚠ {warning}", style="yellow"))
    if len(index.warnings) > 3:
        grid.add_row("", Text(f"… {len(index.warnings) - 3} more warnings", style="yellow"))
    return grid


class SummaryHeader(Widget):
    """Checkpoint summary; shows the path and "reading metadata…" until ``index`` is set."""

    DEFAULT_CSS = """
    SummaryHeader { height: auto; }
    """

    index: reactive[CheckpointIndex | None] = reactive(None, layout=True)

    def __init__(self, path: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.path = path
        self._rendered: Table | None = None
        self._pending: Text | None = None

    def show(self, index: CheckpointIndex | None, rendered: Table | None = None, *, path: str | None = None) -> None:
        """Set the index; ``rendered`` is its summary when already built (by the index worker).

        Totals walk every tensor, so they are computed once, never on a repaint.
        """
        if path is not None:
            self.path = path
        self._rendered = rendered if rendered is not None or index is None else summary_renderable(index)
        self.index = index
        self.refresh(layout=True)

    def set_pending(self, line: Text | None) -> None:
        """An extra line under the summary (pending renames), or None to remove it."""
        self._pending = line
        self.refresh(layout=True)

    def render(self) -> Table | Text | Group:
        if self._rendered is None:
            return Text.assemble((self.path, "bold"), ("   reading metadata…", "dim italic"))
        if self._pending is not None:
            row = Table.grid(padding=(0, 1), expand=True)
            row.add_column(style="bold yellow", no_wrap=True, width=10)
            row.add_column(ratio=1)
            row.add_row("rename", self._pending)
            return Group(self._rendered, row)
        return self._rendered
