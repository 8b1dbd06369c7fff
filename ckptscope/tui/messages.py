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
    from ckptscope.ops.opening import Reader
    from ckptscope.ops.rename.files import RenamePlan
    from ckptscope.ops.rename.plan import NameReport
    from ckptscope.ops.roots import IterationInfo
    from ckptscope.ops.layers import LayerPair
    from ckptscope.ops.stats import TensorStats
    from ckptscope.ops.values import ValuePage
    from ckptscope.ops.tree import TreeNode
    from ckptscope.tui.renaming import PendingView, Preview


@dataclass
class IndexLoaded(Message):
    """The checkpoint's metadata is read and its module tree built."""

    reader: Reader
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
class ValuesPaged(Message):
    """One page of a tensor's values has been read (or failed: ``page`` None and ``error`` set)."""

    name: str
    page: ValuePage | None
    error: str = ""


@dataclass
class LayersCompared(Message):
    """Two members of a collapsed range were compared tensor by tensor (``error`` set on failure)."""

    label: str
    a: str
    b: str
    pairs: list[LayerPair]
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


@dataclass
class PendingRenamesChecked(Message):
    """The pending rename rules were applied to every stored name (for the tree and the header)."""

    version: int
    """Version of the rule list the report is for (a newer one may have arrived meanwhile)."""
    report: NameReport
    view: PendingView | None
    """What the tree shows (None when no rule is pending)."""


@dataclass
class RenamePreviewed(Message):
    """The rename dialog's rule, as typed, was checked against every stored name."""

    token: int
    """Which edit of the dialog this answers (older answers are ignored)."""
    preview: Preview | None
    error: str = ""
    """Set when the rule itself is invalid (a bad regex)."""


@dataclass
class RenamePlanned(Message):
    """``plan_rename`` accepted the pending rules and the destination."""

    plan: RenamePlan


@dataclass
class RenameProgressed(Message):
    """``execute_rename`` has written ``done`` of ``total`` bytes."""

    done: int
    total: int


@dataclass
class RenameApplied(Message):
    """The renamed copy is complete at ``dst``."""

    dst: str
    seconds: float


@dataclass
class RenameFailed(Message):
    """Planning or writing the renamed copy failed; ``reason`` is the one-line message shown."""

    stage: str
    """``plan`` or ``write``."""
    reason: str


# --- diff screen (``ckptscope diff A B``, "diff with…") ---------------------------------------------

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.ops.diff.detail import DiffDetail
    from ckptscope.ops.diff.engine import DiffEngine, DiffReport, PairResult
    from ckptscope.ops.diff.plan import DiffPlan


@dataclass
class DiffPlanned(Message):
    """Both checkpoints are open and their tensors paired; the engine is about to run."""

    plan: DiffPlan
    engine: DiffEngine
    """Read by the screen's progress timer (``bytes_read``) while it runs."""


@dataclass
class PairsCompared(Message):
    """More pairs are compared (batched: one message per ~0.1 s, not one per tensor)."""

    results: list[PairResult]
    done: int
    total: int


@dataclass
class DiffFinished(Message):
    """The engine stopped: every pair compared, or cancelled (``cancelled``)."""

    report: DiffReport
    seconds: float
    cancelled: bool = False


@dataclass
class DiffFailed(Message):
    """Planning or comparing failed; ``reason`` is the one-line message shown to the user."""

    stage: str
    """``plan`` or ``compare``."""
    reason: str


@dataclass
class DiffDetailComputed(Message):
    """Histogram and heatmap of one pair are ready (or failed: ``detail`` None and ``error`` set)."""

    name: str
    detail: DiffDetail | None
    error: str = ""


# --- convert / merge (screens/convert.py) ------------------------------------------------------------

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.ops.convert.plan import ConvertPlan


@dataclass
class ConvertPlanned(Message):
    """``plan_convert`` laid out the destination for the form's current fields."""

    token: int
    """Which edit of the form this answers (older answers are ignored)."""
    plan: ConvertPlan
    problem: str = ""
    """Why it cannot be written as it stands (the destination exists, lies inside the source)."""


@dataclass
class ConvertProgressed(Message):
    """``execute_convert`` has written ``done`` of ``total`` bytes and ``tensors`` of ``tensors_total``."""

    done: int
    total: int
    tensors: int
    tensors_total: int


@dataclass
class ConvertFinished(Message):
    """The converted checkpoint is complete at ``dst``; ``open_path`` is what the browser opens."""

    dst: str
    open_path: str
    seconds: float


@dataclass
class ConvertFailed(Message):
    """Planning, writing or verifying failed; ``reason`` is the one-line message shown in the form."""

    stage: str
    """``plan``, ``write`` or ``verify``."""
    reason: str
    token: int = 0
    """For ``plan``: the edit it answers."""


@dataclass
class ConvertVerified(Message):
    """``verify_round_trip`` compared the source with its round trip through the chosen target."""

    report: DiffReport
    seconds: float
