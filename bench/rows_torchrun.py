"""Row 11: convert HF -> torch_dist on 2 ranks (``--workers 2``, torchrun's launcher) against the
same convert on one process, and each rank's peak RSS.

Both sides write 4 data files (``--num-files 4``), so their outputs are byte-identical (checked on
the warm-up pair). The ratio is 2-rank wall time / 1-process wall time: below 1 means the ranks
overlap their work; on a machine with few cores or one disk it mostly shows the fixed cost of
starting the ranks (torch import, rendezvous). Each rank writes its peak RSS to a file
(``CKPTSCOPE_RSS_DIR``); the largest must stay under the largest tensor + 300 MB.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics

from abab import BenchError, Config, Row, Side, ckptscope, gb_text, mb_text, pairs, size_of, warm


def _digests(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def row11(cfg: Config) -> list[Row]:
    src, info = cfg.data("llama", "llama_hf", gb=cfg.gb)
    warm(src)
    rss_dir = cfg.work / "rss"
    rss_dir.mkdir(exist_ok=True)
    dst = cfg.work / "out_ranks"  # one destination for both: .metadata records the path
    env = {**os.environ, "CKPTSCOPE_RSS_DIR": str(rss_dir)}
    a = Side(ckptscope("convert", src, dst, "--to", "mcore", "--num-files", "4", "--workers", "2"), out=dst, env=env)
    b = Side(ckptscope("convert", src, dst, "--to", "mcore", "--num-files", "4"), out=dst)
    b.run()
    one = _digests(dst)
    a.run()
    if _digests(dst) != one:
        raise BenchError("2 ranks wrote other bytes than one process")
    shutil.rmtree(dst)
    seen: list[int] = []  # each run's ranks overwrite rank*.json: collected before the next run

    def collect() -> None:
        for p in rss_dir.glob("rank*.json"):
            seen.append(json.loads(p.read_text())["max_rss_bytes"])
            p.unlink()

    a.prepare = collect
    raw = pairs(a, b, cfg.pairs)
    collect()
    if not seen:
        raise BenchError("the ranks wrote no peak RSS (CKPTSCOPE_RSS_DIR)")
    rss = max(seen)  # the largest of every rank of every run
    bound = info["largest"] + 300e6
    start_up = statistics.median(p["a_s"] - p["b_s"] for p in raw)
    what = f"convert HF -> torch_dist ({gb_text(size_of(src))}) on 2 ranks vs 1 process, same bytes"
    # No time target: at bench sizes the ratio is the ranks' fixed start-up (launcher, torch import,
    # rendezvous) over a second of copying; the row records it and the RSS bound, which must hold.
    return [Row.from_pairs("11", what, raw, error="" if rss <= bound else "peak RSS per rank over the bound",
                           note=f"2 ranks take {start_up:.1f} s longer (start-up); peak RSS per rank {mb_text(rss)} "
                                f"(bound largest tensor + 300 MB = {mb_text(bound)}: "
                                f"{'OK' if rss <= bound else 'EXCEEDED'})",
                           extra={"peak_rss_per_rank": rss, "rss_bound": bound, "start_up_s": start_up})]
