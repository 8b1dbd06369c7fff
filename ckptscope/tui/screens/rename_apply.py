"""``A``: write the renamed copy. Destination -> plan -> write -> offer to open the result.

The plan is ``ops.rename.plan_rename`` with the pending rules as ``subs``/``drops`` and the
write is ``execute_rename``: the very calls ``ckptscope rename`` makes, run in thread workers
that post past-tense messages (``RenamePlanned``, ``RenameProgressed``, ``RenameApplied``,
``RenameFailed``). Every ``CkptError`` (a conflict, an existing destination, a format rename
does not support) is shown here as one line; nothing is written unless the plan was accepted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, ProgressBar, Static
from textual.worker import Worker, WorkerState

from ckptscope.core.errors import CkptError
from ckptscope.core.units import human_bytes
from ckptscope.ops.rename.files import RenamePlan
from ckptscope.ops.rename.rules import RenameRule, rules_request
from ckptscope.tui.messages import RenameApplied, RenameFailed, RenamePlanned, RenameProgressed
from ckptscope.tui.destinations import replaced_text
from ckptscope.tui.renaming import default_destination
from ckptscope.tui.widgets.key_footer import KeyFooter

PROGRESS_EVERY = 0.05
"""Seconds between progress messages (the writer reports per copied range, far more often)."""
PLAN_ROWS = 200


def plan_summary(plan: RenamePlan) -> Text:
    changes = plan.changes
    return Text.assemble((f"{len(changes.renamed):,}", "bold"), " renamed · ", (f"{len(changes.dropped):,}", "bold"),
                         " dropped · ", f"{len(changes.untouched):,} untouched · ", (plan.format, "cyan"), " · ",
                         (human_bytes(plan.total_bytes), "bold"), " to write")


def plan_details(plan: RenamePlan) -> Group:
    files = Table(box=None, pad_edge=False, header_style="dim", expand=True, title_justify="left")
    files.add_column("file", ratio=1, overflow="fold")
    files.add_column("action", style="cyan", no_wrap=True)
    files.add_column("tensors", justify="right")
    files.add_column("bytes", justify="right")
    for action in plan.files:
        files.add_row(action.path, action.action, f"{action.tensors:,}" if action.tensors else "",
                      human_bytes(action.nbytes) if action.nbytes else "")
    names = Table(box=None, pad_edge=False, header_style="dim", expand=True)
    names.add_column("stored name", ratio=1, overflow="fold")
    names.add_column("", width=1)
    names.add_column("new name", ratio=1, overflow="fold")
    rows = [(old, Text(new, style="green")) for old, new in plan.changes.renamed.items()]
    rows += [(old, Text("✗ dropped", style="red")) for old in plan.changes.dropped]
    for old, new in rows[:PLAN_ROWS]:
        names.add_row(old, "→", new)
    parts: list[Table | Text] = [files, Text(""), names]
    if len(rows) > PLAN_ROWS:
        parts.append(Text(f"… {len(rows) - PLAN_ROWS:,} more", style="dim"))
    return Group(*parts)


class RenameApplyScreen(ModalScreen[str | None]):
    """Dismisses with the destination to open, or None."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "close", id="apply.close", tooltip="Close (not while writing)"),
    ]

    def __init__(self, src: str, rules: Sequence[RenameRule]) -> None:
        super().__init__()
        self.src = src
        self.rules = list(rules)
        self.stage = "destination"
        """destination -> planned -> writing -> done (or back to destination on a failure)."""
        self.plan: RenamePlan | None = None
        self.written: str | None = None
        self._offered = (str(default_destination(src)), False)
        """The destination and overwrite the dialog opened with: the Input's first Changed event carries
        them, and "destination changed" was said before the user changed anything (a person testing)."""
        self._touched = False
        """Whether the user has changed the destination or overwrite since the dialog opened."""

    def compose(self) -> ComposeResult:
        count = len(self.rules)
        with Vertical(id="apply-box"):
            yield Static(Text.assemble(("Write a renamed copy", "bold"), f"  {count} pending rule{'s' if count != 1 else ''}"),
                         id="apply-title")
            yield Static(Text.assemble(("source".ljust(12), "dim"), (self.src, "bold")), id="apply-src")
            with Horizontal(classes="rename-field"):
                yield Label("destination", classes="rename-label")
                yield Input(self._offered[0], id="apply-dst")
            yield Checkbox("overwrite the destination if it exists", id="apply-overwrite")
            yield Static(Text("enter checks the plan; nothing is written before you confirm it", style="dim"),
                         id="apply-status")
            yield ProgressBar(id="apply-progress", show_eta=True)
            with VerticalScroll(id="apply-plan-box"):
                yield Static("", id="apply-plan")
            with Horizontal(id="apply-buttons"):
                yield Button("Check plan", variant="primary", id="apply-go")
                yield Button("Cancel", id="apply-cancel")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#apply-plan-box").display = False
        self.query_one("#apply-dst", Input).focus()

    def _set_stage(self, stage: str) -> None:
        self.stage = stage
        self.set_class(stage in ("writing", "done"), "-writing")
        go = self.query_one("#apply-go", Button)
        go.label = {"destination": "Check plan", "planned": "Write", "writing": "Writing…",
                    "done": "Open result"}[stage]
        go.disabled = stage == "writing"
        self.query_one("#apply-cancel", Button).label = "Close" if stage == "done" else "Cancel"
        self.query_one("#apply-dst", Input).disabled = stage in ("writing", "done")
        self.query_one("#apply-overwrite", Checkbox).disabled = stage in ("writing", "done")

    def _status(self, text: Text | Group) -> None:
        self.query_one("#apply-status", Static).update(text)

    # --- stages ------------------------------------------------------------------------------

    def action_go(self) -> None:
        if self.stage == "destination":
            dst = self.query_one("#apply-dst", Input).value.strip()
            if not dst:
                self._status(Text("✗ type a destination path", style="bold red"))
                return
            self._status(Text("checking the plan…", style="italic"))
            self._plan(str(Path(dst).expanduser()), self.query_one("#apply-overwrite", Checkbox).value)
        elif self.stage == "planned" and self.plan is not None:
            self._set_stage("writing")
            self.query_one(ProgressBar).update(total=max(1, self.plan.total_bytes), progress=0)
            self._status(Text.assemble("writing ", (str(self.plan.dst), "bold"), "…"))
            self._write(self.plan)
        elif self.stage == "done":
            self.dismiss(self.written)

    @work(thread=True, exclusive=True, group="rename-plan", exit_on_error=False, description="planning the rename")
    def _plan(self, dst: str, overwrite: bool) -> None:
        from ckptscope.ops.rename.engine import plan_rename

        subs, drops = rules_request(self.rules)
        try:
            plan = plan_rename(self.src, dst, subs=subs, drops=drops, overwrite=overwrite)
        except CkptError as exc:
            self.post_message(RenameFailed("plan", str(exc)))
            return
        self.post_message(RenamePlanned(plan))

    @work(thread=True, exclusive=True, group="rename-write", exit_on_error=False, description="writing the rename")
    def _write(self, plan: RenamePlan) -> None:
        from ckptscope.ops.rename.engine import execute_rename

        start = time.perf_counter()
        last = [0.0]

        def progress(done: int, total: int) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY or done >= total:
                last[0] = now
                self.post_message(RenameProgressed(done, total))

        try:
            execute_rename(plan, progress=progress)
        except CkptError as exc:
            self.post_message(RenameFailed("write", str(exc)))
            return
        except OSError as exc:
            self.post_message(RenameFailed("write", f"{exc.filename or plan.dst}: {exc.strerror or exc}"))
            return
        self.post_message(RenameApplied(str(plan.dst), time.perf_counter() - start))

    @on(RenamePlanned)
    def _planned(self, message: RenamePlanned) -> None:
        self.plan = message.plan
        self._set_stage("planned")
        replaced = replaced_text(message.plan.dst, message.plan.overwrite)
        self._status(Group(plan_summary(message.plan),
                           Text.assemble("into ", (str(message.plan.dst), "bold"),
                                         ("   enter writes it; SRC is only read", "dim")),
                           *([Text(f"⚠ {replaced}", style="bold yellow")] if replaced else [])))
        self.query_one("#apply-plan", Static).update(plan_details(message.plan))
        self.query_one("#apply-plan-box").display = True
        self.query_one("#apply-go", Button).focus()

    @on(RenameProgressed)
    def _progressed(self, message: RenameProgressed) -> None:
        self.query_one(ProgressBar).update(total=max(1, message.total), progress=message.done)

    @on(RenameApplied)
    def _applied(self, message: RenameApplied) -> None:
        self.written = message.dst
        self._set_stage("done")
        self.query_one(ProgressBar).update(progress=self.query_one(ProgressBar).total)
        self._status(Text.assemble(("✓ wrote ", "bold green"), (message.dst, "bold"),
                                   f" in {message.seconds:.2f} s", ("   enter opens it", "dim")))
        self.query_one("#apply-go", Button).focus()

    @on(RenameFailed)
    def _failed(self, message: RenameFailed) -> None:
        self.plan = None
        self._set_stage("destination")
        what = "cannot plan the rename" if message.stage == "plan" else "writing failed (nothing was left at the destination)"
        self._status(Group(Text(f"✗ {what}", style="bold red"), Text(message.reason, style="red")))
        self.query_one("#apply-plan", Static).update("")
        self.query_one("#apply-plan-box").display = False
        self.query_one("#apply-dst", Input).focus()

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        """A bug in a worker is shown in the dialog, never as a traceback."""
        if event.state is WorkerState.ERROR:
            error = event.worker.error
            self.post_message(RenameFailed("plan" if event.worker.group == "rename-plan" else "write",
                                           f"internal error: {type(error).__name__}: {error}"))

    # --- inputs ------------------------------------------------------------------------------

    @on(Input.Changed, "#apply-dst")
    @on(Checkbox.Changed, "#apply-overwrite")
    def _edited(self) -> None:
        """A new destination needs a new plan; the old plan's verdict (or refusal) no longer holds."""
        dropped = self.stage == "planned"
        if dropped:
            self.plan = None
            self._set_stage("destination")
        edited = (self.query_one("#apply-dst", Input).value, self.query_one("#apply-overwrite", Checkbox).value)
        self._touched = self._touched or dropped or edited != self._offered
        if self.stage == "destination" and self._touched:
            self._status(Text("destination changed: enter checks the plan again", style="dim"))
            self.query_one("#apply-plan", Static).update("")
        self.query_one("#apply-plan-box").display = False

    @on(Input.Submitted, "#apply-dst")
    def _submitted(self) -> None:
        self.action_go()

    @on(Button.Pressed, "#apply-go")
    def _go_pressed(self) -> None:
        self.action_go()

    @on(Button.Pressed, "#apply-cancel")
    def _cancel_pressed(self) -> None:
        self.action_close()

    def action_close(self) -> None:
        if self.stage == "writing":
            self.notify("Writing: wait until it finishes (the destination appears only when complete).",
                        severity="warning")
            return
        self.dismiss(None)
