"""bench/run_all.py does not turn a stalled baseline into a pass: a ratio row whose `cp` took over 2x
its fastest in more than one pair, or over 2x as long as the same copy in another row, is UNSTABLE."""

from __future__ import annotations

import sys

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

import run_all  # noqa: E402
from abab import Row, flag_slow_baselines  # noqa: E402


def copy_row(id: str, a: list[float], b: list[float]) -> Row:
    raw = [{"a_s": x, "b_s": y, "ratio": x / y} for x, y in zip(a, b)]
    return Row.from_pairs(id, f"row {id} vs cp -r", raw, target=1.0)


def test_a_steady_baseline_gives_pass_and_fail_as_before():
    fast = copy_row("4", [0.36, 0.35, 0.37, 0.36, 0.35], [0.37, 0.38, 0.37, 0.36, 0.38])
    slow = copy_row("7", [0.46, 0.47, 0.45, 0.48, 0.46], [0.37, 0.38, 0.37, 0.36, 0.38])
    flag_slow_baselines([fast, slow])
    assert (fast.unstable, fast.passed, run_all._result(fast)) == (False, True, "PASS")
    assert (slow.unstable, slow.passed, run_all._result(slow)) == (False, False, "FAIL")


def test_a_baseline_that_swung_within_the_row_is_neither_pass_nor_fail():
    """Row 5 of one run: `cp` of the same 1.5 GB took 0.46 s in two pairs and 3.5-3.8 s in five."""
    row = copy_row("5", [0.48, 0.45, 0.46, 0.46, 0.52, 0.52, 0.53], [3.60, 3.50, 3.76, 3.69, 3.69, 0.46, 0.50])
    assert row.median < 0.2 and row.unstable and row.passed is None
    assert run_all._result(row) == "UNSTABLE"
    assert "0.46-3.76 s" in run_all._table([row])


def test_one_stalled_pair_is_left_to_the_median():
    """Row 4 of a run: one `cp` of 1.53 s among six of 0.35-0.48 s."""
    row = copy_row("4", [0.48, 0.56, 0.58, 0.55, 0.58, 0.44, 0.45], [1.53, 0.48, 0.42, 0.37, 0.40, 0.35, 0.36])
    assert row.stalled_pairs == 1 and not row.unstable
    assert run_all._result(row) == "FAIL"  # its median is over the target, stall or not


def test_a_baseline_far_slower_than_the_same_copy_in_another_row_is_suspect():
    """Row 6 of that run: every `cp` of 1.43 GB took 2.4-3.1 s, while row 4 copied 1.52 GB in 0.37 s."""
    row4 = copy_row("4", [0.55, 0.48, 0.46, 0.47, 0.46], [0.37, 0.37, 0.37, 0.38, 0.37])
    row6 = copy_row("6", [0.44, 0.60, 0.59, 0.71, 0.65], [2.61, 2.31, 3.07, 2.70, 2.50])
    assert not row6.unstable and row6.passed  # alone it looks like a 0.2x pass
    flag_slow_baselines([row4, row6])
    assert row6.unstable and row6.passed is None and run_all._result(row6) == "UNSTABLE"
    assert not row4.unstable and run_all._result(row4) == "FAIL"
    assert row6.to_json()["unstable"] is True
