"""Run a ``ConvertPlan``: stream tensor by tensor into a temporary directory, rename into place.

Each target writer (hf_target.py, mcore_target.py) writes into the staging directory that
``atomic_output`` hands it; a crash leaves nothing at the destination.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.ops.atomic import atomic_output, check_destination, check_space
from ckptscope.ops.convert.hf_target import write_hf
from ckptscope.ops.convert.mcore_target import write_mcore
from ckptscope.ops.convert.plan import ConvertPlan
from ckptscope.ops.convert.streaming import Progress


def execute_convert(plan: ConvertPlan, *, overwrite: bool = False, progress: Progress | None = None) -> Path:
    dst = Path(plan.dst)
    check_destination(Path(plan.src), dst, overwrite=overwrite)
    check_space(dst.parent, plan.total_bytes * (2 if plan.merge_lora else 1))
    if plan.merge_lora:
        return _convert_and_merge(plan, dst, overwrite, progress)
    with atomic_output(dst, directory=True, overwrite=overwrite) as staging:
        if plan.target == "hf":
            write_hf(plan, staging, progress)
        else:
            write_mcore(plan, staging, progress)
    return dst


def _convert_and_merge(plan: ConvertPlan, dst: Path, overwrite: bool, progress: Progress | None) -> Path:
    """``--merge-lora``: the base model and its adapter written to a temporary dir beside DST, then merged into
    DST by ``lora merge``'s own code (checked against PEFT's ``merge_and_unload``); the temporary dir goes
    whatever happens."""
    from ckptscope.ops.lora import execute_merge, plan_merge

    assert plan.adapter is not None and plan.target == "hf"
    dst.parent.mkdir(parents=True, exist_ok=True)
    unmerged = Path(tempfile.mkdtemp(prefix=f".{dst.name}.unmerged-", dir=dst.parent))
    try:
        write_hf(plan, unmerged, progress)
        try:
            execute_merge(plan_merge(unmerged / plan.adapter.dir, unmerged, dst, overwrite=overwrite))
        except CkptError as exc:  # said of the source: the temporary dir is gone when the user reads it
            problem = exc.problem.replace(str(unmerged / plan.adapter.dir), "the adapter").replace(str(unmerged),
                                                                                                 "the base model")
            raise CkptError(f"--merge-lora: {problem}", Path(plan.src)) from None
    finally:
        shutil.rmtree(unmerged, ignore_errors=True)
    return dst
