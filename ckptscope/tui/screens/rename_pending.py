"""``R``: the pending rename rules, in order, with what each one does; undo, remove, apply.

The list belongs to the browse screen (``RenameActions``); this panel only shows it and asks the
owner to change it, so the tree and the header follow every change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Static

from ckptscope.ops.rename.rules import rule_hits
from ckptscope.tui.widgets.key_footer import KeyFooter
from ckptscope.tui.widgets.table_search import SearchableTable, search_bindings
from ckptscope.tui.widgets.vim_keys import table_keys

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.tui.renaming import PendingRenames


class PendingOwner(Protocol):
    """What the panel asks of the screen that owns the pending list (``RenameActions``)."""

    def pending_renames(self) -> PendingRenames | None: ...

    def remove_rename_rule(self, position: int) -> None: ...

    def action_rename_undo(self) -> None: ...

    def action_rename_apply(self) -> None: ...


class PendingTable(SearchableTable, DataTable[object]):
    """The rules, with the vim keys and / search every list has."""

    BINDINGS: ClassVar[list[BindingType]] = [*table_keys("pending"), *search_bindings("pending")]
    search_what = "rules"


class PendingRenamesScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,R", "close", "close", id="pending.close", tooltip="Close the pending renames"),
        Binding("u", "undo", "undo last", id="pending.undo", tooltip="Remove the most recent rule"),
        Binding("delete,d", "remove", "remove rule", id="pending.remove", tooltip="Remove the highlighted rule"),
        Binding("A", "apply", "apply…", id="pending.apply",
                tooltip="Write a renamed copy with these rules (asks for the destination)"),
    ]

    def __init__(self, owner: PendingOwner) -> None:
        super().__init__()
        self.owner = owner

    def compose(self) -> ComposeResult:
        with Vertical(id="pending-box"):
            yield Static(Text("Pending renames", style="bold"), id="pending-title")
            table = PendingTable(id="pending-table", cursor_type="row", zebra_stripes=True)
            yield table
            yield Static("", id="pending-rule")
            yield Static("", id="pending-status")
            yield Static(Text("Substitutions apply in order, each to the names the ones before produced; drops "
                              "match the stored names. The last column is the same rule for `ckptscope rename`.",
                              style="dim"), id="pending-hint")
            with Horizontal(id="pending-buttons"):
                yield Button("Apply…", variant="primary", id="pending-apply")
                yield Button("Undo last", id="pending-undo")
                yield Button("Remove", id="pending-remove")
                yield Button("Close", id="pending-close")
        yield KeyFooter()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("#", "rule", "tensors", "as a CLI option")
        self.refresh_rules()
        table.focus()

    def refresh_rules(self) -> None:
        """Show the owner's rules and the report of applying all of them."""
        pending = self.owner.pending_renames()
        table = self.query_one(DataTable)
        row = table.cursor_row
        table.clear()
        status = self.query_one("#pending-status", Static)
        if pending is None or not pending.rules:
            status.update(Text("No pending renames. Press r on a tensor or module to add one, x to drop it.",
                               style="italic"))
            self.query_one("#pending-title", Static).update(Text("Pending renames", style="bold"))
            return
        report = pending.report()
        hits = rule_hits(report, pending.rules)
        for position, (rule, hit) in enumerate(zip(pending.rules, hits), start=1):
            verb = "dropped" if rule.kind == "drop" else "renamed"
            table.add_row(Text(str(position), justify="right"),
                          Text(rule.label, style="red" if rule.kind == "drop" else ""),
                          Text(f"{hit:,} {verb}", style="bold red" if not hit else "", justify="right"),
                          Text(rule.as_cli(), style="dim"))
        if row is not None:
            table.move_cursor(row=min(row, table.row_count - 1))
        self.query_one("#pending-title", Static).update(
            Text.assemble(("Pending renames", "bold"), f"  {len(pending.rules)} rule{'s' if len(pending) != 1 else ''}"))
        changes = report.changes
        line = Text.assemble((f"{len(changes.renamed):,}", "bold"), " renamed · ",
                             (f"{len(changes.dropped):,}", "bold"), " dropped · ",
                             f"{len(changes.untouched):,} untouched")
        error = report.error()
        if error is not None:
            line.append(f"\n✗ {error}", style="bold red")
        status.update(line)

    @on(DataTable.RowHighlighted, "#pending-table")
    def _rule_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """The highlighted rule in full, wrapped: its CLI option stays readable on an 80-column
        terminal, where the table's last column is off screen."""
        pending = self.owner.pending_renames()
        if pending is None or not 0 <= event.cursor_row < len(pending.rules):
            self.query_one("#pending-rule", Static).update("")
            return
        rule = pending.rules[event.cursor_row]
        self.query_one("#pending-rule", Static).update(Text.assemble(
            (f"#{event.cursor_row + 1} ", "bold"), rule.label, "\n", ("ckptscope rename ... ", "dim"), rule.as_cli()))

    # --- actions -----------------------------------------------------------------------------

    def action_close(self) -> None:
        self.dismiss(None)

    def action_undo(self) -> None:
        self.owner.action_rename_undo()
        self.refresh_rules()

    def action_remove(self) -> None:
        pending = self.owner.pending_renames()
        table = self.query_one(DataTable)
        if pending is None or not pending.rules or table.cursor_row is None:
            self.notify("No rule to remove.", severity="information")
            return
        self.owner.remove_rename_rule(table.cursor_row)
        self.refresh_rules()

    def action_apply(self) -> None:
        owner = self.owner
        self.dismiss(None)
        owner.action_rename_apply()

    @on(Button.Pressed, "#pending-apply")
    def _apply(self) -> None:
        self.action_apply()

    @on(Button.Pressed, "#pending-undo")
    def _undo(self) -> None:
        self.action_undo()

    @on(Button.Pressed, "#pending-remove")
    def _remove(self) -> None:
        self.action_remove()

    @on(Button.Pressed, "#pending-close")
    def _close(self) -> None:
        self.action_close()
