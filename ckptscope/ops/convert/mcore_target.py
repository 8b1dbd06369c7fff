"""The Megatron-Core target of ``convert``: a save root with ``iter_NNNNNNN/`` in torch_dist or in
per-rank ``--ckpt-format torch`` files, and the tracker written last.
"""

from __future__ import annotations

from pathlib import Path

from ckptscope.ops.convert.plan import ConvertPlan
from ckptscope.ops.convert.streaming import Prefetcher, Progress, file_runs, produce


def write_mcore(plan: ConvertPlan, out: Path, progress: Progress | None = None) -> None:
    from ckptscope.formats.megatron.dist_writer import OutTensor

    iter_dir = out / f"iter_{plan.iteration:07d}"
    iter_dir.mkdir()
    if plan.ckpt_format == "torch":  # per-rank files revisit each tensor: no read-ahead
        tensors = [OutTensor(t.name, t.shape, t.dtype, (lambda t=t: produce(plan, t))) for t in plan.tensors]
        _write_mcore(plan, out, iter_dir, tensors, progress)
        return
    runs = {t.name: file_runs(plan, t) for t in plan.tensors}
    order = [t for t in plan.tensors if runs[t.name] is None]
    with Prefetcher(plan, order) as ahead:
        tensors = [OutTensor(t.name, t.shape, t.dtype, (lambda t=t: ahead.get(t)), (lambda t=t: runs[t.name]))
                   for t in plan.tensors]
        _write_mcore(plan, out, iter_dir, tensors, progress)


def _write_mcore(plan: ConvertPlan, out: Path, iter_dir: Path, tensors: list, progress: Progress | None) -> None:
    from ckptscope.formats.megatron.dist_writer import write_torch_dist, write_torch_legacy

    # The Megatron writers call progress(nbytes) once per OutTensor, in the order given
    # (model_layout.Progress): the i-th call is plan.tensors[i], so the bar can count tensors.
    written = iter(plan.tensors)

    def step(nbytes: int) -> None:
        if progress:
            t = next(written, None)
            progress(t.name if t else "", int(nbytes or 0))
        if plan.ckpt_format == "torch":  # tensors come whole and are sliced per rank: drop their pages
            plan.reader.release_pages()

    args = dict(plan.megatron_args or {})
    if plan.ckpt_format == "torch":
        write_torch_legacy(iter_dir, tensors, args=args, iteration=plan.iteration, tp=plan.tp, pp=plan.pp,
                           ep=plan.ep, spec=plan.spec, progress=step)
    else:
        final = Path(plan.dst).resolve() / iter_dir.name  # .metadata records where it will live, not the temp dir
        write_torch_dist(iter_dir, tensors, args=args, iteration=plan.iteration, spec=plan.spec, progress=step,
                         checkpoint_id=str(final))
    (out / "latest_checkpointed_iteration.txt").write_text(f"{plan.iteration}\n")
