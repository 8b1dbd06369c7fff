"""``ckptscope timeline ROOT``: how every layer moved from save to save, with flags.

stdout carries the data (a table of modules x steps and the flags, or ``--json`` / ``--csv``),
stderr the progress. Exit codes follow ``diff``: 0 nothing flagged, 1 flags raised, 2 trouble.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections import defaultdict

import click

from ckptscope.cli.diff_cmd import EXIT_DIFFERENT, _glob_list, _stderr_console
from ckptscope.core.errors import CkptError
from ckptscope.core.units import plural

EXIT_FLAGGED = EXIT_DIFFERENT
MAX_STEP_COLUMNS = 12
"""The human table shows the most recent steps only; --json / --csv have them all."""
FLAG_LINES = 6
"""Subjects listed per flag group before "... and N more"."""


def _rel(value: float, nan: int) -> str:
    if math.isinf(value):
        text = "inf"
    elif value == 0:
        text = "0"
    else:
        text = f"{value:.2e}"
    return f"{text} nan" if nan else text


def _fitting_table(console, build, most: int):
    """``build(k)`` with the largest ``k <= most`` (recent columns kept) whose table fits the console:
    the module column keeps whole names and the oldest columns go first. ``k`` is at least 1."""
    from ckptscope.cli.console import fits

    for k in range(most, 1, -1):
        table = build(k)
        if fits(console, table):
            return k, table
    return 1, build(1)


def _module_column(table, names) -> None:
    table.add_column("module", no_wrap=True, min_width=max((len(n) for n in names), default=6))


def print_result(result) -> None:
    from rich.table import Table
    from rich.text import Text

    from ckptscope.cli.console import stdout_console
    from ckptscope.core.units import human_bytes

    console = stdout_console()
    console.print(Text.assemble((result.root, "bold"),
                                f" ({result.kind}): {plural(len(result.iterations), 'iteration')} "
                                f"{result.iterations[0]} .. {result.iterations[-1]}, "
                                f"{plural(len(result.tensors), 'tensor')}, {human_bytes(result.bytes_read)} read in "
                                f"{result.seconds:.1f} s"))
    for note in result.notes:
        console.print(f"note: {note}")
    if result.optimizer_note:
        console.print(f"note: {result.optimizer_note}")
    rows = [*result.modules, result.model]

    def build(k: int):
        steps = result.steps[-k:]
        skip = len(result.steps) - len(steps)
        title = "relative change ||W_t - W_t-1|| / ||W_t-1|| per module"
        if skip:
            title += f" (last {len(steps)} of {plural(len(result.steps), 'step')}; --json / --csv have all)"
        table = Table(title=title, title_justify="left")
        _module_column(table, [series.name for series in rows])
        for a, b in steps:
            table.add_column(f"{a}->{b}", justify="right", no_wrap=True)
        table.add_column(f"norm @{result.iterations[-1]}", justify="right", no_wrap=True)
        for series in rows:
            cells = [_rel(series.change[skip + j], series.nan[skip + j + 1]) for j in range(len(steps))]
            table.add_row(Text(series.name), *cells, f"{series.norm[-1]:.4g}")
        return table

    console.print(_fitting_table(console, build, min(MAX_STEP_COLUMNS, len(result.steps)))[1])
    if result.moment_modules:
        print_moments(console, result)
    print_flags(console, result.flags)


def print_moments(console, result) -> None:
    """Adam per module at the last few iterations: mean exp_avg_sq and the implied step size."""
    from rich.table import Table
    from rich.text import Text

    def build(count: int):
        labels = result.iterations[-count:]
        first = len(result.iterations) - len(labels)
        table = Table(title="Adam per module: mean exp_avg_sq / step size lr / (sqrt(mean exp_avg_sq) + eps) "
                            "(LR as saved for the next step; --json / --csv have every iteration)",
                      title_justify="left")
        _module_column(table, [m.name for m in result.moment_modules])
        for label in labels:
            table.add_column(f"v @{label}", justify="right", no_wrap=True)
            table.add_column(f"step @{label}", justify="right", no_wrap=True)
        for m in result.moment_modules:
            cells = []
            for k in range(first, len(result.iterations)):
                v, step = m.exp_avg_sq_mean[k], m.step_size_mean[k]
                cells += ["-" if v is None else f"{v:.3g}", "-" if step is None else f"{step:.3g}"]
            table.add_row(Text(m.name), *cells)
        return table

    console.print(_fitting_table(console, build, min(3, len(result.iterations)))[1])


def print_flags(console, flags) -> None:
    if not flags:
        console.print("flags: none")
        return
    console.print(f"[bold]flags ({len(flags)})[/]")
    groups: dict[tuple, list] = defaultdict(list)
    for flag in flags:
        groups[flag.kind, flag.iteration].append(flag)
    for (kind, iteration), members in groups.items():
        if kind == "stale":
            header = f"[red]stale[/] at iteration {iteration}"
        else:
            modules = sorted({f.module or f.subject for f in members})
            where = ", ".join(modules[:8]) + (" ..." if len(modules) > 8 else "")
            header = f"[red]{kind}[/] at iteration {iteration}: {plural(len(members), 'tensor')} in {where}"
        console.print(f"  {header}")
        for flag in members[:FLAG_LINES]:
            console.print(f"    {flag.subject}: {flag.reason}")
        if len(members) > FLAG_LINES:
            console.print(f"    ... and {len(members) - FLAG_LINES} more (--json lists every flag)")


def _write_csv(result) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    for row in result.csv_rows():
        writer.writerow(row)


@click.command()
@click.argument("root", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--csv", "as_csv", is_flag=True, help="Print long-format CSV rows (level,name,iteration,metric,value).")
@click.option("--iterations", "--steps", "iterations", default=None, metavar="FIRST:LAST",
              help="Only iterations in this inclusive range (either side optional), e.g. 1000:5000.")
@click.option("--include", multiple=True, callback=_glob_list, metavar="GLOB", help="Only these tensors (repeatable).")
@click.option("--exclude", multiple=True, callback=_glob_list, metavar="GLOB", help="Skip these tensors (repeatable).")
@click.option("--sample", type=click.IntRange(min=1), default=None, metavar="ROWS",
              help="Read at most ROWS rows of each tensor (evenly spaced runs, deterministic): a quick look at "
                   "huge runs; the output says the numbers are of the sample.")
@click.option("--frozen-below", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="A step with relative change at most this counts as no change (0: exactly unchanged).")
@click.option("--explode-factor", type=click.FloatRange(min=1, min_open=True), default=10.0, show_default=True,
              help="Flag a step whose change exceeds this x the tensor's median change so far, or whose norm "
                   "exceeds this x the norm one iteration before.")
@click.option("--no-optimizer", is_flag=True, help="Skip the Adam statistics (reads only the weights).")
@click.option("--plot", "plot_path", type=click.Path(path_type=str), default=None, metavar="PNG",
              help="Also write a picture: heatmap of module changes + per-layer curves (needs the 'plot' extra).")
@click.option("--trust-pickle", is_flag=True, help="Load pickles with torch.load(weights_only=False).")
def timeline(root: str, as_json: bool, as_csv: bool, iterations: str | None, include: tuple[str, ...],
             exclude: tuple[str, ...], sample: int | None, frozen_below: float, explode_factor: float,
             no_optimizer: bool, plot_path: str | None, trust_pickle: bool) -> None:
    """How each layer of a training run moved between saves, with flags.

    ROOT is a save root with several iterations (Megatron iter_*, torchtitan step-N, HF Trainer
    checkpoint-N, verl global_step_N, DeepSpeed global_stepN). Per module and tensor, for each step
    between consecutive iterations: relative change ||W_t - W_t-1|| / ||W_t-1||, norm, max |dW|,
    NaN/Inf counts, and Adam statistics where optimizer state is saved (HF Trainer's positional
    optimizer.pt and Megatron's flat distributed-optimizer buffers are named only where every entry
    is verified against its parameter; --json says why not). Flags: frozen, exploding, NaN/Inf first seen, and
    stale (weights equal to an older iteration's: a resume that loaded the wrong save).
    Exit 0 nothing flagged, 1 flags raised, 2 error."""
    if as_json and as_csv:
        raise CkptError("--json and --csv: pick one")
    if plot_path is not None:
        from ckptscope.ops.timeline.plot import check_plotting

        check_plotting()
    from ckptscope.ops.timeline import TimelineOptions, build_timeline_plan, run_timeline

    plan = build_timeline_plan(root, iterations=iterations, include=include, exclude=exclude, sample=sample,
                               optimizer=not no_optimizer, trust_pickle=trust_pickle)
    options = TimelineOptions(frozen_below=frozen_below, explode_factor=explode_factor)
    try:
        if not sys.stderr.isatty():
            result = run_timeline(plan, options=options)
        else:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(TextColumn("timeline"), BarColumn(), MofNCompleteColumn(), TextColumn("blocks"),
                          TimeElapsedColumn(), transient=True, console=_stderr_console()) as progress:
                task = progress.add_task("timeline", total=None)
                result = run_timeline(plan, options=options, progress=lambda done, total: progress.update(
                    task, completed=done, total=total))
    finally:
        plan.close()
    if plot_path is not None:
        from ckptscope.ops.timeline.plot import write_plot

        write_plot(result, plot_path)
        click.echo(f"wrote {plot_path}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_json(), allow_nan=False))
    elif as_csv:
        _write_csv(result)
    else:
        print_result(result)
    sys.exit(EXIT_FLAGGED if result.flags else 0)
