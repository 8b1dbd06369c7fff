"""The top-left corner of a tensor as a table of numbers (``v``)."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ckptscope.ops.stats import ValuePeek


def _cell(value: object) -> str:
    try:
        number = float(value)  # bf16 / fp8 scalars from ml_dtypes convert too
    except (TypeError, ValueError):
        return str(value)
    if isinstance(value, (bool,)) or type(value).__name__ == "bool_":
        return str(bool(value))
    if number.is_integer() and abs(number) < 1e15 and "int" in type(value).__name__:
        return f"{int(number)}"
    return f"{number:.4g}"


CELL = 10
"""Characters per value column (``-1.234e-05``)."""


def peek_table(peek: ValuePeek, max_cols: int = 8) -> Table:
    values = peek.values
    bounds = list(peek.region)
    if bounds and values.ndim >= 1:
        a, b = bounds[-1]
        bounds[-1] = (a, min(b, a + max(1, max_cols)))
    region = ", ".join(f"{a}:{b}" if b - a != 1 else f"{a}" for a, b in bounds)
    table = Table(title=Text(f"{peek.name}[{region}]", style="bold"), title_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="dim", padding=(0, 0))
    if values.ndim == 0:
        table.add_column("value", justify="right")
        table.add_row(_cell(values[()]))
        return table
    rows = values.reshape(1, -1) if values.ndim == 1 else values.reshape(values.shape[-2], values.shape[-1]) \
        if values.ndim == 2 else values.reshape(-1, values.shape[-1])
    col_start = peek.region[-1][0] if peek.region else 0
    row_start = peek.region[-2][0] if len(peek.region) >= 2 else 0
    rows = rows[:, :max(1, max_cols)]
    table.add_column("", style="dim", justify="right", min_width=3, no_wrap=True)
    for j in range(rows.shape[1]):
        table.add_column(str(col_start + j), justify="right", no_wrap=True, min_width=CELL)
    for i in range(rows.shape[0]):
        table.add_row(str(row_start + i) if values.ndim >= 2 else "", *(_cell(v) for v in rows[i]))
    return table


class ValuesView(Static):
    """Shows a hint, an error or a ``ValuePeek``."""

    def show_hint(self, name: str | None) -> None:
        msg = "Select a tensor, then press v to see its first values." if name is None else \
            f"Press v to read the top-left corner of {name}."
        self.update(Text(msg, style="dim"))

    def show_error(self, name: str, error: str) -> None:
        self.update(Text.assemble((name, "bold"), "\n", (error, "red")))

    def show_peek(self, peek: ValuePeek) -> None:
        if peek.values.size == 0:
            self.update(Text(f"{peek.name} is empty.", style="dim"))
            return
        width = self.size.width or 80
        self.update(peek_table(peek, max_cols=max(1, (width - 5) // (CELL + 1))))
