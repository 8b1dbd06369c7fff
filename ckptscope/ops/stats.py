"""Value statistics of one tensor, streamed region by region.

A 70B checkpoint has tensors of several GiB, so statistics never load a whole tensor: the
tensor is cut into boxes of at most ``block_elems`` elements along its leading axes and read
one box at a time through ``reader.read(name, region)``. Memory stays bounded by one box (plus
its float64 copy). The TUI calls this from a cancellable thread worker, hence ``should_stop``.

Two passes: the first gathers moments, extremes and special-value counts; the second bins the
finite values into a histogram over ``[min, max]`` (a range only known after the first pass).
A tensor that fits in one box is read once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptscope.core.errors import CkptError
from ckptscope.core.tensor import TensorMeta

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from ckptscope.formats.base import CheckpointReader

DEFAULT_BLOCK_ELEMS = 1 << 22
"""Elements per streamed box (4M elements: 32 MiB as float64)."""
DEFAULT_BINS = 40


@dataclass(frozen=True, slots=True)
class TensorStats:
    """Summary of a tensor's values. Floats are ``nan`` when there is no finite value to summarise."""

    name: str
    dtype: str
    count: int
    """Elements looked at (the tensor's numel)."""
    finite: int
    """Elements that are neither NaN nor ±Inf; min/max/mean/std/abs_mean cover only these."""
    min: float
    max: float
    mean: float
    std: float
    """Population standard deviation (``ddof=0``, like ``numpy.std``)."""
    abs_mean: float
    zeros: int
    nan: int
    pos_inf: int
    neg_inf: int
    hist_counts: tuple[int, ...]
    """Counts of finite values in ``len(hist_counts)`` equal-width bins over ``[hist_lo, hist_hi]``."""
    hist_lo: float
    hist_hi: float
    note: str = ""
    """How the values were interpreted when not plain reals (``"magnitudes of complex values"``)."""

    @property
    def inf(self) -> int:
        return self.pos_inf + self.neg_inf

    @property
    def bin_edges(self) -> list[float]:
        n = len(self.hist_counts)
        if n == 0:
            return []
        width = (self.hist_hi - self.hist_lo) / n
        return [self.hist_lo + i * width for i in range(n + 1)]


def iter_regions(shape: tuple[int, ...], block_elems: int = DEFAULT_BLOCK_ELEMS) -> Iterator[tuple[slice, ...]]:
    """Boxes that tile ``shape`` in C order, each at most ``block_elems`` elements (at least one row).

    Splits on the first axis whose trailing extent fits in a box; the axes before it are walked
    one index at a time. Boxes are tuples of slices on leading axes, as ``reader.read`` takes.
    """
    if not shape:
        yield ()
        return
    if math.prod(shape) == 0:
        return
    block_elems = max(1, block_elems)
    split = len(shape) - 1
    for axis in range(len(shape)):
        if math.prod(shape[axis + 1:]) <= block_elems:
            split = axis
            break
    step = max(1, block_elems // max(1, math.prod(shape[split + 1:])))
    outer = shape[:split]

    def walk(prefix: tuple[slice, ...], depth: int) -> Iterator[tuple[slice, ...]]:
        if depth == len(outer):
            for start in range(0, shape[split], step):
                yield prefix + (slice(start, min(start + step, shape[split])),)
            return
        for i in range(outer[depth]):
            yield from walk(prefix + (slice(i, i + 1),), depth + 1)

    yield from walk((), 0)


def _as_real(array: np.ndarray) -> tuple[np.ndarray, str]:
    """float64 view of any readable dtype (bf16/fp8 through ml_dtypes, bool as 0/1, complex as |z|)."""
    import numpy as np

    if np.iscomplexobj(array):
        return np.abs(array).astype(np.float64, copy=False), "magnitudes of complex values"
    return np.asarray(array).astype(np.float64), ""


def tensor_stats(reader: CheckpointReader, name: str, *, should_stop: Callable[[], bool] | None = None,
                 bins: int = DEFAULT_BINS, block_elems: int = DEFAULT_BLOCK_ELEMS) -> TensorStats | None:
    """Statistics of tensor ``name``; ``None`` when ``should_stop()`` turned true part-way.

    Raises ``CkptError`` for dtypes that cannot be read as numbers (packed sub-byte floats).
    """
    import numpy as np

    meta: TensorMeta = reader.meta(name)
    if meta.dtype_info.numpy_name is None:
        raise CkptError(f"{name}: dtype {meta.dtype} cannot be read as numbers (sub-byte packing)")
    stop = should_stop or (lambda: False)
    regions = list(iter_regions(meta.shape, block_elems))
    only: Any = None  # the single box, kept when the whole tensor is one read

    count = finite = zeros = nan = pos_inf = neg_inf = 0
    lo, hi = math.inf, -math.inf
    mean = m2 = 0.0  # Chan et al. parallel merge of (count, mean, M2) per box
    abs_sum = 0.0
    note = ""
    for region in regions:
        if stop():
            return None
        values, note = _as_real(reader.read(name, region))
        values = values.reshape(-1)
        if len(regions) == 1:
            only = values
        count += values.size
        is_nan = np.isnan(values)
        nan += int(is_nan.sum())
        pos_inf += int(np.isposinf(values).sum())
        neg_inf += int(np.isneginf(values).sum())
        zeros += int((values == 0).sum())
        good = values[np.isfinite(values)]
        if good.size == 0:
            continue
        n_b = good.size
        mean_b = float(good.mean())
        m2_b = float(((good - mean_b) ** 2).sum())
        total = finite + n_b
        delta = mean_b - mean
        mean += delta * n_b / total
        m2 += m2_b + delta * delta * finite * n_b / total
        finite = total
        abs_sum += float(np.abs(good).sum())
        lo, hi = min(lo, float(good.min())), max(hi, float(good.max()))

    counts: list[int] = []
    if finite:
        span_hi = hi if hi > lo else lo + 1.0  # constant tensor: one occupied bin
        counts = [0] * bins
        for region in regions:
            if stop():
                return None
            if only is not None:
                values = only
            else:
                values, _ = _as_real(reader.read(name, region))
                values = values.reshape(-1)
            good = values[np.isfinite(values)]
            hist, _ = np.histogram(good, bins=bins, range=(lo, span_hi))
            counts = [a + int(b) for a, b in zip(counts, hist)]
        hist_lo, hist_hi = lo, span_hi
    else:
        hist_lo = hist_hi = math.nan
    return TensorStats(
        name=name, dtype=meta.dtype, count=count, finite=finite,
        min=lo if finite else math.nan, max=hi if finite else math.nan,
        mean=mean if finite else math.nan, std=math.sqrt(m2 / finite) if finite else math.nan,
        abs_mean=abs_sum / finite if finite else math.nan,
        zeros=zeros, nan=nan, pos_inf=pos_inf, neg_inf=neg_inf,
        hist_counts=tuple(counts), hist_lo=hist_lo, hist_hi=hist_hi, note=note,
    )
