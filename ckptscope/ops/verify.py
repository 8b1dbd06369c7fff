"""``ckptscope verify``: convert to a target and back in a temporary directory, then diff bitwise.

A round trip alone can hide a symmetric bug (MAPPING.md P2), which is why the mapping layer has a
single source of truth and why the tests also compare against independently converted checkpoints;
``verify`` is the user's quick proof that nothing is lost or changed on the way.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ckptscope.core.errors import CkptError
from ckptscope.core.roles import naming_family
from ckptscope.formats.registry import open_checkpoint
from ckptscope.ops.atomic import owned_temp_dir
from ckptscope.ops.config_check import config_differences
from ckptscope.ops.convert.execute import execute_convert
from ckptscope.ops.convert.plan import plan_convert
from ckptscope.ops.diff.engine import DiffOptions, DiffReport, PairResult, diff_checkpoints
from ckptscope.ops.diff.plan import plan_diff
from ckptscope.ops.model import model_entries
from ckptscope.ops.roots import resolve_root

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.ops.parallel.group import Group


def verify_round_trip(src: str | Path, *, via: str | None = None, tp: int | None = None, pp: int | None = None,
                      ep: int = 1, spec: str = "local", ckpt_format: str = "torch_dist", arch: str | None = None,
                      hf_config: str | Path | None = None, skip_unknown: bool = False,
                      group: Group | None = None) -> DiffReport | None:
    """SRC's model -> ``via`` -> back to SRC's family, compared with SRC's model bit for bit (dtypes
    included). Training state is neither converted nor compared; unknown entries refuse, or with
    ``skip_unknown`` are left out of both.

    ``via`` defaults to the other family: ``mcore`` for an HF source, ``hf`` for a Megatron one (a
    Megatron source went mcore -> mcore -> hf before, a reshard and an export, not a round trip).
    The Megatron options (tp, pp, ep, spec, ckpt_format) apply to whichever leg writes Megatron; tp and
    pp default, on the way back from HF, to a Megatron source's own (its vocabulary is padded for its
    TP: a TP=2 save's 256 rows came back as 128 at TP 1, a shape mismatch that was no loss), else 1.

    A Megatron source's vocab padding rows cannot pass through HF: when they held values they come
    back as zeros, and the whole vocab tensors differ while their ``[:vocab_size]`` pairs are equal;
    the report says so in a note of its own.

    With a torchrun ``group`` (ops/parallel) every rank shares both conversions and the diff, in a
    temp dir rank 0 makes (on a filesystem all ranks see: ``TMPDIR``); the report comes back on rank
    0 and None elsewhere (``verified_identical`` gives every rank the verdict)."""
    family, saved_tp, saved_pp, divisible = source_facts(src)
    via = via or ("hf" if family == "mcore" else "mcore")
    back_to = "hf" if via == "mcore" else "mcore"
    if family == "mcore" and via == "hf":
        tp, pp = tp or saved_tp or 1, pp or saved_pp or 1
    tp, pp = tp or 1, pp or 1
    megatron = {"tp": tp, "pp": pp, "ep": ep, "spec": spec, "ckpt_format": ckpt_format}
    tmp = _shared_tmp(group)
    try:
        there, back = Path(tmp) / "there", Path(tmp) / "back"
        first = plan_convert(src, there, to=via, arch=arch, hf_config=hf_config, skip_unknown=skip_unknown,
                             **(megatron if via == "mcore" else {}))
        _convert(first, group)
        try:
            back_plan = plan_convert(there, back, to=back_to, arch=arch, hf_config=hf_config,
                                     **(megatron | {"vocab_divisible_by": divisible} if back_to == "mcore" else {}))
        except CkptError as exc:  # the way back failed on our own temp copy: name the leg, not the temp dir
            raise CkptError(f"the way back ({via} -> {back_to}) failed: {exc.problem}", src) from None
        _convert(back_plan, group)
        plan = plan_diff(src, back, mapping="auto", compare_unknown=not skip_unknown)
        if group is None:
            report: DiffReport | None = diff_checkpoints(plan, DiffOptions(device="cpu"))
        else:
            from ckptscope.ops.parallel.diff import diff_parallel

            report, _ = diff_parallel(plan, DiffOptions(device="cpu"), group)
        if report is not None and back_to == "hf":  # (the diff compared the facts both configs say)
            seen = {result.name for result in report.results}
            report.results += [r for r in config_results(Path(resolve_root(src)), back) if r.name not in seen]
        if report is not None and back_to == "mcore":
            report.notes += padding_only_note(report)
    finally:
        if group is not None:
            group.settle()
        if group is None or group.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
    if report is None:
        return None
    layout = f"tp {tp}, pp {pp}" + (f", ep {ep}" if ep > 1 else "") + (", te spec" if spec == "te" else "")
    legs = [f"{leg} ({layout}, {ckpt_format})" if leg == "mcore" else leg for leg in (via, back_to)]
    report.a, report.b = str(src), f"{src} -> {legs[0]} -> {legs[1]}"
    return report


def source_facts(src: str | Path) -> tuple[str, int | None, int | None, int | None]:
    """(``mcore`` when SRC's model has Megatron-Core names else ``hf``; the TP size, PP size and
    ``make_vocab_size_divisible_by`` its Megatron args record, or None): what ``via`` goes away from,
    and the layout to come back to."""
    with open_checkpoint(resolve_root(src)) as reader:
        index = reader.index()
        family = naming_family(model_entries(index).tensors)
    # Megatron-LM's args, else verl's transformer_config.json (its TransformerConfig: the TP and PP sizes
    # too; a probe's TP2 verl save came back at TP 1)
    args = next((o.value for name in ("args", "transformer_config") for o in index.objects
                 if o.name == name and isinstance(o.value, dict)), {})
    keys = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "make_vocab_size_divisible_by")
    tp, pp, divisible = (size if isinstance(size, int) and size > 0 else None for size in map(args.get, keys))
    return ("mcore" if family == "mcore" else "hf"), tp, pp, divisible


def padding_only_note(report: DiffReport) -> list[str]:
    """When the only differences are whole vocab tensors whose real rows (the ``[:vocab_size]`` pairs)
    came back equal: one note saying that the padding rows are what changed, and why."""
    status = {r.name: r.status for r in report.results}
    differing = [name for name, s in status.items() if s not in ("equal", "renamed")]
    rows = {name: next((n for n in status if n.startswith(name + "[:")), None) for name in differing}
    if not differing or any(pair is None or status[pair] != "equal" for pair in rows.values()):
        return []
    if any(status[name] == "shape_mismatch" for name in differing):  # --tp N pads to another size
        return [f"only the vocab padding differs ({', '.join(differing)}): the way back padded the vocabulary to "
                f"another size (its TP and make_vocab_size_divisible_by); the real vocabulary came back identical"]
    return [f"only the vocab padding rows differ ({', '.join(differing)}): HF has no place for them, so a Megatron -> "
            f"HF -> Megatron round trip writes them as zeros; the real vocabulary came back identical"]


def config_results(src: Path, back: Path) -> list[PairResult]:
    """One ``different`` result per fact of the source's config.json that the round trip's config says
    otherwise (``ops.config_check``): equal tensors under another activation are another model."""
    import json

    return [PairResult(f"config.json: {fact}", json.dumps(before), json.dumps(after), "different")
            for fact, before, after in config_differences(src, back)]


def _shared_tmp(group: Group | None) -> str:
    """A fresh temp dir; with a group, rank 0's, shared with every rank."""
    def make() -> str:
        return str(owned_temp_dir(Path(tempfile.gettempdir()), "ckptscope-verify-"))

    if group is None:
        return make()
    made = group.agree(lambda: make() if group.rank == 0 else None, "making the temp dir")
    return group.broadcast(made, "sharing the temp dir")


def _convert(plan, group: Group | None) -> None:
    if group is None:
        execute_convert(plan)
    else:
        from ckptscope.ops.parallel.convert import execute_convert_parallel

        execute_convert_parallel(plan, group)
