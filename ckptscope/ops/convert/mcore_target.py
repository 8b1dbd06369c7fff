"""The Megatron-Core target of ``convert``: a save root with ``iter_NNNNNNN/`` in torch_dist or in
per-rank ``--ckpt-format torch`` files, and the tracker written last.

The work comes in two steps so that processes can share it (``ops.parallel``): the data files
(``write_mcore_files``, all of them or a subset; each file's bytes depend on the plan alone) and,
once all are written, the files that mark the save complete (``finish_mcore``).
"""

from __future__ import annotations

from pathlib import Path

from ckptscope.ops.convert.plan import ConvertPlan
from ckptscope.ops.convert.streaming import Prefetcher, Progress, clear_failure, file_runs, note_failure, produce, tracked


def write_mcore(plan: ConvertPlan, out: Path, progress: Progress | None = None) -> None:
    crcs = write_mcore_files(plan, out, None, progress)
    finish_mcore(plan, out, crcs)


def iter_dir_name(plan: ConvertPlan) -> str:
    return f"iter_{plan.iteration:07d}"


def mcore_file_bytes(plan: ConvertPlan) -> dict[str, int]:
    """Bytes of each data file relative to the iteration dir (what a split of the work balances)."""
    from ckptscope.formats.megatron.legacy_writer import legacy_file_bytes

    if plan.ckpt_format == "torch":
        return legacy_file_bytes(_bare_tensors(plan), args=dict(plan.megatron_args or {}), tp=plan.tp, pp=plan.pp,
                                 ep=plan.ep, spec=plan.spec)
    layout = _dist_layout(plan, _bare_tensors(plan))
    return dict(zip(layout.file_names, layout.file_sizes))


def write_mcore_files(plan: ConvertPlan, out: Path, files: set[str] | None = None,
                      progress: Progress | None = None) -> dict[int, int]:
    """Write the data files ``files`` (names relative to the iteration dir, all by default) into
    ``out/iter_NNNNNNN``; returns the CRC-32 of each torch_dist item written (none for torch)."""
    from ckptscope.formats.megatron.dist_writer import OutTensor, write_dist_files
    from ckptscope.formats.megatron.legacy_writer import write_torch_legacy

    iter_dir = out / iter_dir_name(plan)
    iter_dir.mkdir(exist_ok=True)
    clear_failure()
    step = _step(plan, progress)
    if plan.ckpt_format == "torch":  # per-rank files revisit each tensor: no read-ahead
        tensors = [OutTensor(t.name, t.shape, t.dtype, tracked(t.name, lambda t=t: produce(plan, t)))
                   for t in plan.tensors]
        write_torch_legacy(iter_dir, tensors, args=dict(plan.megatron_args or {}), iteration=plan.iteration,
                           tp=plan.tp, pp=plan.pp, ep=plan.ep, spec=plan.spec, progress=step, files=files)
        return {}
    runs = {t.name: file_runs(plan, t) for t in plan.tensors}
    ahead: dict[str, Prefetcher] = {}
    tensors = [OutTensor(t.name, t.shape, t.dtype, tracked(t.name, lambda t=t: ahead["p"].get(t)),
                         tracked(t.name, lambda t=t: runs[t.name])) for t in plan.tensors]
    layout = _dist_layout(plan, tensors)
    wanted = None if files is None else {k for k, name in enumerate(layout.file_names) if name in files}
    by_name = {t.name: t for t in plan.tensors}
    mine = layout.entries_in(set(range(len(layout.file_names))) if wanted is None else wanted)
    order = [by_name[layout.model.entries[e].out.name] for e in mine]
    with Prefetcher(plan, [t for t in order if runs[t.name] is None]) as prefetcher:
        ahead["p"] = prefetcher
        return write_dist_files(iter_dir, layout, wanted, progress=step, on_failure=note_failure)


def finish_mcore(plan: ConvertPlan, out: Path, crcs: dict[int, int]) -> None:
    """torch_dist: ``.metadata``, ``common.pt`` and ``metadata.json`` from every item's CRC; then the
    tracker, last of all."""
    from ckptscope.formats.megatron.dist_writer import finish_torch_dist

    iter_dir = out / iter_dir_name(plan)
    if plan.ckpt_format != "torch":
        final = Path(plan.dst).resolve() / iter_dir.name  # .metadata records where it will live, not the temp dir
        finish_torch_dist(iter_dir, _dist_layout(plan, _bare_tensors(plan)), crcs,
                          args=dict(plan.megatron_args or {}), iteration=plan.iteration, checkpoint_id=str(final))
    (out / "latest_checkpointed_iteration.txt").write_text(f"{plan.iteration}\n")


def _bare_tensors(plan: ConvertPlan) -> list:
    """The plan's tensors for layout questions only (producing one is a bug)."""
    from ckptscope.formats.megatron.dist_writer import OutTensor

    def never():
        raise RuntimeError("a layout-only tensor was asked for its values")

    return [OutTensor(t.name, t.shape, t.dtype, never) for t in plan.tensors]


def _dist_layout(plan: ConvertPlan, tensors: list):
    from ckptscope.formats.megatron.dist_writer import plan_torch_dist

    return plan_torch_dist(tensors, args=dict(plan.megatron_args or {}), spec=plan.spec, num_files=plan.num_files)


def _step(plan: ConvertPlan, progress: Progress | None):
    """The writers' ``progress(nbytes)`` as the CLI's ``progress(name, nbytes)``. The writers call it
    once per tensor written (model_layout.Progress), so the bar counts tensors; the i-th call is named
    after plan.tensors[i], which is exact for a one-process write (a rank's share is counted, not named)."""
    written = iter(plan.tensors)

    def step(nbytes) -> None:
        if progress:
            t = next(written, None)
            progress(t.name if t else "", int(nbytes or 0))
        if plan.ckpt_format == "torch":  # tensors come whole and are sliced per rank: drop their pages
            plan.reader.release_pages()

    return step
