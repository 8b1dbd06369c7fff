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
    raw = pairs(a, b, cfg.pairs, check=every_iteration)
    rss = max(p["a_rss"] for p in raw)
    what = (f"timeline --json, {ITERATIONS} iterations x {gb_text(size_of(src))} "
            f"({gb_text(size_of(root))} read) vs cat of the same files")
    return [Row.from_pairs("10", what, raw, target=1.5,
                           note=f"peak RSS {mb_text(rss)} (largest tensor {mb_text(info['largest'])})",
                           extra={"peak_rss": rss})]
