"""``--iteration N`` and save roots on the command line: which directory a command really opens.

A save root (Megatron ``iter_*`` / ``release``, verl ``global_step_*``, torchtitan ``step-*``, HF
Trainer ``checkpoint-*``) is not itself a checkpoint. ``inspect`` lists its iterations and opens the
latest complete one (or ``N``); ``open --iteration N`` hands the TUI the iteration directory
directly (without the option the TUI shows its own iteration picker); ``check``, ``diff``,
``convert``, ``merge`` and ``verify`` take the same option (``--step`` is an alias).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from ckptscope.ops.roots import IterationInfo

# The CLI imports this module to declare its options: it stays light (click only); rich and the
# save-root code are imported when a command runs.
Iteration = int | str

ITERATION_HELP = ("On a save directory (iter_*, release, global_step_*, step-*, checkpoint-*, checkpoint_*): use iteration N "
                  "(a number, 'release' or 'final') instead of the latest complete one.")
F = TypeVar("F", bound=Callable[..., Any])


class IterationType(click.ParamType):
    """A step number (``0000010`` is 10) or a name (``release``, ``final``)."""

    name = "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Iteration:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if not text:
            self.fail("an iteration number, 'release' or 'final'", param, ctx)
        return int(text) if text.isdigit() else text


ITERATION = IterationType()


def iteration_option(*names: str, help_text: str = ITERATION_HELP) -> Callable[[F], F]:
    """``--iteration N`` with its ``--step N`` alias (or the names given), into ``iteration``."""
    decls = names or ("--iteration", "--step", "iteration")
    return click.option(*decls, type=ITERATION, metavar="N", default=None, help=help_text)


@dataclass(frozen=True, slots=True)
class Resolved:
    path: str
    """What to open: ``root``'s chosen iteration, or the path as given when it is no save root."""
    root: str | None = None
    iterations: list[IterationInfo] | None = None
    chosen: IterationInfo | None = None
    layout: str | None = None
    """The root's layout (``Megatron-LM save root (torch_dist, tracker: iteration 5)``); None for a
    path that is no save root."""


def resolve(path: str, iteration: Iteration | None = None) -> Resolved:
    """Pick the iteration to open under a save root. ``CkptError`` when ``iteration`` does not exist
    (the message lists the ones that do) or is given for a path that is no save root."""
    from ckptscope.ops.roots import (
        describe_root,
        discover_iterations,
        pick_iteration,
        nemo_weights,
        resolve_root,
        save_state_model,
        verl_step_role,
    )

    found = discover_iterations(path)
    if found is None:
        resolve_root(path, iteration)  # raises for --iteration on a path that is no save root
        model = save_state_model(path)
        if model is not None:
            return Resolved(model, layout="accelerate save_state dir (FSDP sharded model in pytorch_model_fsdp_0/)")
        role = verl_step_role(path)
        if role is not None:
            return Resolved(role, layout=f"verl step dir ({Path(role).name}/ of {Path(path).name})")
        weights = nemo_weights(path)
        if weights is not None:
            return Resolved(weights, layout="NeMo 2.0 checkpoint (torch_dist weights/ beside context/)")
        return Resolved(path)
    chosen = pick_iteration(path, found, iteration)
    if iteration is None:
        warn_if_not_tracked(path, found, chosen)
    return Resolved(chosen.path, path, found, chosen, describe_root(path, found))


def resolve_path(path: str, iteration: Iteration | None = None) -> str:
    """The directory a command that takes one checkpoint reads: the root's iteration, or ``path``."""
    from ckptscope.ops.roots import discover_iterations, pick_iteration, resolve_root

    found = discover_iterations(path) if iteration is None else None
    if found:
        warn_if_not_tracked(path, found, pick_iteration(path, found))
    return resolve_root(path, iteration)


def warn_if_not_tracked(path: str, found: list[IterationInfo], chosen: IterationInfo) -> None:
    """One stderr line when a root's default iteration is not the one its trainer's tracker names
    (missing or incomplete there): an export of the fallback is then not the run's latest state."""
    from ckptscope.ops.roots import tracker_gap

    gap = tracker_gap(path, found, chosen)
    if gap is not None:
        click.echo(f"ckptscope: warning: {path}: {gap}", err=True)


def iterations_json(resolved: Resolved) -> list[dict[str, Any]]:
    """The ``iterations`` field of ``inspect --json`` on a save root, newest first. ``iteration`` is
    a number, or ``"release"`` / ``"final"``."""
    return [
        {"iteration": i.iteration, "path": i.path, "size": i.size, "saved": i.saved, "complete": i.complete,
         "latest": i.latest,
         "kind": i.kind, "roles": list(i.roles), "opened": i is resolved.chosen}
        for i in resolved.iterations or []
    ]


def iteration_cell(info: IterationInfo) -> str:
    return f"{info.number:,}" if info.number is not None else info.label


def print_iterations(resolved: Resolved, console: Console | None = None) -> None:
    """The iterations of a save root, with the opened one marked, before the usual inspect view."""
    from rich.table import Table
    from rich.text import Text

    from ckptscope.core.units import human_bytes, human_time, plural

    if console is None:
        from ckptscope.cli.console import stdout_console

        console = stdout_console()
    found = resolved.iterations or []
    complete = sum(1 for i in found if i.complete)
    if resolved.layout:
        console.print(Text.assemble(("layout", "bold"), "  ", resolved.layout))
    table = Table(title=f"save directory {resolved.root}: {plural(len(found), 'iteration')} ({complete} complete)",
                  title_justify="left", show_edge=False, pad_edge=False)
    for column, justify in (("iteration", "right"), ("", "left"), ("status", "left"), ("size", "right"),
                            ("saved", "left"), ("path", "left")):
        table.add_column(column, justify=justify, no_wrap=column in ("saved", ""))  # type: ignore[arg-type]
    for info in found:
        marks = ", ".join(m for m, on in (("opened", info is resolved.chosen), ("latest", info.latest)) if on)
        status = Text("complete", style="green") if info.complete else Text("incomplete", style="bold red")
        where = os.path.relpath(info.path, resolved.root) if resolved.root else info.path
        table.add_row(iteration_cell(info), Text(marks, style="magenta"), status, human_bytes(info.size),
                      human_time(info.saved), "./" if where == "." else where)
    console.print(table)
    console.print()
