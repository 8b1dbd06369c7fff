"""The footer of every screen, with ``q quit`` and ``? help`` first.

Textual's ``Footer`` lists the focused widget's keys, then the screen's, then the app's, so the
two keys a newcomer needs most came last and were cut off on an 80-column terminal (the browser's
own keys fill the line before them). The keys are the same; only their order changes.

Textual also rebuilds the footer (every key a new widget, each styled three times) whenever
the bindings *may* have changed: on every focus change, and four times while the browser
opens, each time with the same keys. Opening 20,000 tensors spent ~50 ms of its ~0.55 s there
(row 9 of bench/run_all.py). This footer rebuilds only when what it shows differs.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from textual.widget import Widget
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

FIRST_ACTIONS = ("quit", "help")
"""Actions whose keys lead the footer, in this order."""


class KeyFooter(Footer):
    """``Footer`` with the keys of ``FIRST_ACTIONS`` moved to the front, rebuilt only on change."""

    _shown: Hashable | None = None
    """What the current keys were composed from (``shown_bindings``); None before the first keys."""

    def compose(self) -> Iterable[Widget]:
        self._shown = self.shown_bindings()
        widgets = list(super().compose())
        for widget in widgets:
            # A key is born compact (Textual's default) and then bound to the footer's ``compact``:
            # restyled twice as it mounted. Set the state the binding leads to up front. The palette
            # key is not bound (it stays compact).
            if isinstance(widget, FooterKey) and not widget.has_class("-command-palette"):
                widget.set_reactive(FooterKey.compact, self.compact)
                widget.set_class(self.compact, "-compact", update=False)
        first = sorted((w for w in widgets if _leads(w)), key=lambda w: FIRST_ACTIONS.index(w.action))
        yield from first
        yield from (w for w in widgets if not _leads(w))

    async def recompose(self) -> None:
        if self._shown is not None and self.is_attached and self.shown_bindings() == self._shown:
            return
        await super().recompose()

    def shown_bindings(self) -> Hashable | None:
        """Everything ``Footer.compose`` reads to build its keys; None while it shows none yet."""
        if not self._bindings_ready or not self.is_attached:
            return None
        app = self.app
        keys = tuple(
            (binding.key, app.get_key_display(binding), binding.description, binding.action, binding.show,
             binding.group, enabled, tooltip, binding.tooltip)
            for _, binding, enabled, tooltip in self.screen.active_bindings.values())
        return (keys, self.compact, self.show_command_palette, self.combine_groups,
                app.ENABLE_COMMAND_PALETTE, app.COMMAND_PALETTE_BINDING)


def _leads(widget: Widget) -> bool:
    return (isinstance(widget, FooterKey) and widget.action in FIRST_ACTIONS
            and not widget.has_class("-command-palette"))
