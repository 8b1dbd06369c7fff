"""The ckptscope Textual app: themes, global keys, palette, error screen; browsing is a screen.

``make_app`` is the one factory used by the CLI, the tests, the screenshot script and the bench
(posting's ``make_posting`` habit), so they all run the same app.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import ClassVar

from textual import events
from textual.app import App
from textual.binding import Binding, BindingType
from textual.theme import Theme
from textual.widgets import Input

from ckptscope.tui.commands import CkptCommands
from ckptscope.tui.screens.browse import BrowseScreen
from ckptscope.tui.screens.error import ErrorScreen

DARK = Theme(
    name="ckptscope-dark", primary="#5fafd7", secondary="#af87d7", accent="#d7875f", warning="#d7af5f",
    error="#d75f5f", success="#87af5f", background="#1b1d23", surface="#22252c", panel="#2b2f38", dark=True,
)
LIGHT = Theme(
    name="ckptscope-light", primary="#1f6fa8", secondary="#7a4fb0", accent="#b5561f", warning="#a67c00",
    error="#b03030", success="#3d7a2a", background="#f7f7f4", surface="#ecece8", panel="#e0e0da", dark=False,
)


def keymap_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "ckptscope" / "keymap.toml"


def load_keymap(path: Path | None = None) -> dict[str, str]:
    """``[keymap]`` table of binding id -> keys; a broken file is ignored (keys still work)."""
    path = path or keymap_path()
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    table = data.get("keymap", {})
    return {str(k): str(v) for k, v in table.items()} if isinstance(table, dict) else {}


class CkptScopeApp(App[None]):
    """Opens one path; shows an error screen (exit code 2) instead of a traceback when it cannot."""

    CSS_PATH = "app.tcss"

    async def _on_key(self, event: events.Key) -> None:
        """A key a list let through after the focus moved on to a text field (``KeysFollowFocus``:
        "/k_proj" in one burst) is typed into that field rather than looked up as a command."""
        origin = getattr(event, "came_from", None)
        focused = self.focused
        if origin is not None and focused is not None and focused is not origin and isinstance(focused, Input):
            event.prevent_default()  # not App._on_key's binding look-up, which textual runs next otherwise
            focused.post_message(events.Key(event.key, event.character))
    TITLE = "ckptscope"
    COMMANDS = App.COMMANDS | {CkptCommands}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit", id="app.quit", tooltip="Quit ckptscope"),
        Binding("question_mark", "help", "help", id="app.help", tooltip="Show every key and its id"),
        Binding("f1", "help", "help", show=False, id="app.help_f1", priority=True,
                tooltip="Help from anywhere, also while typing in a form (where ? is just a character)"),
        Binding("ctrl+p", "command_palette", "palette", show=False, id="app.palette", priority=True,
                tooltip="Open the command palette"),
        Binding("ctrl+t", "toggle_dark", "theme", show=False, id="app.theme",
                tooltip="Toggle the light and dark theme"),
    ]

    def __init__(self, path: str, *, trust_pickle: bool = False, theme: str | None = None,
                 keymap: dict[str, str] | None = None, iterations_root: str | None = None) -> None:
        super().__init__()
        # Everything imported so far lives as long as the process: keep the cyclic collector
        # from walking it again on every collection while the UI starts (tens of ms per open).
        gc.freeze()
        self.path = path
        self.iterations_root = iterations_root
        self.trust_pickle = trust_pickle
        self.error_reason: str | None = None
        """Set when the path could not be opened; the CLI prints it after the app exits."""
        self.register_theme(DARK)
        self.register_theme(LIGHT)
        self._start_with_theme(theme or DARK.name)
        self._user_keymap = load_keymap() if keymap is None else keymap

    def _start_with_theme(self, name: str) -> None:
        """Use theme ``name`` from the first frame on, without a second pass over the CSS.

        Setting ``self.theme`` makes Textual's theme watcher re-parse every stylesheet in a fresh
        parser, which leaves the app's parse cache cold, so the next parse starts over as well: at
        start that was the CSS parsed three times instead of once (~25 ms of row 9 of
        bench/run_all.py). Before the first parse a theme needs only what the watcher sets besides:
        the stylesheet's variables, the app's theme classes and the ANSI colour filter. Unknown
        names still raise Textual's ``InvalidThemeError``; a Textual without these hooks gets the
        plain assignment.
        """
        hooks = ("_validate_theme", "_refresh_truecolor_filter", "ansi_theme", "stylesheet")
        if not all(hasattr(self, hook) for hook in hooks):  # pragma: no cover  # other Textual versions
            self.theme = name
            return
        self.set_reactive(App.theme, self._validate_theme(name))
        dark = self.current_theme.dark
        self.update_classes({f"-theme-{name}": True, "-dark-mode": dark, "-light-mode": not dark}, update=False)
        self._refresh_truecolor_filter(self.ansi_theme)
        self.stylesheet.set_variables(self.get_css_variables())

    def on_mount(self) -> None:
        if self._user_keymap:
            self.set_keymap(self._user_keymap)
        self.push_screen(BrowseScreen(self.path, trust_pickle=self.trust_pickle, iterations_root=self.iterations_root))

    def show_error(self, path: str, reason: str) -> None:
        """Replace whatever is shown with the error screen; quitting then exits with code 2."""
        self.error_reason = reason
        if len(self.screen_stack) > 1:
            self.switch_screen(ErrorScreen(path, reason))
        else:
            self.push_screen(ErrorScreen(path, reason))

    def action_help(self) -> None:
        from ckptscope.tui.screens.help import HelpScreen

        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss()
            return
        self.push_screen(HelpScreen(self.screen))

    def on_resize(self, event) -> None:
        """Under 110 columns footer keys drop their padding, so more of them fit an 80-column footer."""
        self.set_class(event.size.width < 110, "-narrow-terminal")

    def action_archs(self) -> None:
        """The supported architectures page (palette: "view: supported architectures")."""
        from ckptscope.tui.screens.archs import ArchsScreen

        self.push_screen(ArchsScreen())

    def action_toggle_dark(self) -> None:
        self.theme = LIGHT.name if self.theme == DARK.name else DARK.name

    async def action_quit(self) -> None:
        """Quit, after asking when a browser holds pending renames (they exist nowhere else)."""
        code = 2 if self.error_reason else 0
        browsers = [s for s in self.screen_stack if hasattr(s, "confirm_discard")]
        holding = next((s for s in browsers if s.pending_rule_count()), None)
        if holding is None:
            self.exit(return_code=code)
            return
        holding.confirm_discard(lambda: self.exit(return_code=code), "quit")


def make_app(path: str | os.PathLike[str], *, trust_pickle: bool = False, theme: str | None = None,
             keymap: dict[str, str] | None = None, iterations_root: str | None = None) -> CkptScopeApp:
    return CkptScopeApp(str(path), trust_pickle=trust_pickle, theme=theme, keymap=keymap,
                        iterations_root=iterations_root)
