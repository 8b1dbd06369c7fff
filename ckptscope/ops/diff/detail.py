"""Where two tensors differ: a histogram of ``|a - b|`` and a coarse heatmap, for one pair of a diff plan.

The diff report says *how much* a tensor changed; this says *where* and *how the change is
spread*: a few large outliers, a whole band of rows, or noise everywhere. It reads the pair the same
way the engine does (the canonical boxes of ``_overlaps``, cut by ``split_box``, read by ``read_piece``),
one block at a time, and keeps only fixed-size summaries, so memory is one block whatever the
tensor's size. The TUI runs it on demand in a cancellable worker (``should_stop``).

* Histogram: ``|a - b|`` of the elements whose difference is finite and non-zero, in octave bins
  (bin ``k`` holds ``[2**k, 2**(k+1))``, decided exactly from the float's exponent), merged into
  wider bins when they span more than ``max_bins`` octaves. Exact zeros (equal values, including
  ``-0.0`` vs ``0.0``), NaN differences (one side NaN) and infinite ones are counted apart, so the
  counts add up to the tensor's size.
* Heatmap: the tensor seen as a matrix (leading axes flattened into rows, the last axis as
  columns; a 1-D tensor is one row), cut into at most ``rows x cols`` cells of near-equal size.
  Each cell holds the largest ``|a - b|`` in it (``inf`` for a NaN or infinite difference) and the
  number of differing elements (bitwise for equal dtypes, as the metrics count them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from math import prod

import numpy as np

from ckptscope.core.errors import CkptError
from ckptscope.mappings.links import Box, box_shape
from ckptscope.ops.diff.engine import _overlaps, read_piece, split_box
from ckptscope.ops.diff.plan import DiffPair, DiffPlan

DEFAULT_ROWS = 16
DEFAULT_COLS = 64
DEFAULT_BINS = 40
BLOCK_ELEMS = 1 << 20
"""Elements per block: about six float64-sized temporaries of this many elements are alive at once."""
_EXP_OFFSET = 1100
"""frexp exponents of float64 lie in [-1073, 1024]; shifted by this they index a fixed array."""
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class DiffHistogram:
    """Counts of ``|a - b|`` in log-spaced bins.

    Bin ``i`` covers ``[2**(lo_exp + i*step), 2**(lo_exp + (i+1)*step))``."""

    counts: tuple[int, ...]
    lo_exp: int
    step: int
    """Octaves per bin (1 unless the differences span more than ``max_bins`` octaves)."""
    zeros: int
    """Elements whose difference is exactly zero."""
    nan: int
    inf: int

    @property
    def edges(self) -> list[float]:
        return [2.0 ** (self.lo_exp + i * self.step) for i in range(len(self.counts) + 1)]

    def bin_of(self, value: float) -> int | None:
        """The bin ``value`` (a finite, positive difference) falls in, or None outside the bins."""
        if not (value > 0 and math.isfinite(value)):
            return None
        octave = math.frexp(value)[1] - 1
        i = (octave - self.lo_exp) // self.step
        return i if 0 <= i < len(self.counts) else None

    @property
    def total(self) -> int:
        return sum(self.counts) + self.zeros + self.nan + self.inf


@dataclass(frozen=True)
class DiffHeatmap:
    """The tensor as a ``matrix_rows x matrix_cols`` matrix, cut into cells at ``row_edges`` x ``col_edges``."""

    matrix_rows: int
    matrix_cols: int
    row_edges: tuple[int, ...]
    col_edges: tuple[int, ...]
    max_abs: tuple[tuple[float, ...], ...]
    """Per cell: the largest ``|a - b|`` (0.0 when nothing differs; ``inf`` for NaN/infinite differences)."""
    counts: tuple[tuple[int, ...], ...]
    """Per cell: differing elements."""

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.row_edges) - 1, len(self.col_edges) - 1

    def cell_of(self, row: int, col: int) -> tuple[int, int]:
        """The cell holding matrix element ``(row, col)``."""
        r, c = self.shape
        return row * r // self.matrix_rows, col * c // self.matrix_cols


@dataclass(frozen=True)
class DiffDetail:
    name: str
    shape: tuple[int, ...]
    numel: int
    num_diff: int
    max_abs: float
    """Largest ``|a - b|`` (``inf`` when some difference is NaN or infinite)."""
    histogram: DiffHistogram
    heatmap: DiffHeatmap


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """Rows and columns of the matrix view: leading axes flattened into rows; 1-D (and 0-D) is one row."""
    if len(shape) <= 1:
        return 1, (shape[0] if shape else 1)
    return prod(shape[:-1]), shape[-1]


def _edges(n: int, cells: int) -> tuple[int, ...]:
    """Cell ``i`` holds the indices ``x`` with ``x * cells // n == i``."""
    return tuple(-((-i * n) // cells) for i in range(cells + 1))


class _Grid:
    """The running heatmap and histogram (fixed size: cells and a table of exponents)."""

    def __init__(self, shape: tuple[int, ...], rows: int, cols: int) -> None:
        self.shape = shape
        self.nrows, self.ncols = matrix_shape(shape)
        self.r = max(1, min(rows, self.nrows))
        self.c = max(1, min(cols, self.ncols))
        self.max_abs = np.zeros((self.r, self.c), np.float64)
        self.counts = np.zeros((self.r, self.c), np.int64)
        self.exponents = np.zeros(2 * _EXP_OFFSET, np.int64)
        self.zeros = self.nan = self.inf = self.num_diff = 0

    def add(self, a: np.ndarray, b: np.ndarray, box: Box) -> None:
        if not a.size:
            return
        differ, delta = _difference(a, b)
        self.num_diff += int(np.count_nonzero(differ))
        self._histogram(delta)
        # The heatmap keys on NaN/inf as the hottest value; equal elements have delta 0.
        hot = np.where(np.isfinite(delta), delta, np.inf)
        rect = self._rectangle(box)
        if rect is not None:
            self._add_rectangle(hot, differ, *rect)
        else:
            self._add_scattered(hot, differ, box)

    def _histogram(self, delta: np.ndarray) -> None:
        nan = np.isnan(delta)
        inf = np.isinf(delta)
        self.nan += int(np.count_nonzero(nan))
        self.inf += int(np.count_nonzero(inf))
        finite = delta[~(nan | inf)]
        positive = finite[finite > 0]
        self.zeros += int(finite.size - positive.size)
        if positive.size:
            _, exp = np.frexp(positive)
            self.exponents += np.bincount(exp.astype(np.int64) - 1 + _EXP_OFFSET, minlength=self.exponents.size)

    def _rectangle(self, box: Box) -> tuple[int, int, int, int] | None:
        """``(row0, rows, col0, cols)`` when ``box`` is a rectangle of the matrix view, else None."""
        shape = self.shape
        if len(shape) <= 1:
            lo, hi = box[0] if box else (0, 1)
            return 0, 1, lo, hi - lo
        middle = box[1:-1]
        if any((lo, hi) != (0, n) for (lo, hi), n in zip(middle, shape[1:-1])):
            return None
        inner = prod(shape[1:-1])
        (r0, r1), (c0, c1) = box[0], box[-1]
        return r0 * inner, (r1 - r0) * inner, c0, c1 - c0

    def _add_rectangle(self, hot: np.ndarray, differ: np.ndarray, row0: int, nrows: int, col0: int,
                       ncols: int) -> None:
        hot = hot.reshape(nrows, ncols)
        differ = differ.reshape(nrows, ncols)
        rcell = np.arange(row0, row0 + nrows, dtype=np.int64) * self.r // self.nrows
        ccell = np.arange(col0, col0 + ncols, dtype=np.int64) * self.c // self.ncols
        rstart = np.flatnonzero(np.diff(rcell, prepend=-1))
        cstart = np.flatnonzero(np.diff(ccell, prepend=-1))
        block_max = np.maximum.reduceat(np.maximum.reduceat(hot, cstart, axis=1), rstart, axis=0)
        ones = differ.astype(np.int64)
        block_count = np.add.reduceat(np.add.reduceat(ones, cstart, axis=1), rstart, axis=0)
        where = np.ix_(rcell[rstart], ccell[cstart])
        self.max_abs[where] = np.maximum(self.max_abs[where], block_max)
        self.counts[where] += block_count

    def _add_scattered(self, hot: np.ndarray, differ: np.ndarray, box: Box) -> None:
        """Any other box: only its differing elements are placed, one by one."""
        flat = np.flatnonzero(differ.reshape(-1))
        if not flat.size:
            return
        local = np.unravel_index(flat, box_shape(box))
        coords = [idx + lo for idx, (lo, _) in zip(local, box)]
        row = np.ravel_multi_index(coords[:-1], self.shape[:-1])
        cells = (row * self.r // self.nrows) * self.c + coords[-1] * self.c // self.ncols
        np.maximum.at(self.max_abs.reshape(-1), cells, hot.reshape(-1)[flat])
        self.counts += np.bincount(cells, minlength=self.r * self.c).reshape(self.r, self.c)

    def histogram(self, max_bins: int) -> DiffHistogram:
        used = np.flatnonzero(self.exponents)
        if not used.size:
            return DiffHistogram((), 0, 1, self.zeros, self.nan, self.inf)
        lo, hi = int(used[0]), int(used[-1])
        step = max(1, -(-(hi - lo + 1) // max_bins))
        counts = self.exponents[lo: hi + 1]
        pad = (-counts.size) % step
        merged = np.concatenate([counts, np.zeros(pad, np.int64)]).reshape(-1, step).sum(axis=1)
        return DiffHistogram(tuple(int(c) for c in merged), lo - _EXP_OFFSET, step, self.zeros, self.nan, self.inf)

    def heatmap(self) -> DiffHeatmap:
        return DiffHeatmap(self.nrows, self.ncols, _edges(self.nrows, self.r), _edges(self.ncols, self.c),
                           tuple(tuple(float(v) for v in row) for row in self.max_abs),
                           tuple(tuple(int(v) for v in row) for row in self.counts))


def _difference(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat masks of differing elements (bitwise for equal dtypes) and ``|a - b|`` in float64."""
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    complex_values = flat_a.dtype.kind == "c" or flat_b.dtype.kind == "c"
    wide = np.complex128 if complex_values else np.float64
    a64, b64 = flat_a.astype(wide), flat_b.astype(wide)
    with np.errstate(invalid="ignore", over="ignore"):
        delta = np.abs(a64 - b64)
    both_nan = np.isnan(a64) & np.isnan(b64)
    delta[both_nan] = 0.0  # two NaNs are no value difference (as in the metrics)
    if flat_a.dtype == flat_b.dtype and flat_a.dtype.itemsize in _UINT and not complex_values:
        kind = _UINT[flat_a.dtype.itemsize]
        differ = np.ascontiguousarray(flat_a).view(kind) != np.ascontiguousarray(flat_b).view(kind)
    else:
        differ = ~((a64 == b64) | both_nan)
    return differ, delta


def pair_detail(plan: DiffPlan, pair: DiffPair | str, *, rows: int = DEFAULT_ROWS, cols: int = DEFAULT_COLS,
                max_bins: int = DEFAULT_BINS, block_elems: int = BLOCK_ELEMS,
                should_stop: Callable[[], bool] = lambda: False) -> DiffDetail | None:
    """Histogram and heatmap of one compared pair; None when ``should_stop`` said so.

    Raises ``CkptError`` for a pair whose values cannot be compared (one side missing, shapes differ).
    """
    if isinstance(pair, str):
        found = [p for p in plan.pairs if p.name == pair]
        if not found:
            raise CkptError(f"{pair}: not in this diff")
        pair = found[0]
    status = pair.static_status
    if status is not None:
        raise CkptError(f"{pair.name}: {status.replace('_', ' ')}; there are no values to compare")
    assert pair.a is not None and pair.b is not None
    shape = tuple(pair.a.shape)
    grid = _Grid(shape, rows, cols)
    max_elems = max(1, block_elems)
    for box, pa, pb in _overlaps(pair.a, pair.b):
        for block in split_box(box, max_elems):
            if should_stop():
                return None
            grid.add(read_piece(plan.a, pa, block), read_piece(plan.b, pb, block), block)
    heatmap = grid.heatmap()
    return DiffDetail(pair.name, shape, prod(shape), grid.num_diff, float(grid.max_abs.max()),
                      grid.histogram(max_bins), heatmap)
