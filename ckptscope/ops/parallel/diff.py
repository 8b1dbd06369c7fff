"""``diff`` (and ``verify``'s diff) on the ranks of a torchrun group.

Each rank compares the pairs ``partition.assign`` gives it by bytes; rank 0 gathers every
per-pair result and makes the one report (renamed pairs, padding, notes) the one-process run
makes, so it prints the same JSON. Every rank gets the verdict, to exit with the same code.
"""

from __future__ import annotations

from ckptscope.core.dtypes import dtype_by_name
from ckptscope.core.errors import CkptError
from ckptscope.ops.convert.streaming import note_tensor
from ckptscope.ops.diff.engine import DiffEngine, DiffOptions, DiffReport
from ckptscope.ops.diff.plan import DiffPair, DiffPlan
from ckptscope.ops.parallel.group import Group
from ckptscope.ops.parallel.partition import assign


def pair_bytes(pair: DiffPair) -> int:
    """Bytes a pair's comparison reads (both sides; 0 when metadata decides)."""
    if pair.static_status is not None:
        return 0
    return sum(r.numel * dtype_by_name(r.dtype).bits // 8 for r in (pair.a, pair.b) if r is not None)


def diff_parallel(plan: DiffPlan, options: DiffOptions, group: Group) -> tuple[DiffReport | None, bool]:
    """(the report on rank 0, None elsewhere; whether the checkpoints are identical, on every rank).
    The caller prints, then calls ``group.settle()`` before exiting."""
    try:
        return _diff(plan, options, group)
    except CkptError:
        group.settle()
        raise


def _diff(plan: DiffPlan, options: DiffOptions, group: Group) -> tuple[DiffReport | None, bool]:
    if plan.side_files:
        raise CkptError(f"--training-state with the trainer's own files ({', '.join(f.name for f in plan.side_files)}) "
                        f"runs in one process: drop --workers / torchrun")
    engine = DiffEngine(plan, options)
    sizes = {i: pair_bytes(pair) for i, pair in enumerate(plan.pairs)}
    mine = set(assign(sizes, group.world)[group.rank])
    order = [plan.pairs[i].name for i in sorted(mine)]
    done: set[str] = set()

    def on_result(result) -> None:
        done.add(result.name)
        note_tensor(result.name)

    def pending() -> str:
        return next((name for name in order if name not in done), "")

    results = group.agree(lambda: engine.compare(on_result, only=mine), "comparing", tensor=pending)
    gathered = group.gather((results, engine.bytes_read), "collecting results")

    def report() -> DiffReport | None:
        if group.rank != 0:
            return None
        merged, read = {}, 0
        for part, nbytes in gathered or []:
            merged.update(part)
            read += nbytes
        return engine.report(merged, read)

    out = group.agree(report, "reporting")
    identical = group.broadcast(out.identical if out is not None else None, "sharing the verdict")
    return out, bool(identical)
