"""Per-pair difference metrics, accumulated block by block so no tensor is ever held whole.

Every block contributes sums (float64) that merge associatively, so blocks can be computed in any
order, on several threads or on a GPU, and still give the same totals. Definitions:

* ``num_diff``: elements that are not identical. Same dtype: compared bitwise (so ``-0.0 != 0.0``
  and two identical NaNs are equal, as ``torch.equal`` would not say). Different dtypes: compared by
  value after upcasting to float64.
* ``max_abs_diff`` / ``mean_abs_diff``: over all elements of ``|a - b|`` (float64).
* ``rel_l2``: ``||a - b|| / ||a||`` (null when ``||a|| = 0`` and they differ).
* ``cosine``: ``<a, b> / (||a|| ||b||)`` (null when either norm is 0).
* ``violations``: elements outside ``atol + rtol·|b|`` (numpy ``allclose`` rule); NaN vs non-NaN
  always violates.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from typing import TYPE_CHECKING

from ckptscope.ops.blockmath import PIECE, is_float, same_bytes, sum_squares, widen

if TYPE_CHECKING:
    import numpy as np

_UINT_BY_SIZE = {1: "u1", 2: "u2", 4: "u4", 8: "u8"}
_local = threading.local()
"""numpy is imported by the functions that need it: a diff whose tensors are all byte-equal never
decodes a value, and so never pays numpy's import."""


@dataclass
class Accumulator:
    numel: int = 0
    num_diff: int = 0
    violations: int = 0
    sum_abs: float = 0.0
    sum_sq_diff: float = 0.0
    sum_sq_a: float = 0.0
    sum_sq_b: float = 0.0
    dot: float = 0.0
    max_abs: float = 0.0
    max_at: tuple[int, ...] | None = None
    nan: bool = False
    """A NaN difference was seen (one side NaN, the other not): max/mean become NaN."""

    def merge(self, other: "Accumulator") -> None:
        self.numel += other.numel
        self.num_diff += other.num_diff
        self.violations += other.violations
        self.sum_abs += other.sum_abs
        self.sum_sq_diff += other.sum_sq_diff
        self.sum_sq_a += other.sum_sq_a
        self.sum_sq_b += other.sum_sq_b
        self.dot += other.dot
        self.nan = self.nan or other.nan
        # The largest difference, the first in C order on ties, whatever order blocks merge in.
        if other.max_at is not None and (self.max_at is None or other.max_abs > self.max_abs
                                         or (other.max_abs == self.max_abs and other.max_at < self.max_at)):
            self.max_abs, self.max_at = other.max_abs, other.max_at

    def metrics(self) -> dict[str, float | int | None]:
        norm_a, norm_b = math.sqrt(self.sum_sq_a), math.sqrt(self.sum_sq_b)
        if self.num_diff == 0:
            rel = 0.0
        elif norm_a > 0:
            rel = math.sqrt(self.sum_sq_diff) / norm_a
        else:
            rel = None
        cosine = self.dot / (norm_a * norm_b) if norm_a > 0 and norm_b > 0 else (1.0 if self.num_diff == 0 else None)
        if cosine is not None:
            cosine = max(-1.0, min(1.0, cosine))
        return {
            "max_abs_diff": math.nan if self.nan else self.max_abs,
            "mean_abs_diff": math.nan if self.nan else (self.sum_abs / self.numel if self.numel else 0.0),
            "rel_l2": None if self.nan else rel,
            "cosine": None if self.nan else cosine,
            "num_diff": self.num_diff,
        }


def _as_float64(x: np.ndarray) -> np.ndarray:
    import numpy as np

    if x.dtype == np.float64:
        return x
    if x.dtype.kind == "b":
        return x.astype(np.float64)
    return x.astype(np.float64)


