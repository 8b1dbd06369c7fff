"""The table under the shard map: every chunk with its global offsets, shape, stored size, byte range
and file.

Rows are numbered ``#k`` like the labels in the map, and the first cell carries the file's
colour, so the drawing and the table read together.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.binding import BindingType
from textual.widgets import DataTable

from ckptscope.core.tensor import Encoding, TensorMeta
from ckptscope.core.units import human_bytes, shape_str
from ckptscope.ops.layout import file_colors
from ckptscope.tui.colors import file_fill
from ckptscope.tui.widgets.table_search import SearchableTable, search_bindings
from ckptscope.tui.widgets.vim_keys import table_keys

MAX_ROWS = 2000
"""Rows shown at most; a DCP tensor over thousands of ranks still opens instantly."""


class ChunkTable(SearchableTable, DataTable[object]):
    """Chunks of one tensor. Call ``show(meta)``."""

    BINDINGS: ClassVar[list[BindingType]] = [*table_keys("chunks"), *search_bindings("chunks")]
    search_what = "chunks (file, offsets)"

    DEFAULT_CSS = """
    ChunkTable { height: auto; max-height: 16; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)

    def show(self, meta: TensorMeta | None) -> None:
        self.clear(columns=True)
        if meta is None:
            return
        odd = any(c.encoding is not Encoding.RAW or c.big_endian for c in meta.chunks)
        self.add_columns("chunk", "offsets", "shape", "stored size", "byte range", "file", *(["encoding"] if odd else []))
        colors = file_colors(meta.chunks)
        for k, chunk in enumerate(meta.chunks[:MAX_ROWS]):
            start, stop = chunk.byte_range
            span = f"{start:,}–{stop:,}" if chunk.byte_length else "—"
            self.add_row(
                Text.assemble(("▌", file_fill(colors[chunk.file])), f"#{k}"),
                shape_str(chunk.offsets), shape_str(chunk.shape),
                Text(human_bytes(chunk.byte_length) if chunk.byte_length else "—", justify="right"),
                span, chunk.file,
                *([chunk.encoding.value + (" (big-endian)" if chunk.big_endian else "")] if odd else []),
            )
        if len(meta.chunks) > MAX_ROWS:
            blank = [""] * (6 if odd else 5)
            self.add_row(Text(f"… {len(meta.chunks) - MAX_ROWS} more", style="dim"), *blank)
