"""The diff screen's header: A and B, how they were paired, the verdict, counts per status, progress."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from textual.widget import Widget

from ckptscope.core.units import human_bytes
from ckptscope.tui.diff_rows import STATUS_LABELS, STATUS_STYLES, STATUSES


@dataclass
class DiffProgress:
    """Everything the header shows; the screen updates it and calls ``DiffHeader.show``."""

    a: str
    b: str
    mapping: str | None = None
    device: str | None = None
    notes: list[str] = field(default_factory=list)
    padding: list[str] = field(default_factory=list)
    total: int = 0
    done: int = 0
    bytes_read: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    state: str = "planning"
    """``planning``, ``comparing``, ``finished``, ``cancelled`` or ``failed``."""

    @property
    def differing(self) -> int:
        return sum(n for status, n in self.counts.items() if status not in ("equal", "close"))


def verdict(progress: DiffProgress) -> Text:
    if progress.state == "planning":
        return Text("pairing tensors…", style="dim italic")
    if progress.state == "failed":
        return Text("failed", style="bold red")
    if progress.differing:
        text = Text("different", style="bold red")
    elif progress.state == "finished":
        return Text("identical", style="bold green")
    else:
        text = Text("no difference so far", style="bold")
    if progress.state == "comparing":
        text.append("  (comparing…)", style="dim italic")
    elif progress.state == "cancelled":
        text.append("  (stopped before the end)", style="yellow")
    return text


def header_renderable(progress: DiffProgress) -> Table:
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(style="bold", no_wrap=True, width=8)
    grid.add_column(ratio=1)
    grid.add_row("A", Text(progress.a, style="bold"))
    grid.add_row("B", Text(progress.b, style="bold"))
    line = verdict(progress)
    if progress.state != "planning":
        line.append("   ")
        line.append_text(counts_text(progress))
    grid.add_row("result", line)
    if progress.mapping is not None:
        how = Text.assemble("mapping ", (progress.mapping, "cyan"), " · device ", (progress.device or "?", "cyan"))
        for note in progress.notes[:2]:
            how.append(f" · {note}", style="dim")
        if len(progress.notes) > 2:
            how.append(f" · +{len(progress.notes) - 2} notes", style="dim")
        how.no_wrap, how.overflow = True, "ellipsis"  # one line: a narrow screen keeps its rows for the table
        grid.add_row("paired", how)
    for pad in progress.padding[:2]:
        grid.add_row(Text("padding", style="bold yellow"), Text(pad, style="yellow", no_wrap=True, overflow="ellipsis"))
    if progress.state in ("comparing", "finished", "cancelled"):
        bar = Table.grid(padding=(0, 1))
        bar.add_column(width=30)
        bar.add_column()
        bar.add_row(ProgressBar(total=max(progress.total, 1), completed=progress.done, width=30),
                    Text(f"{progress.done:,}/{progress.total:,} tensors · {human_bytes(progress.bytes_read)} read",
                         style="dim"))
        grid.add_row("progress", bar)
    return grid


def counts_text(progress: DiffProgress) -> Text:
    """``39 pairs: 36 equal · 2 different · 1 dtype`` (statuses with a zero count left out)."""
    text = Text(f"{progress.total:,} pairs: ")
    parts = [(status, n) for status, n in progress.counts.items() if n]
    if not parts:
        text.append("none compared yet", style="dim")
    for i, (status, n) in enumerate(parts):
        if i:
            text.append(" · ", style="dim")
        text.append(f"{n:,} ", style="bold")
        text.append(STATUS_LABELS.get(status, status), style=STATUS_STYLES.get(status, ""))
    return text


class DiffHeader(Widget):
    DEFAULT_CSS = """
    DiffHeader { height: auto; }
    """

    def __init__(self, progress: DiffProgress, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.progress = progress

    def show(self, progress: DiffProgress | None = None) -> None:
        if progress is not None:
            self.progress = progress
        self.refresh(layout=True)

    def render(self) -> RenderableType:
        return header_renderable(self.progress)
