"""``ckptscope diff A B``: numeric comparison with diff(1) exit codes (0 same, 1 different, 2 trouble).

In an interactive terminal (and without ``--json``/``--plain``) the TUI diff screen opens; anything
else gets a report on stdout: the summary and the differing pairs (``--top``), or one JSON object.
"""

from __future__ import annotations

import json
import math
import sys

import click

from ckptscope.cli.parallel import group, relaunch_if_asked, workers_option
from ckptscope.cli.roots_view import iteration_option, warn_if_not_tracked
from ckptscope.core.errors import CkptError
from ckptscope.core.units import plural

EXIT_DIFFERENT = 1


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.4g}"
    return str(value)


def _quant_cell(quant: dict | None) -> str:
    """``Q8_0 0.46% <= 1.18%``: relative RMS error of the quantised side against its type's bound."""
    if quant is None:
        return "-"
    rel, bound = quant["rel_rms"], quant["expected_rel_rms"]
    shown = "n/a" if rel is None else f"{100 * rel:.3g}%"
    mark = "[green]<=[/]" if quant["within"] else "[red]>[/]"
    if bound is None:
        return f"{quant['ggml_type']} {shown}"
    return f"{quant['ggml_type']} {shown} {mark} {100 * bound:.3g}%"


def summary_line(summary: dict[str, int]) -> str:
    """``21 pairs compared: 21 different (9 dtype mismatch, 12 shape mismatch)``: the counts as a
    sentence whose parts add up (``different`` includes the mismatches; the JSON keeps the flat keys)."""
    compared, different = summary["compared"], summary["different"]
    mismatches = summary["dtype_mismatch"] + summary["shape_mismatch"]
    kinds = [f"{different - mismatches} in value" if mismatches and different > mismatches else "",
             f"{summary['dtype_mismatch']} dtype mismatch" if summary["dtype_mismatch"] else "",
             f"{summary['shape_mismatch']} shape mismatch" if summary["shape_mismatch"] else ""]
    kinds = [k for k in kinds if k]
    if "quantization_error" in summary:
        kinds.append(f"{summary['quantization_error']} within quantization error, "
                     f"{summary['beyond_quantization']} beyond")
    parts = [f"{summary[k]} {k}" for k in ("equal", "close") if summary[k] or k == "equal"]
    parts.append(f"{different} different" + (f" ({', '.join(kinds)})" if kinds else ""))
    line = f"{plural(compared, 'pair')} compared: {', '.join(parts)}"
    unpaired = [f"{summary['renamed']} renamed" if summary["renamed"] else "",
                f"{summary['only_a']} only in A" if summary["only_a"] else "",
                f"{summary['only_b']} only in B" if summary["only_b"] else ""]
    unpaired = [u for u in unpaired if u]
    return line + (f"; not compared: {', '.join(unpaired)}" if unpaired else "")


def _status_text(result) -> str:
    if result.status == "dtype_mismatch":
        return f"dtype {result.dtype_a}->{result.dtype_b}"
    if result.status == "shape_mismatch":
        return f"shape {list(result.shape_a)}->{list(result.shape_b)}"
    if result.status == "renamed":
        return f"renamed -> {result.renamed_to}"
    return {"only_a": "only in A", "only_b": "only in B"}.get(result.status, result.status)


def _cells(result) -> list[str]:
    """The metric cells of one differing pair, in ``METRIC_COLUMNS`` order."""
    m = result.metrics
    at = ",".join(map(str, result.max_diff_at)) if result.max_diff_at else "-"
    return [_fmt(m.get("max_abs_diff")), _fmt(m.get("mean_abs_diff")), _fmt(m.get("rel_l2")),
            _fmt(m.get("cosine")), _fmt(m.get("num_diff")), at]


METRIC_COLUMNS = ("max_abs", "mean_abs", "rel_l2", "cosine", "num_diff", "at")


