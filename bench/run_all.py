#!/usr/bin/env python
"""Every ckptscope performance target in one table, each figure a ratio from alternating runs.

    python bench/run_all.py [--quick] [--json OUT] [--only ROW[,ROW...]] [--pairs N] [--gb GB] [--keep]

Each ratio row runs A (ckptscope) and B (the baseline) as ABAB... pairs, each run a fresh process
on the same bytes with the page cache in the same state (see abab.py), and reports the median of
the per-pair ratios A/B with its [min-max] spread. Row 9 is absolute seconds (median of fresh
runs). ``--quick``: 5 pairs, ~0.3 GB instead of ~1.5 GB for the write-heavy rows, no 1M-tensor
linearity point. Every raw pair goes to the JSON file (default bench/results.json).

Rows: 1, 2, 2-lin (inspect), 3 (inspect vs sft-cli), 4, 5 (convert, each with a -load variant),
6 (merge, + verl peer), 7 (rename), 8 (diff), 9 (TUI start-up), 10 (timeline), 11 (convert on 2 ranks
vs 1 process, per-rank RSS). ``--only 4`` runs row 4 and 4-load.
Exit status: 0 whether targets pass or not (the table is the result), 2 if a row errored.
"""

from __future__ import annotations

import argparse
import compileall
import datetime
import importlib.util
import json
import os
import platform
import shutil
import sys
import tempfile
import textwrap
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rows_convert  # noqa: E402
import rows_inspect  # noqa: E402
import rows_rename_diff  # noqa: E402
import rows_timeline  # noqa: E402
import rows_torchrun  # noqa: E402
import rows_tui  # noqa: E402
from abab import BASELINE_SPREAD, BENCH, Config, Row, flag_slow_baselines  # noqa: E402

GROUPS = {"1": rows_inspect.row1, "2": rows_inspect.row2, "2-lin": rows_inspect.row2_linearity,
          "3": rows_inspect.row3, "4": rows_convert.row4, "5": rows_convert.row5, "6": rows_convert.row6,
          "7": rows_rename_diff.row7, "8": rows_rename_diff.row8, "9": rows_tui.row9,
          "10": rows_timeline.row10, "11": rows_torchrun.row11}


def _disk_gb(gb: float, work_parent: Path) -> float:
    """The write-heavy rows hold at most ~6 copies of the model at once (HF, its patched twin,
    torch_dist, FSDP2 shards, two outputs) plus ~1 GB of small-tensor sets. Scale down if short."""
    free = shutil.disk_usage(work_parent).free
    need = (6 * gb + 1) * 1e9 * 1.2
    if free >= need:
        return gb
    scaled = max(0.05, round((free / 1.2 - 1e9) / 6e9, 2))
    print(f"only {free / 1e9:.1f} GB free under {work_parent}; need ~{need / 1e9:.1f} GB for {gb} GB models: "
          f"scaling the models down to {scaled} GB", file=sys.stderr)
    return scaled


def _result(row: Row) -> str:
    """PASS / FAIL against the target; UNSTABLE when the baseline itself swung (``BASELINE_SPREAD``);
    ERROR, skip, or info for a measured row without a target."""
    if row.unstable and not row.error:
        return "UNSTABLE"
    if row.passed is not None:
        return "PASS" if row.passed else "FAIL"
    return "ERROR" if row.error else "skip" if row.skipped or not row.values else "info"


def _unstable_note(row: Row) -> str:
    if not row.unstable:
        return ""
    if row.baseline_suspect:
        return f"UNSTABLE: {row.baseline_suspect}; the machine, not the tool, set this ratio: rerun the row"
    times = row.baseline_times
    return (f"UNSTABLE: the baseline took {min(times):.2f}-{max(times):.2f} s for the same bytes, over "
            f"{BASELINE_SPREAD:g}x its fastest in {row.stalled_pairs} pairs; the machine, not the tool, set this "
            "ratio: rerun the row")


