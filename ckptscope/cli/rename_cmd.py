"""``ckptscope rename SRC DST``: regex/map renames and drops, header-only, atomic."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import click

from ckptscope.core.errors import CkptError


def _load_map(path: str | None) -> dict[str, str] | None:
    if path is None:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CkptError(f"cannot read --map file: {exc.strerror or exc}", path) from None
    except json.JSONDecodeError as exc:
        raise CkptError(f"--map file is not valid JSON: {exc}", path) from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise CkptError('--map file must be a JSON object {"old name": "new name", ...}', path)
    return data


@click.command()
@click.argument("src", type=click.Path(path_type=str))
@click.argument("dst", type=click.Path(path_type=str))
@click.option("--sub", "subs", nargs=2, multiple=True, metavar="PATTERN REPL",
              help="Regex substitution applied to every name, in the order given (repeatable).")
@click.option("--drop", "drops", multiple=True, metavar="PATTERN", help="Remove tensors whose name matches (regex).")
@click.option("--map", "map_file", metavar="FILE.json", help='Explicit {"old": "new"} table.')
@click.option("--dry-run", is_flag=True, help="Print the plan and write nothing.")
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
def rename(src: str, dst: str, subs: tuple[tuple[str, str], ...], drops: tuple[str, ...], map_file: str | None,
           dry_run: bool, overwrite: bool, as_json: bool) -> None:
    """Rename (or drop) tensors; tensor bytes are copied verbatim, SRC is never modified."""
    from ckptscope.core.units import human_bytes
    from ckptscope.ops.rename.engine import execute_rename, plan_rename
    from ckptscope.ops.rename.torch import needs_torch

    if map_file:  # the table is read, never written over (--overwrite names the destination only)
        from pathlib import Path

        from ckptscope.ops.atomic import check_destination

        check_destination(Path(src), Path(dst), overwrite=overwrite, inputs=(Path(map_file),))
    plan = plan_rename(src, dst, subs=subs, drops=drops, mapping=_load_map(map_file), overwrite=overwrite)
    if not dry_run and needs_torch(plan) and importlib.util.find_spec("torch") is None:
        raise ImportError("rewriting a torch.save file needs torch", name="torch")  # the CLI's one line
    if as_json:
        click.echo(json.dumps({**plan.to_json(), "dry_run": dry_run}))
    else:
        changes = plan.changes
        click.echo(f"{len(changes.renamed)} renamed, {len(changes.dropped)} dropped, "
                   f"{len(changes.untouched)} untouched ({plan.format}, {human_bytes(plan.total_bytes)} to write)")
        for old, new in changes.renamed.items():
            click.echo(f"  {old} -> {new}")
        for old in changes.dropped:
            click.echo(f"  {old} -> (dropped)")
    if dry_run:
        click.echo("dry run: nothing written", err=True)
        return
    from ckptscope.cli.progress import byte_progress

    with byte_progress("renaming", plan.total_bytes, quiet=as_json) as update:
        execute_rename(plan, progress=None if update is None else lambda done, total: update(done))
    click.echo(f"wrote {plan.dst}", err=True)
