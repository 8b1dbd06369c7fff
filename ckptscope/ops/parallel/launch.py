"""``--workers P``: run the same command on P processes of this node, launched by torch's own
``torchrun`` machinery (``torch.distributed.launcher``, as ``torchrun --standalone``), so the
ranks are exactly what a user's ``torchrun -m ckptscope ...`` starts."""

from __future__ import annotations

import shutil
import sys
import tempfile
import uuid
from collections.abc import Sequence


def strip_workers(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--workers N`` / ``--workers=N``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            out.append(arg)
    return out


def run_workers(workers: int, argv: Sequence[str]) -> int:
    """Run ``python -m ckptscope ARGV`` on ``workers`` local ranks; returns the exit code the ranks
    agreed on (rank 0's, else the first failing rank's)."""
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # ranks say what went wrong
    # torchrun's agent keeps its per-run log directory under /tmp/torchelastic_* and never removes
    # it: one left behind per command. Ours is removed when the ranks are done.
    log_dir = tempfile.mkdtemp(prefix="ckptscope-workers-")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=workers, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1,
                          **_logs_in(log_dir))
    try:
        elastic_launch(config, sys.executable)("-m", "ckptscope", *strip_workers(argv))
    except ChildFailedError as exc:
        codes = [failure.exitcode for _, failure in sorted(exc.failures.items())]
        return next((code for code in codes if code > 0), 2)  # the ranks' agreed code; a signal: 2
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0


def _logs_in(log_dir: str) -> dict:
    """``LaunchConfig``'s ``logs_specs`` for ``log_dir`` (torch >= 2.3; older ones take none)."""
    try:
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    except ImportError:
        return {}
    return {"logs_specs": DefaultLogsSpecs(log_dir=log_dir)}
