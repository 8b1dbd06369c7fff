"""``/`` search inside any table, with ``n`` / ``N`` for the next and previous match (less, vim).

A table mixes in ``SearchableTable``: ``/`` asks for a pattern in a one-line prompt at the bottom,
the cursor lands on the first row at or after it that contains the pattern (case-insensitive,
over the row's full text, not the shortened cells), and ``n`` / ``N`` walk the matches, wrapping
around. The prompt is a modal screen so the table's own keys never see the typed text.
"""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import Input


class SearchPrompt(ModalScreen[str | None]):
    """One line at the bottom: dismisses with the typed pattern (enter) or None (esc)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "cancel", id="search.cancel")]
    DEFAULT_CSS = """
    SearchPrompt { align: left bottom; background: transparent; }
    SearchPrompt Input { dock: bottom; width: 100%; margin: 0 0 1 0; }
    """

    def __init__(self, what: str, pattern: str = "") -> None:
        super().__init__()
        self.what, self.pattern = what, pattern

    def compose(self) -> ComposeResult:
        yield Input(self.pattern, placeholder=f"search {self.what} (enter jumps, n / N next / previous)",
                    id="search-input")

    @on(Input.Submitted, "#search-input")
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)


def search_bindings(prefix: str) -> list[Binding]:
    """``/``, ``n``, ``N`` for a table; ids ``<prefix>.search`` ..."""
    return [
        Binding("slash", "search", "search", id=f"{prefix}.search", tooltip="Search the rows of this table"),
        Binding("n", "search_next(1)", "next match", show=False, id=f"{prefix}.search_next",
                tooltip="Next row matching the search"),
        Binding("N", "search_next(-1)", "prev match", show=False, id=f"{prefix}.search_prev",
                tooltip="Previous row matching the search"),
    ]


class SearchableTable:
    """Mixin for a ``DataTable``: row search. Override ``row_text`` to search text the cells shorten."""

    search_pattern: str = ""
    search_what: str = "rows"

    def row_text(self, row: int) -> str:
        cells = self.get_row_at(row)  # type: ignore[attr-defined]
        return " ".join(getattr(c, "plain", str(c)) for c in cells)

    def matching_rows(self) -> list[int]:
        pattern = self.search_pattern.lower()
        if not pattern:
            return []
        return [r for r in range(self.row_count) if pattern in self.row_text(r).lower()]  # type: ignore[attr-defined]

    def action_search(self) -> None:
        def searched(pattern: str | None) -> None:
            if pattern is None:
                return
            self.search_pattern = pattern.strip()
            self.action_search_next(0)

        self.app.push_screen(SearchPrompt(self.search_what, self.search_pattern), searched)  # type: ignore[attr-defined]

    def action_search_next(self, step: int) -> None:
        rows = self.matching_rows()
        if not rows:
            what = f"no row matches {self.search_pattern!r}" if self.search_pattern else "press / to search"
            self.notify(what, severity="warning" if self.search_pattern else "information")  # type: ignore[attr-defined]
            return
        here = self.cursor_row  # type: ignore[attr-defined]
        if step >= 0:
            after = [r for r in rows if r > here or (step == 0 and r == here)]
            target = after[0] if after else rows[0]
        else:
            before = [r for r in rows if r < here]
            target = before[-1] if before else rows[-1]
        self.move_cursor(row=target)  # type: ignore[attr-defined]
        position = rows.index(target) + 1
        self.notify(f"match {position} of {len(rows)}: {self.search_pattern!r}", timeout=2)  # type: ignore[attr-defined]
