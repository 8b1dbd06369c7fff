"""The stdout console every human report prints through, and the one rule for its width.

Width: the terminal's in a terminal; ``COLUMNS`` whenever it is set (a user who says 80 means 80,
piped or not); otherwise, piped, a fixed ``PIPED_WIDTH`` so that grep and less see whole rows
instead of rich's 80-column default. Reports that hold long tensor names check with ``fits``
whether their table fits that width and otherwise print one block per tensor: a name is never
cut, folded or squeezed out of its column.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

PIPED_WIDTH = 160
"""Width of piped output when ``COLUMNS`` is not set (inspect, diff, timeline, archs alike)."""


def report_width() -> int | None:
    """The width to give rich: None lets it read the terminal or ``COLUMNS``; a number when neither applies."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").strip().isdigit():
        return None
    return PIPED_WIDTH


def stdout_console() -> Console:
    """A console for reports on stdout: no highlighting (names are data), no soft wrap, ``report_width``.
    It writes through ``sys.stdout``, which a piped run wraps in ``PipeSafeStdout``."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False, width=report_width())


def discard_stdout() -> None:
    """Point file descriptor 1 at /dev/null: what is still written (and the final flush) goes nowhere
    instead of failing on a pipe whose reader has gone."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def fits(console: Console, renderable: RenderableType) -> bool:
    """Whether ``renderable`` at its natural width (every cell on one line) fits ``console``."""
    from rich.measure import Measurement

    unbounded = console.options.update_width(1 << 20)  # measured unclamped: rich caps at the width otherwise
    return Measurement.get(console, unbounded, renderable).maximum <= console.width


class PipeSafeStdout:
    """``sys.stdout`` for a piped run: when the reader goes away (``ckptscope inspect --json X | head``),
    the rest is discarded (``discard_stdout``) instead of raising ``BrokenPipeError``, which click
    and rich turn into exit status 1; the command finishes and exits with its own status (for
    ``diff``: identical or not)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            discard_stdout()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            discard_stdout()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
