"""The training timeline of a save root (``t`` in the iteration picker; ``ckptscope timeline``).

A heatmap of modules x steps, coloured by the relative change ``||W_t - W_t-1|| / ||W_t-1||`` on a
log scale, the flags beside it (frozen, exploding, NaN/Inf, stale resume), and a sparkline of the
highlighted module's norm over the iterations. Enter on a cell opens the diff of that module between
the two iterations of its step; enter on a flag puts the cursor on its cell. The run itself is
``ops.timeline`` in a thread worker that posts past-tense messages; this screen only shows them.

On a narrow screen the side panel goes below the heatmap (beside it, the heatmap showed one step),
and long module and subject names keep their distinguishing end (``…layers.1.mlp``) in columns
sized from the width there is.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, ProgressBar, Sparkline, Static
from textual.worker import get_current_worker

from ckptscope.core.errors import CkptError
from ckptscope.core.units import plural
from ckptscope.tui.widgets.column_fit import fit_column
from ckptscope.tui.widgets.diff_table import NameCell
from ckptscope.tui.widgets.key_footer import KeyFooter
from ckptscope.tui.widgets.table_search import SearchableTable, search_bindings
from ckptscope.tui.widgets.vim_keys import table_keys

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.ops.timeline import Series, TimelineResult

LEVELS = ("modules", "layers", "tensors")
RAMP = ("#1d3b6e", "#2a5c8f", "#2f7f9f", "#3d9e8f", "#7fb85a", "#d6c541", "#f08a2c", "#d7301f")
"""Colours from small to large relative change (log10 from -6 to 0, one colour per 0.75 decade)."""
NARROW_BELOW = 120
"""Screens narrower than this show flags, detail and sparkline below the heatmap."""
NAME_SHARE = 0.4
"""Most of the heatmap's width its name column takes (the steps get the rest)."""
MIN_NAME = 12
FLAG_KIND, FLAG_AT = 9, 8
"""Widths of the flag table's kind and iteration columns; the subject gets the rest (the reason scrolls)."""


def change_cell(change: float, nan: int = 0) -> Text:
    """One heatmap cell: the change to one significant digit on a colour of its order of magnitude (the
    detail line under the cursor has it in full). A module holding NaN is red with its finite elements'
    change and a ``!`` (a bare "NaN" hid that the rest kept training, which the CLI's ``2.10e-02 nan`` says)."""
    if math.isinf(change):
        return Text(" inf  ", style="bold white on red")
    if change == 0 or math.isnan(change):
        return Text(" NaN! " if nan else "   0  ", style="bold white on red" if nan else "dim")
    text = f"{change:.0e}".replace("e-0", "e-").replace("e+0", "e")
    if nan:
        return Text(f"{text + '!':>5} ", style="bold white on red")
    level = min(len(RAMP) - 1, max(0, int((math.log10(change) + 6) / 6 * len(RAMP))))
    return Text(f" {text:<5}", style=f"black on {RAMP[level]}" if level >= 4 else f"white on {RAMP[level]}")



def spark_caption(norms: list[float]) -> Text:
    """The sparkline's caption with its scale: the bars always span lowest to highest, so a norm that moved
    by 0.001 % drew the same full swing as one that doubled (a person testing); the caption says how far."""
    finite = [v for v in norms if math.isfinite(v)]
    if len(finite) < 2:
        return Text("norm over the iterations", style="dim")
    lo, hi = min(finite), max(finite)
    if hi == lo:
        return Text(f"norm over the iterations: flat at {hi:.4g}", style="dim")
    spread = (hi - lo) / max(abs(hi), abs(lo))
    digits = max(4, min(17, 2 - math.floor(math.log10(spread))))  # enough that the two ends read apart
    return Text(f"norm over the iterations: {lo:.{digits}g} … {hi:.{digits}g} (bars span {spread:.2g} of the "
                f"largest)", style="dim")

