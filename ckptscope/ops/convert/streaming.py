"""The streaming machinery every convert target shares: produce a destination tensor from its
recipe, read the next one ahead while this one is written, and find tensors that are plain copies of source bytes.

Each destination tensor is assembled from its recipe's source regions (block copies only), cast if
``--dtype`` asked for it, written, and dropped before the next one: peak memory is about one
destination tensor plus the regions being read, whatever the model size.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from ckptscope.core.dtypes import dtype_by_name
from ckptscope.core.errors import CkptError
from ckptscope.mappings.links import materialize
from ckptscope.ops.convert.plan import ConvertPlan, OutputTensor

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

Progress = Callable[[str, int], None]
"""``progress(tensor_name, nbytes_written)``."""

FAIL_ENV = "CKPTSCOPE_FAIL_ON_TENSOR"
"""Tests only: a tensor name; writing it fails as a real error would (``ops.parallel`` failure
tests). ``NAME:kill`` kills the process outright instead (SIGKILL: a rank that dies)."""
_current: dict[str, str] = {"name": ""}


def note_tensor(name: str) -> None:
    """Record the tensor a writer starts on (a failure names it: ``current_tensor``); honour ``FAIL_ENV``."""
    import os

    _current["name"] = name
    target, _, mode = os.environ.get(FAIL_ENV, "").partition(":")
    if name and target == name:
        if mode == "kill":
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        note_failure(name)
        raise CkptError(f"failure injected by {FAIL_ENV}")


def clear_failure() -> None:
    """Forget the failure of an earlier write in this process (a writer calls it as it starts)."""
    _current.pop("failed", None)


def note_failure(name: str) -> None:
    """Record the tensor whose write failed (the first one wins): with several writer threads the
    last tensor started is not necessarily the one that failed."""
    _current.setdefault("failed", name)


def current_tensor() -> str:
    """The tensor the last ``note_tensor`` named ('' before any)."""
    return _current.get("failed") or _current["name"]


def tracked(name: str, fn: Callable):
    """``fn`` wrapped to call ``note_tensor(name)`` first (a writer's produce or runs callback)."""

    def call():
        note_tensor(name)
        return fn()

    return call


def produce(plan: ConvertPlan, tensor: OutputTensor):
    """The destination tensor as a numpy array (assembled, cast when asked)."""
    reader = plan.reader
    array = materialize(tensor.recipe, lambda source, slices: reader.read(source, slices),
                        dtype=dtype_by_name(tensor.recipe.dtype).numpy())
    reader.release_pages()  # the source pages are copied out: drop them before the writer serialises
    if tensor.dtype != tensor.recipe.dtype:
        array = array.astype(dtype_by_name(tensor.dtype).numpy())
    return array


class Prefetcher:
    """Hands out destination tensors in plan order, producing the next one on a second thread
    while the caller writes this one.

    Reading (page faults on the source maps, block copies, fused assembly) and writing (the
    ``write`` syscalls) then overlap: numpy's copies and file writes release the GIL. At most
    two destination tensors are alive at once (the one being written and the next), which is
    what the memory bound (2 x the largest tensor + 300 MB) allows. A tensor asked for out of
    order is produced directly, so a writer that revisits tensors stays correct.
    """

    def __init__(self, plan: ConvertPlan, order: list[OutputTensor]) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._plan = plan
        self._order = order
        self._position = {t.name: i for i, t in enumerate(order)}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptscope-produce")
        self._pending: tuple[str, Future] | None = None

    def get(self, tensor: OutputTensor) -> np.ndarray:
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == tensor.name:
            array = pending[1].result()
        else:
            if pending is not None:
                pending[1].cancel()
            array = produce(self._plan, tensor)
        following = self._position.get(tensor.name, len(self._order)) + 1
        if following < len(self._order):
            after = self._order[following]
            self._pending = (after.name, self._pool.submit(produce, self._plan, after))
        return array

    def close(self) -> None:
        """Stop: wait for a tensor being produced (it may hold the reader), drop it."""
        self._pending = None
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Prefetcher:  # noqa: PYI034 -- a final class; typing.Self needs 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def file_runs(plan: ConvertPlan, tensor: OutputTensor) -> list[tuple[Path, int, int]] | None:
    """The destination tensor as source file byte runs to concatenate, when it is one: no cast,
    no zero fill, and pieces that tile it along its first axis in order, each a contiguous run
    of its source (a renamed tensor, one layer of a stacked one, q/k/v or gate/up rows of a fused
    one). Such tensors are copied file to file (``formats.filefill``), never decoded; None otherwise."""
    from ckptscope.mappings.links import source_slices

    recipe = tensor.recipe
    if tensor.dtype != recipe.dtype or recipe.fill or not recipe.pieces or not recipe.shape:
        return None
    pieces = sorted(recipe.pieces, key=lambda p: p.dst_box[0][0])
    row = 0
    for piece in pieces:
        first, rest = piece.dst_box[0], piece.dst_box[1:]
        if first[0] != row or any(box != (0, n) for box, n in zip(rest, recipe.shape[1:])):
            return None
        row = first[1]
    if row != recipe.shape[0]:
        return None
    runs = []
    for piece in pieces:
        spans = plan.reader.byte_runs(piece.source, source_slices(piece, piece.dst_box))
        if spans is None:
            return None
        runs += spans
    return runs
