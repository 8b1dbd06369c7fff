"""``ckptscope check PATH``: is the checkpoint whole? Exit 0 clean, 1 problems found, 2 unreadable."""

from __future__ import annotations

import json
import sys

import click

EXIT_PROBLEMS = 1


@click.command()
@click.argument("path", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of one line per problem.")
def check(path: str, as_json: bool) -> None:
    """Check that every tensor is stored exactly once and every byte is on disk (metadata only).

    Finds holes and overlaps between chunks, missing or truncated files, chunk byte ranges that do
    not fit their dtype and shape, HF indices that disagree with their shards, and missing
    completeness markers (.metadata, metadata.json, latest_checkpointed_iteration.txt). A save
    root is checked through its tracker and the iteration it names.
    """
    from ckptscope.ops.check import check_checkpoint

    report = check_checkpoint(path)
    if report.target is not None:
        click.echo(f"ckptscope: checking iteration {report.iteration} ({report.target})", err=True)
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        for problem in report.problems:
            click.echo(problem.line())
        click.echo(report.summary())
    if not report.ok:
        sys.exit(EXIT_PROBLEMS)
