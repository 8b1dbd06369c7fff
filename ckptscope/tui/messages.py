"""Past-tense messages that thread workers post back to the UI thread.

Workers never touch widgets; they describe what happened and the screen that owns the worker
updates its widgets in the handler (textual ``docs/guide/workers.md``, harlequin ``app.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import RenderableType

    from ckptscope.core.index import CheckpointIndex
    from ckptscope.formats.base import CheckpointReader
    from ckptscope.ops.roots import IterationInfo
    from ckptscope.ops.stats import TensorStats, ValuePeek
    from ckptscope.ops.tree import TreeNode


@dataclass
class IndexLoaded(Message):
    """The checkpoint's metadata is read and its module tree built."""

    reader: CheckpointReader
    index: CheckpointIndex
    tree: TreeNode
    header: RenderableType
    """The header's summary, built in the worker (it walks every tensor)."""
    seconds: float


@dataclass
class IterationsDiscovered(Message):
    """The path is a save root holding several iterations; the user picks one."""

    root: str
    iterations: list[IterationInfo]


@dataclass
class OpenFailed(Message):
    """The path could not be opened; ``reason`` is the one-line message shown to the user."""

    path: str
    reason: str


@dataclass
class StatsComputed(Message):
    """Value statistics of one tensor are ready (or failed: ``stats`` None and ``error`` set)."""

    name: str
    stats: TensorStats | None
    error: str = ""


@dataclass
class ValuesPeeked(Message):
    """The top-left corner of one tensor has been read."""

    name: str
    peek: ValuePeek | None
    error: str = ""


@dataclass
class FilterApplied(Message):
    """The tree restricted to tensors matching ``pattern`` is built."""

    pattern: str
    tree: TreeNode
    matched: int
    """Tensors matching (before ranges collapse them)."""
    leaves: list[list[TreeNode]]
    """Displayed leaves as ancestor chains, for jumping from match to match."""
    jump: bool = False
    """Move the cursor to the first match once shown (the user pressed enter)."""
