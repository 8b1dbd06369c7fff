"""The diff screen's detail pane: one pair's sources, dtypes, shapes and metrics, then where it
differs: a histogram of ``|a - b|`` over octaves and a heatmap of the tensor as a matrix."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ckptscope.core.units import shape_str
from ckptscope.tui.diff_rows import fmt_metric, status_text
from ckptscope.tui.widgets.stats_view import BARS

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.ops.diff.detail import DiffDetail, DiffHeatmap, DiffHistogram
    from ckptscope.ops.diff.engine import PairResult

HEAT_COLORS = ("#2b4a6f", "#2f6f9f", "#3f8fb0", "#5aa9a0", "#8fbf6a", "#d8c35a", "#f0a04b", "#e8663d", "#d7263d")
"""Cool to hot; one per level of the log scale (readable on both themes)."""
HOT_NONFINITE = "#ff5fff"
EMPTY_COLOR = "#4a4a4a"
"""A cell where nothing differs (grey: neither cool nor hot)."""
CELL = "█"
HALF = "▀"
HIST_COLOR = "#d7875f"


def fmt_value(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4g}"
    return f"{value:.2e}"


def facts(result: PairResult) -> Group:
    """Both sides (source names as the plan describes them, dtype, shape), then the metrics."""
    sides = Table.grid(padding=(0, 1))
    sides.add_column(style="bold", no_wrap=True)
    sides.add_column(overflow="fold")
    for label, source, dtype, shape in (("A", result.a, result.dtype_a, result.shape_a),
                                        ("B", result.b, result.dtype_b, result.shape_b)):
        if source is None:
            sides.add_row(label, Text("— (not in this checkpoint)", style="dim"))
            continue
        # the pane's title is the pair's name: a side stored under that same name shows only its dtype and
        # shape (the name again, cut mid-word where the pane is narrow, told nothing; a person testing)
        if dtype is None and shape is None:  # not a tensor: a config fact's value, say (``diff.engine.CONFIG_FACT``)
            sides.add_row(label, Text(source))
            continue
        line = Text() if source == result.name else Text(source + "\n")
        line.append(str(dtype), style="cyan")
        line.append(f"  {shape_str(tuple(shape or ()))}", style="dim")
        sides.add_row(label, line)
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("status", status_text(result.status))
    m = result.metrics
    if any(v is not None for v in m.values()):
        at = Text(f"  at {list(result.max_diff_at)}", style="dim") if result.max_diff_at else ""
        numel = math.prod(result.shape_a or ())
        num_diff = m.get("num_diff")
        share = Text(f" of {numel:,} ({100 * num_diff / numel:.3g}%)", style="dim") if num_diff and numel else ""
        grid.add_row("max_abs", Text.assemble(fmt_metric(m.get("max_abs_diff")), at))
        grid.add_row("mean_abs", fmt_metric(m.get("mean_abs_diff")))
        grid.add_row("rel_l2", fmt_metric(m.get("rel_l2")))
        cosine = m.get("cosine")
        near_one = isinstance(cosine, float) and 0.999 < cosine < 1.0
        gap = Text(f"  1 − cosine = {1.0 - cosine:.3g}", style="dim") if near_one else ""
        grid.add_row("cosine", Text.assemble(fmt_metric(cosine), gap))
        grid.add_row("num_diff", Text.assemble(fmt_metric(num_diff), share))
    return Group(sides, Text(), grid)


def histogram_lines(hist: DiffHistogram, height: int = 5) -> list[Text]:
    """Vertical bars, one column (two when there is room) per bin, low edge left, high edge right."""
    lines = [Text("|a − b| histogram, log scale", style="bold")]
    counts = hist.counts
    extras = Text.assemble(("exact zeros ", "dim"), (f"{hist.zeros:,}", "bold"))
    if hist.nan:
        extras.append_text(Text.assemble(("  NaN ", "dim"), (f"{hist.nan:,}", "bold magenta")))
    if hist.inf:
        extras.append_text(Text.assemble(("  inf ", "dim"), (f"{hist.inf:,}", "bold magenta")))
    if not counts:
        lines.append(Text("no finite non-zero difference", style="dim"))
        lines.append(extras)
        return lines
    width = 2 if len(counts) <= 24 else 1
    peak = max(counts)
    for row in range(height - 1, -1, -1):
        line = Text()
        for count in counts:
            part = count / peak * height * 8 - row * 8
            index = 0 if count == 0 or part <= 0 else 8 if part >= 8 else max(1, int(part))
            line.append(BARS[index] * width, style=HIST_COLOR)
        if row == height - 1:
            line.append(f"  {peak:,}", style="dim")
        lines.append(line)
    span = len(counts) * width
    lo, hi = fmt_value(hist.edges[0]), fmt_value(hist.edges[-1])
    lines.append(Text("▔" * span, style="dim"))
    if span >= len(lo) + len(hi) + 2:
        lines.append(Text(lo + " " * (span - len(lo) - len(hi)) + hi, style="dim"))
    else:
        lines.append(Text(f"{lo} to {hi}", style="dim"))
    step = "octave" if hist.step == 1 else f"{hist.step} octaves"
    lines.append(extras)  # each on a line of its own: the pane is 40 columns on a 120-column terminal
    lines.append(Text(f"one bar per {step}", style="dim"))
    return lines


def heat_level(value: float, lo: float, hi: float) -> int:
    """Index into ``HEAT_COLORS`` on a log scale from ``lo`` to ``hi`` (positive, finite)."""
    if hi <= lo or value >= hi:
        return len(HEAT_COLORS) - 1
    if value <= lo:
        return 0
    span = math.log(hi) - math.log(lo)
    return min(len(HEAT_COLORS) - 1, int((math.log(value) - math.log(lo)) / span * (len(HEAT_COLORS) - 1) + 0.5))


def _cell_color(value: float, count: int, lo: float, hi: float) -> str:
    if not count:
        return EMPTY_COLOR
    if not math.isfinite(value):
        return HOT_NONFINITE
    if value <= 0:
        return HEAT_COLORS[0]
    return HEAT_COLORS[heat_level(value, lo, hi)]


def heatmap_lines(heat: DiffHeatmap, shape: tuple[int, ...]) -> list[Text]:
    """Two cell rows per line (``▀``: the upper row is the foreground, the lower the background)."""
    r, c = heat.shape
    cell_rows = -(-heat.matrix_rows // r)
    cell_cols = -(-heat.matrix_cols // c)
    view = (f"{heat.matrix_rows:,} × {heat.matrix_cols:,}" if len(shape) == 2 else
            f"{' × '.join(map(str, shape[:-1]))} rows × {shape[-1]} cols" if len(shape) > 2 else
            f"one row of {heat.matrix_cols:,}")
    # short lines, each a fact: they wrapped mid-phrase in a 40-column pane
    lines = [Text.assemble(("where they differ", "bold"), (" · max |a − b|", "dim")),
             Text(view, style="dim"),
             Text(f"{r} × {c} cells of ≤ {cell_rows:,} × {cell_cols:,}", style="dim")]
    finite = [v for row, counts in zip(heat.max_abs, heat.counts) for v, n in zip(row, counts)
              if n and v > 0 and math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    label_width = len(f"{heat.row_edges[-2]:,}")
    for i in range(0, r, 2):
        line = Text(f"{heat.row_edges[i]:>{label_width},} ", style="dim")
        upper = [_cell_color(v, n, lo, hi) for v, n in zip(heat.max_abs[i], heat.counts[i])]
        if i + 1 < r:
            lower = [_cell_color(v, n, lo, hi) for v, n in zip(heat.max_abs[i + 1], heat.counts[i + 1])]
            for top, bottom in zip(upper, lower):
                line.append(HALF, style=f"{top} on {bottom}")
        else:
            for top in upper:
                line.append(HALF, style=top)
        lines.append(line)
    legend = Text(" " * (label_width + 1))
    legend.append(CELL, style=EMPTY_COLOR)
    legend.append(" equal   ", style="dim")
    if finite and hi > lo:
        legend.append(f"{lo:.2g} ", style="dim")
        for color in HEAT_COLORS:
            legend.append(CELL, style=color)
        legend.append(f" {hi:.2g} (log)", style="dim")
    elif finite:
        legend.append(CELL, style=HEAT_COLORS[-1])
        legend.append(" " + fmt_value(hi), style="dim")
    if any(not math.isfinite(v) for row in heat.max_abs for v in row):
        legend.append("   ")
        legend.append(CELL, style=HOT_NONFINITE)
        legend.append(" NaN/inf", style="dim")
    lines.append(legend)
    return lines


class PairDetailView(Static):
    """Shows a hint, one pair's facts, and (when computed) its histogram and heatmap."""

    DEFAULT_CSS = """
    PairDetailView { height: auto; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.result: PairResult | None = None
        self.detail: DiffDetail | None = None

    def show_hint(self, text: str = "Select a tensor (↑ ↓) to see how and where it differs.") -> None:
        self.result, self.detail = None, None
        self.update(Text(text, style="dim"))

    def show(self, result: PairResult, detail: DiffDetail | None = None, *, note: Text | str | None = None) -> None:
        """``note`` stands in for the histogram and heatmap (computing…, equal, an error)."""
        self.result, self.detail = result, detail
        parts: list[RenderableType] = [Text(result.name, style="bold"), facts(result), Text()]
        if detail is not None:
            parts.extend(histogram_lines(detail.histogram))
            parts.append(Text())
            parts.extend(heatmap_lines(detail.heatmap, detail.shape))
        elif note is not None:
            parts.append(Text(note, style="dim italic") if isinstance(note, str) else note)
        self.update(Group(*parts))
