"""Row 10: ``timeline`` over 10 iterations of a Llama-shaped model, against reading the same bytes.

The timeline must read every byte of every iteration once and do a few float64 passes over it
(norms, differences, max |dW|), so ``cat`` of the same files is its floor; both read from a warm page
cache, so the ratio is the CPU cost of the statistics against the cost of just reading.
"""

from __future__ import annotations

import json

from abab import BenchError, Config, Row, Side, ckptscope, files_under, gb_text, mb_text, pairs, size_of, warm

ITERATIONS = 10


def row10(cfg: Config) -> list[Row]:
    src, info = cfg.data("llama", "llama_hf", gb=cfg.gb)
    root, _ = cfg.data("timeline_root", "timeline_root", src=str(src), iterations=ITERATIONS)
    warm(root)

    def every_iteration(run) -> None:
        got = json.loads(run.stdout)["iterations"]
        if got != list(range(1, ITERATIONS + 1)):
            raise BenchError(f"timeline read iterations {got}, expected 1..{ITERATIONS}")

    a = Side(ckptscope("timeline", "--json", "--no-optimizer", root), ok=(0, 1))
    b = Side(["cat", *map(str, files_under(root))])
    raw = pairs(a, b, cfg.pairs, check=every_iteration, check_every=True)
    rss = max(p["a_rss"] for p in raw)
    what = (f"timeline --json, {ITERATIONS} iterations x {gb_text(size_of(src))} "
            f"({gb_text(size_of(root))} read) vs cat of the same files")
    rows = [Row.from_pairs("10", what, raw, target=1.5,
                           note=f"peak RSS {mb_text(rss)} (largest tensor {mb_text(info['largest'])})",
                           extra={"peak_rss": rss})]
    return rows + [_dense(cfg)]


def _dense(cfg: Config) -> Row:
    """10-dense: every weight changes at every step (real training), so no block is skipped as
    byte-equal to the previous iteration's and every step is decoded and subtracted. A model a fifth
    of row 10's keeps the disk use at two of row 10's models. No target in the issue: reported so the
    row 10 figure, where one tensor changes per iteration, is not read as the cost of a dense run."""
    small, _ = cfg.data("llama_small", "llama_hf", gb=round(max(0.05, cfg.gb / 5), 2))
    root, _ = cfg.data("timeline_dense", "timeline_dense_root", src=str(small), iterations=ITERATIONS)
    warm(root)
    a = Side(ckptscope("timeline", "--json", "--no-optimizer", root), ok=(0, 1))
    b = Side(["cat", *map(str, files_under(root))])
    raw = pairs(a, b, cfg.pairs)
    what = (f"timeline --json, {ITERATIONS} iterations x {gb_text(size_of(small))}, every weight changing "
            f"every step ({gb_text(size_of(root))} read) vs cat")
    return Row.from_pairs("10-dense", what, raw, note="no target in the issue; informational")
