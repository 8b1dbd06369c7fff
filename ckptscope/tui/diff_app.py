"""The app for ``ckptscope diff A B`` in a terminal: the ckptscope app (themes, keys, palette, help,
error screen) with the diff screen as its only screen, and diff(1)'s exit code on quit."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import events

from ckptscope.tui.app import CkptScopeApp
from ckptscope.tui.screens.diff import DiffScreen

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.ops.diff.engine import DiffOptions


class DiffApp(CkptScopeApp):
    def __init__(self, a: str, b: str, *, mapping: str = "auto", include: tuple[str, ...] = (),
                 exclude: tuple[str, ...] = (), options: DiffOptions | None = None, arch: str | None = None,
                 trust_pickle: bool = False, theme: str | None = None, keymap: dict[str, str] | None = None,
                 training_state: bool = False, hf_config: str | None = None) -> None:
        super().__init__(a, trust_pickle=trust_pickle, theme=theme, keymap=keymap)
        self.diff_code: int | None = None
        """diff(1)'s exit code, set when the user quits (None after a crash: Textual's own code is 1)."""
        self.diff_screen = DiffScreen(a, b, mapping=mapping, include=include, exclude=exclude, options=options,
                                      arch=arch, trust_pickle=trust_pickle, standalone=True,
                                      training_state=training_state, hf_config=hf_config)

    def on_mount(self, event: events.Mount) -> None:
        # Textual calls every class's on_mount along the MRO; prevent_default stops the browser's.
        event.prevent_default()
        if self._user_keymap:
            self.set_keymap(self._user_keymap)
        self.push_screen(self.diff_screen)

    async def action_quit(self) -> None:
        self.diff_code = 2 if self.error_reason else self.diff_screen.exit_code()
        self.exit(return_code=self.diff_code)


def make_diff_app(a: str, b: str, **kwargs) -> DiffApp:
    """The diff app (see ``DiffApp``); the CLI, the tests and the screenshot script all use this."""
    return DiffApp(str(a), str(b), **kwargs)
