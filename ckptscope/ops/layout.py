"""Shard-layout geometry: which stored chunk covers which block of a tensor, on a coarse grid.

A logical tensor is a global shape plus chunks at global offsets (one per rank, file or slab).
The TUI draws that as a map; this module computes the map as plain data so it can be tested
without a terminal and reused by other front ends.

The last two axes form the drawn plane (rows x columns); a 1-D tensor is a single row and a
0-d tensor a single cell. Leading axes (stacked layers, experts) become *panels*: one small
multiple per distinct interval of the leading axes that the chunk boundaries produce, so a
pipeline split of stacked layers shows one panel per stage.

Grid lines follow the chunks' own boundaries: each interval between consecutive boundaries
gets at least one cell when there is room, so a thin chunk never disappears. When there are
more intervals than cells, the axis is sampled uniformly and a cell lists every chunk it
touches (``Cell.owners`` has several entries; the view marks such cells as mixed).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ckptscope.core.names import natural_key
from ckptscope.core.tensor import Chunk, TensorMeta

MAX_PANELS = 256
"""Panels computed at most; a view shows a window of them and says how many there are."""


@dataclass(frozen=True, slots=True)
class Span:
    """One grid band along an axis: global ``[start, stop)`` drawn ``cells`` cells wide."""

    start: int
    stop: int
    cells: int


@dataclass(frozen=True, slots=True)
class Panel:
    """One 2-D small multiple: the plane for one box of the leading axes."""

    lead: tuple[tuple[int, int], ...]
    """Global ``(start, stop)`` on each leading axis shown by this panel (empty for <= 2-D)."""
    rows: tuple[Span, ...]
    cols: tuple[Span, ...]
    owners: tuple[tuple[tuple[int, ...], ...], ...]
    """``owners[i][j]``: indices (into ``meta.chunks``) of the chunks covering band ``rows[i]`` x
    ``cols[j]``. Empty: nothing stores it (a hole). Several: replicas, or a sampled mixed cell."""
    sampled: bool = False
    """True when an axis had more boundaries than cells and was sampled uniformly."""

    @property
    def holes(self) -> int:
        return sum(1 for row in self.owners for cell in row if not cell)


@dataclass(frozen=True, slots=True)
class ShardLayout:
    name: str
    shape: tuple[int, ...]
    lead_axes: tuple[int, ...]
    """Axes drawn as panels (all but the last two)."""
    plane_axes: tuple[int, ...]
    """Axes drawn as rows and columns: ``(ndim-2, ndim-1)``, ``(0,)`` for 1-D, ``()`` for 0-d."""
    panels: tuple[Panel, ...]
    total_panels: int
    """Panels the leading axes split into (``panels`` may stop at ``MAX_PANELS``)."""
    num_chunks: int
    files: tuple[str, ...]
    """Files in colour order (natural sort of names)."""
    file_colors: dict[str, int]
    splits: dict[int, int]
    """Axis -> number of distinct chunk offsets along it (only axes split in more than one)."""
    stored_elems: int
    """Sum of chunk sizes: equals numel for an exact cover, more with replicas, less with holes."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def replicated(self) -> bool:
        return self.stored_elems > self.numel

    @property
    def holes(self) -> int:
        return sum(p.holes for p in self.panels)


def file_colors(chunks: tuple[Chunk, ...] | list[Chunk]) -> dict[str, int]:
    """File -> colour index, in natural order of file names (``rank_2`` before ``rank_10``)."""
    files = sorted({c.file for c in chunks}, key=natural_key)
    return {f: i for i, f in enumerate(files)}


def split_counts(meta: TensorMeta) -> dict[int, int]:
    """How many pieces the chunks cut each axis into (axes with a single piece left out)."""
    out = {}
    for axis in range(len(meta.shape)):
        offsets = {c.offsets[axis] for c in meta.chunks if len(c.offsets) > axis}
        if len(offsets) > 1:
            out[axis] = len(offsets)
    return out


