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
    """A console for reports on stdout: no highlighting (names are data), no soft wrap, ``report_width``."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False, width=report_width())


def fits(console: Console, renderable: RenderableType) -> bool:
    """Whether ``renderable`` at its natural width (every cell on one line) fits ``console``."""
    from rich.measure import Measurement

    unbounded = console.options.update_width(1 << 20)  # measured unclamped: rich caps at the width otherwise
    return Measurement.get(console, unbounded, renderable).maximum <= console.width
