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


class PathInput(Input):
    """The path box: its own enter (submit) is the footer's "compare". A priority binding on the screen did
    that before, but it ran ahead of keys still queued for the box, so a path pasted or typed fast and
    then enter was read empty ("Type the path ...")."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "submit", "compare", id="diff_with.compare", tooltip="Compare with the path typed"),
    ]


class DiffWithDialog(ModalScreen[str | None]):
    """Dismisses with the path of B (a checkpoint ckptscope can open), or None."""

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
            yield PathInput(placeholder="path of the other checkpoint (B): file, HF dir, iter_* dir, save root",
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
        """Enter: check the path typed is a checkpoint (sniffing only, as ``open`` does before its screen), then
        compare with it. A path that is none stays in the box with the reason under it: the dialog used to
        close and the diff screen failed, so the path had to be typed again."""
        from ckptscope.core.errors import CkptError
        from ckptscope.ops.opening import check_openable

        value = self.query_one("#diff-with-path", Input).value.strip()
        status = self.query_one("#diff-with-status", Static)
        if not value:
            status.update(Text("Type the path of the checkpoint to compare with.", style="yellow"))
            return
        path = os.path.expanduser(value)
        if not os.path.exists(path):
            status.update(Text(f"{value}: no such file or directory", style="bold red"))
            return
        try:
            check_openable(path)
        except CkptError as exc:
            status.update(Text(str(exc), style="bold red"))
            return
        self.dismiss(path)

    def action_cancel(self) -> None:
        self.dismiss(None)
