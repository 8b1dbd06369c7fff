"""The views' one door to the readers: open a path as a ``Reader``.

The TUI and the CLI import ``ops`` and ``core`` only (an import-linter contract says so): which
reader sniffs, opens and indexes a checkpoint is the back-end's business, and keeping that knowledge
out of the views is what lets formats/ change without touching a screen.
"""

from __future__ import annotations

from pathlib import Path

from ckptscope.formats.base import CheckpointReader as Reader
from ckptscope.formats.registry import detect_format, open_checkpoint

__all__ = ["Reader", "check_openable", "open_checkpoint"]


def check_openable(path: str | Path) -> None:
    """Raise ``CkptError`` (one line: missing path, unreadable, unknown format) unless ``path`` is a
    checkpoint, a save root or an accelerate save_state dir: what ``open`` checks before the
    full-screen UI starts, so a typo gets a line on stderr, not a screen."""
    from ckptscope.ops.roots import discover_iterations, model_dir_within

    if discover_iterations(path) is not None:
        return
    detect_format(model_dir_within(path) or path)