class TimelineProgressed(Message):
    def __init__(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        super().__init__()


class TimelineComputed(Message):
    def __init__(self, result: TimelineResult | None, error: str = "") -> None:
        self.result, self.error = result, error
        super().__init__()


class HeatTable(SearchableTable, DataTable[object]):
    BINDINGS: ClassVar[list[BindingType]] = [
        *table_keys("heat"), *search_bindings("heat"),
        Binding("h", "cursor_left", "left", show=False, id="heat.left", tooltip="Previous step"),
        Binding("l", "cursor_right", "right", show=False, id="heat.right", tooltip="Next step"),
    ]
    search_what = "modules"
    longest = MIN_NAME
    steps_width = 0
    """Cells the step columns take, padding included (set with the columns)."""

    def name_width(self) -> int:
        """The longest name, up to the larger of NAME_SHARE of the width and what the steps leave: with a
        few iterations the names had 40 % and the rest of the screen stood empty (a person testing saw
        ``…layers.0.…t_attention_layernorm`` beside 40 blank columns)."""
        width = self.size.width or 80
        left = width - self.steps_width - 2 * self.cell_padding - self.styles.scrollbar_size_vertical
        return max(MIN_NAME, min(self.longest, max(int(width * NAME_SHARE), left)))

    def on_resize(self, event: events.Resize) -> None:
        fit_column(self, "name", self.name_width())


class FlagTable(SearchableTable, DataTable[object]):
    BINDINGS: ClassVar[list[BindingType]] = [*table_keys("flags"), *search_bindings("flags")]
    search_what = "flags"
    longest = MIN_NAME

    def subject_width(self) -> int:
        room = (self.size.width or 40) - FLAG_KIND - FLAG_AT - 6 * self.cell_padding - 1
        return max(MIN_NAME, min(self.longest, room))

    def on_resize(self, event: events.Resize) -> None:
        fit_column(self, "subject", self.subject_width())


class TimelineScreen(Screen[None]):
    """Modules x steps of one save root; esc goes back to the picker."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "back", id="timeline.back", tooltip="Back to the iteration picker"),
        Binding("m", "level('modules')", "modules", id="timeline.modules", tooltip="One row per module"),
        Binding("L", "level('layers')", "layers", id="timeline.layers", tooltip="One row per layer"),
        Binding("T", "level('tensors')", "tensors", id="timeline.tensors", tooltip="One row per tensor"),
        Binding("F", "focus_flags", "flags", id="timeline.flags", tooltip="Move to the list of flags"),
    ]

    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root
        self.result: TimelineResult | None = None
        self.level = "modules"
        self.rows: list[Series] = []
        self.paths: list[str] = []

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble(("timeline ", "bold"), (self.root, "bold"), ("   reading every iteration…", "dim")),
                     id="tl-title")
        yield ProgressBar(id="tl-progress", show_eta=True)
        with Horizontal(id="tl-main"):
            yield HeatTable(id="tl-heat", cursor_type="cell", zebra_stripes=False)
            with Vertical(id="tl-side"):
                yield Static(Text("flags", style="bold"), id="tl-flags-title")
                yield FlagTable(id="tl-flags", cursor_type="row")
                yield Static("", id="tl-detail")
                yield Static(Text("norm over the iterations", style="dim"), id="tl-spark-title")
                yield Sparkline([], id="tl-spark")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.set_class(self.app.size.width < NARROW_BELOW, "-narrow")
        self.query_one(HeatTable).loading = True
        self._run()

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width < NARROW_BELOW, "-narrow")

    def on_unmount(self) -> None:
        self.workers.cancel_group(self, "timeline")

    # --- the run -------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="timeline", exit_on_error=False, description="timeline")
    def _run(self) -> None:
        from ckptscope.ops.timeline import build_timeline_plan, run_timeline

        worker = get_current_worker()
        try:
            plan = build_timeline_plan(self.root)
        except CkptError as exc:
            self.post_message(TimelineComputed(None, str(exc)))
            return
        self.paths = [str(i.path) for i in plan.iterations]
        try:
            result = run_timeline(plan, progress=lambda done, total: self.post_message(TimelineProgressed(done, total)),
                                  cancelled=lambda: worker.is_cancelled)
        except CkptError as exc:
            self.post_message(TimelineComputed(None, str(exc)))
            return
        finally:
            plan.close()
        if not worker.is_cancelled:
            self.post_message(TimelineComputed(result))

    @on(TimelineProgressed)
    def _progressed(self, message: TimelineProgressed) -> None:
        self.query_one(ProgressBar).update(total=max(1, message.total), progress=message.done)

    @on(TimelineComputed)
    def _computed(self, message: TimelineComputed) -> None:
        heat = self.query_one(HeatTable)
        heat.loading = False
        self.query_one(ProgressBar).display = False
        if message.result is None:
            self.query_one("#tl-title", Static).update(Text.assemble(("timeline ", "bold"), self.root, "  ",
                                                                     (message.error, "red")))
            return
        self.result = result = message.result
        title = Text.assemble(("timeline ", "bold"), (self.root, "bold"), "   ",
                              plural(len(result.iterations), "iteration"), f" {result.iterations[0]}…"
                              f"{result.iterations[-1]} · ", plural(len(result.flags), "flag"))
        for note in result.notes:
            title.append(f"\n{note}", style="dim")
        self.query_one("#tl-title", Static).update(title)
        flags = self.query_one(FlagTable)
        flags.longest = max((len(flag.subject) for flag in result.flags), default=MIN_NAME)
        flags.add_column("flag", width=FLAG_KIND)
        flags.add_column("at", width=FLAG_AT)
        flags.add_column("subject", key="subject", width=flags.subject_width())
        flags.add_column("reason")
        for flag in result.flags:
            style = "bold red" if flag.kind in ("nan", "inf", "stale") else "yellow"
            flags.add_row(Text(flag.kind, style=style), str(flag.iteration), NameCell(flag.subject, head="index"), flag.reason)
        if not result.flags:
            flags.add_row(Text("none", style="green"), "", "", "nothing flagged")  # the wide column: it was cut
        self._show_level()
        heat.focus()

    # --- the heatmap ---------------------------------------------------------------------------

    def _show_level(self) -> None:
        result = self.result
        if result is None:
            return
        heat = self.query_one(HeatTable)
        heat.clear(columns=True)
        self.rows = {"modules": result.modules, "layers": result.layers, "tensors": result.tensors}[self.level]
        heat.longest = max((len(series.name) for series in self.rows), default=MIN_NAME)
        steps = [(f"{a}→{b}", f"{a}-{b}") for a, b in zip(result.iterations, result.iterations[1:])]
        heat.steps_width = sum(max(6, len(label)) + 2 * heat.cell_padding for label, _ in steps)
        heat.add_column(self.level[:-1], key="name", width=heat.name_width())
        for label, key in steps:
            heat.add_column(label, key=key, width=max(6, len(label)))
        for series in self.rows:
            heat.add_row(NameCell(series.name, head="index"), *(change_cell(c, series.nan[k + 1]) for k, c in enumerate(series.change)))
        if self.rows and len(result.iterations) > 1:
            heat.move_cursor(row=0, column=1)

    def action_level(self, level: str) -> None:
        if level != self.level:
            self.level = level
            self._show_level()

    @on(DataTable.CellHighlighted, "#tl-heat")
    def _cell(self, event: DataTable.CellHighlighted) -> None:
        if self.result is None or not 0 <= event.coordinate.row < len(self.rows):
            return
        series = self.rows[event.coordinate.row]
        self.query_one(Sparkline).data = [v if math.isfinite(v) else 0.0 for v in series.norm]
        self.query_one("#tl-spark-title", Static).update(spark_caption(series.norm))
        step = event.coordinate.column - 1
        its = self.result.iterations
        text = Text.assemble((series.name, "bold"), f"\nnorm {series.norm[0]:.4g} → {series.norm[-1]:.4g}")
        if 0 <= step < len(series.change):
            nan = series.nan[step + 1]
            text.append(f"\n{its[step]} → {its[step + 1]}: change {series.change[step]:.3g}, "
                        f"max |dW| {series.max_abs_change[step]:.3g}"
                        + (f" (of its finite elements; {nan:,} NaN at {its[step + 1]})" if nan else ""))
            text.append("\nenter: diff this between the two iterations", style="dim")
        self.query_one("#tl-detail", Static).update(text)

    @on(DataTable.CellSelected, "#tl-heat")
    def _open_diff(self, event: DataTable.CellSelected) -> None:
        from ckptscope.tui.screens.diff import DiffScreen

        step = event.coordinate.column - 1
        if self.result is None or step < 0 or not self.paths or event.coordinate.row >= len(self.rows):
            return
        series = self.rows[event.coordinate.row]
        self.app.push_screen(DiffScreen(self.paths[step], self.paths[step + 1], include=(series.name,),
                                        standalone=False))

    @on(DataTable.RowSelected, "#tl-flags")
    def _flag_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a flag: the heatmap cursor on its module (or tensor) at its iteration."""
        result = self.result
        if result is None or not 0 <= event.cursor_row < len(result.flags):
            return
        flag = result.flags[event.cursor_row]
        for level in LEVELS:
            self.action_level(level)
            names = [s.name for s in self.rows]
            target = flag.module if level == "modules" else flag.subject
            if target in names:
                column = max(1, result.iterations.index(flag.iteration)) if flag.iteration in result.iterations else 1
                heat = self.query_one(HeatTable)
                heat.move_cursor(row=names.index(target), column=column)
                heat.focus()
                return

    @on(DataTable.RowHighlighted, "#tl-flags")
    def _flag_highlighted(self, event: DataTable.RowHighlighted) -> None:
        result = self.result
        if result is None or not 0 <= event.cursor_row < len(result.flags):
            return
        flag = result.flags[event.cursor_row]
        self.query_one("#tl-detail", Static).update(Text.assemble(
            (f"{flag.kind} at {flag.iteration}", "bold"), "  ", (flag.subject, "bold"), "\n", flag.reason,
            ("\nenter: its cell in the heatmap", "dim")))

    def action_focus_flags(self) -> None:
        self.query_one(FlagTable).focus()

    def action_back(self) -> None:
        self.app.pop_screen()