def compare_block(a: np.ndarray, b: np.ndarray, origin: tuple[int, ...], *, atol: float = 0.0,
                  rtol: float = 0.0) -> Accumulator:
    """Metrics for one block; ``origin`` is the block's first element in canonical coordinates. inf and
    NaN are handled by the paths themselves: numpy's RuntimeWarnings about them (a block holding +inf
    and -inf, an fp16 signalling NaN) are not said on stderr (they were, beside ``--json``)."""
    import numpy as np

    with np.errstate(all="ignore"):
        return _compare_block(a, b, origin, atol, rtol)


def _compare_block(a: np.ndarray, b: np.ndarray, origin: tuple[int, ...], atol: float, rtol: float) -> Accumulator:
    import numpy as np

    acc = Accumulator(numel=int(a.size))
    if a.size == 0:
        return acc
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    if a.dtype == b.dtype and a.dtype.itemsize in _UINT_BY_SIZE and a.dtype.kind != "c":
        kind = np.dtype(_UINT_BY_SIZE[a.dtype.itemsize])
        flat_a, flat_b = np.ascontiguousarray(flat_a), np.ascontiguousarray(flat_b)
        if same_bytes(flat_a, flat_b):  # most blocks of a differing tensor: one memcmp, no mask
            where = np.zeros(0, dtype=np.intp)
        elif is_float(flat_a):
            dense = _piecewise(flat_a, flat_b, kind, a.shape, origin, atol, rtol)
            if dense is not None:
                return dense
            where = np.flatnonzero(np.not_equal(flat_a.view(kind), flat_b.view(kind)))
        else:
            where = np.flatnonzero(np.not_equal(flat_a.view(kind), flat_b.view(kind)))
        total = sum_squares(flat_a)
        if math.isfinite(total):
            # Outside ``where`` b equals a bit for bit, so one full reduction suffices: b's norm and
            # <a, b> are ||a||^2 corrected on the differing elements only.
            da, db = _as_float64(flat_a[where]), _as_float64(flat_b[where])
            _sparse_sums(acc, total, da, db)
            _diff_stats(acc, where, da, db, a.shape, origin, atol, rtol)
            return acc
        a64, b64 = _as_float64(flat_a), _as_float64(flat_b)
    else:
        a64, b64 = _as_float64(flat_a), _as_float64(flat_b)
        where = np.flatnonzero(~((a64 == b64) | (np.isnan(a64) & np.isnan(b64))))
    finite = np.isfinite(a64) & np.isfinite(b64)
    fa, fb = (a64, b64) if finite.all() else (a64[finite], b64[finite])
    acc.sum_sq_a, acc.sum_sq_b, acc.dot = float(fa @ fa), float(fb @ fb), float(fa @ fb)
    _diff_stats(acc, where, a64[where], b64[where], a.shape, origin, atol, rtol)
    return acc


