"""The Values tab: a value pager over any slice of a tensor.

A slice box takes NumPy syntax (``[3, :, 100:140]``); the table shows one page of it with a cell
cursor; the line under the table shows the cell under the cursor exactly: its global index, its
stored bits (``0x3f80`` for a bf16 1.0) and the float they encode. Keys page through rows and
columns, step the fixed axis (the layer of a stacked tensor, an expert) and toggle the table
between floats and stored bits. The widget only shows pages; the screen reads them in a worker
when the pager posts ``PageWanted``.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Input, Static

from ckptscope.core.errors import CkptError
from ckptscope.ops.values import Selection, ValuePage, exact_float, parse_selection, stored_bits
from ckptscope.tui.widgets.vim_keys import table_keys

CELL = 10
"""Characters per value column (``-1.234e-05``)."""
PAGE_ROWS = 64
"""Rows read per page: a few screens of scrolling inside the table before the next read."""


def cell_text(value: object, bits: bool = False) -> str:
    """A value as the table shows it: 4 significant digits, or its stored bits in hex."""
    if bits:
        hexed = stored_bits(value)
        if hexed is not None:
            return hexed
    try:
        number = float(value)  # bf16 / fp8 scalars from ml_dtypes convert too
    except (TypeError, ValueError):
        return str(value)
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return str(bool(value))
    if number.is_integer() and abs(number) < 1e15 and "int" in type(value).__name__:
        text = f"{int(number)}"
    else:
        text = f"{number:.4g}"
    digits = 3
    while len(text) > CELL and digits >= 0:  # never cut by the column: fewer digits, exponent kept
        text = f"{number:.{digits}e}"
        digits -= 1
    return text


class ValuesTable(DataTable):
    """The page of values, with vim keys and the pager's paging keys."""

    BINDINGS: ClassVar[list[BindingType]] = [
        *table_keys("values"),
        Binding("h", "cursor_left", "left", show=False, id="values.left", tooltip="Previous column"),
        Binding("l", "cursor_right", "right", show=False, id="values.right", tooltip="Next column"),
        Binding("ctrl+f,pagedown", "page_rows(1)", "next rows", id="values.next_rows",
                tooltip="The next page of rows of the slice"),
        Binding("ctrl+b,pageup", "page_rows(-1)", "prev rows", id="values.prev_rows",
                tooltip="The previous page of rows of the slice"),
        Binding("greater_than_sign", "page_cols(1)", "next cols", id="values.next_cols",
                tooltip="The next page of columns of the slice"),
        Binding("less_than_sign", "page_cols(-1)", "prev cols", show=False, id="values.prev_cols",
                tooltip="The previous page of columns of the slice"),
        Binding("right_square_bracket", "step(1)", "next layer", id="values.next_layer",
                tooltip="Step the fixed axis (layer, expert) of the slice forward"),
        Binding("left_square_bracket", "step(-1)", "prev layer", show=False, id="values.prev_layer",
                tooltip="Step the fixed axis (layer, expert) of the slice back"),
        Binding("x", "toggle_bits", "bits/float", id="values.bits",
                tooltip="Show stored bits (hex) or floats in the table"),
        Binding("colon", "edit_slice", "slice", id="values.slice", tooltip="Type a slice in NumPy syntax"),
    ]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        pager = self.parent
        if action == "step" and isinstance(pager, ValuesPager):  # ] [ only where there is an axis to step
            return pager.selection is not None and pager.selection.can_step
        return True

    def action_scroll_top(self) -> None:
        """g: the first row of the whole slice, not of the page read."""
        self.post_message(ValuesPager.Move(edge=-1))

    def action_scroll_bottom(self) -> None:
        """G: the last row of the whole slice."""
        self.post_message(ValuesPager.Move(edge=1))

    def action_page_rows(self, step: int) -> None:
        self.post_message(ValuesPager.Move(rows=step))

    def action_page_cols(self, step: int) -> None:
        self.post_message(ValuesPager.Move(cols=step))

    def action_step(self, step: int) -> None:
        self.post_message(ValuesPager.Move(layer=step))

    def action_toggle_bits(self) -> None:
        self.post_message(ValuesPager.Move(bits=True))

    def action_edit_slice(self) -> None:
        self.post_message(ValuesPager.Move(edit=True))


