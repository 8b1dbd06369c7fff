"""The views' one door to the readers: open a path as a ``Reader``.

The TUI and the CLI import ``ops`` and ``core`` only (an import-linter contract says so): which
reader sniffs, opens and indexes a checkpoint is the back-end's business, and keeping that knowledge
out of the views is what lets formats/ change without touching a screen.
"""

from __future__ import annotations

from ckptscope.formats.base import CheckpointReader as Reader
from ckptscope.formats.registry import open_checkpoint

__all__ = ["Reader", "open_checkpoint"]
