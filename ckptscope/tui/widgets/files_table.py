"""The files of a checkpoint: role, size and how many tensors (chunks) each one stores."""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

from rich.text import Text
from textual.binding import BindingType
from textual.widgets import DataTable

from ckptscope.core.index import CheckpointIndex
from ckptscope.core.units import human_bytes
from ckptscope.tui.widgets.table_search import SearchableTable, search_bindings
from ckptscope.tui.widgets.vim_keys import table_keys


class FilesTable(SearchableTable, DataTable[object]):
    BINDINGS: ClassVar[list[BindingType]] = [*table_keys("files"), *search_bindings("files")]
    search_what = "files"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.add_columns("file", "role", "size", "chunks")

    def show(self, index: CheckpointIndex) -> None:
        self.clear()
        chunks: Counter[str] = Counter(c.file for t in index.tensors.values() for c in t.chunks)
        for info in index.files:
            self.add_row(Text(info.path, style="bold"), Text(info.role, style="cyan"),
                         Text(human_bytes(info.size), justify="right"),
                         Text(f"{chunks.get(info.path, 0):,}" if info.role == "data" else "", justify="right"))
