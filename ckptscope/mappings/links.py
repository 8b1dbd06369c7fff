"""Links and recipes: the one representation of every HF <-> Megatron-Core transform.

Every transform we need (QKV/GQA interleave, [gate; up], vocab padding, layer stacking, expert
stacking, TP halves) only moves rectangular blocks of elements; no value is ever computed. So a
transform is a list of ``Link``s, each saying "this box of the Megatron tensor holds exactly this
box of the HF tensor". A link has no direction: grouping the links by their HF end gives the recipes
that build HF tensors from a Megatron checkpoint, grouping them by their Megatron end gives the
recipes for the opposite conversion. That is how the inverse is *derived* and never written twice
(MAPPING.md P2: symmetric bugs pass round trips, so there must be only one place to get it wrong).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from math import prod

Box = tuple[tuple[int, int], ...]
"""``((start, stop), ...)`` per axis, step 1."""


def full_box(shape: tuple[int, ...]) -> Box:
    return tuple((0, n) for n in shape)


def box_shape(box: Box) -> tuple[int, ...]:
    return tuple(stop - start for start, stop in box)


def squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


def box_text(box: Box, shape: tuple[int, ...]) -> str:
    """``[3, 0:32, :]``: a box as users write slices (whole axes as ``:``, single indices bare)."""
    parts = []
    for (start, stop), size in zip(box, shape):
        if start == 0 and stop == size:
            parts.append(":")
        elif stop == start + 1:
            parts.append(str(start))
        else:
            parts.append(f"{start}:{stop}")
    return "[" + ", ".join(parts) + "]"


@dataclass(frozen=True, slots=True)
class Link:
    """``mcore[mcore_box]`` and ``hf[hf_box]`` hold the same elements in the same order.

    Boxes may differ only by axes of size one (an expert or layer index on the Megatron side).
    """

    mcore: str
    mcore_box: Box
    hf: str
    hf_box: Box
    transform: str

    def __post_init__(self) -> None:
        if squeezed(box_shape(self.mcore_box)) != squeezed(box_shape(self.hf_box)):
            raise ValueError(f"link {self.mcore}{self.mcore_box} <-> {self.hf}{self.hf_box}: shapes differ")


@dataclass(frozen=True, slots=True)
class Piece:
    """Destination box ``dst_box`` is filled from ``source[src_box]`` (reshaped if unit axes differ)."""

    dst_box: Box
    source: str
    src_box: Box


@dataclass(slots=True)
class Recipe:
    """How to build one destination tensor from source tensors."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    pieces: list[Piece] = field(default_factory=list)
    transforms: list[str] = field(default_factory=list)
    padding: list[tuple[str, Box]] = field(default_factory=list)
    """Source regions deliberately left out (vocab pad rows): reported by diff, never copied."""
    fill: list[Box] = field(default_factory=list)
    """Destination regions with no source (vocab pad rows on import): written as zeros."""

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def sources(self) -> list[str]:
        seen: dict[str, None] = {}
        for piece in self.pieces:
            seen.setdefault(piece.source, None)
        return list(seen)

    @property
    def is_identity(self) -> bool:
        """One piece, the whole tensor, under the same shape: a plain (possibly renamed) copy."""
        return (len(self.pieces) == 1 and not self.fill and self.pieces[0].dst_box == full_box(self.shape)
                and box_shape(self.pieces[0].src_box) == self.shape)


def recipes_from_links(links: Iterable[Link], *, to: str, shapes: dict[str, tuple[int, ...]],
                       dtypes: dict[str, str]) -> dict[str, Recipe]:
    """Group links by their ``to`` end (``"hf"`` or ``"mcore"``) into destination recipes.

    ``shapes``/``dtypes`` give the destination tensors' shapes and dtypes (derived by the caller
    from the config); the dtype of a destination is its first source's dtype when not given.
    """
    recipes: dict[str, Recipe] = {}
    for link in links:
        if to == "hf":
            dst, dst_box, src, src_box = link.hf, link.hf_box, link.mcore, link.mcore_box
        else:
            dst, dst_box, src, src_box = link.mcore, link.mcore_box, link.hf, link.hf_box
        recipe = recipes.get(dst)
        if recipe is None:
            recipe = recipes[dst] = Recipe(dst, shapes[dst], dtypes.get(dst, ""))
        recipe.pieces.append(Piece(dst_box, src, src_box))
        if link.transform not in recipe.transforms:
            recipe.transforms.append(link.transform)
    return recipes