def plane_size(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, columns) of the drawn plane."""
    if not shape:
        return 1, 1
    if len(shape) == 1:
        return 1, shape[0]
    return shape[-2], shape[-1]


def grid_size(shape: tuple[int, ...], max_rows: int, max_cols: int, min_cols: int = 32) -> tuple[int, int]:
    """Cells for the plane, keeping its aspect (a terminal cell is about twice as tall as wide)
    until that would make it narrower than ``min_cols``: a tall matrix stays readable."""
    rows, cols = plane_size(shape)
    if len(shape) <= 1:
        return 1, max(1, min(max_cols, cols if cols else 1))
    if rows == 0 or cols == 0:
        return 1, max_cols
    want_rows = round(max_cols * rows / cols / 2)
    if want_rows > max_rows:
        narrow = round(max_rows * 2 * cols / rows)
        return max_rows, max(1, min(max_cols, max(narrow, min(min_cols, max_cols, cols))))
    return max(1, want_rows), max_cols


def _bounds(chunk: Chunk, axis: int) -> tuple[int, int]:
    if axis >= len(chunk.offsets):
        return 0, 1
    return chunk.offsets[axis], chunk.offsets[axis] + chunk.shape[axis]


def _intervals(size: int, chunk_ids: list[int], chunks: tuple[Chunk, ...], axis: int | None) -> list[tuple[int, int]]:
    if axis is None:
        return [(0, 1)]
    cuts = {0, size}
    for i in chunk_ids:
        lo, hi = _bounds(chunks[i], axis)
        cuts.update(x for x in (lo, hi) if 0 <= x <= size)
    points = sorted(cuts)
    return [(a, b) for a, b in itertools.pairwise(points) if b > a] or [(0, max(size, 1))]


def allocate(intervals: list[tuple[int, int]], cells: int) -> tuple[list[Span], bool]:
    """Give each interval cells in proportion to its length, at least one each when they fit.

    Returns the spans and whether the axis had to be sampled uniformly instead.
    """
    cells = max(1, cells)
    total = sum(b - a for a, b in intervals) or 1
    if len(intervals) > cells:
        lo, hi = intervals[0][0], intervals[-1][1]
        edges = [lo + round((hi - lo) * k / cells) for k in range(cells + 1)]
        spans = [Span(a, b, 1) for a, b in itertools.pairwise(edges) if b > a]
        return spans, True
    exact = [(b - a) * cells / total for a, b in intervals]
    alloc = [max(1, int(x)) for x in exact]
    # Hand out the remaining cells by largest remainder, then take back from the widest if over.
    order = sorted(range(len(intervals)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    k = 0
    while sum(alloc) < cells and order:
        alloc[order[k % len(order)]] += 1
        k += 1
    while sum(alloc) > cells:
        widest = max(range(len(alloc)), key=lambda i: alloc[i])
        if alloc[widest] <= 1:
            break
        alloc[widest] -= 1
    return [Span(a, b, n) for (a, b), n in zip(intervals, alloc)], False


def _covering(chunks: tuple[Chunk, ...], ids: list[int], axes: tuple[int | None, int | None],
              row: Span, col: Span) -> tuple[int, ...]:
    found = []
    for i in ids:
        ok = True
        for axis, span in zip(axes, (row, col)):
            if axis is None:
                continue
            lo, hi = _bounds(chunks[i], axis)
            if not (lo < span.stop and span.start < hi):
                ok = False
                break
        if ok:
            found.append(i)
    return tuple(found)


def shard_layout(meta: TensorMeta, *, max_rows: int = 12, max_cols: int = 48,
                 max_panels: int = MAX_PANELS) -> ShardLayout:
    """The coarse map of ``meta``'s chunks: panels over leading axes, bands along the plane."""
    shape = meta.shape
    ndim = len(shape)
    chunks = meta.chunks
    lead_axes = tuple(range(max(0, ndim - 2)))
    plane_axes: tuple[int, ...] = tuple(range(max(0, ndim - 2), ndim))
    row_axis: int | None = ndim - 2 if ndim >= 2 else None
    col_axis: int | None = ndim - 1 if ndim >= 1 else None
    grid_rows, grid_cols = grid_size(shape, max_rows, max_cols)

    lead_intervals = [_intervals(shape[a], list(range(len(chunks))), chunks, a) for a in lead_axes]
    total_panels = math.prod(len(x) for x in lead_intervals) if lead_intervals else 1
    panels = []
    for lead in itertools.islice(itertools.product(*lead_intervals), max_panels):
        ids = [i for i, c in enumerate(chunks)
               if all(_bounds(c, a)[0] < hi and lo < _bounds(c, a)[1] for a, (lo, hi) in zip(lead_axes, lead))]
        rows_size, cols_size = plane_size(shape)
        rows, rs = allocate(_intervals(rows_size, ids, chunks, row_axis), grid_rows)
        cols, cs = allocate(_intervals(cols_size, ids, chunks, col_axis), grid_cols)
        owners = tuple(tuple(_covering(chunks, ids, (row_axis, col_axis), r, c) for c in cols) for r in rows)
        panels.append(Panel(lead=tuple(lead), rows=tuple(rows), cols=tuple(cols), owners=owners, sampled=rs or cs))
    colors = file_colors(chunks)
    return ShardLayout(
        name=meta.name, shape=shape, lead_axes=lead_axes, plane_axes=plane_axes, panels=tuple(panels),
        total_panels=total_panels, num_chunks=len(chunks), files=tuple(colors), file_colors=colors,
        splits=split_counts(meta), stored_elems=sum(c.numel for c in chunks),
    )
