"""The process group of a ``torchrun`` launch (gloo), and how ranks agree on success or failure.

``python -m ckptscope`` joins a group only when torchrun's variables are set (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``); otherwise nothing here imports torch.
Every step a rank runs goes through ``agree``: each rank reports its error line (or none) to all
others, so one rank's failure stops every rank with the same one line, "rank R: tensor T: reason".
A rank that dies outright makes the others' next collective fail (or time out after
``CKPTSCOPE_DIST_TIMEOUT`` seconds), which is reported the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from ckptscope.core.errors import CkptError

T = TypeVar("T")
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
TIMEOUT_ENV = "CKPTSCOPE_DIST_TIMEOUT"
RSS_ENV = "CKPTSCOPE_RSS_DIR"
"""A directory: each rank writes ``rank{R}.json`` with its peak RSS there on exit (tests, benchmarks)."""
DEFAULT_TIMEOUT_S = 3600
"""How long a rank waits for the others at a collective. Ranks meet after their share of the work,
so this must exceed the spread of their finish times (balanced shares keep it small)."""


def launched_by_torchrun() -> bool:
    return all(os.environ.get(name) for name in TORCHRUN_ENV)


def timeout_seconds() -> float:
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise CkptError(f"{TIMEOUT_ENV}={text!r}: expected a number of seconds") from None
    if value <= 0:
        raise CkptError(f"{TIMEOUT_ENV} must be positive")
    return value


class Group:
    """This rank's view of the gloo group: rank, world size and the few collectives the ops need."""

    def __init__(self, rank: int, world: int, dist: Any, timeout: float) -> None:
        self.rank, self.world, self._dist, self.timeout = rank, world, dist, timeout

    def _collective(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except Exception as exc:  # gloo: a peer closed its connection, or the timeout passed
            detail = _short(exc)
            raise CkptError(f"rank {self.rank}: lost contact with the other ranks while {what} (a rank died or "
                            f"did not answer within {self.timeout:g}s, see {TIMEOUT_ENV}): {detail}") from None

    def all_gather(self, value: Any, what: str) -> list:
        out: list = [None] * self.world
        self._collective(what, lambda: self._dist.all_gather_object(out, value))
        return out

    def gather(self, value: Any, what: str) -> list | None:
        """Every rank's ``value`` on rank 0 (None elsewhere)."""
        out: list | None = [None] * self.world if self.rank == 0 else None
        self._collective(what, lambda: self._dist.gather_object(value, out, dst=0))
        return out

    def broadcast(self, value: Any, what: str) -> Any:
        """Rank 0's ``value`` on every rank."""
        box = [value]
        self._collective(what, lambda: self._dist.broadcast_object_list(box, src=0))
        return box[0]

    def settle(self) -> None:
        """Once every rank knows the outcome: wait until all have cleaned up (best effort: a rank
        that died is not waited for), then ignore SIGTERM. torchrun stops the other ranks as soon
        as one exits non-zero (diff's 1, an error's 2); from here each rank only prints its line
        or report and exits with the agreed code, which a SIGTERM must not cut short."""
        import signal

        try:
            self._dist.barrier()
        except Exception:  # noqa: BLE001 -- the failure itself is what gets reported
            pass
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def agree(self, fn: Callable[[], T], what: str, tensor: Callable[[], str] | None = None) -> T:
        """Run ``fn`` on this rank, then stop every rank with the first failing rank's one line if any
        rank failed (``tensor()`` names what it was on)."""
        error, value = None, None
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 -- any failure becomes every rank's one line
            reason = str(exc) if isinstance(exc, CkptError) else f"{type(exc).__name__}: {exc}"
            on = tensor() if tensor else ""
            error = f"rank {self.rank}: " + (f"tensor {on}: " if on else "") + reason
            if os.environ.get("CKPTSCOPE_DEBUG"):
                import traceback

                traceback.print_exc()
        errors = self.all_gather(error, what)
        first = next((e for e in errors if e), None)
        if first is not None:
            raise CkptError(first)
        return value  # type: ignore[return-value]


def _short(exc: Exception) -> str:
    """gloo's message without its source location and advice: ``Read error [127.0.0.1]:5432:
    Connection reset by peer``."""
    import re

    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text)
    return text.split(". This is typically")[0]


_group: Group | None = None


def current() -> Group | None:
    """The torchrun group (joined on first use), or None when torchrun did not launch this process."""
    global _group
    if _group is not None or not launched_by_torchrun():
        return _group
    from datetime import timedelta

    import torch.distributed as dist

    timeout = timeout_seconds()
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    _group = Group(dist.get_rank(), dist.get_world_size(), dist, timeout)
    _stop_on_sigterm(_group.rank)
    import atexit

    atexit.register(_leave, dist, _group.rank)
    return _group


def exit_rank(code: object) -> None:
    """End this rank now with ``code`` (``SystemExit.code``: None is 0), once the command is done
    and every rank knows the outcome: report the peak RSS if asked, flush, ``os._exit``.

    The interpreter's own shutdown is skipped on purpose: tearing down gloo's process group there
    (its C++ threads, while the peers exit at their own pace) sometimes aborts the process
    ("terminate called without an active exception"), which would turn exit 0 into a crash."""
    if _group is None:
        return
    import sys

    _report_rss(_group.rank)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)


def _report_rss(rank: int) -> None:
    """The peak RSS in ``RSS_ENV``/rank{R}.json when that variable asks for it."""
    if not os.environ.get(RSS_ENV):
        return
    import json
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    with open(os.path.join(os.environ[RSS_ENV], f"rank{rank}.json"), "w") as handle:
        json.dump({"rank": rank, "max_rss_bytes": peak}, handle)


def _leave(dist: Any, rank: int) -> None:
    """Leave the group before the interpreter exits, when ``exit_rank`` did not end the process
    (an exit outside ``cli.main``); report the peak RSS when ``RSS_ENV`` asks."""
    _report_rss(rank)
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 -- exiting anyway; a peer that died already said why
        pass


def _stop_on_sigterm(rank: int) -> None:
    """torchrun stops the other workers with SIGTERM when one fails: unwind (temp output removed)
    with one line instead of dying mid-write."""
    import signal

    def stop(signum, frame) -> None:
        raise CkptError(f"rank {rank}: stopped by torchrun (another rank failed or the job was cancelled)")

    signal.signal(signal.SIGTERM, stop)
