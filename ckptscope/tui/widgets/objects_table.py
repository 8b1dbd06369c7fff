"""Non-tensor items (args, iteration, rng, optimizer groups, scheduler) and format metadata as a
key-value table.

Values arrive already made safe by the readers (pickled classes become plain dicts with a
``__class__`` key; nothing is unpickled here), so this widget only flattens them into dotted
keys: ``args.hidden_size``, ``optimizer.param_groups.0.lr``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from rich.text import Text
from textual import events
from textual.binding import BindingType
from textual.widgets import DataTable, Static

from ckptscope.core.index import CheckpointIndex
from ckptscope.core.units import middle_ellipsis
from ckptscope.tui.widgets.column_fit import fit_column
from ckptscope.tui.widgets.table_search import SearchableTable, search_bindings
from ckptscope.tui.widgets.vim_keys import table_keys

MAX_ROWS = 5000
MAX_VALUE = 120
"""Characters of a value shown in its cell; the row under the cursor shows it whole below the table."""
MAX_FULL_VALUE = 20_000
KEY_SHARE = 0.45
"""Most of the tab's width the key column takes: the whole longest key when it fits in that, so
space is never left empty beside a cut key; longer keys (Megatron args have long ones) keep their
start and end around a middle ellipsis, and the whole key is shown below the table."""
MIN_KEY_WIDTH = 16


def key_width(tab_width: int, longest: int) -> int:
    """The key column's width for a tab ``tab_width`` wide whose longest key has ``longest`` characters."""
    return max(MIN_KEY_WIDTH, min(longest, int(tab_width * KEY_SHARE)))


def flatten(prefix: str, value: Any, depth: int = 0) -> Iterator[tuple[str, str, str]]:
    """(key, type, value) rows; short lists of scalars stay on one row."""
    if isinstance(value, dict) and depth < 6:
        cls = value.get("__class__")
        items = [(k, v) for k, v in value.items() if k != "__class__"]
        if cls or not items:
            yield prefix, str(cls or "dict"), f"{len(items)} keys" if items else "{}"
        for key, item in items:
            yield from flatten(f"{prefix}.{key}" if prefix else str(key), item, depth + 1)
        return
    if isinstance(value, (list, tuple)) and depth < 6:
        scalars = all(not isinstance(v, (dict, list, tuple)) for v in value)
        if scalars and len(value) <= 16:
            yield prefix, type(value).__name__, _full(repr(list(value)))
            return
        yield prefix, type(value).__name__, f"{len(value)} items"
        for i, item in enumerate(value[:64]):
            yield from flatten(f"{prefix}.{i}", item, depth + 1)
        return
    yield prefix, type(value).__name__, _full(repr(value) if not isinstance(value, str) else value)


def _full(text: str) -> str:
    return text if len(text) <= MAX_FULL_VALUE else text[: MAX_FULL_VALUE - 1] + "…"


def _short(text: str) -> str:
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


def object_rows(index: CheckpointIndex) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    for entry in index.objects:
        if isinstance(entry.value, (dict, list, tuple)):
            first = True
            for key, kind, value in flatten(entry.name, entry.value):
                if first and key == entry.name:
                    kind = entry.type
                first = False
                rows.append((key, kind, value))
        else:
            rows.append((entry.name, entry.type, _full(repr(entry.value))))
    for key, value in index.metadata.items():
        rows.extend((f"metadata.{k}", t, v) for k, t, v in flatten(str(key), value))
    return rows[:MAX_ROWS]


def _key_cell(key: str, width: int) -> Text:
    """A key cut to ``width``: start and end kept (``args.`` or ``optimizer.`` and the last word)."""
    return Text(middle_ellipsis(key, width), style="bold")


class ObjectsTable(SearchableTable, DataTable[object]):
    """Key / type / value of every object and metadata entry; long keys and values are shortened in
    their cells and shown whole by ``ObjectDetail`` for the row under the cursor. ``/`` searches the
    full keys and values."""

    BINDINGS: ClassVar[list[BindingType]] = [*table_keys("objects"), *search_bindings("objects")]
    search_what = "keys and values"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.rows_full: list[tuple[str, str, str]] = []

    def show(self, index: CheckpointIndex) -> None:
        self.clear(columns=True)
        self.rows_full = object_rows(index)
        width = self._key_width()
        self.add_column("key", width=width, key="key")
        self.add_columns("type", "value")
        for key, kind, value in self.rows_full:
            self.add_row(_key_cell(key, width), Text(kind, style="cyan"), _short(value))
        if not self.rows_full:
            self.add_row(Text("no objects: this checkpoint holds only tensors", style="dim"), "", "")

    def _key_width(self) -> int:
        # the tab may be hidden (its size not known yet): then half the terminal is a fair guess
        tab = self.size.width or self.app.size.width // 2
        return key_width(tab, max((len(key) for key, _, _ in self.rows_full), default=MIN_KEY_WIDTH))

    def on_resize(self, event: events.Resize) -> None:
        width = self._key_width()
        if self.rows_full and fit_column(self, "key", width):
            for row, (key, _, _) in enumerate(self.rows_full):  # the cells hold keys cut to the old width
                self.update_cell_at((row, 0), _key_cell(key, width))

    def row_text(self, row: int) -> str:
        full = self.full_row(row)
        return " ".join(full) if full is not None else ""

    def full_row(self, row: int) -> tuple[str, str, str] | None:
        return self.rows_full[row] if 0 <= row < len(self.rows_full) else None


class ObjectDetail(Static):
    """The highlighted object row in full: key, type and the whole value, wrapped."""

    DEFAULT_CSS = """
    ObjectDetail { height: auto; max-height: 8; padding: 0 1; }
    """

    def show(self, row: tuple[str, str, str] | None) -> None:
        if row is None:
            self.update("")
            return
        key, kind, value = row
        self.update(Text.assemble((key, "bold"), "  ", (kind, "cyan"), "\n", value))
