"""One progress bar for every op that moves bytes: bytes done, bytes/s, elapsed and ETA on stderr.

Shown only when stderr is a terminal and the output is not JSON, so pipes and CI logs stay clean.
Ops report how far they are through a callback; this module is the only place that knows rich's
progress columns, so convert, merge, rename and diff look alike.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


SPEED_WINDOW_S = 5.0
"""Seconds of recent progress the rate (and so the ETA) is computed over: a stall at the start (imports,
the first read) or in the middle ages out instead of dragging the whole run's estimate."""


@contextmanager
def byte_progress(label: str, total_bytes: int, *, quiet: bool = False,
                  count: int | None = None, noun: str = "tensors") -> Iterator[Callable[..., None] | None]:
    """Yields ``update(done_bytes, done_items=None)`` (None when no bar is shown).

    ``count`` items (tensors, pairs) are shown as ``label 12/300 tensors`` beside the bytes. Bytes
    and rate are in binary units (KiB, MiB), as ``human_bytes`` everywhere else.
    """
    if quiet or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    from ckptscope.core.units import human_bytes

    class BinarySpeedColumn(ProgressColumn):
        """``12.3 MiB/s`` (rich's TransferSpeedColumn is decimal only)."""

        def render(self, task) -> Text:
            speed = task.finished_speed or task.speed
            return Text("?" if speed is None else f"{human_bytes(int(speed))}/s", style="progress.data.speed")

    def describe(items: int) -> str:
        return f"{label} {items}/{count} {noun}" if count is not None else label

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                  BinarySpeedColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True, speed_estimate_period=SPEED_WINDOW_S) as bar:
        task = bar.add_task(describe(0), total=max(1, total_bytes))

        def update(done_bytes: int, done_items: int | None = None) -> None:
            if done_items is None:
                bar.update(task, completed=done_bytes)
            else:
                bar.update(task, completed=done_bytes, description=describe(done_items))

        yield update
