"""``--iteration N`` and save roots on the command line: which directory a command really opens.

A save root (Megatron ``iter_*``, verl ``global_step_*``, torchtitan ``step-*``) is not itself a
checkpoint. ``inspect`` lists its iterations and opens the latest complete one (or ``N``);
``open --iteration N`` hands the TUI the iteration directory directly (without the option the TUI
shows its own iteration picker).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ckptscope.core.errors import CkptError
from ckptscope.core.units import human_bytes
from ckptscope.ops.roots import IterationInfo, discover_iterations, pick_iteration


@dataclass(frozen=True, slots=True)
class Resolved:
    path: str
    """What to open: ``root``'s chosen iteration, or the path as given when it is no save root."""
    root: str | None = None
    iterations: list[IterationInfo] | None = None
    chosen: IterationInfo | None = None


def resolve(path: str, iteration: int | None = None) -> Resolved:
    """Pick the iteration to open under a save root. ``CkptError`` when ``iteration`` does not exist
    (the message lists the ones that do) or is given for a path that is no save root."""
    found = discover_iterations(path)
    if found is None:
        if iteration is not None:
            raise CkptError(f"--iteration {iteration}: not a save directory with iterations "
                            "(iter_*, global_step_*, step-*)", path)
        return Resolved(path)
    chosen = pick_iteration(path, found, iteration)
    return Resolved(chosen.path, path, found, chosen)


def iterations_json(resolved: Resolved) -> list[dict[str, Any]]:
    """The ``iterations`` field of ``inspect --json`` on a save root, newest first."""
    return [
        {"iteration": i.iteration, "path": i.path, "size": i.size, "complete": i.complete, "latest": i.latest,
         "kind": i.kind, "roles": list(i.roles), "opened": i is resolved.chosen}
        for i in resolved.iterations or []
    ]


def print_iterations(resolved: Resolved, console: Console | None = None) -> None:
    """The iterations of a save root, with the opened one marked, before the usual inspect view."""
    console = console or Console(highlight=False)
    found = resolved.iterations or []
    complete = sum(1 for i in found if i.complete)
    plural = "s" if len(found) != 1 else ""
    table = Table(title=f"save directory {resolved.root}: {len(found)} iteration{plural} ({complete} complete)",
                  title_justify="left", show_edge=False, pad_edge=False)
    for column, justify in (("iteration", "right"), ("", "left"), ("status", "left"), ("size", "right"),
                            ("path", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for info in found:
        marks = ", ".join(m for m, on in (("opened", info is resolved.chosen), ("latest", info.latest)) if on)
        status = Text("complete", style="green") if info.complete else Text("incomplete", style="bold red")
        where = os.path.relpath(info.path, resolved.root) if resolved.root else info.path
        table.add_row(f"{info.iteration:,}", Text(marks, style="magenta"), status, human_bytes(info.size), where)
    console.print(table)
    console.print()
