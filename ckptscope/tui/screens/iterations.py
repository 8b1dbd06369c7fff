"""Opening a save root (``iter_*`` / ``release``, ``global_step_*``, ``step-*``, ``checkpoint-*`` dirs)
asks which iteration to open."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Static

from ckptscope.core.units import human_bytes, human_time, plural
from ckptscope.ops.roots import IterationInfo, default_iteration
from ckptscope.tui.widgets.key_footer import KeyFooter
from ckptscope.tui.widgets.vim_keys import table_keys


class PickerTable(DataTable[object]):
    """The iterations, with the vim keys every other list has (j/k, g/G, ctrl+d/ctrl+u). Enter is the
    table's own (hidden) key, so it is named again here to show in the footer: the picker's footer said
    nothing about opening (a person testing)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "open", id="iterations.open_row", tooltip="Open the highlighted iteration"),
        *table_keys("iterations"),
    ]


class IterationPickerScreen(Screen[str | None]):
    """Dismisses with the chosen iteration's path, or None."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "open", id="iterations.open", tooltip="Open the highlighted iteration"),
        Binding("escape", "back", "back", id="iterations.back",
                tooltip="Back to the checkpoint that is open (nothing happens when none is open yet)"),
        Binding("q", "quit", "quit", id="iterations.quit", tooltip="Quit ckptscope"),
        Binding("t", "timeline", "timeline", id="iterations.timeline",
                tooltip="How the weights moved from save to save: change per module and step, flags"),
    ]

    def __init__(self, root: str, iterations: list[IterationInfo], *, can_go_back: bool = True) -> None:
        super().__init__()
        self.root = root
        self.iterations = iterations
        self.can_go_back = can_go_back
        """False on the first picker of a session: there is no screen to go back to, and esc must
        not quit behind the user's back (q does)."""

    def compose(self) -> ComposeResult:
        with Vertical(id="picker"):
            complete = sum(1 for i in self.iterations if i.complete)
            yield Static(Text.assemble((self.root, "bold"), "   save directory · ",
                                       (plural(len(self.iterations), "iteration"), "bold"),
                                       f" ({complete} complete)"), id="picker-title")
            table = PickerTable(id="picker-table", cursor_type="row", zebra_stripes=True)
            yield table
            if not self.iterations:
                yield Static(Text("No iteration directories yet (the tracker file exists but no iter_* "
                                  "directory).", style="yellow"))
        yield KeyFooter()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("iteration", "", "status", "size", "saved", "path")
        for info in self.iterations:
            status = Text("✓ complete", style="green") if info.complete else Text("✗ incomplete", style="bold red")
            label = f"{info.number:,}" if info.number is not None else info.label
            table.add_row(Text(label, style="bold", justify="right"),
                          Text("latest", style="magenta") if info.latest else "",
                          status, Text(human_bytes(info.size), justify="right"), human_time(info.saved),
                          _below(info.path, self.root), key=info.path)
        # The cursor starts on what opening the root picks (the tracker's or DeepSpeed's 'latest' when complete),
        # not on the top row: a DeepSpeed tag of the user's own is listed below the numbered saves, and Enter
        # opened global_step2 beside a 'latest' naming it (a person testing the picker)
        chosen = default_iteration(self.iterations)
        if chosen is not None:
            table.move_cursor(row=self.iterations.index(chosen))
        table.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(str(event.row_key.value))

    def action_open(self) -> None:
        table = self.query_one(DataTable)
        if self.iterations and table.cursor_row is not None:
            self.dismiss(self.iterations[table.cursor_row].path)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "back":  # the first picker has nothing to go back to: no "esc back" in its footer
            return self.can_go_back
        return True

    def action_back(self) -> None:
        if self.can_go_back:
            self.dismiss(None)
        else:
            self.notify("Nothing is open yet: enter opens the highlighted iteration, q quits.", timeout=4)

    async def action_quit(self) -> None:
        await self.app.action_quit()

    def action_timeline(self) -> None:
        from ckptscope.tui.screens.timeline import TimelineScreen

        if sum(1 for i in self.iterations if i.complete) < 2:
            self.notify("A timeline needs at least two complete iterations.", severity="warning")
            return
        self.app.push_screen(TimelineScreen(self.root))


def _below(path: str, root: str) -> str:
    """``iter_0000100`` for ``root/iter_0000100``: the title already names the root, and a narrow
    terminal then still shows which directory each row is."""
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path
