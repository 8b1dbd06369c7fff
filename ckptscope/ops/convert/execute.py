"""Run a ``ConvertPlan``: stream tensor by tensor into a temporary directory, rename into place.

Each target writer (hf_target.py, mcore_target.py) writes into the staging directory that
``atomic_output`` hands it; a crash leaves nothing at the destination.
"""

from __future__ import annotations

from pathlib import Path

from ckptscope.ops.atomic import atomic_output, check_destination, check_space
from ckptscope.ops.convert.hf_target import write_hf
from ckptscope.ops.convert.mcore_target import write_mcore
from ckptscope.ops.convert.plan import ConvertPlan
from ckptscope.ops.convert.streaming import Progress


def execute_convert(plan: ConvertPlan, *, overwrite: bool = False, progress: Progress | None = None) -> Path:
    dst = Path(plan.dst)
    check_destination(Path(plan.src), dst, overwrite=overwrite)
    check_space(dst.parent, plan.total_bytes)
    with atomic_output(dst, directory=True, overwrite=overwrite) as staging:
        if plan.target == "hf":
            write_hf(plan, staging, progress)
        else:
            write_mcore(plan, staging, progress)
    return dst
