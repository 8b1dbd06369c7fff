"""A yes/no question before work is thrown away (pending renames on quit or on opening another
checkpoint): never lose a plan silently. Its own footer names its keys (the screen below offered
keys that do nothing while the question is open)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from ckptscope.tui.widgets.key_footer import KeyFooter


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True for yes (y, or the button), False for no (n, esc, or the button)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "no", id="confirm.no", key_display="n/esc"),
    ]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    #confirm-box { width: auto; max-width: 90%; height: auto; border: round $warning; padding: 1 2;
                   background: $surface; }
    #confirm-buttons { height: auto; margin: 1 0 0 0; }
    #confirm-buttons Button { margin: 0 2 0 0; }
    """

    def __init__(self, question: str, detail: str = "", yes: str = "Discard", no: str = "Keep") -> None:
        super().__init__()
        self.question, self.detail, self.yes, self.no = question, detail, yes, no

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(Text(self.question, style="bold"))
            if self.detail:
                yield Static(Text(self.detail, style="dim"))
            with Horizontal(id="confirm-buttons"):
                yield Button(f"{self.yes} (y)", variant="error", id="confirm-yes")
                yield Button(f"{self.no} (n)", variant="primary", id="confirm-no")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)
