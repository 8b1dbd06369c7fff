"""The convert form's logic without widgets: defaults, the plan as table rows and text, the verify verdict.

Kept apart from ``screens/convert.py`` so the screen only wires widgets to workers, and so the
wording of a plan (one row per destination tensor: its sources and transforms) is testable alone.
The rows say what ``ckptscope convert --dry-run`` says, shortened for a table cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ckptscope.core.units import human_bytes


if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.core.index import CheckpointIndex
    from ckptscope.ops.convert.plan import Box, ConvertPlan, OutputTensor, Recipe
    from ckptscope.ops.diff.engine import DiffReport

TARGETS = ("hf", "mcore")
FORMATS = ("torch_dist", "torch")
DTYPES = ("keep", "bfloat16", "float16", "float32")
"""The choices ``plan_convert`` accepts (``ops.convert.plan.DTYPES``), listed here to build the form
without importing the ops module (and mappings with it) before the form is opened."""
DETAIL_PIECES = 8
"""Pieces listed in full for the highlighted row; more are counted."""
VERIFY_ROWS = 40



@dataclass(frozen=True)
class ConvertSettings:
    """What the form asks for: the keyword arguments of ``plan_convert`` (and of ``verify_round_trip``)."""

    target: str = "hf"
    tp: int = 1
    pp: int = 1
    ckpt_format: str = "torch_dist"
    dtype: str = "keep"
    skip_unknown: bool = False
    """Leave out entries that are neither model nor training state (``--skip-unknown``)."""
    ep: int = 1
    spec: str = "local"
    hf_config: str | None = None
    """Directory with the HF config.json to use (``--hf-config``); None: the source's own."""
    arch: str | None = None
    """``--arch``: the architecture when the checkpoint does not say; None: detected."""
    max_shard_size: str = "5GB"
    """``--max-shard-size`` of HF safetensors shards."""
    hf_experts: str = "per-expert"
    """``--hf-experts``: MoE experts per expert (save_pretrained) or fused 3-D (transformers v5)."""
    merge_lora: bool = False
    """``--merge-lora``: a LoRA training save's adapter merged into the weights, not written apart."""

    def label(self) -> str:
        if self.target == "hf":
            return ("HF safetensors" + ("" if self.dtype == "keep" else f", {self.dtype}")
                    + (", LoRA merged" if self.merge_lora else ""))
        dtype = "" if self.dtype == "keep" else f", {self.dtype}"
        ep = f" ep {self.ep}" if self.ep > 1 else ""
        spec = ", te spec" if self.spec == "te" else ""
        return f"Megatron-Core {self.ckpt_format}, tp {self.tp} pp {self.pp}{ep}{spec}{dtype}"


def default_target(index: CheckpointIndex | None) -> str:
    """``ops.convert.plan.target_family_for``: HF for training saves (as ``merge``), Megatron-Core
    for a whole HF model; HF while the index is unknown."""
    if index is None:
        return "hf"
    from ckptscope.ops.convert.plan import target_family_for

    return target_family_for(index)


def result_path(plan: ConvertPlan) -> str:
    """What to browse once written: the HF directory, or the iteration inside the Megatron save root."""
    if plan.target == "mcore":
        return str(Path(plan.dst) / f"iter_{plan.iteration:07d}")
    return str(plan.dst)


# --- the plan as text -----------------------------------------------------------------------------


def box_text(box: Box) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


def sources_text(recipe: Recipe) -> str:
    """Each source once: ``name[box]`` for one block, ``name (k blocks)`` for several (a fused qkv)."""
    blocks: dict[str, list[Box]] = {}
    for piece in recipe.pieces:
        blocks.setdefault(piece.source, []).append(piece.src_box)
    parts = [name + box_text(boxes[0]) if len(boxes) == 1 else f"{name} ({len(boxes)} blocks)"
             for name, boxes in blocks.items()]
    return " + ".join(parts) if parts else "(zeros)"


def transforms_text(tensor: OutputTensor, *, full: bool = False) -> str:
    """The recipe's transforms, ``cast`` when the dtype changes (``full``: from which dtype), and the
    zero-filled rows (vocab padding)."""
    recipe = tensor.recipe
    words = list(recipe.transforms)
    if tensor.dtype != recipe.dtype:
        words.append(f"cast from {recipe.dtype}" if full else "cast")
    words += [f"zero rows {box[0][0]}:{box[0][1]}" for box in recipe.fill]
    return ", ".join(words)


def shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def plan_row(tensor: OutputTensor) -> tuple[str, str, str, str, str]:
    """(destination, shape, dtype, transforms, sources): one row of the plan table (the long cell last)."""
    return tensor.name, shape_text(tensor.shape), tensor.dtype, transforms_text(tensor), sources_text(tensor.recipe)


def plan_detail(tensor: OutputTensor) -> Text:
    """The highlighted row in full, as ``convert --dry-run`` prints it (every block, up to DETAIL_PIECES)."""
    pieces = tensor.recipe.pieces
    shown = [f"{p.source}{box_text(p.src_box)} → {box_text(p.dst_box)}" for p in pieces[:DETAIL_PIECES]]
    if len(pieces) > DETAIL_PIECES:
        shown.append(f"… {len(pieces) - DETAIL_PIECES} more blocks")
    text = Text.assemble((tensor.name, "bold"), f" {shape_text(tensor.shape)} {tensor.dtype}",
                         (f"  [{transforms_text(tensor, full=True)}]", "cyan"))
    for line in shown:
        text.append("\n  ← " + line, style="dim")
    return text


def plan_summary(plan: ConvertPlan) -> Text:
    """One line of totals, then the plan's notes (config derived, vocabulary padded, names kept)."""
    if plan.target == "hf":
        files = len(plan.shards)
        layout = f"HF safetensors, {files} file{'s' if files != 1 else ''}"
    else:
        layout = f"Megatron-Core {plan.ckpt_format}, tp {plan.tp} pp {plan.pp}"
    text = Text.assemble((f"{len(plan.tensors):,}", "bold"), " tensors · ", (human_bytes(plan.total_bytes), "bold"),
                         " · arch ", (plan.arch, "bold cyan"), " · ", layout)
    extras = [f"copies {', '.join(name for _, name in plan.copies)}"] if plan.copies else []
    if plan.dropped:
        extras.append(f"not written: {len(plan.dropped)} ({', '.join(plan.dropped[:3])}"
                      f"{', …' if len(plan.dropped) > 3 else ''})")
    for note in [*plan.notes, *extras]:
        text.append(f"\nnote: {note}", style="dim")
    return text


# --- verify ---------------------------------------------------------------------------------------


def verify_text(report: DiffReport, seconds: float, dtype: str = "keep") -> Group:
    """``✓ identical`` with the counts, or the differing tensors (status, max |a-b|), at most VERIFY_ROWS.
    ``dtype`` other than keep is named: the round trip keeps dtypes, so it says nothing about a cast."""
    summary = report.summary()
    route = Text(report.b.split(" -> ", 1)[-1] if " -> " in report.b else report.b, style="dim")
    if dtype != "keep":
        route.append(f"   (dtypes kept: the {dtype} cast is not part of the check)")
    if report.identical:
        head = Text.assemble(("✓ identical", "bold green"), f": {summary['equal']:,} of {summary['compared']:,} "
                             f"tensors equal bit for bit after the round trip", f" ({seconds:.1f} s)")
        return Group(head, Text.assemble(("via ", "dim"), route))
    bad = [r for r in report.results if r.differs]
    head = Text.assemble((f"✗ {len(bad):,} tensor{'s' if len(bad) != 1 else ''} differ", "bold red"),
                         f" after the round trip ({summary['equal']:,} equal, {summary['only_a']} only in the source, "
                         f"{summary['only_b']} only in the result)")
    table = Table(box=None, pad_edge=False, header_style="dim", expand=True)
    table.add_column("tensor", ratio=1, overflow="fold")
    table.add_column("status", style="red", no_wrap=True)
    table.add_column("max |a-b|", justify="right", no_wrap=True)
    for result in bad[:VERIFY_ROWS]:
        value = result.metrics.get("max_abs_diff")
        table.add_row(result.name, result.status, f"{value:.3g}" if isinstance(value, float) else "")
    parts: list[Text | Table] = [head, Text.assemble(("via ", "dim"), route), table]
    if len(bad) > VERIFY_ROWS:
        parts.append(Text(f"… {len(bad) - VERIFY_ROWS:,} more", style="dim"))
    return Group(*parts)
