"""Block metrics of ``diff`` (ops/diff/metrics.py) against their definitions, computed here the
plain way (whole arrays in float64, numpy).

``compare_block`` takes one of three paths for a block of one float dtype: byte-equal (one
``memcmp``), the piecewise path for a block that differs (cache-sized pieces, the common case of a
fine-tuned model against its base) and the masked path (NaN or inf present). Each case below is
built so a given path runs, and all of them must give the definitions' numbers.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from ckptscope.ops.blockmath import PIECE
from ckptscope.ops.diff.metrics import Accumulator, compare_block


def _reference(a: np.ndarray, b: np.ndarray, origin: tuple[int, ...], atol: float, rtol: float) -> dict:
    kind = f"u{a.dtype.itemsize}"
    differ = (a.reshape(-1).view(kind) != b.reshape(-1).view(kind))
    x, y = a.astype(np.float64).reshape(-1), b.astype(np.float64).reshape(-1)
    finite = np.isfinite(x) & np.isfinite(y)
    with np.errstate(invalid="ignore", over="ignore"):
        delta = np.abs(x - y)
    delta[np.isnan(x) & np.isnan(y)] = 0.0
    where = np.flatnonzero(differ)
    out = {"num_diff": int(where.size), "sum_sq_a": float(x[finite] @ x[finite]),
           "sum_sq_b": float(y[finite] @ y[finite]), "dot": float(x[finite] @ y[finite]),
           "nan": bool(np.isnan(delta[where]).any())}
    ok = np.where(np.isnan(delta), 0.0, delta)
    out["sum_abs"] = float(ok[where].sum())
    out["sum_sq_diff"] = float(ok[where] @ ok[where])
    with np.errstate(invalid="ignore"):
        out["violations"] = int(np.count_nonzero(~(delta[where] <= atol + rtol * np.abs(y[where]))))
    if where.size:
        top = int(where[np.argmax(ok[where])])
        out["max_abs"] = float(ok[top])
        out["max_at"] = tuple(int(o + i) for o, i in zip(origin, np.unravel_index(top, a.shape)))
    else:
        out["max_abs"], out["max_at"] = 0.0, None
    return out


def _check(got: Accumulator, ref: dict) -> None:
    assert got.numel > 0
    for key in ("num_diff", "violations", "max_at", "nan"):
        assert getattr(got, key) == ref[key], key
    assert got.max_abs == ref["max_abs"]
    for key in ("sum_sq_a", "sum_sq_b", "dot", "sum_abs", "sum_sq_diff"):
        assert getattr(got, key) == pytest.approx(ref[key], rel=1e-12, abs=1e-300), key


DTYPES = [ml_dtypes.bfloat16, np.float16, np.float32, np.float64, ml_dtypes.float8_e4m3fn]


def _pair(dtype, shape, rng, *, changed: float):
    a = (rng.standard_normal(shape) * 3).astype(dtype)
    b = a.copy()
    mask = rng.random(shape) < changed
    b[mask] = (a.astype(np.float32)[mask] + rng.standard_normal(int(mask.sum())).astype(np.float32)).astype(dtype)
    return a, b


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("changed", [1.0, 0.3, 1e-5])
@pytest.mark.parametrize("tol", [(0.0, 0.0), (1e-2, 1e-1)])
def test_block_metrics_equal_the_definitions(dtype, changed, tol):
    rng = np.random.default_rng(11)
    shape = (3 * PIECE // 256 + 5, 256)  # pieces that cut rows, and a short last piece
    a, b = _pair(dtype, shape, rng, changed=changed)
    origin = (40, 0)
    _check(compare_block(a, b, origin, atol=tol[0], rtol=tol[1]), _reference(a, b, origin, *tol))


def test_only_signed_zeros_differ_and_ties_take_the_first():
    a = np.zeros((2 * PIECE + 3,), dtype=ml_dtypes.bfloat16)
    b = a.copy()
    b[PIECE + 7] = -0.0  # bitwise different, equal in value
    got = compare_block(a, b, (0,))
    _check(got, _reference(a, b, (0,), 0.0, 0.0))
    assert (got.num_diff, got.max_abs, got.max_at, got.violations) == (1, 0.0, (PIECE + 7,), 0)
    b[PIECE + 9] = 2.0
    b[2 * PIECE + 1] = -2.0  # the same |difference| later: the first one is reported
    got = compare_block(a, b, (0,))
    assert (got.max_abs, got.max_at) == (2.0, (PIECE + 9,))
    _check(got, _reference(a, b, (0,), 0.0, 0.0))


@pytest.mark.parametrize("poison", [math.nan, math.inf])
def test_nan_and_inf_take_the_masked_path_with_the_same_definitions(poison):
    rng = np.random.default_rng(5)
    a, b = _pair(np.float32, (2 * PIECE + 11,), rng, changed=0.5)
    b[PIECE + 3] = poison
    a[5] = poison
    got = compare_block(a, b, (0,))
    _check(got, _reference(a, b, (0,), 0.0, 0.0))


def test_metrics_of_merged_blocks_equal_the_whole():
    rng = np.random.default_rng(2)
    a, b = _pair(ml_dtypes.bfloat16, (4 * PIECE // 128, 128), rng, changed=0.7)
    whole = compare_block(a, b, (0, 0))
    parts = Accumulator()
    for lo in range(0, a.shape[0], 100):
        parts.merge(compare_block(a[lo:lo + 100], b[lo:lo + 100], (lo, 0)))
    assert parts.numel == whole.numel == a.size
    assert (parts.num_diff, parts.max_abs, parts.max_at) == (whole.num_diff, whole.max_abs, whole.max_at)
    assert parts.metrics() == pytest.approx(whole.metrics(), rel=1e-12)
