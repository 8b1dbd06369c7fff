"""The diff screen (``ckptscope diff A B`` in a terminal, or "diff with…" from the browser).

One thread worker plans the pairing (``plan_diff``) and runs the streaming ``DiffEngine``; it posts
``DiffPlanned``, batches of ``PairsCompared``, then ``DiffFinished`` (or ``DiffFailed``). Rows appear
as pairs complete, under the current sort and filters. Highlighting a row shows the pair's facts at
once; its histogram and heatmap (``ops.diff.detail``) are computed on demand in a second,
cancellable worker and cached. Leaving the screen or quitting cancels both workers; the engine
checks the flag between blocks.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Input, Static
from textual.worker import Worker, WorkerState, get_current_worker

from ckptscope.core.errors import CkptError
from ckptscope.ops.diff.engine import CONFIG_FACT, is_fact
from ckptscope.tui.diff_rows import COLUMN_BY_KEY, COLUMNS, STATUS_FILTERS, STATUS_LABELS, keeps, sort_key
from ckptscope.tui.messages import DiffDetailComputed, DiffFailed, DiffFinished, DiffPlanned, PairsCompared
from ckptscope.tui.widgets.diff_header import DiffHeader, DiffProgress
from ckptscope.tui.widgets.diff_table import DiffTable
from ckptscope.tui.widgets.key_footer import KeyFooter
from ckptscope.tui.widgets.pair_detail import PairDetailView

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.ops.diff.detail import DiffDetail
    from ckptscope.ops.diff.engine import DiffEngine, DiffOptions, DiffReport, PairResult
    from ckptscope.ops.diff.plan import DiffPlan, DiffSide

FLUSH_EVERY = 0.1
"""Seconds between batches of results posted by the engine worker."""
PROGRESS_EVERY = 0.25
"""Seconds between header refreshes while the engine runs (bytes read move within a pair)."""
DETAIL_DELAY = 0.15
"""Seconds the cursor must rest on a row before its histogram and heatmap are computed."""
FILTER_DELAY = 0.12
DETAIL_CACHE = 128
HEAT_ROWS = 16
HEAT_MAX_COLS = 64
WITH_VALUES = ("different", "close", "dtype_mismatch")
"""Statuses whose pairs have values that differ somewhere: the detail worker has something to show."""
SORT_CYCLE: tuple[str | None, ...] = (None, *(c.key for c in COLUMNS))
NARROW_BELOW = 120
"""Screens narrower than this show the detail pane below the table: beside it, table and pane
each got too little width (names cut to ``model.…oj.weight``, the pane cut at the right edge)."""


def _sort_bindings() -> list[Binding]:
    return [Binding(str(i), f"sort('{c.key}')", f"sort {c.key}", show=False, id=f"diff.sort_{c.key}",
                    tooltip=f"Sort by {c.key} (again: reverse)") for i, c in enumerate(COLUMNS, start=1)]


class DiffScreen(Screen[None]):
    """Compare ``a`` and ``b``. ``standalone``: the app's only screen (quitting gives diff's exit code)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("d", "status_filter('differing')", "differing", id="diff.differing",
                tooltip="Show only the tensors that differ (anything but equal and close)"),
        Binding("a", "status_filter('all')", "all", id="diff.all", tooltip="Show every tensor"),
        Binding("f", "cycle_status", "status", id="diff.status_next",
                tooltip="Cycle the status filter: all, differing, then each status"),
        Binding("s", "cycle_sort", "sort", id="diff.sort_next",
                tooltip="Sort by the next column (plan order, name, status, max_abs, …)"),
        Binding("S", "reverse_sort", "reverse", show=False, id="diff.sort_reverse", tooltip="Reverse the sort"),
        Binding("slash", "open_filter", "filter", id="diff.filter", tooltip="Filter tensor names (substring or glob)"),
        Binding("escape", "back", "back", id="diff.back",
                tooltip="Close the name filter; then back to the browser (when opened from it)"),
        Binding("y", "copy_name", "copy name", show=False, id="diff.copy_name",
                tooltip="Copy the tensor name to the clipboard"),
        *_sort_bindings(),
    ]
    PALETTE_COMMANDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("filter: all tensors", "status_filter('all')", "Show every pair"),
        ("filter: differing only", "status_filter('differing')", "Anything but equal and close"),
        *((f"filter: status {s}", f"status_filter('{s}')", f"Only pairs whose status is {s}")
          for s in STATUS_FILTERS[2:]),
        ("filter: tensor names…", "open_filter", "Substring or glob"),
        ("sort: plan order", "sort_plan", "The order the pairs were planned in"),
        *((f"sort: by {c.key}", f"sort('{c.key}')", "Again: reverse") for c in COLUMNS),
        ("sort: reverse", "reverse_sort", "Flip the current sort"),
        ("tensor: copy name", "copy_name", "Copy the tensor name to the clipboard"),
    )

    def __init__(self, a: str, b: str, *, mapping: str = "auto", include: tuple[str, ...] = (),
                 exclude: tuple[str, ...] = (), options: DiffOptions | None = None, arch: str | None = None,
                 trust_pickle: bool = False, standalone: bool = True, training_state: bool = False,
                 hf_config: str | None = None) -> None:
        super().__init__()
        self.a, self.b = str(a), str(b)
        self.training_state = training_state
        """Also compare training state (``diff --training-state``); models only by default."""
        self.mapping, self.include, self.exclude, self.arch = mapping, tuple(include), tuple(exclude), arch
        self.options = options
        self.trust_pickle = trust_pickle
        self.hf_config = hf_config
        """``diff --hf-config``: the model config for a side whose metadata does not say it."""
        self.standalone = standalone
        self.progress = DiffProgress(self.a, self.b)
        self.plan: DiffPlan | None = None
        self.engine: DiffEngine | None = None
        self.report: DiffReport | None = None
        self.results: dict[str, PairResult] = {}
        self.order: dict[str, int] = {}
        self.sort_column: str | None = None
        self.sort_reverse = False
        self.status_filter = "all"
        self.name_filter = ""
        self.current: str | None = None
        self._details: LRUCache[str, DiffDetail] = LRUCache(DETAIL_CACHE)
        self._detail_timer: Timer | None = None
        self._filter_timer: Timer | None = None
        self._progress_timer: Timer | None = None

    # --- layout ------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield DiffHeader(self.progress, id="diff-header")
        with Horizontal(id="diff-main"):
            with Vertical(id="diff-left"):
                yield DiffTable(id="diff-table")
                yield Static("", id="diff-status")
                yield Input(placeholder="tensor name: substring or glob (*.mlp.*)", id="diff-filter")
            with VerticalScroll(id="diff-detail-box"):
                yield PairDetailView(id="diff-detail")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.set_class(self.app.size.width < NARROW_BELOW, "-narrow")
        self.query_one(PairDetailView).show_hint()
        self.query_one(DiffTable).loading = True
        self.call_after_refresh(self._run_diff)

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width < NARROW_BELOW, "-narrow")

    def on_unmount(self) -> None:
        for timer in (self._detail_timer, self._filter_timer, self._progress_timer):
            if timer is not None:
                timer.stop()
        running = any(w.group == "diff" and w.state is WorkerState.RUNNING for w in self.workers)
        if self.plan is not None and not running:
            _close(self.plan)

    # --- the engine worker -------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="diff", exit_on_error=False, description="comparing checkpoints")
    def _run_diff(self) -> None:
        from ckptscope.ops.diff.engine import DiffEngine
        from ckptscope.ops.diff.plan import plan_diff

        worker = get_current_worker()
        start = time.perf_counter()
        try:
            plan = plan_diff(self.a, self.b, mapping=self.mapping, include=self.include, exclude=self.exclude,
                             arch=self.arch, trust_pickle=self.trust_pickle, training_state=self.training_state,
                             hf_config=self.hf_config)
            engine = DiffEngine(plan, self.options)
        except CkptError as exc:
            self.post_message(DiffFailed("plan", str(exc)))
            return
        self.post_message(DiffPlanned(plan, engine))
        batch: list[PairResult] = []
        flushed = time.monotonic()

        def flush(done: int, total: int) -> None:
            nonlocal batch, flushed
            if batch:
                self.post_message(PairsCompared(batch, done, total))
                batch = []
            flushed = time.monotonic()

        def progressed(done: int, total: int) -> None:
            if done == total or time.monotonic() - flushed >= FLUSH_EVERY:
                flush(done, total)

        try:
            # ``flush`` rebinds ``batch``, so append through the name, not a bound method.
            report = engine.run(lambda result: batch.append(result), cancelled=lambda: worker.is_cancelled,
                                on_progress=progressed)
        except CkptError as exc:
            self.post_message(DiffFailed("compare", str(exc)))
            return
        finally:
            if worker.is_cancelled:
                _close(plan)
        flush(len(report.results), len(plan.pairs))
        self.post_message(DiffFinished(report, time.perf_counter() - start, worker.is_cancelled))

    @on(DiffPlanned)
    def _planned(self, message: DiffPlanned) -> None:
        plan = self.plan = message.plan
        self.engine = message.engine
        self.order = {pair.name: i for i, pair in enumerate(plan.pairs)}
        p = self.progress
        # a save root given as a side opens its default iteration: the header names what was compared (it
        # kept the root, and the user could not tell which iteration B was; a person testing)
        p.a, p.b = _opened(plan.a, p.a), _opened(plan.b, p.b)
        p.mapping, p.device, p.notes = plan.mapping, message.engine.device, list(plan.notes)
        p.padding = [_padding_text(item) for item in plan.padding]
        p.total, p.state = len(plan.pairs), "comparing"
        self.query_one(DiffTable).loading = False
        self.query_one(DiffTable).focus()
        self._progress_timer = self.set_interval(PROGRESS_EVERY, self._tick)
        self._refresh_header()
        self._update_status()

    def _tick(self) -> None:
        if self.engine is not None and self.progress.state == "comparing":
            self.progress.bytes_read = self.engine.bytes_read
            self._refresh_header()

    @on(PairsCompared)
    def _compared(self, message: PairsCompared) -> None:
        p = self.progress
        for result in message.results:
            self.results[result.name] = result
            p.counts[result.status] = p.counts.get(result.status, 0) + 1
        p.done = len(self.results)
        if self.engine is not None:
            p.bytes_read = self.engine.bytes_read
        kept = [r for r in message.results if keeps(r, self.status_filter, self.name_filter)]
        if kept:
            table = self.query_one(DiffTable)
            follow = self.current if table.cursor_row > 0 else None
            table.add_results(kept)
            table.order_by(self._row_key)
            if follow is not None and follow in table.rows:
                table.move_cursor(row=table.get_row_index(follow), scroll=False)
            self._sync_cursor()
        self._refresh_header()
        self._update_status()

    @on(DiffFinished)
    def _finished(self, message: DiffFinished) -> None:
        self.report = message.report
        p = self.progress
        renamed = [r for r in message.report.results if r.status == "renamed"]
        for result in renamed:  # found once every pair was seen: an only_a and an only_b row become one
            for name, old in ((result.name, "only_a"), (result.renamed_to, "only_b")):
                if name in self.results:
                    p.counts[old] = p.counts.get(old, 0) - 1
                    del self.results[name]
            self.results[result.name] = result
            p.counts["renamed"] = p.counts.get("renamed", 0) + 1
        if renamed:
            p.total -= len(renamed)  # the plan counted each renamed tensor twice (only in A, only in B)
        facts = [r for r in message.report.results if is_fact(r.name) and r.name not in self.results]
        for result in facts:  # found after every pair: what the two config.json files say otherwise
            self.results[result.name] = result
            p.counts[result.status] = p.counts.get(result.status, 0) + 1
        p.total += len(facts)
        if renamed or facts:
            self._rebuild()
        p.state = "cancelled" if message.cancelled else "finished"
        p.done = len(message.report.results)
        p.bytes_read = message.report.bytes_read
        p.padding = [_padding_text(item) for item in message.report.padding]
        if self._progress_timer is not None:
            self._progress_timer.stop()
        self._refresh_header()
        self._update_status()
        self._sync_cursor()

    @on(DiffFailed)
    def _failed(self, message: DiffFailed) -> None:
        self._fail(message.reason)

    def _fail(self, reason: str) -> None:
        self.progress.state = "failed"
        if self._progress_timer is not None:
            self._progress_timer.stop()
        if self.standalone:
            self.app.show_error(f"{self.a}  vs  {self.b}", reason)  # type: ignore[attr-defined]
        else:
            self.app.notify(reason, title="diff failed", severity="error", timeout=10)
            self.dismiss(None)

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        """A bug in a worker becomes a message on screen, never a traceback."""
        if event.state is not WorkerState.ERROR:
            return
        error = event.worker.error
        reason = str(error) if isinstance(error, CkptError) else f"internal error: {type(error).__name__}: {error}"
        if event.worker.group == "diff":
            self._fail(reason)
        elif event.worker.group == "detail" and self.current in self.results:
            self.query_one(PairDetailView).show(self.results[self.current], note=Text(reason, style="red"))
        else:
            self.notify(reason, severity="error")

    # --- exit code ---------------------------------------------------------------------------

    def exit_code(self) -> int:
        """diff(1)'s: 0 identical, 1 different, 2 trouble (a failure, or stopped before any difference)."""
        if self.progress.state == "failed":
            return 2
        if self.progress.differing:
            return 1
        return 0 if self.progress.state == "finished" else 2

    # --- rows ----------------------------------------------------------------------------------

    def _row_key(self, name: str) -> tuple[object, ...]:
        return sort_key(self.results[name], self.sort_column, self.sort_reverse, self.order.get(name, 0))

    def _rebuild(self) -> None:
        """Show the rows the filters keep, in the current order, cursor on the top row."""
        table = self.query_one(DiffTable)
        table.clear()
        kept = [r for r in self.results.values() if keeps(r, self.status_filter, self.name_filter)]
        kept.sort(key=lambda r: self._row_key(r.name))
        table.add_results(kept)
        table.set_sort(self.sort_column, self.sort_reverse)
        self.current = None
        self._sync_cursor()
        self._update_status()

    def _sync_cursor(self) -> None:
        """Show the row under the cursor in the detail pane (sorting moves rows under a still cursor)."""
        table = self.query_one(DiffTable)
        name = table.key_at_cursor()
        if name is None:
            self.current = None
            self.query_one(PairDetailView).show_hint(
                "No tensor matches the filters." if self.results else "Waiting for the first results…")
        elif name != self.current:
            self._select(name)

    @on(DataTable.RowHighlighted, "#diff-table")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        # The event may be stale (rows were sorted since it was posted): trust the cursor, not it.
        self._sync_cursor()

    @on(DataTable.HeaderSelected, "#diff-table")
    def _header_clicked(self, event: DataTable.HeaderSelected) -> None:
        self.action_sort(str(event.column_key.value))

    def _update_status(self) -> None:
        shown = self.query_one(DiffTable).row_count
        parts = [f"{shown:,} of {len(self.results):,} shown"]
        if self.status_filter != "all":
            parts.append("differing only" if self.status_filter == "differing" else
                         f"status {STATUS_LABELS.get(self.status_filter, self.status_filter)}")
        if self.name_filter.strip():
            parts.append(f"name ~ {self.name_filter.strip()!r}")
        if self.sort_column is None:
            parts.append("plan order")
        else:
            descending = COLUMN_BY_KEY[self.sort_column].descending != self.sort_reverse
            parts.append(f"sorted by {self.sort_column} {'▼' if descending else '▲'}")
        self.query_one("#diff-status", Static).update(" · ".join(parts))

    def _refresh_header(self) -> None:
        self.query_one(DiffHeader).show(self.progress)

    # --- detail --------------------------------------------------------------------------------

    def _select(self, name: str) -> None:
        self.current = name
        result = self.results[name]
        view = self.query_one(PairDetailView)
        if self._detail_timer is not None:
            self._detail_timer.stop()
        if is_fact(name):
            what = (f"The config.json files disagree on {name.removeprefix(CONFIG_FACT)}" if name.startswith(CONFIG_FACT)
                    else f"The two sides' model configs disagree on the Megatron arg {name.split(': ', 1)[1]}")
            view.show(result, note=f"{what}: A says {result.a}, B says {result.b}. Equal tensors under it are "
                                   f"another model.")
            return
        if result.status == "dtype_mismatch" and result.metrics.get("num_diff") == 0:
            view.show(result, note="Only the dtype differs: every value is equal after upcasting.")
            return
        if result.status not in WITH_VALUES:
            note = {"equal": "Every element is bitwise equal.",
                    "only_a": "Only A has this tensor: there are no values to compare.",
                    "only_b": "Only B has this tensor: there are no values to compare.",
                    "renamed": f"Renamed: B holds the same dtype, shape and bytes as {result.renamed_to}.",
                    "shape_mismatch": "The shapes differ: values are not compared element by element."}
            view.show(result, note=note.get(result.status))
            return
        if name in self._details:
            view.show(result, self._details[name])
            return
        view.show(result, note="computing where they differ…")
        self._detail_timer = self.set_timer(DETAIL_DELAY, lambda: self._start_detail(name))

    def _start_detail(self, name: str) -> None:
        if name == self.current and self.plan is not None:
            width = self.query_one("#diff-detail-box").size.width
            cols = max(8, min(HEAT_MAX_COLS, width - 10))
            self._compute_detail(name, cols)

    @work(thread=True, exclusive=True, group="detail", exit_on_error=False, description="where they differ")
    def _compute_detail(self, name: str, cols: int) -> None:
        from ckptscope.ops.diff.detail import pair_detail

        worker = get_current_worker()
        assert self.plan is not None
        try:
            detail = pair_detail(self.plan, name, rows=HEAT_ROWS, cols=cols, should_stop=lambda: worker.is_cancelled)
        except CkptError as exc:
            self.post_message(DiffDetailComputed(name, None, str(exc)))
            return
        if detail is not None and not worker.is_cancelled:
            self.post_message(DiffDetailComputed(name, detail))

    @on(DiffDetailComputed)
    def _detail_computed(self, message: DiffDetailComputed) -> None:
        if message.detail is not None:
            self._details[message.name] = message.detail
        if message.name != self.current or message.name not in self.results:
            return
        view = self.query_one(PairDetailView)
        if message.detail is None:
            view.show(self.results[message.name], note=Text(message.error, style="red"))
        else:
            view.show(self.results[message.name], message.detail)

    # --- actions ---------------------------------------------------------------------------------

    def action_sort(self, column: str) -> None:
        if self.sort_column == column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_column, self.sort_reverse = column, False
        self._rebuild()

    def action_sort_plan(self) -> None:
        self.sort_column, self.sort_reverse = None, False
        self._rebuild()

    def action_cycle_sort(self) -> None:
        i = SORT_CYCLE.index(self.sort_column)
        self.sort_column, self.sort_reverse = SORT_CYCLE[(i + 1) % len(SORT_CYCLE)], False
        self._rebuild()

    def action_reverse_sort(self) -> None:
        if self.sort_column is None:
            self.notify("Rows are in plan order: press s or 1-7 to sort by a column first.")
            return
        self.sort_reverse = not self.sort_reverse
        self._rebuild()

    def action_status_filter(self, status: str) -> None:
        if status not in STATUS_FILTERS:
            return
        self.status_filter = status
        self._rebuild()

    def action_cycle_status(self) -> None:
        i = STATUS_FILTERS.index(self.status_filter)
        self.status_filter = STATUS_FILTERS[(i + 1) % len(STATUS_FILTERS)]
        self._rebuild()

    def action_open_filter(self) -> None:
        self.add_class("-filtering")
        self.refresh_bindings()
        bar = self.query_one("#diff-filter", Input)
        bar.display = True  # focused now: keys typed right after "/" belong to the filter
        self.set_focus(bar)  # the screen's own, synchronous (Widget.focus waits for the queue)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "back" and self.standalone and not self.has_class("-filtering"):
            return False  # nothing to go back to: keep esc out of the footer
        return True

    def action_back(self) -> None:
        if self.has_class("-filtering"):
            self.remove_class("-filtering")
            self.refresh_bindings()
            filter_input = self.query_one("#diff-filter", Input)
            filter_input.styles.clear_rule("display")  # the stylesheet hides it again
            if filter_input.value:
                filter_input.value = ""
                self._apply_name_filter("")
            self.query_one(DiffTable).focus()
            return
        if not self.standalone:
            self.dismiss(None)

    @on(Input.Changed, "#diff-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        if self._filter_timer is not None:
            self._filter_timer.stop()
        value = event.value
        self._filter_timer = self.set_timer(FILTER_DELAY, lambda: self._apply_name_filter(value))

    @on(Input.Submitted, "#diff-filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        if self._filter_timer is not None:
            self._filter_timer.stop()
        self._apply_name_filter(event.value)
        self.query_one(DiffTable).focus()

    def _apply_name_filter(self, value: str) -> None:
        if value.strip() != self.name_filter.strip():
            self.name_filter = value
            self._rebuild()

    def action_copy_name(self) -> None:
        if self.current is not None:
            self.app.copy_to_clipboard(self.current)
            self.notify(f"copied {self.current}")


def _padding_text(item: dict) -> str:
    rows = item["rows"]
    text = (f"{item['side'].upper()} {item['source']} rows {rows[0]}-{rows[1] - 1} lie beyond the vocabulary "
            "and are not compared")
    if "all_zero" in item:
        text += " (all zero)" if item["all_zero"] else " (NOT all zero)"
    return text


def _close(plan: DiffPlan) -> None:
    for side in (plan.a, plan.b):
        try:
            side.reader.close()
        except Exception:  # noqa: BLE001 - closing is best effort; the readers are done either way
            pass


def _opened(side: DiffSide, given: str) -> str:
    """The path ``side``'s reader opened when it is not ``given`` (a root's iteration), else ``given``."""
    opened = getattr(side.reader, "path", None)
    if opened is None:
        return given
    try:
        same = Path(opened).resolve() == Path(given).resolve()
    except OSError:
        return given
    return given if same else str(opened)
