"""``r``: rename the tensor or module under the cursor, with a live preview of every name it changes.

Three ways to say it: the new full name (a tensor), the new prefix (a module), or a regex and
replacement (what ``ckptscope rename --sub`` takes). Whatever is typed becomes one
``RenameRule``; the preview runs the pending rules plus that rule through
``check_name_changes`` in a thread worker and shows each changed name (stored -> new) with its
conflict, if any. The dialog dismisses with the rule only when the result is valid.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Button, Input, Label, RadioButton, RadioSet, Static

from ckptscope.ops.rename.plan import RenamePlanError
from ckptscope.ops.rename.rules import RenameRule, regex_rule, rename_name, rename_prefix
from ckptscope.tui.messages import RenamePreviewed
from ckptscope.tui.renaming import PendingRenames, Preview, Selection, preview
from ckptscope.tui.widgets.key_footer import KeyFooter

PREVIEW_DELAY = 0.08
"""Seconds of typing pause before the preview is recomputed."""
PREVIEW_ROWS = 400


def preview_table(result: Preview) -> Table:
    """stored name → new name; conflicts in red with their reason (a column only when there are any)."""
    conflicts = any(row.problem for row in result.rows)
    table = Table(box=None, expand=True, pad_edge=False, show_header=True, header_style="dim")
    table.add_column("stored name", ratio=3, overflow="fold")
    table.add_column("", width=1)
    table.add_column("new name", ratio=3, overflow="fold")
    if conflicts:
        table.add_column("conflict", ratio=2, overflow="fold")
    for row in result.rows:
        bad = bool(row.problem)
        if row.new is None:
            new = Text("✗ dropped", style="red")
        elif row.new == row.old:
            new = Text("(unchanged)", style="dim")
        else:
            new = Text(row.new, style="bold red" if bad else "bold green")
        cells: list[Text | str] = [Text(row.old, style="red" if bad else ""), "→", new]
        if conflicts:
            cells.append(Text(f"⚠ {row.problem}", style="bold red") if bad else "")
        table.add_row(*cells)
    return table


class RenameDialog(ModalScreen[RenameRule | None]):
    """Dismisses with the rule to add to the pending list, or None."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "cancel", id="rename_dialog.cancel", tooltip="Close without adding a rule"),
        Binding("ctrl+r", "toggle_mode", "name ↔ regex", id="rename_dialog.mode",
                tooltip="Switch between editing the name (or prefix) and a regex with a replacement"),
        Binding("ctrl+s", "add", "add to pending", id="rename_dialog.add",
                tooltip="Add the rule to the pending list (enter in a field does the same)"),
    ]

    def __init__(self, selection: Selection, pending: PendingRenames) -> None:
        super().__init__()
        self.selection = selection
        self.pending = pending
        self.multi = selection.copies > 1
        self.current = pending.current_path(selection)
        """The name or prefix (of the first copy) after the pending rules: what a new rule matches."""
        self.regex_mode = self.multi
        self._token = 0
        self._timer: Timer | None = None
        self._regex_edited = False
        self.last: Preview | None = None

    # --- layout ------------------------------------------------------------------------------

    def _initial_regex(self, new: str | None = None) -> tuple[str, str]:
        if self.multi:
            return self.selection.regex(self.current)
        new = self.current if new is None else new
        rule = rename_name(self.current, new) if self.selection.kind == "tensor" else rename_prefix(self.current, new)
        return rule.pattern, rule.repl

    def compose(self) -> ComposeResult:
        sel = self.selection
        what = "tensor" if sel.kind == "tensor" else "module"
        title = Text.assemble((f"Rename {what} ", "bold"), (sel.display, "bold cyan"))
        if self.multi:
            title.append(f"  ({sel.copies} copies in repeated layers)", style="dim")
        if self.current != sel.path:
            first = "the first copy is " if self.multi else ""
            title.append(f"\n{first}now named {self.current}{'' if sel.kind == 'tensor' else '.*'} by a pending rule",
                         style="yellow")
        pattern, repl = self._initial_regex()
        simple = "new name" if sel.kind == "tensor" else "new prefix"
        with Vertical(id="rename-box"):
            yield Static(title, id="rename-title")
            with RadioSet(id="rename-mode"):
                yield RadioButton(simple, value=not self.regex_mode, id="mode-simple", disabled=self.multi)
                yield RadioButton("regex", value=self.regex_mode, id="mode-regex")
            with Horizontal(classes="rename-field", id="field-new"):
                yield Label(simple.split()[1], classes="rename-label")
                yield Input(self.current, id="rename-new", placeholder="empty prefix: strip it" if
                            sel.kind == "subtree" else "")
            with Horizontal(classes="rename-field", id="field-pattern"):
                yield Label("pattern", classes="rename-label")
                yield Input(pattern, id="rename-pattern", placeholder="Python regex, searched in every name")
            with Horizontal(classes="rename-field", id="field-repl"):
                yield Label("replace", classes="rename-label")
                yield Input(repl, id="rename-repl", placeholder="replacement, \\g<1> for a group")
            yield Static("", id="rename-status")
            with VerticalScroll(id="rename-preview-box"):
                yield Static("", id="rename-preview")
            with Horizontal(id="rename-buttons"):
                yield Static(Text("rules apply in order, after the pending ones", style="dim"), id="rename-hint")
                yield Button("Add to pending", variant="primary", id="rename-add")
                yield Button("Cancel", id="rename-cancel")
        yield KeyFooter()

    def on_mount(self) -> None:
        self._show_mode()
        self._schedule()

    def _show_mode(self) -> None:
        self.set_class(self.regex_mode, "-regex")
        target = "#rename-pattern" if self.regex_mode else "#rename-new"
        self.call_after_refresh(self.query_one(target, Input).focus)

    # --- the rule as typed -------------------------------------------------------------------

    def rule(self) -> RenameRule | None:
        """The rule the fields describe, or None when they change nothing yet."""
        if self.regex_mode:
            pattern = self.query_one("#rename-pattern", Input).value
            if not pattern:
                return None
            return regex_rule(pattern, self.query_one("#rename-repl", Input).value)
        new = self.query_one("#rename-new", Input).value.strip()
        if new == self.current:
            return None
        if self.selection.kind == "tensor":
            return rename_name(self.current, new)
        return rename_prefix(self.current, new.rstrip("."))

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        if event.input.id in ("rename-pattern", "rename-repl") and event.input.has_focus:
            self._regex_edited = True
        self._schedule()

    def _schedule(self) -> None:
        self._token += 1
        if self._timer is not None:
            self._timer.stop()
        token, rule = self._token, self.rule()
        if rule is None:
            self.last = None
            hint = "type a pattern" if self.regex_mode else f"type the {'name' if self.selection.kind == 'tensor' else 'prefix'}"
            self.query_one("#rename-status", Static).update(Text(f"{hint}; the preview shows every name it changes",
                                                                 style="dim"))
            self.query_one("#rename-preview", Static).update("")
            self.query_one("#rename-preview-box").display = False
            return
        self._timer = self.set_timer(PREVIEW_DELAY, lambda: self._compute(token, rule))

    @work(thread=True, exclusive=True, group="rename-preview", exit_on_error=False, description="rename preview")
    def _compute(self, token: int, rule: RenameRule) -> None:
        base = self.pending.report()
        try:
            candidate = self.pending.with_rule(rule)
        except RenamePlanError as exc:
            self.post_message(RenamePreviewed(token, None, str(exc)))
            return
        result = preview(self.pending.names, base, candidate, PREVIEW_ROWS)
        if not result.error and result.changed:
            problem = self.pending.apply_problem(candidate)
            if problem:
                result = replace(result, error=problem)
        self.post_message(RenamePreviewed(token, result))

    @on(RenamePreviewed)
    def _previewed(self, message: RenamePreviewed) -> None:
        if message.token != self._token:
            return  # an older edit
        status = self.query_one("#rename-status", Static)
        view = self.query_one("#rename-preview", Static)
        result = message.preview
        self.last = result
        box = self.query_one("#rename-preview-box")
        box.display = result is not None and bool(result.rows)
        if result is None:
            status.update(Text(f"✗ {message.error}", style="bold red"))
            view.update("")
            return
        line = Text.assemble((f"{result.changed:,}", "bold"), f" tensor{'s' if result.changed != 1 else ''} "
                             "renamed by this rule")
        if result.conflicts:
            line.append(f" · {result.conflicts} in conflict", style="bold red")
        parts: list[Text | Table] = [line]
        if result.error:  # the full message lists names; the rows below show each one, so one line here
            parts.append(Text(f"✗ {result.error}", style="bold red", no_wrap=True, overflow="ellipsis"))
        elif result.changed:
            parts.append(Text("✓ no conflicts: enter adds it to the pending renames", style="green"))
        status.update(Group(*parts))
        shown = len(result.rows)
        table = preview_table(result)
        more = result.total - shown
        view.update(Group(table, Text(f"… {more:,} more", style="dim")) if more > 0 else table)

    # --- actions -----------------------------------------------------------------------------

    @on(RadioSet.Changed, "#rename-mode")
    def _mode_changed(self, event: RadioSet.Changed) -> None:
        regex = event.pressed.id == "mode-regex"
        if regex == self.regex_mode:
            return
        if regex and not self._regex_edited:
            pattern, repl = self._initial_regex(self.query_one("#rename-new", Input).value.strip())
            self.query_one("#rename-pattern", Input).value = pattern
            self.query_one("#rename-repl", Input).value = repl
        self.regex_mode = regex
        self._show_mode()
        self._schedule()

    def action_toggle_mode(self) -> None:
        if self.multi:
            self.notify("Several copies are selected: only a regex keeps each copy's index.", severity="information")
            return
        target = "#mode-simple" if self.regex_mode else "#mode-regex"
        self.query_one(target, RadioButton).value = True

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_add()

    @on(Button.Pressed, "#rename-add")
    def _add_pressed(self) -> None:
        self.action_add()

    @on(Button.Pressed, "#rename-cancel")
    def _cancel_pressed(self) -> None:
        self.dismiss(None)

    def action_add(self) -> None:
        """Check the rule on every name now (not the possibly older preview) and add it if valid."""
        rule = self.rule()
        status = self.query_one("#rename-status", Static)
        if rule is None:
            status.update(Text("nothing to add: the name is unchanged", style="bold yellow"))
            self.app.bell()
            return
        try:
            report = self.pending.with_rule(rule)
        except RenamePlanError as exc:
            error: object = exc
        else:
            # the preview of this very rule has read the files already: the check costs no I/O then
            error = report.error() or self.pending.apply_problem(report)
        if error:
            # (in a Group: a bare Text given to a Static wraps whatever its no_wrap says)
            status.update(Group(Text(f"✗ not added: {error}", style="bold red", no_wrap=True, overflow="ellipsis")))
            self.app.bell()
            return
        self.dismiss(rule)

    def action_cancel(self) -> None:
        self.dismiss(None)