def _table(rows: list[Row], width: int = 72) -> str:
    head = ("row", "what", "measured median [min-max]", "target", "result")
    body = [(r.id, r.what + "".join(f" ({t})" for t in (r.note, r.skipped, r.error.splitlines()[0] if r.error else "",
                                                        _unstable_note(r))
                                    if t),
             r.measured_text(), r.target_text(), _result(r)) for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    widths[1] = width
    fmt = "  ".join(f"{{:{'<' if i < 2 else '>'}{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    for line in body:  # long descriptions wrap under their own column
        what = textwrap.wrap(line[1], width) or [""]
        lines.append(fmt.format(line[0], what[0], *line[2:]))
        lines += [fmt.format("", more, "", "", "") .rstrip() for more in what[1:]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 pairs, ~0.3 GB models, no 1M-tensor point")
    parser.add_argument("--json", default=str(BENCH / "results.json"), help="where to write every raw pair")
    parser.add_argument("--only", action="append", default=[], help="row(s) to run, e.g. 4 or 1,2-lin (repeatable)")
    parser.add_argument("--pairs", type=int, default=None, help="A/B pairs per row (default 7, --quick 5; min 5)")
    parser.add_argument("--gb", type=float, default=None, help="model size of rows 4-8 (default 1.5, --quick 0.3)")
    parser.add_argument("--dir", default="/tmp", help="parent of the temp work dir")
    parser.add_argument("--keep", action="store_true", help="keep the generated data (prints where)")
    args = parser.parse_args(argv)
    only = [o for item in args.only for o in item.split(",") if o]
    unknown = [o for o in only if o not in GROUPS]
    if unknown:
        parser.error(f"unknown row(s) {unknown}; rows are {', '.join(GROUPS)}")
    n_pairs = max(5, args.pairs or (5 if args.quick else 7))
    gb = _disk_gb(args.gb or (0.3 if args.quick else 1.5), Path(args.dir))

    # An installed package is byte-compiled; this box sets PYTHONDONTWRITEBYTECODE, so without
    # this every fresh process would compile ckptscope from source and pay it in A's time.
    # (found without importing it: this process stays small, see abab.generate)
    package = importlib.util.find_spec("ckptscope").submodule_search_locations[0]
    compileall.compile_dir(package, quiet=1)
    work = Path(tempfile.mkdtemp(prefix="ckptscope-bench-", dir=args.dir))
    cfg = Config(quick=args.quick, pairs=n_pairs, gb=gb, work=work)
    started, load_before = time.time(), os.getloadavg()
    rows: list[Row] = []
    try:
        for group, func in GROUPS.items():
            if only and group not in only:
                continue
            print(f"row {group} ...", file=sys.stderr, flush=True)
            t = time.perf_counter()
            try:
                got = func(cfg)
            except Exception as exc:  # one broken row must not hide the others
                got = [Row(group, func.__doc__.splitlines()[0] if func.__doc__ else func.__name__,
                           error=f"{type(exc).__name__}: {exc}")]
                traceback.print_exc()
            for row in got:
                print(f"  {row.id}: {row.measured_text()} (target {row.target_text()})"
                      f"{' - ' + row.error.splitlines()[0] if row.error else ''}", file=sys.stderr, flush=True)
            rows += got
            print(f"  ({time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
    finally:
        if args.keep:
            print(f"data kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    flag_slow_baselines(rows)
    elapsed = time.time() - started
    print(f"\n{n_pairs} A/B pairs per ratio row (ABAB, fresh processes, warm page cache, sync before writes); "
          f"models {gb} GB; load average {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
          f"{elapsed / 60:.1f} min")
    print(_table(rows))
    report = {"started": datetime.datetime.fromtimestamp(started).isoformat(timespec="seconds"),
              "seconds": round(elapsed, 1), "quick": args.quick, "pairs": n_pairs, "gb": gb,
              "python": platform.python_version(), "cpus": os.cpu_count(),
              "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
              "rows": [r.to_json() for r in rows]}
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(f"raw pairs: {args.json}")
    return 2 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