def print_report(report, top: int) -> None:
    from rich.table import Table
    from rich.text import Text

    from ckptscope.cli.console import fits, stdout_console

    console = stdout_console()
    verdict = "[green]identical[/]" if report.identical else "[red]different[/]"
    console.print(f"[bold]{report.a}[/] vs [bold]{report.b}[/]: {verdict}  (mapping: {report.mapping}, "
                  f"device: {report.device})", soft_wrap=True)
    console.print(summary_line(report.summary()))
    for note in report.notes:
        console.print(f"note: {note}")
    for pad in report.padding:
        zero = "all zero" if pad["all_zero"] else "NOT all zero"
        console.print(f"padding: {pad['side'].upper()} {pad['source']} rows {pad['rows'][0]}-{pad['rows'][1] - 1} "
                      f"({plural(pad['count'], 'row')} beyond the vocabulary, {zero}; not compared)")
    differing = [r for r in report.results if r.differs]
    if not differing:
        return
    # Quantisation error is expected: what it does not explain comes first, so --top shows it.
    differing.sort(key=lambda r: r.quant is not None and r.quant["within"])
    shown = differing[:top]
    title = f"differing tensors ({len(shown)} of {len(differing)})"
    quant = any(r.quant is not None for r in shown)
    table = Table(title=title, title_justify="left")
    table.add_column("name", no_wrap=True)  # never cut: the stacked layout below takes over instead
    table.add_column("status", no_wrap=True)
    for column in METRIC_COLUMNS + (("quant",) if quant else ()):
        table.add_column(column, justify="right", no_wrap=True)
    for result in shown:
        row = [Text(result.name), Text(_status_text(result)), *_cells(result)]
        table.add_row(*row, *([_quant_cell(result.quant)] if quant else []))
    if fits(console, table):
        console.print(table)
    else:  # too narrow for one row per pair: one block per pair, the name whole on its own line
        console.print(title, style="italic")
        for result in shown:
            console.print(Text(result.name, style="bold"), soft_wrap=True)
            console.print(Text("  " + _status_text(result)), soft_wrap=True)
            metrics = [f"{k} {v}" for k, v in zip(METRIC_COLUMNS, _cells(result)) if v != "-"]
            if metrics:
                console.print(Text("  " + "  ".join(metrics)))
            if result.quant is not None:
                console.print(f"  quant {_quant_cell(result.quant)}")
    mapped = [r for r in shown if (r.a and r.a != r.name) or (r.b and r.b != r.name)]
    for result in mapped:
        console.print(Text(f"  {result.name}:\n    A = {result.a or '-'}\n    B = {result.b or '-'}"), soft_wrap=True)


def _glob_list(ctx, param, values):
    out = []
    for value in values:
        out.extend(v for v in value.split(",") if v)
    return tuple(out)


