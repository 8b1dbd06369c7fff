"""The ``/`` filter input under the tree: glob (``*.mlp.*``) or substring, narrowing live."""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.widgets import Input


class FilterBar(Input):
    """An Input that hides itself on escape; the screen reacts to ``Input.Changed``."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss_filter", "close filter", id="filter.close",
                tooltip="Clear the filter and go back to the tree"),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(placeholder="filter: substring or glob (*.mlp.*)  ·  enter: tree  ·  esc: clear",
                         id=id)

    async def action_dismiss_filter(self) -> None:
        self.value = ""
        await self.screen.run_action("close_filter")  # (a coroutine: not awaited, it never ran)
