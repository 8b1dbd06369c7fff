"""What the diff table shows and in which order: columns, sort keys, status filters, cell text.

Plain functions over ``PairResult`` (no widgets), so the screen, the tests and the header share one
definition of "sorted by max_abs" or "differing only".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.text import Text

from ckptscope.core.names import natural_key
from ckptscope.core.units import human_count
from ckptscope.tui.filtering import matches

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.ops.diff.engine import PairResult

STATUSES = ("equal", "close", "different", "dtype_mismatch", "shape_mismatch", "renamed", "only_a", "only_b")
"""The engine's statuses (``ops.diff.STATUSES``), repeated so this module never imports numpy."""
SEVERITY = {"different": 0, "dtype_mismatch": 1, "shape_mismatch": 2, "only_a": 3, "only_b": 4, "renamed": 5,
            "close": 6, "equal": 7}
"""Sorting by status puts the most interesting first."""
STATUS_STYLES = {"equal": "green", "close": "cyan", "different": "bold red", "dtype_mismatch": "yellow",
                 "shape_mismatch": "bold magenta", "only_a": "#d7875f", "only_b": "#af87d7", "renamed": "bold cyan"}
STATUS_LABELS = {"dtype_mismatch": "dtype", "shape_mismatch": "shape", "only_a": "only in A", "only_b": "only in B",
                 "renamed": "renamed"}


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    metric: str | None
    """Key in ``PairResult.metrics``; None for name and status."""
    descending: bool
    """First sort direction: largest differences first (cosine: smallest first)."""
    width: int | None


COLUMNS: tuple[Column, ...] = (
    Column("name", "name", None, False, None),
    Column("status", "status", None, False, 9),
    Column("max_abs", "max_abs", "max_abs_diff", True, 9),
    Column("mean_abs", "mean_abs", "mean_abs_diff", True, 9),
    Column("rel_l2", "rel_l2", "rel_l2", True, 9),
    Column("cosine", "cosine", "cosine", False, 9),
    Column("num_diff", "num_diff", "num_diff", True, 9),
)
COLUMN_BY_KEY = {c.key: c for c in COLUMNS}

STATUS_FILTERS = ("all", "differing", *STATUSES)
"""What the status filter cycles through: everything, anything not equal/close, one status."""


def keeps(result: PairResult, status_filter: str, name_filter: str) -> bool:
    """True when ``result`` passes the status filter and the name filter (substring or glob)."""
    if status_filter == "differing" and not result.differs:
        return False
    if status_filter not in ("all", "differing") and result.status != status_filter:
        return False
    return not name_filter.strip() or matches(result.name, name_filter.strip())


def sort_key(result: PairResult, column: str | None, reverse: bool, order: int) -> tuple[Any, ...]:
    """Key for ascending sort. ``column`` None is plan order. Missing values (pairs that were not
    compared) always sort last, in either direction; a NaN difference counts as the largest."""
    if column is None:
        return (order,)
    spec = COLUMN_BY_KEY[column]
    descending = spec.descending != reverse
    if column == "name":
        key = natural_key(result.name)
        return (0, _Reversed(key) if descending else key, order)
    if column == "status":
        rank = SEVERITY.get(result.status, 9)
        return (0, -rank if descending else rank, order)
    value = result.metrics.get(spec.metric or "")
    if value is None:
        return (1, 0.0, order)
    value = float(value)
    if math.isnan(value):
        value = math.inf
    return (0, -value if descending else value, order)


class _Reversed:
    """Inverts the order of a key that cannot be negated (a natural-sort tuple)."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __lt__(self, other: _Reversed) -> bool:
        return other.key < self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reversed) and other.key == self.key


def fmt_metric(value: object, digits: int = 6) -> str:
    """A metric in ``digits`` significant digits (the detail pane's precision)."""
    if value is None:
        return "—"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value == 0:
            return "0"
        return f"{value:.{digits}g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def fmt_cell(value: object, width: int) -> str:
    """A metric for a table cell of ``width`` characters: 3 significant digits, fewer if they do
    not fit (``-1.2e-05``); counts with thousands separators, or ``12.3M`` beyond the width."""
    if isinstance(value, int) and not isinstance(value, bool):
        text = f"{value:,}"
        return text if len(text) <= width else human_count(value)
    if isinstance(value, float) and 0.999 < value < 1.0:  # a cosine: "1" would hide the difference
        for digits in range(4, width):
            text = fmt_metric(value, digits)
            if text != "1" and len(text) <= width:
                return text
        return f"1−{1.0 - value:.0e}"  # a minus sign (U+2212): "1-2e-12" read like a range (a person testing)
    for digits in (3, 2, 1):
        text = fmt_metric(value, digits)
        if len(text) <= width:
            return text
    return text


def status_text(status: str) -> Text:
    return Text(STATUS_LABELS.get(status, status), style=STATUS_STYLES.get(status, ""))


def row_cells(result: PairResult) -> list[Text | str]:
    """The table row of one result, in ``COLUMNS`` order."""
    cells: list[Text | str] = [result.name, status_text(result.status)]
    for column in COLUMNS[2:]:
        value = result.metrics.get(column.metric or "")
        style = "dim" if value is None or value == 0 else ""
        cells.append(Text(fmt_cell(value, column.width or 9), style=style, justify="right"))
    return cells