class SliceInput(Input):
    """The slice box. Enter applies the slice typed, esc puts back the slice shown and returns to the table:
    esc used to leave the invalid text in the box and fall through to the browser, which cleared the
    filter as well (a person testing). Both keys are in the footer while typing."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "submit", "apply slice", id="values.apply_slice", tooltip="Read the slice typed"),
        Binding("escape", "cancel_edit", "cancel", id="values.cancel_slice",
                tooltip="Put back the slice shown and return to the table"),
    ]

    def action_cancel_edit(self) -> None:
        pager = self.parent
        if isinstance(pager, ValuesPager):
            pager.cancel_edit()


class ValuesPager(Vertical):
    """Slice box, page table and exact cell line for one tensor."""

    class PageWanted(Message):
        """The screen should read this page (``ops.values.read_page``) and call ``show_page``."""

        def __init__(self, name: str, selection: Selection, row: int, col: int, rows: int, cols: int) -> None:
            self.name, self.selection, self.row, self.col = name, selection, row, col
            self.rows, self.cols = rows, cols
            super().__init__()

    class Move(Message):
        """A paging key was pressed in the table."""

        def __init__(self, rows: int = 0, cols: int = 0, layer: int = 0, bits: bool = False,
                     edit: bool = False, edge: int = 0) -> None:
            self.rows, self.cols, self.layer, self.bits, self.edit = rows, cols, layer, bits, edit
            self.edge = edge
            """-1: the first row of the slice (g), 1: the last (G)."""
            super().__init__()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.tensor: str | None = None
        self.shape: tuple[int, ...] = ()
        self.selection: Selection | None = None
        self.page: ValuePage | None = None
        self.bits = False
        self._row = self._col = 0
        self._land_last = False
        """Put the cursor on the page's last row when it arrives (G)."""

    def compose(self) -> ComposeResult:
        yield SliceInput(placeholder="slice: [3, :, 100:140]", id="values-slice")
        yield Static(id="values-title")
        yield ValuesTable(id="values-table", cursor_type="cell", zebra_stripes=True)
        yield Static(id="values-cell")

    # --- what the screen calls ------------------------------------------------------------------

    def show_hint(self, name: str | None) -> None:
        msg = "Select a tensor, then press v to page through its values." if name is None else \
            f"Press v to read the values of {name}."
        self._message(Text(msg, style="dim"))

    def show_error(self, name: str, error: str) -> None:
        self._message(Text.assemble((name, "bold"), "  ", (error, "red")))

    def start(self, name: str, shape: tuple[int, ...]) -> None:
        """Page through ``name`` from its first page (keeps the slice typed for the same tensor)."""
        if name != self.tensor:
            self.tensor, self.shape = name, tuple(shape)
            self.selection = parse_selection("", self.shape)
            self._row = self._col = 0
            self.query_one("#values-slice", Input).value = self.selection.text()
        if self.size.width:
            self._want()
        else:  # the tab was just shown: ask once the pane has its width, so the first page fits it
            self.call_after_refresh(self._want)

    def on_resize(self) -> None:
        """The first page can be asked for before the pane has its width (80 columns assumed): with more
        columns than fit, paging by columns skipped those past the edge (a probe at 80x24: [0:6] shown as
        0-2, then > went to 6). A page whose column count is not what fits now is asked for again."""
        page = self.page
        if page is not None and page.col_axis is not None and self._wrong_width(page):
            self._want()

    def _wrong_width(self, page: ValuePage) -> bool:
        """More columns than fit (the rest would be skipped by >), or fewer while more exist."""
        shown, fits = page.values.shape[1], self._page_cols()
        return shown > fits or (shown < fits and page.col_start + shown < page.cols_total)

    def show_page(self, page: ValuePage, keep_cursor: bool = False) -> None:
        if page.name != self.tensor:
            return
        self.page = page
        if page.col_axis is not None and self.size.width and self._wrong_width(page):
            self._want()  # asked for before the pane had its width: ask again with the columns that fit
        self.screen.refresh_bindings()  # ] [ in the footer only when the slice has an axis to step
        cursor = self.query_one(ValuesTable).cursor_coordinate
        self.query_one("#values-title", Static).update(Text(page.title(), style="bold"))
        table = self.query_one(ValuesTable)
        table.clear(columns=True)
        values = page.values
        row_labels = [str(page.row_start + i) if page.row_axis is not None else "" for i in range(values.shape[0])]
        # the labels' width given, not measured later: a frame drawn before the table measured its auto-width
        # column showed no row numbers (a snapshot differed under a loaded CI run)
        table.add_column("", key="row", width=max(map(len, row_labels), default=0))
        for j in range(values.shape[1]):
            label = str(page.col_start + j) if page.col_axis is not None else "value"
            table.add_column(label, width=CELL)
        for i, label in enumerate(row_labels):
            table.add_row(Text(label, style="dim"), *(Text(cell_text(v, self.bits), justify="right")
                                                       for v in values[i]))
        if len(table.columns) > 1:
            row, column = (cursor.row, cursor.column) if keep_cursor else (0, 1)
            if self._land_last:
                row, self._land_last = values.shape[0] - 1, False
            table.move_cursor(row=row, column=max(1, column))
            self._show_cell(table.cursor_coordinate.row, table.cursor_coordinate.column - 1)

    def cancel_edit(self) -> None:
        """Esc in the slice box: the slice shown comes back, the error line goes, the table has the keys."""
        box = self.query_one("#values-slice", Input)
        if self.selection is not None:
            box.value = self.selection.text()
        self.query_one("#values-cell", Static).update("")
        table = self.query_one(ValuesTable)
        table.focus()
        self._show_cell(table.cursor_coordinate.row, table.cursor_coordinate.column - 1)

    # --- inside -------------------------------------------------------------------------------

    def _message(self, text: Text) -> None:
        self.page = None
        self.query_one("#values-title", Static).update(text)
        self.query_one(ValuesTable).clear(columns=True)
        self.query_one("#values-cell", Static).update("")

    def _page_cols(self) -> int:
        width = self.size.width or 80
        return max(1, min(32, (width - 8) // (CELL + 1)))

    def _want(self) -> None:
        if self.tensor is None or self.selection is None:
            return
        self.post_message(self.PageWanted(self.tensor, self.selection, self._row, self._col, PAGE_ROWS,
                                          self._page_cols()))

    @on(Input.Submitted, "#values-slice")
    def _slice_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.tensor is None:
            return
        try:
            self.selection = parse_selection(event.value, self.shape)
        except CkptError as exc:
            self.query_one("#values-cell", Static).update(Text(str(exc), style="red"))
            return
        event.input.value = self.selection.text()
        self._row = self._col = 0
        self.query_one(ValuesTable).focus()
        self._want()

    @on(Move)
    def _moved(self, event: Move) -> None:
        event.stop()
        if event.edit:
            self.query_one("#values-slice", Input).focus()
            return
        if self.page is None or self.selection is None:
            return
        if event.bits:
            self.bits = not self.bits
            self.show_page(self.page, keep_cursor=True)
            return
        if event.layer:
            self.selection = self.selection.stepped(event.layer)
            self.query_one("#values-slice", Input).value = self.selection.text()
        page_rows, page_cols = self.page.values.shape
        if event.edge:
            self._row = 0 if event.edge < 0 else max(0, self.page.rows_total - PAGE_ROWS)
            self._land_last = event.edge > 0
            self._want()
            return
        self._row = max(0, min(self._row + event.rows * page_rows, self.page.rows_total - 1))
        self._col = max(0, min(self._col + event.cols * page_cols, self.page.cols_total - 1))
        self._want()

    @on(DataTable.CellHighlighted, "#values-table")
    def _cell_highlighted(self, event: DataTable.CellHighlighted) -> None:
        self._show_cell(event.coordinate.row, event.coordinate.column - 1)

    def _show_cell(self, row: int, col: int) -> None:
        page = self.page
        if page is None or col < 0 or row >= page.values.shape[0] or col >= page.values.shape[1]:
            return
        value = page.values[row, col]
        index = ", ".join(map(str, page.index_of(row, col)))
        line = Text.assemble((f"[{index}]", "bold"), "  ", (page.dtype, "dim"))
        hexed = stored_bits(value)
        if hexed is not None:
            line.append(f"  stored {hexed}")
        line.append(f"  = {exact_float(value)}")
        self.query_one("#values-cell", Static).update(line)
