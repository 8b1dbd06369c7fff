"""``ckptscope convert | merge | verify``: HF <-> Megatron-Core conversion, shard merging, round trips.

stdout carries the plan (``--dry-run``) or the result; progress (tensors, bytes, rate) goes to stderr.
"""

from __future__ import annotations

import json
import sys

import click

from ckptscope.cli.parallel import group, not_first_rank, relaunch_if_asked, workers_option
from ckptscope.cli.roots_view import iteration_option, resolve_path
from ckptscope.core.errors import CkptError

EXIT_DIFFERENT = 1


def _progress(total_tensors: int, total_bytes: int, quiet: bool):
    """The shared byte bar (cli/progress.py) as a context, and the writer's per-tensor callback."""
    from contextlib import ExitStack

    from ckptscope.cli.progress import byte_progress

    stack = ExitStack()
    update = stack.enter_context(byte_progress("writing", total_bytes, quiet=quiet, count=total_tensors))
    if update is None:
        return stack, None
    state = {"n": 0, "bytes": 0}

    def step(name: str, nbytes: int) -> None:  # the writers call it once per tensor written (streaming.Progress)
        state["n"] = min(total_tensors, state["n"] + 1)
        state["bytes"] += nbytes
        update(state["bytes"], state["n"])

    return stack, step


def print_plan(plan, as_json: bool) -> None:
    from ckptscope.core.units import human_bytes, plural

    if as_json:
        click.echo(json.dumps(plan.to_json()))
        return
    data = plan.to_json()
    click.echo(f"{plan.src} -> {plan.dst}: to {plan.target} ({data['format']}), arch {plan.arch}, "
               f"{plural(len(plan.tensors), 'tensor')}, {human_bytes(plan.total_bytes)}"
               + (f", tp {plan.tp} pp {plan.pp}" + (f" ep {plan.ep}" if plan.ep > 1 else "") if plan.target == "mcore"
                  else f", {plural(len(plan.shards), 'file')}"))
    for note in plan.notes:
        click.echo(f"note: {note}")
    for t in data["tensors"]:
        shown = t["sources"] if len(t["sources"]) <= 8 else t["sources"][:3]  # transposed tensors: a piece per row
        sources = " + ".join(_source_text(s) for s in shown)
        if len(shown) < len(t["sources"]):
            sources += f" + ... ({len(t['sources'])} pieces)"
        extra = f" [{', '.join(t['transforms'])}]"
        zero = f" zero rows {t['zero_rows']}" if t["zero_rows"] else ""
        click.echo(f"  {t['name']} {tuple(t['shape'])} {t['dtype']} <- {sources}{extra}{zero}")
    for name in data["copies"]:
        click.echo(f"  copy {name}")
    if plan.dropped:
        click.echo(f"  not written: {plural(len(plan.dropped), 'entry', 'entries')} ({', '.join(plan.dropped[:5])}{', ...' if len(plan.dropped) > 5 else ''})")


def _source_text(source: dict) -> str:
    box = source["box"]
    return source["source"] + "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


def _one_process_merge(merge_lora: bool, workers: int | None) -> None:
    """--merge-lora with --workers: said once, before any worker starts (each rank said it)."""
    if merge_lora and workers and workers > 1:
        raise CkptError("--merge-lora runs in one process (the merge reads the whole adapter); run it without "
                        "torchrun or --workers")


def _check_against_given(src: str, dst: str, overwrite: bool) -> None:
    """The destination against the path the user named: a save root's iteration is what is read, but
    writing into the root (``merge ROOT ROOT/merged``) would still put the output in the source tree."""
    from pathlib import Path

    from ckptscope.ops.atomic import check_destination

    check_destination(Path(src), Path(dst), overwrite=overwrite)


