"""Colours the TUI uses for data: one per dtype family, and a palette for files in a shard map.

Kept apart from ``app.tcss`` because they colour Rich text inside widgets (tree labels, the
layout map), not widgets themselves. They are chosen to read on both the light and dark theme.
"""

from __future__ import annotations

DTYPE_COLORS: dict[str, str] = {
    "float64": "#5f87ff", "float32": "#00afd7", "bfloat16": "#5faf5f", "float16": "#d7af00",
    "int64": "#af5fd7", "int32": "#af5fd7", "int16": "#af5fd7", "int8": "#d75f87",
    "uint8": "#d75f5f", "bool": "#d75f5f",
}
"""Tree icons and dtype names: float32 cyan, bf16 green, fp16 amber, fp8 red, ints purple."""

DTYPE_ICON = "●"


def dtype_color(dtype: str) -> str:
    if dtype.startswith(("float8", "float4", "float6")):
        return "#ff5f5f"
    if dtype.startswith("complex"):
        return "#87afaf"
    return DTYPE_COLORS.get(dtype, "#a8a8a8")


FILE_PALETTE: tuple[tuple[str, str], ...] = (
    # (fill of even chunks, fill of odd chunks in the same file): the second shade keeps two
    # neighbouring chunks of one file apart without a border line.
    ("#3a6ea5", "#2f5a88"),
    ("#c26a2e", "#a35824"),
    ("#4e9a52", "#3f7e43"),
    ("#9b59b6", "#7e4796"),
    ("#c0392b", "#a12f23"),
    ("#16a085", "#12836d"),
    ("#b7950b", "#967a09"),
    ("#5d6d7e", "#4b5866"),
    ("#d35493", "#b0457a"),
    ("#2e86c1", "#256d9e"),
    ("#7d6608", "#655306"),
    ("#1e8449", "#186b3b"),
)
HOLE_COLOR = "#3a3a3a"
"""Fill of a region no chunk stores (an incomplete checkpoint)."""


def file_fill(color_index: int, chunk_index: int = 0) -> str:
    pair = FILE_PALETTE[color_index % len(FILE_PALETTE)]
    return pair[chunk_index % 2]
