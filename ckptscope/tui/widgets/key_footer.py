"""The footer of every screen, with ``q quit`` and ``? help`` first.

Textual's ``Footer`` lists the focused widget's keys, then the screen's, then the app's, so the
two keys a newcomer needs most came last and were cut off on an 80-column terminal (the browser's
own keys fill the line before them). The keys are the same; only their order changes.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual.widget import Widget
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

FIRST_ACTIONS = ("quit", "help")
"""Actions whose keys lead the footer, in this order."""


class KeyFooter(Footer):
    """``Footer`` with the keys of ``FIRST_ACTIONS`` moved to the front."""

    def compose(self) -> Iterable[Widget]:
        widgets = list(super().compose())
        first = sorted((w for w in widgets if _leads(w)), key=lambda w: FIRST_ACTIONS.index(w.action))
        yield from first
        yield from (w for w in widgets if not _leads(w))


def _leads(widget: Widget) -> bool:
    return (isinstance(widget, FooterKey) and widget.action in FIRST_ACTIONS
            and not widget.has_class("-command-palette"))
