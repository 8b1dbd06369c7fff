"""Resize one fixed-width ``DataTable`` column after its rows exist (on a resize of the table).

``DataTable`` has no public call for it; the diff table, the objects table and the timeline tables
all size a name column from the width they get, so the one private detail lives here.
"""

from __future__ import annotations

from textual.widgets import DataTable


def fit_column(table: DataTable[object], key: str, width: int) -> bool:
    """Give column ``key`` ``width`` cells; False (nothing done) when it has that width or is absent."""
    column = table.columns.get(key)  # type: ignore[call-overload]
    if column is None or column.width == width:
        return False
    column.width, column.auto_width = width, False
    table._clear_caches()
    table._require_update_dimensions = True
    table.refresh()
    return True
