"""``D`` / "ops: diff with…" in the browser: ask for the other checkpoint, then open the diff screen
with the checkpoint being browsed as A (the iteration picked, for a save root)."""

from __future__ import annotations

import os
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from ckptscope.tui.widgets.key_footer import KeyFooter
from ckptscope.tui.widgets.path_suggester import PathSuggester


class DiffWithDialog(ModalScreen[str | None]):
    """Dismisses with the path of B (it exists), or None."""

    BINDINGS: ClassVar[list[BindingType]] = [
        # priority: the input's own enter (hidden in the footer) would otherwise hide this one
        Binding("enter", "compare", "compare", id="diff_with.compare", priority=True,
                tooltip="Compare with the path typed"),
        Binding("escape", "cancel", "cancel", id="diff_with.cancel", tooltip="Close without comparing"),
    ]

    def __init__(self, a: str) -> None:
        super().__init__()
        self.a = a

    def compose(self) -> ComposeResult:
        with Vertical(id="diff-with-box"):
            yield Static(Text.assemble(("Diff ", "bold"), (self.a, "bold cyan"), (" with…", "bold")),
                         id="diff-with-title")
            yield Input(placeholder="path of the other checkpoint (B): file, HF dir, iter_* dir, save root",
                        suggester=PathSuggester(), id="diff-with-path")
            yield Static(Text("enter compares (A = the checkpoint open here) · → completes a path · esc cancels",
                              style="dim"), id="diff-with-status")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Submitted, "#diff-with-path")
    def _submitted(self, event: Input.Submitted) -> None:
        self.action_compare()

    def action_compare(self) -> None:
        """Enter: check the path typed, then compare with it."""
        value = self.query_one("#diff-with-path", Input).value.strip()
        status = self.query_one("#diff-with-status", Static)
        if not value:
            status.update(Text("Type the path of the checkpoint to compare with.", style="yellow"))
            return
        if not os.path.exists(os.path.expanduser(value)):
            status.update(Text(f"{value}: no such file or directory", style="bold red"))
            return
        self.dismiss(os.path.expanduser(value))

    def action_cancel(self) -> None:
        self.dismiss(None)
