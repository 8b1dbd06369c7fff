"""What the browse screen's index worker does, as one plain function (no widgets, no Textual).

Everything slow about opening a path happens here, on the worker thread: iteration discovery,
the reader's index, the module tree, and the header's totals (three passes over every tensor,
too slow to redo on the UI thread for 20k tensors).

(Starting this before Textual is imported was measured and does not pay: the GIL serialises
the two, and the first frame comes ~2x later for no gain in time to a usable tree. Opening in a
forked child process was measured as well: sending the index and tree back costs more than
opening, ~0.4 s to pickle and ~0.75 s to unpickle for 20k tensors, against ~0.5 s to open.)

What did pay is keeping the cyclic garbage collector out of it. Opening allocates a few hundred
thousand small objects that all stay alive; each allocation burst triggers collections that
traverse every live object (Textual's included), on both threads: ~40 % of the worker's time and
half the first paint after it. So the collector is paused while opening
(``core.collector.collector_paused``) and the result is then frozen (``gc.freeze``): moved out of
the generations the collector scans, as CPython's docs suggest for long-lived data. Reference
counting still frees what is dropped; row 9 of bench/run_all.py measures the effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.core.index import CheckpointIndex
    from ckptscope.ops.opening import Reader
    from ckptscope.ops.roots import IterationInfo
    from ckptscope.ops.tree import TreeNode


@dataclass
class Opened:
    """What opening a path produced: iterations of a save root, or a reader with index and tree."""

    iterations: list[IterationInfo] | None = None
    reader: Reader | None = None
    index: CheckpointIndex | None = None
    tree: TreeNode | None = None
    header: Any = None
    """The header's Rich renderable, built off the UI thread."""
    seconds: float = 0.0


def open_path(path: str | Path, *, trust_pickle: bool = False, discover: bool = True) -> Opened:
    """Discover iterations, or open the checkpoint and build its tree. Raises ``CkptError``."""
    import gc
    import time

    from ckptscope.core.collector import collector_paused

    start = time.perf_counter()
    with collector_paused():
        try:
            return _open(path, trust_pickle, discover, start)
        finally:
            # Before the collector is back on: otherwise its first collection walks every new object once more.
            gc.freeze()


def _open(path: str | Path, trust_pickle: bool, discover: bool, start: float) -> Opened:
    import time

    from ckptscope.ops.opening import open_checkpoint
    from ckptscope.ops.roots import discover_iterations, model_dir_within
    from ckptscope.ops.model import model_entries, training_heads
    from ckptscope.ops.tree import build_tree

    if discover:
        found = discover_iterations(path)
        if found is not None:
            return Opened(iterations=found, seconds=time.perf_counter() - start)
    reader = open_checkpoint(model_dir_within(path) or path, trust_pickle=trust_pickle)
    index = reader.index()
    tree = build_tree(index.tensors.values())
    entries = model_entries(index)
    last = training_heads(index, entries)
    if last:  # the model's modules first, then the optimizer, scheduler ... (stable: each group keeps its order)
        tree.children.sort(key=lambda child: child.label in last)
    # The tree's children are built lazily; build the levels the first frame shows here, on the
    # worker thread, so the UI thread only creates widgets (layer ranges need every layer's
    # signature, which is the expensive part for MoE checkpoints).
    for _, child in tree.folded_children():
        child.folded_children()
    from ckptscope.tui.widgets.summary_header import summary_renderable

    return Opened(reader=reader, index=index, tree=tree, header=summary_renderable(index, entries),
                  seconds=time.perf_counter() - start)
