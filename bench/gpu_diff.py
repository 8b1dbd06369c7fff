"""``diff --device cuda`` against ``diff --device cpu`` on a machine with a GPU (not part of run_all.py:
CI and this project's own machine have none).

Two data sets, as rows 8 and 8-dense use them: a Llama-shaped HF model against a copy with three
tensors changed in one element (the byte pass decides almost everything, so the GPU has little to
do), and two iterations of a model in which every value changed (every element is decoded and
reduced: the case the GPU path exists for). ``--device auto`` is timed too: it should stay on the
CPU for the first and take up the GPU for the second. Each figure is the median [min-max] of the ratios
cuda/cpu over ABAB pairs of fresh processes on a warm page cache, and both sides' reports must be
the same (the float sums to 1e-9 relative, everything else exactly).

    python bench/gpu_diff.py [--gb 1.5] [--dense-gb 2.5] [--pairs 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from abab import BenchError, Config, Side, ckptscope, gb_text, pairs, size_of, spawn, warm  # noqa: E402


def _same_reports(cpu: dict, cuda: dict) -> None:
    if cpu["summary"] != cuda["summary"]:
        raise BenchError(f"summaries differ: cpu {cpu['summary']} cuda {cuda['summary']}")
    for x, y in zip(cpu["tensors"], cuda["tensors"], strict=True):
        for key, value in x.items():
            other = y.get(key)
            if isinstance(value, float) and isinstance(other, float) and not (math.isnan(value) or math.isnan(other)):
                if abs(value - other) > 1e-9 * max(abs(value), abs(other)) + 1e-300:
                    raise BenchError(f"{x['name']} {key}: cpu {value!r} cuda {other!r}")
            elif value != other:
                raise BenchError(f"{x['name']} {key}: cpu {value!r} cuda {other!r}")


def _row(what: str, a_dir: Path, b_dir: Path, n: int) -> list[dict]:
    """Two ratios on one data set: ``--device cuda`` / ``cpu`` and ``--device auto`` / ``cpu``."""
    warm(a_dir, b_dir)
    runs = {d: spawn(ckptscope("diff", "--json", "--device", d, a_dir, b_dir), capture=True)
            for d in ("cpu", "cuda", "auto")}
    for device, run in runs.items():
        if run.code not in (0, 1):
            raise BenchError(f"diff --device {device} exit {run.code}:\n{run.stderr[-1500:]}")
    reports = {d: json.loads(r.stdout) for d, r in runs.items()}
    if reports["cuda"].get("device") != "cuda":
        raise BenchError(f"--device cuda ran on {reports['cuda'].get('device')}")
    _same_reports(reports["cpu"], reports["cuda"])
    _same_reports(reports["cpu"], reports["auto"])
    rows = []
    for device in ("cuda", "auto"):
        raw = pairs(Side(ckptscope("diff", "--json", "--device", device, a_dir, b_dir), ok=(0, 1)),
                    Side(ckptscope("diff", "--json", "--device", "cpu", a_dir, b_dir), ok=(0, 1)), n)
        ratios = [p["ratio"] for p in raw]
        rows.append({"what": what, "device": device, "ran_on": reports[device].get("device"),
                     "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                     "a_s": statistics.median(p["a_s"] for p in raw), "cpu_s": statistics.median(p["b_s"] for p in raw),
                     "different": reports["cpu"]["summary"]["different"], "raw": raw})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.5, help="model of the 3-tensors-differ data set")
    parser.add_argument("--dense-gb", type=float, default=2.5, help="model of the every-value-differs one")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ckptscope-gpu-bench-"))
    try:
        cfg = Config(quick=False, pairs=args.pairs, gb=args.gb, work=work)
        a_dir, _ = cfg.data("llama", "llama_hf", gb=args.gb)
        b_dir, _ = cfg.data("llama_b", "patched_copy", src=str(a_dir), count=3)
        rows = _row(f"2 x {gb_text(size_of(a_dir))}, 3 tensors differ", a_dir, b_dir, args.pairs)
        shutil.rmtree(a_dir), shutil.rmtree(b_dir)
        base, _ = cfg.data("llama_dense", "llama_hf", gb=args.dense_gb)
        dense, _ = cfg.data("dense", "timeline_dense_root", src=str(base), iterations=2)
        rows += _row(f"2 x {gb_text(size_of(dense / 'checkpoint-1'))}, every value differs",
                     dense / "checkpoint-1", dense / "checkpoint-2", args.pairs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"diff --device X / --device cpu, {args.pairs} ABAB pairs, median [min-max]; reports checked equal")
    for row in rows:
        print(f"  {row['what']:<42} {row['device']:>4} (ran on {row['ran_on']}): {row['median']:.2f}x "
              f"[{row['min']:.2f}-{row['max']:.2f}]  ({row['device']} {row['a_s']:.2f} s, cpu {row['cpu_s']:.2f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
