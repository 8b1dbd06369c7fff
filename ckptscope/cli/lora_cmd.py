"""``ckptscope lora stats|merge``: PEFT LoRA adapters (``adapter_model.safetensors`` + ``adapter_config.json``)."""

from __future__ import annotations

import json

import click

from ckptscope.core.units import plural


def _adapter_of(path: str) -> str:
    """A Trainer output dir of PEFT checkpoints (``checkpoint-N/adapter_config.json``) stands for its
    newest complete checkpoint, as it does for inspect and diff; said on stderr."""
    from pathlib import Path

    from ckptscope.core.errors import CkptError
    from ckptscope.ops.roots import resolve_root

    given = Path(path)
    if not given.is_dir() or (given / "adapter_config.json").is_file():
        return path
    try:
        chosen = Path(resolve_root(given))
    except CkptError:
        return path
    if chosen != given and (chosen / "adapter_config.json").is_file():
        click.echo(f"{path}: using {chosen.name}, its newest complete checkpoint", err=True)
        return str(chosen)
    return path


@click.group()
def lora() -> None:
    """PEFT LoRA adapters: effective rank of each A/B pair, merge into the base model."""


@lora.command()
@click.argument("adapter", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--rtol", type=float, default=None, metavar="RTOL",
              help="Count singular values above RTOL x s_max (default: numpy matrix_rank's "
                   "s_max x max(out, in) x eps(float64)).")
def stats(adapter: str, as_json: bool, rtol: float | None) -> None:
    """Singular values and numerical rank of B @ A (float64 SVD) for every LoRA pair."""
    from ckptscope.ops.lora import SV_SHOWN, lora_stats

    adapter = _adapter_of(adapter)
    summary, pairs = lora_stats(adapter, rtol=rtol)
    for warning in summary.get("warnings", []):  # an incomplete pair is not among the pairs listed: say why
        click.echo(f"warning: {warning}", err=True)
    if as_json:
        click.echo(json.dumps({"path": adapter, **summary, "pairs": [p.to_json() for p in pairs]}))
        return
    scale = "alpha/sqrt(r)" if summary["use_rslora"] else "alpha/r"
    click.echo(f"{plural(len(pairs), 'LoRA pair')}, r={summary['r']}, lora_alpha={summary['lora_alpha']}, scale {scale}; "
               f"rank counts singular values of B@A above {summary['tolerance']}")
    for p in pairs:
        shown = " ".join(f"{s:.4g}" for s in p.singular_values[:SV_SHOWN])
        more = " ..." if len(p.singular_values) > SV_SHOWN else ""
        click.echo(f"{p.module}  {p.shape[0]}x{p.shape[1]}  r={p.r} alpha={p.lora_alpha:g} scale={p.scaling:.4g}  "
                   f"rank {p.rank}/{p.r}  stable rank {p.stable_rank:.2f}  |scale*BA|_F {p.delta_fro:.4g}  "
                   f"s: {shown}{more} (tol {p.tol:.3g}, {p.method})")


@lora.command()
@click.argument("adapter", type=click.Path(path_type=str))
@click.argument("base", type=click.Path(path_type=str))
@click.argument("out", type=click.Path(path_type=str))
@click.option("--dtype", type=click.Choice(["keep", "float32"]), default="keep", show_default=True,
              help="Output dtype: the base's own, or float32 for every float tensor.")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
def merge(adapter: str, base: str, out: str, dtype: str, overwrite: bool, as_json: bool) -> None:
    """Write BASE with the adapter merged (W + scale * B @ A), as PEFT's merge_and_unload() does.

    OUT is an HF safetensors dir (config and tokenizer files copied from BASE), written atomically.
    DoRA, embedding/conv LoRA, modules_to_save and trainable tokens are refused (exit 2)."""
    from ckptscope.core.units import human_bytes
    from ckptscope.ops.lora import execute_merge, plan_merge

    plan = plan_merge(_adapter_of(adapter), base, out, dtype=dtype, overwrite=overwrite)
    execute_merge(plan)
    if as_json:
        click.echo(json.dumps(plan.to_json()))
    else:
        click.echo(f"merged {len(plan.merged)} of {plural(len(plan.tensors), 'tensor')} ({human_bytes(plan.total_bytes)}, "
                   f"{plural(len(plan.shards), 'shard')})")
    click.echo(f"wrote {plan.out}", err=True)
