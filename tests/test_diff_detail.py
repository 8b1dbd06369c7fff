"""``diff_detail``: histogram of |a-b| and coarse heatmap of one pair, against numpy.

Fixtures are written with ``safetensors.torch.save_file``; the expected cells and bins are computed
here with numpy from the tensors themselves (full |a-b| arrays, cut at the heatmap's edges), never
from ckptscope's reader.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ckptscope.core.errors import CkptError
from ckptscope.ops.diff.detail import _Grid, matrix_shape, pair_detail
from ckptscope.ops.diff.plan import plan_diff


def _octave(d: float) -> int:
    return math.floor(math.log2(d))


def _write_pair(root, a: dict, b: dict):
    """Two HF-style dirs, one safetensors file each, and their diff plan."""
    for side, tensors in (("a", a), ("b", b)):
        (root / side).mkdir(parents=True)
        save_file(tensors, str(root / side / "model.safetensors"))
    return plan_diff(root / "a", root / "b")


def _expected_grid(delta2d: np.ndarray, differ2d: np.ndarray, row_edges, col_edges):
    """Brute force: every cell's max |a-b| and count, from the whole matrix."""
    r, c = len(row_edges) - 1, len(col_edges) - 1
    top = np.zeros((r, c))
    count = np.zeros((r, c), dtype=int)
    for i in range(r):
        for j in range(c):
            cell = delta2d[row_edges[i]:row_edges[i + 1], col_edges[j]:col_edges[j + 1]]
            top[i, j] = cell.max() if cell.size else 0.0
            count[i, j] = differ2d[row_edges[i]:row_edges[i + 1], col_edges[j]:col_edges[j + 1]].sum()
    return top, count


def _cell(edges, index: int) -> int:
    return next(i for i in range(len(edges) - 1) if edges[i] <= index < edges[i + 1])


@pytest.fixture
def perturbed(tmp_path):
    g = torch.Generator().manual_seed(1)
    a = {"w": torch.randn(100, 70, generator=g), "cube": torch.randn(4, 6, 10, generator=g),
         "bias": torch.randn(300, generator=g), "same": torch.randn(8, 8, generator=g)}
    b = {k: v.clone() for k, v in a.items()}
    b["w"][37, 61] += 3.0
    b["w"][90, 2] -= 0.01
    b["w"][91, 3] += 1e-5
    b["cube"][2, 3, 7] += 0.75
    b["bias"][250] += 0.125
    return _write_pair(tmp_path, a, b), a, b


def test_heatmap_cells_and_histogram_bins(perturbed):
    plan, a, b = perturbed
    x, y = a["w"].double().numpy(), b["w"].double().numpy()
    delta = np.abs(x - y)
    detail = pair_detail(plan, "w", rows=8, cols=16)
    assert detail is not None
    heat = detail.heatmap
    assert heat.shape == (8, 16) and (heat.matrix_rows, heat.matrix_cols) == (100, 70)
    # edges cover the matrix, cells differ in size by at most one
    for edges, n in ((heat.row_edges, 100), (heat.col_edges, 70)):
        sizes = np.diff(edges)
        assert edges[0] == 0 and edges[-1] == n and sizes.max() - sizes.min() <= 1
    top, count = _expected_grid(delta, delta > 0, heat.row_edges, heat.col_edges)
    np.testing.assert_array_equal(np.array(heat.max_abs), top)
    np.testing.assert_array_equal(np.array(heat.counts), count)
    for r, c in ((37, 61), (90, 2), (91, 3)):
        i, j = _cell(heat.row_edges, r), _cell(heat.col_edges, c)
        assert heat.cell_of(r, c) == (i, j)
        assert heat.max_abs[i][j] >= delta[r, c] > 0
    i, j = heat.cell_of(37, 61)
    assert heat.max_abs[i][j] == delta[37, 61] == detail.max_abs
    assert sum(map(sum, heat.counts)) == detail.num_diff == 3

    hist = detail.histogram
    assert hist.step == 1 and hist.total == delta.size
    assert hist.zeros == delta.size - 3 and hist.nan == hist.inf == 0
    assert sum(hist.counts) == 3
    for r, c in ((37, 61), (90, 2), (91, 3)):
        k = _octave(delta[r, c])
        assert hist.bin_of(delta[r, c]) == k - hist.lo_exp
        assert hist.counts[k - hist.lo_exp] >= 1
        lo, hi = hist.edges[k - hist.lo_exp], hist.edges[k - hist.lo_exp + 1]
        assert lo <= delta[r, c] < hi
    assert hist.lo_exp == _octave(delta[91, 3]) and len(hist.counts) == _octave(delta[37, 61]) - hist.lo_exp + 1


