"""The diff screen's table of pairs: one row per tensor (keyed by its canonical name), sortable.

The name column takes whatever width the metric columns leave and shows whole names; only a name
that does not fit keeps its end and its first indexed component (``…layers.5.mlp.gate_proj.weight``,
``core.units.index_ellipsis``): abbreviated components made similar names impossible to tell apart, and
a middle cut dropped the layer number at 100-119 columns (a person testing). On a narrow table the name column takes the width its
longest name needs (up to what status and max_abs leave) and the other metrics scroll sideways:
sixteen characters of ``model.…oj.weight`` told no row from another. The detail pane always shows
the whole name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, ClassVar

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.text import Text
from textual import events
from textual.binding import BindingType
from textual.widgets import DataTable

from ckptscope.core.units import index_ellipsis, middle_ellipsis
from ckptscope.tui.diff_rows import COLUMNS, row_cells
from ckptscope.tui.widgets.column_fit import fit_column
from ckptscope.tui.widgets.row_fit import TAIL_ONLY_BELOW, shorten
from ckptscope.tui.widgets.vim_keys import KeysFollowFocus, table_keys

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.ops.diff.engine import PairResult

MIN_NAME_WIDTH = 16
KEEP_VISIBLE = ("status", "max_abs")
"""Columns that stay on screen beside the name however narrow the table (the rest scroll)."""


def name_width(table_width: int, longest: int, padding: int) -> int:
    """The name column's width: what the other columns leave when that shows whole names or cuts
    that keep both ends (``TAIL_ONLY_BELOW`` or more); else, on a narrow table, the longest name
    as far as the columns in ``KEEP_VISIBLE`` leave room for it (the other metrics scroll)."""
    cell = 2 * padding
    others = sum((c.width or 0) + cell for c in COLUMNS[1:]) + cell
    leftover = table_width - others - 2
    if leftover >= min(longest, TAIL_ONLY_BELOW):
        return max(MIN_NAME_WIDTH, leftover)
    keep = sum((c.width or 0) + cell for c in COLUMNS if c.key in KEEP_VISIBLE) + cell
    return max(MIN_NAME_WIDTH, leftover, min(longest, table_width - keep - 2))


class NameCell:
    """A name as a table cell: shortened to the column's width when drawn (so a resized column
    needs no new rows), never parsed as markup."""

    __slots__ = ("name", "style", "head")

    def __init__(self, name: str, style: str = "", head: float | str | None = None) -> None:
        self.name, self.style = name, style
        self.head = head
        """Share of a cut name's room given to its start (0: only the end); None: ``shorten``'s;
        ``"index"``: the end plus the first indexed component (``index_ellipsis``)."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        if self.head is None:
            text = shorten(self.name, width)
        elif self.head == "index":
            text = index_ellipsis(self.name, width)
        else:
            text = middle_ellipsis(self.name, width, float(self.head))
        yield Text(text, style=self.style, no_wrap=True, end="")

    def __str__(self) -> str:
        return self.name

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(min(len(self.name), MIN_NAME_WIDTH), len(self.name))


class DiffTable(KeysFollowFocus, DataTable[object]):
    """Rows are added as results stream in; the screen decides what is shown and in which order."""

    BINDINGS: ClassVar[list[BindingType]] = table_keys("difftable")

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, id=id)
        self.longest = MIN_NAME_WIDTH
        """Length of the longest name added (the name column's wish on a narrow table)."""

    def on_mount(self) -> None:
        for column in COLUMNS:
            self.add_column(column.label, key=column.key, width=column.width or MIN_NAME_WIDTH)
        self.set_sort(None, False)
        self.call_after_refresh(self.fit_name_column)

    def on_resize(self, event: events.Resize) -> None:
        self.fit_name_column()

    def fit_name_column(self) -> None:
        """Give the name column the width the other columns leave (a vertical scrollbar included),
        or on a narrow table the width its names need (see ``name_width``)."""
        fit_column(self, "name", name_width(self.size.width, self.longest, self.cell_padding))

    def set_sort(self, column: str | None, reverse: bool) -> None:
        """Mark the sorted column's header: ▼ largest (or last) first, ▲ smallest (or first) first."""
        for spec in COLUMNS:
            justify = "left" if spec.metric is None else "right"
            label = Text(spec.label, justify=justify)
            if spec.key == column:
                arrow = " ▼" if spec.descending != reverse else " ▲"
                label = Text(spec.label + arrow, style="bold", justify=justify)
            self.columns[spec.key].label = label  # type: ignore[index]
        self._clear_caches()
        self.refresh()

    def add_results(self, results: Iterable[PairResult]) -> None:
        longest = self.longest
        for result in results:
            longest = max(longest, len(result.name))
            self.add_row(NameCell(result.name, head="index"), *row_cells(result)[1:], key=result.name)
        if longest != self.longest:
            self.longest = longest
            self.fit_name_column()

    def order_by(self, key: Callable[[str], object]) -> None:
        """Sort rows by ``key(name)``; the cursor keeps its row index (the screen moves it)."""
        self.sort("name", key=lambda cell: key(cell.name))

    def key_at_cursor(self) -> str | None:
        if not self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return row_key.value