def _piecewise(flat_a: np.ndarray, flat_b: np.ndarray, kind, shape: tuple[int, ...],
               origin: tuple[int, ...], atol: float, rtol: float) -> Accumulator | None:
    """The metrics of a block that differs, in ``PIECE``-sized pieces through per-thread float64
    buffers that stay in the core's cache: no block-sized temporaries, which on a tensor that
    differs everywhere (a fine-tuned model against its base) cost more in page faults and memory
    traffic than the arithmetic. A piece whose bytes are equal costs one ``memcmp`` and one norm.
    Same definitions as the masked path below (bitwise ``num_diff``; sums over all elements, which
    equal sums over the differing ones since equal elements add 0). Returns None, having changed
    nothing, when a value is NaN or inf (or a square overflows): the masked path handles those."""
    import numpy as np

    x_buf, y_buf, ne_buf = _piece_buffers()
    bits_a, bits_b = flat_a.view(kind), flat_b.view(kind)
    out = Accumulator(numel=int(flat_a.size))
    tolerant = atol > 0 or rtol > 0
    for lo in range(0, flat_a.size, PIECE):
        pa, pb = flat_a[lo:lo + PIECE], flat_b[lo:lo + PIECE]
        x = widen(pa, x_buf)
        if same_bytes(pa, pb):
            sq = float(np.dot(x, x))
            if not math.isfinite(sq):
                return None
            out.sum_sq_a += sq
            out.sum_sq_b += sq
            out.dot += sq
            continue
        y = widen(pb, y_buf)
        saa, sbb, sab = float(np.dot(x, x)), float(np.dot(y, y)), float(np.dot(x, y))
        if not (math.isfinite(saa) and math.isfinite(sbb) and math.isfinite(sab)):
            return None
        ne = np.not_equal(bits_a[lo:lo + PIECE], bits_b[lo:lo + PIECE], out=ne_buf[:x.size])
        num_diff = int(np.count_nonzero(ne))
        np.subtract(x, y, out=x)
        out.sum_sq_diff += float(np.dot(x, x))
        np.abs(x, out=x)
        out.sum_abs += float(x.sum())
        top = int(x.argmax())
        if tolerant:
            np.abs(y, out=y)
            np.multiply(y, rtol, out=y)
            np.add(y, atol, out=y)
            out.violations += int(np.count_nonzero(np.greater(x, y, out=ne_buf[:x.size])))
        else:
            out.violations += int(np.count_nonzero(x))
        largest = float(x[top])
        if num_diff and (out.max_at is None or largest > out.max_abs):
            if largest == 0.0:  # only bitwise differences (-0.0 / 0.0): the first of them
                top = int(np.argmax(np.not_equal(bits_a[lo:lo + PIECE], bits_b[lo:lo + PIECE])))
            local = np.unravel_index(lo + top, shape)
            out.max_abs, out.max_at = largest, tuple(int(o + i) for o, i in zip(origin, local))
        out.num_diff += num_diff
        out.sum_sq_a += saa
        out.sum_sq_b += sbb
        out.dot += sab
    return out


def _piece_buffers():
    import numpy as np

    bufs = getattr(_local, "pieces", None)
    if bufs is None:
        bufs = _local.pieces = (np.empty(PIECE, np.float64), np.empty(PIECE, np.float64), np.empty(PIECE, np.bool_))
    return bufs


def _sparse_sums(acc: Accumulator, total: float, da: np.ndarray, db: np.ndarray) -> None:
    """Norms and dot product from ``total = ||a||^2`` (all finite) and the differing elements.

    Sums run over elements finite on both sides, as in the dense path."""
    import numpy as np

    finite = np.isfinite(db)
    drop = float(np.dot(da[~finite], da[~finite])) if not finite.all() else 0.0
    fa, fb = da[finite], db[finite]
    acc.sum_sq_a = total - drop
    acc.sum_sq_b = total - drop + float(fb @ fb - fa @ fa)
    acc.dot = total - drop + float(fa @ (fb - fa))


def _diff_stats(acc: Accumulator, where: np.ndarray, da: np.ndarray, db: np.ndarray, shape: tuple[int, ...],
                origin: tuple[int, ...], atol: float, rtol: float) -> None:
    """Counts, |a-b| sums, the largest difference and its location, from the differing elements."""
    import numpy as np

    acc.num_diff = int(where.size)
    if acc.num_diff == 0:
        return
    with np.errstate(invalid="ignore", over="ignore"):
        delta = np.abs(da - db)
    delta[np.isnan(da) & np.isnan(db)] = 0.0  # bitwise-different NaN payloads: not a value difference
    nan_delta = np.isnan(delta)
    if nan_delta.any():
        acc.nan = True
        delta_ok = np.where(nan_delta, 0.0, delta)
    else:
        delta_ok = delta
    acc.sum_abs = float(delta_ok.sum())
    acc.sum_sq_diff = float(np.dot(delta_ok, delta_ok)) if np.isfinite(delta_ok).all() else math.inf
    top = int(np.argmax(delta_ok))
    acc.max_abs = float(delta_ok[top])
    local = np.unravel_index(int(where[top]), shape)
    acc.max_at = tuple(int(o + i) for o, i in zip(origin, local))
    with np.errstate(invalid="ignore", over="ignore"):
        allowed = atol + rtol * np.abs(db)
        acc.violations = int(np.count_nonzero(~(delta <= allowed)))