def test_leading_axes_become_rows_and_1d_is_one_row(perturbed):
    plan, a, b = perturbed
    detail = pair_detail(plan, "cube", rows=100, cols=100)
    heat = detail.heatmap
    assert matrix_shape((4, 6, 10)) == (24, 10)
    assert heat.shape == (24, 10)  # no more cells than elements
    delta = np.abs(a["cube"].double().numpy() - b["cube"].double().numpy()).reshape(24, 10)
    row = 2 * 6 + 3
    assert heat.max_abs[row][7] == delta[row, 7] > 0 and heat.counts[row][7] == 1
    assert sum(map(sum, heat.counts)) == 1

    detail = pair_detail(plan, "bias", rows=8, cols=7)
    heat = detail.heatmap
    assert heat.shape == (1, 7) and heat.matrix_rows == 1
    d = abs(float(b["bias"][250]) - float(a["bias"][250]))
    j = _cell(heat.col_edges, 250)
    assert heat.max_abs[0][j] == d and heat.counts[0][j] == 1
    assert detail.histogram.counts[detail.histogram.bin_of(d)] == 1


def test_small_blocks_give_the_same_detail(perturbed):
    plan, _, _ = perturbed
    for name in ("w", "cube", "bias"):
        whole = pair_detail(plan, name, rows=5, cols=9)
        pieces = pair_detail(plan, name, rows=5, cols=9, block_elems=37)
        assert pieces == whole


def test_identical_pair_has_no_differences(perturbed):
    plan, a, _ = perturbed
    detail = pair_detail(plan, "same")
    assert detail.num_diff == 0 and detail.max_abs == 0.0
    assert detail.histogram.counts == () and detail.histogram.zeros == a["same"].numel()
    assert not any(map(any, detail.heatmap.counts))


def test_dtype_change_histogram_matches_numpy(tmp_path):
    g = torch.Generator().manual_seed(2)
    t = torch.randn(64, 48, generator=g)
    plan = _write_pair(tmp_path, {"w": t}, {"w": t.to(torch.bfloat16)})
    detail = pair_detail(plan, "w", rows=4, cols=4, max_bins=200)
    x = t.double().numpy()
    y = t.to(torch.bfloat16).double().numpy()
    delta = np.abs(x - y)
    positive = delta[delta > 0]
    octaves = np.floor(np.log2(positive)).astype(int)
    hist = detail.histogram
    assert hist.zeros == int((delta == 0).sum()) and hist.total == t.numel()
    assert hist.lo_exp == octaves.min() and len(hist.counts) == octaves.max() - octaves.min() + 1
    np.testing.assert_array_equal(hist.counts, np.bincount(octaves - octaves.min()))
    assert detail.num_diff == int((x != y).sum())
    top, count = _expected_grid(delta, x != y, detail.heatmap.row_edges, detail.heatmap.col_edges)
    np.testing.assert_array_equal(np.array(detail.heatmap.max_abs), top)
    np.testing.assert_array_equal(np.array(detail.heatmap.counts), count)

    coarse = pair_detail(plan, "w", max_bins=3).histogram
    assert len(coarse.counts) <= 3 and coarse.step == math.ceil(len(hist.counts) / 3)
    assert sum(coarse.counts) == sum(hist.counts) and coarse.lo_exp == hist.lo_exp