@click.command()
@click.argument("a", type=click.Path(path_type=str))
@click.argument("b", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as one JSON object on stdout, and nothing else there.")
@click.option("--plain", is_flag=True, help="Print the report even in a terminal (no TUI).")
@click.option("--map", "mapping", type=click.Choice(["auto", "none"]), default="auto", show_default=True,
              help="auto: compare HF and Megatron-Core names through the model mapping; none: by stored name.")
@click.option("--atol", type=float, default=0.0, show_default=True, help="Absolute tolerance for 'close'.")
@click.option("--rtol", type=float, default=0.0, show_default=True, help="Relative tolerance for 'close'.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where differing values are decoded and measured: cuda needs torch with a GPU; auto moves to "
                   "the GPU once enough values need it, and stays on the CPU without one.")
@click.option("--include", multiple=True, callback=_glob_list, metavar="GLOB", help="Only these names (repeatable).")
@click.option("--exclude", multiple=True, callback=_glob_list, metavar="GLOB", help="Skip these names (repeatable).")
@click.option("--top", type=click.IntRange(min=0), default=20, show_default=True, help="Differing pairs to list.")
@click.option("--arch", default=None, help="Architecture for --map auto when the checkpoints do not say.")
@click.option("--hf-config", type=click.Path(path_type=str), default=None,
              help="Directory with an HF config.json for what a side's own metadata does not say (a Megatron save "
                   "without args: its query groups, vocabulary size).")
@click.option("--trust-pickle", is_flag=True, help="Load pickles with torch.load(weights_only=False).")
@click.option("--training-state", is_flag=True,
              help="Also compare training state (optimizer moments, scheduler, rng ...), by stored name. "
                   "Without it only the models are compared.")
@click.option("--raw", is_flag=True,
              help="Compare block-scaled tensors (FP8 + weight_scale_inv, MXFP4 _blocks + _scales) as stored, "
                   "payload and scales bit for bit, instead of dequantised. Prints the report (no TUI).")
@iteration_option(help_text="For each side that is a save directory: use iteration N (a number, 'release' or "
                            "'final') instead of its latest complete one (B: unless --iteration-b).")
@iteration_option("--iteration-b", "--step-b", "iteration_b",
                  help_text="Iteration N of B when B is a save directory (default: --iteration, if given).")
@workers_option
def diff(a: str, b: str, as_json: bool, plain: bool, mapping: str, atol: float, rtol: float, device: str,
         include: tuple[str, ...], exclude: tuple[str, ...], top: int, arch: str | None, hf_config: str | None,
         trust_pickle: bool,
         training_state: bool, raw: bool, iteration: int | str | None, iteration_b: int | str | None,
         workers: int) -> None:
    """Compare two checkpoints tensor by tensor. Exit 0 identical, 1 different, 2 error.

    A or B may be a save root: its latest complete iteration is compared, or --iteration N (both
    sides that are roots) / --iteration-b N (B). `diff ROOT ROOT --iteration 10 --iteration-b 20`
    compares two iterations of one run. Under torchrun (or with --workers P) the pairs are shared
    out between the ranks; rank 0 prints the same report and every rank exits with the same code."""
    if as_json and plain:
        raise click.UsageError("--json and --plain ask for two different outputs; give one")
    if atol < 0 or rtol < 0 or math.isnan(atol) or math.isnan(rtol):
        raise CkptError("--atol and --rtol must be non-negative numbers")
    a, b = resolve_sides(a, b, iteration, iteration_b)
    from ckptscope.ops.diff.engine import DiffOptions

    options = DiffOptions(atol=atol, rtol=rtol, device=device)
    interactive = (not as_json and not plain and not raw and sys.stdout.isatty() and sys.stdin.isatty()
                   and workers == 1)
    relaunch_if_asked(workers)
    ranks = group()
    if ranks is not None:
        interactive = False
    if interactive:
        try:
            from ckptscope.tui import run_diff_tui
        except ImportError:
            run_diff_tui = None
        if run_diff_tui is not None:
            code = run_diff_tui(a, b, mapping=mapping, include=include, exclude=exclude, options=options, arch=arch,
                                trust_pickle=trust_pickle, training_state=training_state, hf_config=hf_config)
            sys.exit(code)

    from ckptscope.ops.diff.plan import plan_diff

    plan = plan_diff(a, b, mapping=mapping, include=include, exclude=exclude, arch=arch, trust_pickle=trust_pickle,
                     training_state=training_state, raw=raw, hf_config=hf_config)
    from ckptscope.cli.progress import byte_progress
    from ckptscope.ops.diff.engine import DiffEngine

    if ranks is not None:
        from ckptscope.ops.parallel.diff import diff_parallel

        report, identical = diff_parallel(plan, options, ranks)
        if report is not None:
            click.echo(json.dumps(report.to_json(), allow_nan=False)) if as_json else print_report(report, top)
        ranks.settle()
        sys.exit(0 if identical else EXIT_DIFFERENT)
    engine = DiffEngine(plan, options)
    with byte_progress("diff", plan.bytes_to_read(), quiet=as_json, count=len(plan.pairs), noun="pairs") as update:
        report = engine.run(on_progress=None if update is None else
                            lambda done, total: update(engine.bytes_read, done))
    if as_json:
        click.echo(json.dumps(report.to_json(), allow_nan=False))
    else:
        print_report(report, top)
    sys.exit(0 if report.identical else EXIT_DIFFERENT)


def resolve_sides(a: str, b: str, iteration: int | str | None, iteration_b: int | str | None) -> tuple[str, str]:
    """The directories to compare: each save root's chosen iteration. ``--iteration`` applies to every
    side that is a root (an error when neither is), ``--iteration-b`` to B only (an error when B is none)."""
    from ckptscope.ops.roots import discover_iterations, pick_iteration, resolve_root

    found_a, found_b = discover_iterations(a), discover_iterations(b)
    if iteration is not None and found_a is None and found_b is None:
        resolve_root(a, iteration)  # raises: not a save directory
    if iteration_b is not None and found_b is None:
        resolve_root(b, iteration_b)  # raises: not a save directory
    wanted_b = iteration_b if iteration_b is not None else iteration

    def side(path: str, found, wanted) -> str:
        if not found:  # no root (or a tracker alone): the path itself, as diff always did
            return path if wanted is None or found is None else pick_iteration(path, found, wanted).path
        chosen = pick_iteration(path, found, wanted)
        if wanted is None:
            warn_if_not_tracked(path, found, chosen)
        return chosen.path

    return side(a, found_a, iteration), side(b, found_b, wanted_b)


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)
