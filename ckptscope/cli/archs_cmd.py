"""``ckptscope archs [NAME]``: the architectures ckptscope maps between HF and Megatron-Core, tensor by
tensor, with the transform and the parallel splits, read from the mapping tables (ops.archs)."""

from __future__ import annotations

import json
import sys

import click


@click.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the human view.")
def archs(name: str | None, as_json: bool) -> None:
    """List the supported architectures: every tensor's HF name <-> Megatron-Core name, the transform
    between them and how TP (column/row), EP and PP (by layer) split it.

    `ckptscope archs NAME` shows one architecture with the Megatron aliases read too (local spec,
    grouped and stacked experts) and the model-level facts a conversion carries. Generated from the
    same tables convert and diff use.
    """
    from ckptscope.ops.archs import arch_info, list_archs

    infos = [arch_info(name)] if name else list_archs()
    if as_json:
        doc = infos[0].to_json() if name else {"archs": [i.to_json() for i in infos]}
        click.echo(json.dumps(doc, indent=2 if sys.stdout.isatty() else None))
        return
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from ckptscope.cli.console import fits, stdout_console

    console = stdout_console()
    for info in infos:
        types = ", ".join(info.model_types) or "-"
        console.print(Text.assemble((info.name, "bold"), f"  {info.hf_class}  (model_type: {types})"))
        table = Table(box=None, pad_edge=False, show_edge=False)
        for column in ("HF", "Megatron-Core", "transform", "TP", "EP", "PP"):
            table.add_column(column, no_wrap=True)
        rows = []
        for t in info.tensors:
            mcore = [t.mcore]
            if name:  # detail: every spelling read, and the local spec's per-rank name
                mcore += [f"  also {a}" for a in t.aliases] + ([f"  local spec (torch files): {t.local}"]
                                                                if t.local else [])
                mcore += [f"  only in {t.layers}"] if t.layers else []
            rows.append((t, mcore))
            cells = ("\n".join(t.hf), "\n".join(mcore), t.transform, t.tp, "experts" if t.ep else "-", t.pp)
            table.add_row(*(escape(c) for c in cells))  # names hold [{e}] and [gate_t; up_t]: not markup
        if fits(console, table):
            console.print(table)
        else:  # narrower than the names: one block per rule, every name whole on its own line
            for t, mcore in rows:
                for hf in t.hf:
                    console.print(Text(hf, style="bold"), soft_wrap=True)
                console.print(Text("  <-> " + mcore[0]), soft_wrap=True)
                for extra in mcore[1:]:
                    console.print(Text("    " + extra), soft_wrap=True)
                console.print(Text(f"  transform {t.transform}, TP {t.tp}, EP {'experts' if t.ep else '-'}, "
                                   f"PP {t.pp}", style="dim"))
        for fact in info.facts:
            console.print(Text.assemble(("  note ", "dim"), fact))
        if name is None:
            console.print()
