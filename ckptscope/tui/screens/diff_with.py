"""``D`` / "ops: diff with…" in the browser: ask for the other checkpoint, then open the diff screen
with the checkpoint being browsed as A (the iteration picked, for a save root)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import Footer, Input, Static

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.tui.screens.browse import BrowseScreen


class PathSuggester(Suggester):
    """Completes the last path component from the directory listing (→ accepts, as in a shell)."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        if not value:
            return None
        folder, stem = os.path.split(value)
        try:
            names = sorted(os.listdir(os.path.expanduser(folder) or "."))
        except OSError:
            return None
        for name in names:
            if name.startswith(stem) and name != stem and not (name.startswith(".") and not stem.startswith(".")):
                full = os.path.join(folder, name)
                return full + os.sep if os.path.isdir(os.path.expanduser(full)) else full
        return None


class DiffWithDialog(ModalScreen[str | None]):
    """Dismisses with the path of B (it exists), or None."""

    BINDINGS: ClassVar[list[BindingType]] = [
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
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Submitted, "#diff-with-path")
    def _submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
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


def ask_diff_with(screen: BrowseScreen) -> None:
    """Ask for B, then push the diff screen over the browser (esc there comes back)."""
    if screen.index is None:
        screen.notify("The checkpoint is still loading.", severity="warning")
        return
    a = screen.path

    def chosen(b: str | None) -> None:
        if b is None:
            return
        from ckptscope.tui.screens.diff import DiffScreen

        screen.app.push_screen(DiffScreen(a, b, trust_pickle=screen.trust_pickle, standalone=False))

    screen.app.push_screen(DiffWithDialog(a), chosen)