def run_convert(src: str, dst: str, *, to: str, tp: int = 1, pp: int = 1, ep: int = 1, spec: str = "local",
                ckpt_format: str = "torch_dist",
                dtype: str = "keep", hf_config: str | None = None, arch: str | None = None,
                max_shard_size: str = "5GB", dry_run: bool = False, overwrite: bool = False, as_json: bool = False,
                trust_pickle: bool = False, quiet: bool = False, skip_unknown: bool = False,
                hf_experts: str = "per-expert", num_files: int = 2, merge_lora: bool = False) -> None:
    from ckptscope.ops.convert.execute import execute_convert
    from ckptscope.ops.convert.plan import plan_convert

    plan = plan_convert(src, dst, to=to, tp=tp, pp=pp, ep=ep, spec=spec, ckpt_format=ckpt_format, dtype=dtype,
                        hf_config=hf_config,
                        arch=arch, max_shard_size=max_shard_size, trust_pickle=trust_pickle,
                        skip_unknown=skip_unknown, hf_experts=hf_experts, merge_lora=merge_lora)
    plan.num_files = num_files
    ranks = None if dry_run else group()
    if ranks is not None and merge_lora:
        raise CkptError("--merge-lora runs in one process (the merge reads the whole adapter); run it without "
                        "torchrun or --workers")
    if ranks is not None and ranks.rank != 0:
        quiet = True
    if dry_run:
        if not_first_rank():  # under torchrun every rank plans; one prints
            return
        print_plan(plan, as_json)
        return
    if ranks is None:
        context, step = _progress(len(plan.tensors), plan.total_bytes, quiet or as_json)
        with context:
            execute_convert(plan, overwrite=overwrite, progress=step)
    else:  # this rank's files only; rank 0 finishes the output (ops/parallel/convert.py)
        from ckptscope.ops.parallel.convert import execute_convert_parallel, output_files, share

        files = len(output_files(plan))
        if files < ranks.world and ranks.rank == 0:
            knob = "--max-shard-size" if plan.target == "hf" else "--num-files" if plan.ckpt_format != "torch" else ""
            click.echo(f"note: {ranks.world} ranks share {files} output file(s): {ranks.world - files} have nothing to "
                       f"write" + (f" (a smaller {knob} gives more files)" if knob == "--max-shard-size" else
                                   f" (raise {knob})" if knob else ""), err=True)
        context, step = _progress(0, share(plan, ranks)[1], quiet or as_json)
        with context:
            execute_convert_parallel(plan, ranks, overwrite=overwrite, progress=step)
        if quiet:
            return
    if as_json:
        click.echo(json.dumps({**plan.to_json(), "written": True}))
    elif not quiet:
        from ckptscope.core.units import human_bytes, plural

        for caveat in plan.caveats:
            click.echo(f"warning: {caveat}", err=True)

        click.echo(f"wrote {dst}: {plural(len(plan.tensors), 'tensor')}, {human_bytes(plan.total_bytes)} ({plan.target}, "
                   f"{plan.ckpt_format if plan.target == 'mcore' else 'safetensors'})")


_common = [
    click.option("--dtype", type=click.Choice(["keep", "bfloat16", "float16", "float32"]), default="keep",
                 show_default=True, help="Output dtype (never a silent cast: keep is the default)."),
    click.option("--hf-config", type=click.Path(path_type=str), help="Directory with the HF config.json to use."),
    click.option("--arch", help="Architecture when the checkpoint does not say (llama, qwen2, qwen3, mixtral, ...)."),
    click.option("--max-shard-size", default="5GB", show_default=True, help="HF output shard size."),
    click.option("--dry-run", is_flag=True, help="Print the plan (each tensor, its sources, transforms); write nothing."),
    click.option("--overwrite", is_flag=True, help="Replace DST if it exists."),
    click.option("--json", "as_json", is_flag=True, help="Print the plan/result as one JSON object."),
    click.option("--trust-pickle", is_flag=True, help="Load pickles with torch.load(weights_only=False)."),
    click.option("--skip-unknown", is_flag=True,
                 help="Leave out entries that are neither model weights nor known training state (listed in "
                      "the plan) instead of refusing."),
    iteration_option(),
    workers_option,
    click.option("--merge-lora", is_flag=True,
                 help="A LoRA training save (PEFT-wrapped, as verl saves it): merge the adapter into the weights "
                      "written, instead of writing it apart as lora_adapter/ (verl's merger)."),
]


def common_options(fn):
    for option in reversed(_common):
        fn = option(fn)
    return fn


@click.command()
@click.argument("src", type=click.Path(path_type=str))
@click.argument("dst", type=click.Path(path_type=str))
@click.option("--to", "to", type=click.Choice(["hf", "mcore"]), required=True, help="Target format family.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor parallel size (mcore).")
@click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True, help="Pipeline parallel size (mcore).")
@click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True,
              help="Expert parallel size (MoE, --ckpt-format torch: one mp_rank_TT_PPP_EEE dir per expert rank).")
@click.option("--ckpt-format", type=click.Choice(["torch_dist", "torch"]), default="torch_dist", show_default=True)
@click.option("--spec", type=click.Choice(["local", "te"]), default="local", show_default=True,
              help="Megatron-Core layer spec to name the output for (te: Transformer Engine layers).")
@click.option("--hf-experts", type=click.Choice(["per-expert", "fused"]), default="per-expert", show_default=True,
              help="MoE experts in the HF output: per expert (save_pretrained) or fused 3-D (transformers v5 in memory).")
@click.option("--num-files", type=click.IntRange(min=1), default=2, show_default=True,
              help="torch_dist data files (__0_K.distcp): how many ranks can share the writing. The bytes depend on "
                   "this, never on the number of ranks.")
