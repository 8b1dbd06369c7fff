"""Shown instead of a traceback when the path cannot be opened; quitting exits with code 2."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Center, Vertical
from textual.screen import Screen
from textual.widgets import Static

from ckptscope.tui.widgets.key_footer import KeyFooter

EXIT_TROUBLE = 2


class ErrorScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,escape,enter", "quit_trouble", "quit", id="error.quit", tooltip="Quit (exit code 2)"),
    ]

    def __init__(self, path: str, reason: str) -> None:
        super().__init__()
        self.path = path
        self.reason = reason

    def compose(self) -> ComposeResult:
        with Center(), Vertical(id="error-box"):
            yield Static(Text("cannot open this checkpoint", style="bold"), id="error-title")
            yield Static(Text(self.path, style="bold"), id="error-path")
            yield Static(Text(self.reason), id="error-reason")
            yield Static(Text("press q to quit", style="dim italic"), id="error-hint")
        yield KeyFooter()

    def action_quit_trouble(self) -> None:
        self.app.exit(return_code=EXIT_TROUBLE)