def test_nan_and_inf_differences(tmp_path):
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    y = x.clone()
    y[0, 1] = float("nan")
    y[2, 3] = float("inf")
    nan_both = x.clone()
    nan_both[1, 1] = float("nan")
    plan = _write_pair(tmp_path, {"w": x, "n": nan_both}, {"w": y, "n": nan_both.clone()})
    detail = pair_detail(plan, "w", rows=3, cols=4)
    assert (detail.histogram.nan, detail.histogram.inf, detail.histogram.zeros) == (1, 1, 10)
    assert detail.heatmap.max_abs[0][1] == math.inf and detail.heatmap.max_abs[2][3] == math.inf
    assert detail.num_diff == 2
    same_nan = pair_detail(plan, "n")
    assert same_nan.num_diff == 0 and same_nan.histogram.nan == 0


def test_scattered_boxes_agree_with_rectangles():
    """A box cut on a middle axis (not a matrix rectangle) lands in the same cells."""
    rng = np.random.default_rng(3)
    shape = (3, 5, 8)
    a = rng.standard_normal(shape).astype(np.float32)
    b = a.copy()
    b[rng.random(shape) < 0.2] += 1.0
    whole = _Grid(shape, 4, 3)
    whole.add(a, b, ((0, 3), (0, 5), (0, 8)))
    cut = _Grid(shape, 4, 3)
    for k in range(3):
        for lo, hi in ((0, 2), (2, 5)):
            cut.add(a[k:k + 1, lo:hi], b[k:k + 1, lo:hi], ((k, k + 1), (lo, hi), (0, 8)))
    assert cut.heatmap() == whole.heatmap() and cut.histogram(40) == whole.histogram(40)


def test_cancel_and_uncomparable_pairs(tmp_path):
    plan = _write_pair(tmp_path, {"w": torch.ones(4, 4), "gone": torch.ones(2)}, {"w": torch.ones(2, 8)})
    with pytest.raises(CkptError, match="shape mismatch"):
        pair_detail(plan, "w")
    with pytest.raises(CkptError, match="only a"):
        pair_detail(plan, "gone")
    with pytest.raises(CkptError, match="not in this diff"):
        pair_detail(plan, "nope")
    plan = _write_pair(tmp_path / "other", {"w": torch.ones(4, 4)}, {"w": torch.zeros(4, 4)})
    assert pair_detail(plan, "w", should_stop=lambda: True) is None


SAMPLES = Path(__file__).resolve().parents[1] / "sample_ckpts"


def test_mapped_pair_fused_qkv_pieces(tmp_path):
    """Megatron-Core (fused, stacked linear_qkv) vs its HF source with one q_proj element moved:
    the recipe's row pieces land the difference in the right cell."""
    hf = tmp_path / "hf"
    shutil.copytree(SAMPLES / "hf_llama_gqa", hf)
    tensors = load_file(str(hf / "model.safetensors"))
    name = "model.layers.1.self_attn.q_proj.weight"
    at = (45, 3)  # a row in the second KV group's block of q rows
    before = float(tensors[name][at])
    tensors[name][at] += 0.75
    delta = abs(float(tensors[name][at]) - before)
    save_file(tensors, str(hf / "model.safetensors"), metadata={"format": "pt"})
    plan = plan_diff(SAMPLES / "mcore_llama_gqa", hf)
    assert plan.mapping == "mcore->hf"
    pair = next(p for p in plan.pairs if p.name == name)
    assert len(pair.a.pieces) > 1  # built from several blocks of the fused tensor
    detail = pair_detail(plan, pair, rows=8, cols=8, block_elems=50)
    heat = detail.heatmap
    i, j = _cell(heat.row_edges, at[0]), _cell(heat.col_edges, at[1])
    assert heat.max_abs[i][j] == delta and heat.counts[i][j] == 1 == detail.num_diff
    assert detail.histogram.counts[detail.histogram.bin_of(delta)] == 1
    k_proj = pair_detail(plan, "model.layers.1.self_attn.k_proj.weight")
    assert k_proj.num_diff == 0
