"""``ckptscope check PATH``: is the checkpoint whole? Exit 0 clean, 1 problems found, 2 unreadable."""

from __future__ import annotations

import json
import sys

import click

from ckptscope.cli.roots_view import iteration_option

EXIT_PROBLEMS = 1


@click.command()
@click.argument("path", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of one line per problem.")
@iteration_option(help_text="On a save directory: check iteration N (a number, 'release' or 'final') instead of the "
                            "one the trainer would resume from.")
def check(path: str, as_json: bool, iteration: int | str | None) -> None:
    """Check that every tensor is stored exactly once and every byte is on disk (metadata only).

    Finds holes and overlaps between chunks, missing or truncated files, chunk byte ranges that do
    not fit their dtype and shape, HF indices that disagree with their shards, and missing
    completeness markers (.metadata, metadata.json, trainer_state.json). A save root is checked by
    its own trainer's markers: Megatron and verl through latest_checkpointed_iteration.txt and the
    iteration it names, torchtitan (step-N, no tracker) through its newest step with .metadata, HF
    Trainer (checkpoint-N, no tracker) through its highest checkpoint and its trainer_state.json.

    The first line names the layout recognised, the last one sums up; --json adds "layout".
    """
    from ckptscope.ops.check import check_checkpoint

    report = check_checkpoint(path, iteration)
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        header = report.layout or "save root"
        if report.target is not None and report.iteration is not None:
            what = f"iteration {report.iteration}" if isinstance(report.iteration, int) else report.iteration
            header += f": checking {what} ({report.target})"
        click.echo(header)
        for problem in report.problems:
            click.echo(problem.line())
        click.echo(report.summary())
    if not report.ok:
        sys.exit(EXIT_PROBLEMS)