def uncovered(shape: tuple[int, ...], boxes: list[Box]) -> list[Box]:
    """Boxes of ``shape`` that no box in ``boxes`` covers, along axis 0 only (enough for our
    transforms, which only split rows); other axes must be covered whole."""
    if not shape:
        return [] if boxes else [()]
    rows = sorted((b[0][0], b[0][1]) for b in boxes)
    gaps, cursor = [], 0
    for start, stop in rows:
        if start > cursor:
            gaps.append(((cursor, start),) + full_box(shape[1:]))
        cursor = max(cursor, stop)
    if cursor < shape[0]:
        gaps.append(((cursor, shape[0]),) + full_box(shape[1:]))
    return gaps


def map_box(box: Box, a_box: Box, b_box: Box) -> Box:
    """The part of ``b_box`` that holds ``box`` (a part of ``a_box``), where ``a_box`` and ``b_box``
    hold the same elements in the same order (a link's or a piece's two ends).

    The two ends agree once axes of size one are dropped (``Link``), so their non-unit axes pair up
    in order: the k-th non-unit axis of ``a_box`` is the k-th of ``b_box``. That covers boxes that
    are aligned axis by axis, extra unit axes on either side (a stacked layer or expert index), and
    a row of one tensor that is a column of the other (a transposed layout such as GPT-OSS's
    experts: ``down_proj[e][:, h]`` is ``linear_fc2.weight[h, :]``). Unit axes of ``b_box`` keep their
    index; unit axes of ``a_box`` select nothing.
    """
    a_axes = [k for k, (lo, hi) in enumerate(a_box) if hi - lo != 1]
    b_axes = [k for k, (lo, hi) in enumerate(b_box) if hi - lo != 1]
    out = list(b_box)
    for ka, kb in zip(a_axes, b_axes):
        (lo, hi), (alo, _), (blo, _) = box[ka], a_box[ka], b_box[kb]
        out[kb] = (blo + lo - alo, blo + hi - alo)
    return tuple(out)


def source_slices(piece: Piece, box: Box) -> tuple[slice, ...]:
    """The source region holding destination ``box`` (inside ``piece.dst_box``) of a piece.

    A source box may carry extra axes of size one (a stacked layer or expert index); they are kept,
    and the region read is reshaped to the destination box. A destination box may carry them too
    (one expert of a fused ``[E, ...]`` HF tensor built from a per-expert source): they select
    nothing in the source. Non-unit axes pair up in order (``map_box``).
    """
    return tuple(slice(lo, hi) for lo, hi in map_box(box, piece.dst_box, piece.src_box))


def materialize(recipe: Recipe, fetch, dtype=None):
    """Build a whole destination tensor: ``fetch(source, slices)`` returns a numpy array region.

    Pure block copies (no arithmetic), so the result is bit-identical to its sources; regions in
    ``recipe.fill`` are zeros.
    """
    import numpy as np

    if recipe.is_identity:  # the common case: hand the source region over, no second copy
        block = fetch(recipe.pieces[0].source, source_slices(recipe.pieces[0], recipe.pieces[0].dst_box))
        return block.reshape(recipe.shape) if dtype is None or block.dtype == dtype else block.astype(dtype)
    out = None
    for piece in recipe.pieces:
        block = fetch(piece.source, source_slices(piece, piece.dst_box))
        if out is None:
            out = np.zeros(recipe.shape, dtype=dtype or block.dtype)
        out[tuple(slice(lo, hi) for lo, hi in piece.dst_box)] = block.reshape(box_shape(piece.dst_box))
    if out is None:
        out = np.zeros(recipe.shape, dtype=dtype or np.float32)
    return out
