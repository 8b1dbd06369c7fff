"""Rename from the browser: keys, pending rules, and the dialogs, mixed into ``BrowseScreen``.

Kept apart from ``browse.py`` (which only lists ``RENAME_BINDINGS`` and inherits the actions)
so the rename flow is one module. The pending rules belong to the screen that shows the
checkpoint; opening another path starts an empty list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import work
from textual.binding import Binding, BindingType

from ckptscope.ops.rename.plan import NameReport, RenamePlanError
from ckptscope.ops.rename.rules import RenameRule, drop_name, drop_names, drop_prefix
from ckptscope.tui.messages import IndexLoaded, PendingRenamesChecked
from ckptscope.tui.renaming import PendingRenames, PendingView, Selection, selection_of
from ckptscope.tui.widgets.summary_header import SummaryHeader
from ckptscope.tui.widgets.tensor_tree import TensorTree

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.core.index import CheckpointIndex

RENAME_BINDINGS: list[BindingType] = [
    Binding("r", "rename_selection", "rename", id="rename.selection",
            tooltip="Rename the tensor or module under the cursor (new name, new prefix or regex; live preview)"),
    Binding("x", "rename_drop", "drop", show=False, id="rename.drop",
            tooltip="Drop the tensor or module under the cursor from the renamed copy (a pending rule)"),
    Binding("u", "rename_undo", "undo rename", show=False, id="rename.undo", tooltip="Undo the last pending rename rule"),
    Binding("A", "rename_apply", "apply renames", show=False, id="rename.apply",
            tooltip="Write a renamed copy with the pending rules (asks for the destination)"),
]
"""Pending rules are listed by ``R`` (``ops.rename``, declared with the other ops keys)."""


class RenameActions:
    """The rename actions of the browse screen (a mixin: it relies on the screen's attributes)."""

    path: str
    index: CheckpointIndex | None
    trust_pickle: bool
    _renames: PendingRenames | None = None

    def pending_renames(self) -> PendingRenames | None:
        """The pending rules of the checkpoint shown (None until its index is read)."""
        if self.index is None:
            return None
        if self._renames is None or self._renames.path != self.path:
            from ckptscope.ops.rename.engine import changes_checker  # the writers: only once renaming starts

            self._renames = PendingRenames(self.path, list(self.index.tensors),
                                           checker=changes_checker(self.index, self.path))
        return self._renames

    def on_index_loaded(self, message: IndexLoaded) -> None:
        """Another checkpoint (or iteration) is shown: its rename list starts empty."""
        self._renames = None
        self._show_pending(None, None)

    # --- selection ---------------------------------------------------------------------------

    def _selection(self) -> Selection | None:
        tree = self.query_one(TensorTree)
        node = tree.cursor_node
        if node is None or node.data is None or node.data.more_from >= 0:
            return None
        return selection_of(tree.chain(node), tensor=node.data.tensor is not None)

    def _ready(self) -> tuple[PendingRenames, Selection] | None:
        pending = self.pending_renames()
        if pending is None:
            self.notify("Still reading the checkpoint.", severity="warning")
            return None
        selection = self._selection()
        if selection is None:
            self.notify("Put the cursor on a tensor or a module first.", severity="warning")
            return None
        return pending, selection

    # --- actions -----------------------------------------------------------------------------

    def action_rename_selection(self) -> None:
        from ckptscope.tui.screens.rename_dialog import RenameDialog

        ready = self._ready()
        if ready is None:
            return
        pending, selection = ready
        if selection.kind == "tensor" and selection.copies == 1 and pending.current_name(selection.path) is None:
            self.notify(f"{selection.path} is dropped by a pending rule (u undoes the last rule, R lists them).",
                        severity="warning")
            return

        def added(rule: RenameRule | None) -> None:
            if rule is not None:
                pending.add(rule)
                self.rename_rules_changed(f"pending: {rule.label}")

        self.app.push_screen(RenameDialog(selection, pending), added)

    def action_rename_drop(self) -> None:
        ready = self._ready()
        if ready is None:
            return
        pending, selection = ready
        if selection.copies == 1:
            rule = drop_name(selection.path) if selection.kind == "tensor" else drop_prefix(selection.path)
        else:
            pattern, _ = selection.regex()
            rule = drop_names(pattern, f"drop {selection.display}" + (".*" if selection.kind == "subtree" else ""))
        try:
            error = pending.with_rule(rule).error()
        except RenamePlanError as exc:
            error = exc
        if error is not None:
            self.notify(f"cannot drop {selection.display}: {error}", severity="error")
            return
        pending.add(rule)
        self.rename_rules_changed(f"pending: {rule.label}")

    def action_rename_undo(self) -> None:
        pending = self.pending_renames()
        rule = pending.undo() if pending is not None else None
        if rule is None:
            self.notify("No pending renames to undo.", severity="information")
            return
        self.rename_rules_changed(f"undone: {rule.label}")

    def remove_rename_rule(self, position: int) -> None:
        pending = self.pending_renames()
        if pending is not None and 0 <= position < len(pending.rules):
            rule = pending.remove(position)
            self.rename_rules_changed(f"removed: {rule.label}")

    def action_rename_pending(self) -> None:
        from ckptscope.tui.screens.rename_pending import PendingRenamesScreen

        if self.pending_renames() is None:
            self.notify("Still reading the checkpoint.", severity="warning")
            return
        self.app.push_screen(PendingRenamesScreen(self))  # type: ignore[arg-type]

    def action_rename_apply(self) -> None:
        from ckptscope.tui.screens.rename_apply import RenameApplyScreen

        pending = self.pending_renames()
        if pending is None or not pending.rules:
            self.notify("No pending renames: press r on a tensor or module first (x drops it).",
                        severity="information")
            return

        def finished(dst: str | None) -> None:
            if dst is not None:
                self.open_renamed(dst)

        self.app.push_screen(RenameApplyScreen(self.path, pending.rules), finished)

    def open_renamed(self, dst: str, *, applied: bool = True) -> None:
        """Browse the written copy over this checkpoint's browser, which stays as it is (tree, tab,
        pending rules): ``backspace`` there comes back. ``applied``: the copy holds the pending rules
        (rename), which are then cleared here, as they are done."""
        if applied and self._renames is not None:
            self._renames = None
            self._show_pending(None, None)
        screen = type(self)(dst, trust_pickle=self.trust_pickle, discover=False,  # type: ignore[call-arg]
                            opened_from=getattr(self, "path", None))
        self.app.push_screen(screen)

    def pending_rule_count(self) -> int:
        pending = self._renames
        return len(pending.rules) if pending is not None else 0

    def confirm_discard(self, then, action: str) -> None:
        """Run ``then`` at once without pending rules; with some, ask before they are thrown away."""
        count = self.pending_rule_count()
        if not count:
            then()
            return
        from ckptscope.tui.screens.confirm import ConfirmScreen

        def answered(discard: bool | None) -> None:
            if discard:
                then()

        rules = f"{count} pending rename rule{'s' if count != 1 else ''}"
        self.app.push_screen(ConfirmScreen(f"Discard {rules} and {action}?",
                                           "They are not written anywhere yet (A writes a renamed copy)."), answered)

    # --- pending list -> tree and header -----------------------------------------------------

    def rename_rules_changed(self, note: str) -> None:
        """Say what changed and recompute the tree's and the header's view of the pending rules."""
        self.notify(f"{note}  (R lists the rules, A applies them)", timeout=4)
        pending = self.pending_renames()
        if pending is not None:
            self._check_pending(pending)

    @work(thread=True, exclusive=True, group="rename-pending", exit_on_error=False,
          description="checking pending renames")
    def _check_pending(self, pending: PendingRenames) -> None:
        version = pending.version
        report = pending.report()
        view = PendingView.of(report.changes) if pending.rules else None
        self.post_message(PendingRenamesChecked(version, report, view))

    def on_pending_renames_checked(self, message: PendingRenamesChecked) -> None:
        pending = self._renames
        if pending is None or message.version != pending.version:
            return
        self._show_pending(pending if pending.rules else None, message.report, message.view)
        from ckptscope.tui.screens.rename_pending import PendingRenamesScreen

        screen = self.app.screen
        if isinstance(screen, PendingRenamesScreen):
            screen.refresh_rules()

    def _show_pending(self, pending: PendingRenames | None, report: NameReport | None,
                      view: PendingView | None = None) -> None:
        self.query_one(TensorTree).set_pending(view)
        header = self.query_one(SummaryHeader)
        if pending is None or report is None:
            header.set_pending(None)
            return
        changes = report.changes
        rules = len(pending.rules)
        line = Text.assemble((f"{rules} rule{'s' if rules != 1 else ''} pending", "bold yellow"), ": ",
                             (f"{len(changes.renamed):,}", "bold"), " renamed · ",
                             (f"{len(changes.dropped):,}", "bold"), " dropped",
                             ("   R review · u undo · A apply", "dim"))
        error = report.error()
        if error is not None:
            line.append(f"\n✗ {error}", style="bold red")
        header.set_pending(line)

    # (typing aid: the screen provides these)
    if TYPE_CHECKING:  # pragma: no cover
        def notify(self, *args: Any, **kwargs: Any) -> None: ...
        def query_one(self, *args: Any, **kwargs: Any) -> Any: ...
        app: Any
