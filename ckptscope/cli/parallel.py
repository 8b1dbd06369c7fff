"""The CLI side of running on many processes: ``--workers P`` (relaunch this command under torch's
launcher) and who prints (rank 0 only; see ops/parallel)."""

from __future__ import annotations

import sys

import click

ARGV: list[str] = []
"""The command line ``main`` was given (what ``--workers`` relaunches, minus itself)."""

workers_option = click.option(
    "--workers", type=click.IntRange(min=1), default=1, show_default=True,
    help="Run on P processes of this node (the same as `torchrun --standalone --nproc-per-node P -m ckptscope ...`).")


def group():
    """The torchrun group when torchrun launched this process with more than one rank, else None."""
    from ckptscope.ops.parallel.group import current

    found = current()
    return found if found is not None and found.world > 1 else None


def not_first_rank() -> bool:
    """Launched by torchrun as a rank other than 0 (read from the environment: no torch import)."""
    import os

    from ckptscope.ops.parallel.group import launched_by_torchrun

    return launched_by_torchrun() and os.environ.get("RANK") != "0"


def relaunch_if_asked(workers: int) -> None:
    """With ``--workers P`` > 1 outside torchrun: run the command on P ranks and exit with their code."""
    from ckptscope.ops.parallel.group import launched_by_torchrun

    if workers > 1 and not launched_by_torchrun():
        from ckptscope.ops.parallel.launch import run_workers

        sys.exit(run_workers(workers, ARGV))


def leave(code: object) -> None:
    """A rank of a torchrun group ends here with ``code`` (see ``ops.parallel.group.exit_rank``);
    without a group this does nothing and the interpreter exits as usual."""
    from ckptscope.ops.parallel.group import exit_rank

    exit_rank(code)
