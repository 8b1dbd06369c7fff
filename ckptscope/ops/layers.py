"""Two members of a collapsed range side by side: how far layer 3 is from layer 17.

Layers that collapse into ``layers.[0-31]`` have the same names, shapes and dtypes, so they can be
compared tensor by tensor with the diff metrics (``ops/diff/metrics.py``). A user checks that a
conversion did not copy one layer into another, that layers are not all identical (a broken
initialisation or a bad merge), or how far a fine-tune moved one layer relative to its neighbour.
Reads are region by region, as ``tensor_stats`` reads, so memory stays bounded by one block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptscope.core.errors import CkptError
from ckptscope.ops.tree import TreeNode

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.formats.base import CheckpointReader


@dataclass(frozen=True, slots=True)
class LayerPair:
    """One tensor of member ``a`` against the same tensor of member ``b``."""

    suffix: str
    """The tensor's name below the member (``self_attn.q_proj.weight``)."""
    shape: tuple[int, ...]
    dtype: str
    metrics: dict[str, float | int | None]
    """``ops.diff.metrics.Accumulator.metrics()``: num_diff, max_abs_diff, rel_l2, cosine, ..."""


def member_tensors(node: TreeNode) -> dict[str, str]:
    """Every tensor below ``node``: its name relative to ``node.path`` -> its full name."""
    out = {}
    for sub in node.walk():
        if sub.tensor is not None and not sub.children:
            out[sub.tensor.name[len(node.path) + 1:]] = sub.tensor.name
    return out


def compare_members(reader: "CheckpointReader", range_node: TreeNode, a: str, b: str, *,
                    should_stop: Callable[[], bool] | None = None) -> list[LayerPair]:
    """Compare member ``a`` with member ``b`` of ``range_node`` (both layer numbers of the range)."""
    from ckptscope.ops.diff.metrics import Accumulator, compare_block
    from ckptscope.ops.stats import iter_regions

    keys = range_node.member_keys
    for key in (a, b):
        if key not in keys:
            raise CkptError(f"layer {key} is not in {range_node.label} (range {keys[0]}-{keys[-1]})")
    side_a, side_b = member_tensors(range_node.member(a)), member_tensors(range_node.member(b))
    out = []
    for suffix, name_a in side_a.items():
        name_b = side_b[suffix]  # members of a range have the same names below them, by construction
        meta = reader.meta(name_a)
        acc = Accumulator()
        for region in iter_regions(meta.shape):
            if should_stop is not None and should_stop():
                return out
            origin = tuple(r.start for r in region) + (0,) * (len(meta.shape) - len(region))
            acc.merge(compare_block(reader.read(name_a, region), reader.read(name_b, region), origin))
        out.append(LayerPair(suffix, meta.shape, meta.dtype, acc.metrics()))
    return out
