"""Statistics of one tensor and a histogram of its values, drawn with block characters."""

from __future__ import annotations

import math

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ckptscope.ops.stats import TensorStats

BARS = " ▁▂▃▄▅▆▇█"


def fmt(value: float) -> str:
    if math.isnan(value):
        return "—"
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.6g}"
    return f"{value:.4e}"


def histogram(stats: TensorStats, height: int = 8, bar_width: int = 1) -> list[Text]:
    """A vertical bar chart of ``stats.hist_counts``, ``height`` rows tall, with the range below. The
    tallest bar's count is in the title (``histogram_title``): beside the top row it made a 40-bin chart
    one line wider than the pane at 80 columns, and the wrapped count landed in the middle of the bars."""
    counts = stats.hist_counts
    if not counts:
        return [Text("no finite values to plot", style="dim")]
    peak = max(counts) or 1
    levels = [c / peak * height * 8 for c in counts]
    lines = []
    for row in range(height - 1, -1, -1):
        line = Text()
        for level in levels:
            part = level - row * 8
            index = 0 if part <= 0 else 8 if part >= 8 else max(1, int(part))
            line.append(BARS[index] * bar_width, style="#5fafd7")
        lines.append(line)
    width = len(counts) * bar_width
    lo, hi = fmt(stats.hist_lo), fmt(stats.hist_hi)
    lines.append(Text("▔" * width, style="dim"))
    lines.append(Text(lo + " " * max(1, width - len(lo) - len(hi)) + hi, style="dim"))
    return lines


def histogram_title(stats: TensorStats) -> Text:
    title = Text(f"histogram of finite values ({len(stats.hist_counts)} bins)", style="bold")
    if stats.hist_counts:
        title.append(f"  tallest {max(stats.hist_counts):,}", style="dim")
    return title


def stats_table(stats: TensorStats) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(justify="right")
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(justify="right")
    pct = (lambda n: f"{n:,} ({100 * n / stats.count:.2f}%)") if stats.count else (lambda n: f"{n:,}")
    grid.add_row("min", fmt(stats.min), "zeros", pct(stats.zeros))
    grid.add_row("max", fmt(stats.max), "NaN", Text(pct(stats.nan), style="bold red" if stats.nan else ""))
    grid.add_row("mean", fmt(stats.mean), "+Inf", Text(pct(stats.pos_inf), style="bold red" if stats.pos_inf else ""))
    grid.add_row("std", fmt(stats.std), "-Inf", Text(pct(stats.neg_inf), style="bold red" if stats.neg_inf else ""))
    grid.add_row("abs mean", fmt(stats.abs_mean), "elements", f"{stats.count:,}")
    return grid


class StatsView(Static):
    """Shows a hint, progress, an error or a ``TensorStats``; the screen decides which."""

    def show_hint(self, name: str | None) -> None:
        if name is None:
            self.update(Text("Select a tensor, then press s to compute its statistics.", style="dim"))
        else:
            self.update(Text.assemble(("Press ", "dim"), ("s", "bold"), (" to compute statistics of ", "dim"),
                                      (name, "bold")))

    def show_progress(self, name: str) -> None:
        self.update(Text.assemble(("computing statistics of ", "dim italic"), (name, "bold"), ("…", "dim")))

    def show_error(self, name: str, error: str) -> None:
        self.update(Text.assemble((name, "bold"), "\n", (error, "red")))

    def show_stats(self, stats: TensorStats) -> None:
        parts: list[RenderableType] = [Text(stats.name, style="bold"), Text(), stats_table(stats), Text()]
        if stats.note:
            parts.insert(1, Text(stats.note, style="italic dim"))
        parts.append(histogram_title(stats))
        parts.extend(histogram(stats, bar_width=1 if len(stats.hist_counts) > 30 else 2))
        self.update(Group(*parts))
