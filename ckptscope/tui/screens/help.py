"""``?``: every key of the current screen with its id (for remapping), generated from BINDINGS.

Generated rather than written so that it cannot drift from the real bindings. The page scrolls with
the keys every list here answers (j/k, g/G, ctrl+d/ctrl+u), and its own footer says so: the browser's
footer under it offered keys that do nothing while the help is open.
"""

from __future__ import annotations

from typing import ClassVar

from rich import box
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from ckptscope.tui.widgets.key_footer import KeyFooter

KEYMAP_HINT = ("Remap any key by id in ~/.config/ckptscope/keymap.toml, e.g.\n"
               '  [keymap]\n  "browse.filter" = "ctrl+f"\n  "browse.stats" = "S"')


def _key_names(binding: Binding, app_keymap: dict[str, str]) -> str:
    keys = app_keymap.get(binding.id or "", binding.key)
    names = {"slash": "/", "question_mark": "?", "left_square_bracket": "[", "right_square_bracket": "]",
             "escape": "esc"}
    return ", ".join(names.get(k.strip(), k.strip()) for k in keys.split(","))


def bindings_table(title: str, bindings: list[Binding], keymap: dict[str, str]) -> Table:
    table = Table(title=Text(title, style="bold"), title_justify="left", show_edge=False, pad_edge=False,
                  header_style="dim", expand=True, box=box.SIMPLE_HEAD)
    table.add_column("key", style="bold cyan", no_wrap=True, width=12)
    table.add_column("does", ratio=1)
    table.add_column("id", style="dim", no_wrap=True, width=22)
    for b in bindings:
        table.add_row(_key_names(b, keymap), b.tooltip or b.description, b.id or "")
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "dismiss", "close", id="help.close", tooltip="Close the help"),
        Binding("j", "scroll_lines(1)", "scroll", id="help.down", key_display="j/k", tooltip="Scroll down a line"),
        Binding("k", "scroll_lines(-1)", "up", show=False, id="help.up", tooltip="Scroll up a line"),
        Binding("ctrl+d", "scroll_pages(0.5)", "half page", id="help.half_down", key_display="^d/^u",
                tooltip="Scroll down half a page"),
        Binding("ctrl+u", "scroll_pages(-0.5)", "half page up", show=False, id="help.half_up",
                tooltip="Scroll up half a page"),
        Binding("g", "scroll_to_end(False)", "top/bottom", id="help.top", key_display="g/G", tooltip="To the top"),
        Binding("G", "scroll_to_end(True)", "bottom", show=False, id="help.bottom", tooltip="To the bottom"),
    ]

    def __init__(self, screen: Screen[object]) -> None:
        super().__init__()
        self.target = screen

    def compose(self) -> ComposeResult:
        keymap = dict(getattr(self.app, "_keymap", {}) or {})
        own = [b for b in self.target.BINDINGS if isinstance(b, Binding)]
        rename = [b for b in own if (b.id or "").startswith("rename.") or b.id == "ops.rename"]
        groups: list[tuple[str, list[Binding]]] = [("This screen", [b for b in own if b not in rename])]
        if rename:
            groups.append(("Rename", rename))
        for tree in self.target.query("TensorTree"):  # absent on the error and picker screens
            groups.append(("Tree", [b for b in tree.BINDINGS if isinstance(b, Binding)]))
        groups.append(("Everywhere", [b for b in self.app.BINDINGS if isinstance(b, Binding)]))
        with VerticalScroll(id="help-box"):
            yield Static(Text("ckptscope keys", style="bold"), id="help-title")
            for title, bindings in groups:
                yield Static(bindings_table(title, bindings, keymap), classes="help-group")
            yield Static(Text("Tree: ↑ ↓ move · → / enter expand · ← collapse · mouse: click to select, "
                              "scroll to move\nFilter: text = substring, * ? [] = glob (e.g. *.mlp.*.weight); "
                              "enter jumps to the first match", style="dim"), classes="help-group")
            if rename:
                yield Static(Text("Rename: r on a tensor edits its name, on a module its prefix; ctrl+r switches "
                                  "to a regex. Rules pile up as pending (the tree shows old → new) until A writes "
                                  "a renamed copy; the source is never modified.", style="dim"), classes="help-group")
            if any(b.id == "ops.convert" for b in own):
                yield Static(Text("Convert: C (or \"ops: merge to HF…\") opens a form: target hf / mcore, tp, pp, "
                                  "format, dtype, destination. The plan (each destination tensor, its sources and "
                                  "transforms) follows the fields; ctrl+s writes it, ctrl+r verifies a round trip, "
                                  "ctrl+o browses the result.", style="dim"), classes="help-group")
            yield Static(Text(KEYMAP_HINT, style="dim"), classes="help-group")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#help-box", VerticalScroll).focus()

    def action_scroll_lines(self, lines: int) -> None:
        self.query_one("#help-box", VerticalScroll).scroll_relative(y=lines, animate=False)

    def action_scroll_pages(self, pages: float) -> None:
        box = self.query_one("#help-box", VerticalScroll)
        box.scroll_relative(y=round(box.scrollable_content_region.height * pages), animate=False)

    def action_scroll_to_end(self, bottom: bool) -> None:
        box = self.query_one("#help-box", VerticalScroll)
        (box.scroll_end if bottom else box.scroll_home)(animate=False)

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