@common_options
def convert(src, dst, to, tp, pp, ep, spec, ckpt_format, hf_experts, num_files, dtype, hf_config, arch, max_shard_size,
            dry_run, overwrite, as_json, trust_pickle, skip_unknown, iteration, workers, merge_lora) -> None:
    """Convert SRC to HF safetensors or to a Megatron-Core save root (torch_dist or per-rank torch).

    SRC may be a save root: its latest complete iteration is converted, or --iteration N. Under
    torchrun (or with --workers P) the output files are shared out between the ranks."""
    if to == "hf" and (tp != 1 or pp != 1 or ep != 1 or spec != "local"):
        raise CkptError("--tp/--pp/--ep/--spec only apply to --to mcore")
    _one_process_merge(merge_lora, workers)
    if not dry_run:
        relaunch_if_asked(workers)
    resolved = resolve_path(src, iteration)
    if not dry_run:
        _check_against_given(src, dst, overwrite)
    run_convert(resolved, dst, to=to, tp=tp, pp=pp, ep=ep, spec=spec, ckpt_format=ckpt_format,
                dtype=dtype, hf_config=hf_config, arch=arch,
                max_shard_size=max_shard_size, dry_run=dry_run, overwrite=overwrite, as_json=as_json,
                trust_pickle=trust_pickle, skip_unknown=skip_unknown, hf_experts=hf_experts, num_files=num_files,
                merge_lora=merge_lora)


@click.command()
@click.argument("src", type=click.Path(path_type=str))
@click.argument("dst", type=click.Path(path_type=str))
@common_options
def merge(src, dst, dtype, hf_config, arch, max_shard_size, dry_run, overwrite, as_json, trust_pickle, skip_unknown,
          iteration, workers, merge_lora) -> None:
    """Merge sharded training checkpoints (verl FSDP, Megatron TP/PP or torch_dist, DCP) into one HF model.

    SRC may be a save root: its latest complete iteration is merged, or --iteration N. Under
    torchrun (or with --workers P) the shards are shared out between the ranks."""
    _one_process_merge(merge_lora, workers)
    if not dry_run:
        relaunch_if_asked(workers)
    resolved = resolve_path(src, iteration)
    if not dry_run:
        _check_against_given(src, dst, overwrite)
    run_convert(resolved, dst, to="hf", dtype=dtype, hf_config=hf_config, arch=arch,
                max_shard_size=max_shard_size, dry_run=dry_run, overwrite=overwrite, as_json=as_json,
                trust_pickle=trust_pickle, skip_unknown=skip_unknown, merge_lora=merge_lora)


@click.command()
@click.argument("src", type=click.Path(path_type=str))
@click.option("--via", type=click.Choice(["mcore", "hf"]), default=None,
              help="The format in between  [default: the other family: mcore for an HF source, hf for a Megatron one]")
@click.option("--tp", type=click.IntRange(min=1), default=None,
              help="Tensor parallel size of the Megatron leg (whichever way it runs)  [default: a Megatron "
                   "source's own when the way back writes Megatron, else 1]")
@click.option("--pp", type=click.IntRange(min=1), default=None,
              help="Pipeline parallel size of the Megatron leg  [default: a Megatron source's own when the way "
                   "back writes Megatron, else 1]")
@click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True,
              help="Expert parallel size of the Megatron leg (MoE, torch).")
@click.option("--spec", type=click.Choice(["local", "te"]), default="local", show_default=True,
              help="Megatron-Core layer spec of the Megatron leg.")
@click.option("--ckpt-format", type=click.Choice(["torch_dist", "torch"]), default="torch_dist", show_default=True,
              help="Megatron format of the Megatron leg.")
@click.option("--arch", help="Architecture when the checkpoint does not say.")
@click.option("--hf-config", type=click.Path(path_type=str), help="Directory with the HF config.json to use.")
@click.option("--json", "as_json", is_flag=True, help="Print the diff report as one JSON object.")
@click.option("--skip-unknown", is_flag=True,
              help="Leave out (and do not compare) entries that are neither model weights nor known training state.")
@iteration_option()
@workers_option
def verify(src, via, tp, pp, ep, spec, ckpt_format, arch, hf_config, as_json, skip_unknown, iteration, workers) -> None:
    """Convert SRC to the target and back in a temp dir, then diff bitwise. Exit 0 iff identical.

    SRC may be a save root: its latest complete iteration is verified, or --iteration N. Under
    torchrun (or with --workers P) both conversions and the diff are shared out between the ranks
    (the temp dir must then be on a filesystem all of them see: TMPDIR)."""
    from ckptscope.cli.diff_cmd import print_report
    from ckptscope.ops.verify import verify_round_trip

    relaunch_if_asked(workers)
    ranks = group()
    report = verify_round_trip(resolve_path(src, iteration), via=via, tp=tp, pp=pp, ep=ep, spec=spec,
                               ckpt_format=ckpt_format, arch=arch, hf_config=hf_config, skip_unknown=skip_unknown,
                               group=ranks)
    if ranks is not None:  # settled by verify_round_trip: SIGTERM no longer cuts rank 0's report short
        identical = ranks.broadcast(report.identical if report is not None else None, "sharing the verdict")
        if report is None:
            sys.exit(0 if identical else EXIT_DIFFERENT)
    if as_json:
        click.echo(json.dumps(report.to_json(), allow_nan=False))
    else:
        print_report(report, top=50)
    sys.exit(0 if report.identical else EXIT_DIFFERENT)
