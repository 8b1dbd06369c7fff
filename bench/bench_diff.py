#!/usr/bin/env python
"""``ckptscope diff`` speed and memory against baselines measured in the same run.

    python bench/bench_diff.py [--gb 1.1] [--dir /tmp] [--repeat 3] [--device cpu|cuda]

Writes two HF checkpoint dirs of about ``--gb`` GB each (one ``model.safetensors``, bf16
Llama-shaped tensors, real safetensors writer) that differ in exactly 3 tensors, warms the page
cache, then times (median of ``--repeat``, each in a fresh process so peak RSS is its own):

* ``ckptscope diff --json A B`` (exit code 1 expected);
* naive: ``safe_open`` both files and ``torch.equal`` per tensor, the loop people write by hand;
* ``sft diff --delta`` from the sft-cli package, when it can be pip-installed into a temp dir.

Prints seconds, GB/s, peak RSS, the ratios baseline / ckptscope (target >= 2x) and the RSS bound
2 x largest tensor + 300 MB. With ``--device cuda`` it also measures pinned host-to-device
bandwidth in the same run and reports the CUDA diff's throughput as a fraction of it (target >= 70 %).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NAIVE = r"""
import resource, sys, torch
from safetensors import safe_open
a, b = sys.argv[1], sys.argv[2]
differ = 0
with safe_open(a, "pt") as fa, safe_open(b, "pt") as fb:
    for name in fa.keys():
        if not torch.equal(fa.get_tensor(name), fb.get_tensor(name)):
            differ += 1
print(differ, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

RUN_CKPTSCOPE = r"""
import resource, sys
from ckptscope.cli import main
code = 0
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("RSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "CODE", code, file=sys.stderr)
"""

RUN_SFT = r"""
import resource, sys
from sft.cli import app
try:
    app(sys.argv[1:])
except SystemExit:
    pass
print("RSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def write_pair(root: Path, gigabytes: float) -> tuple[Path, Path, int, int]:
    import torch
    from safetensors.torch import save_file

    hidden = 2048
    tensors: dict[str, torch.Tensor] = {}
    total, layer = 0, 0
    gen = torch.Generator().manual_seed(0)
    while total < gigabytes * 1e9:
        p = f"model.layers.{layer}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[f"{p}.self_attn.{proj}.weight"] = torch.randn(hidden, hidden, generator=gen).to(torch.bfloat16)
        for proj, shape in (("gate_proj", (3 * hidden, hidden)), ("up_proj", (3 * hidden, hidden)),
                            ("down_proj", (hidden, 3 * hidden))):
            tensors[f"{p}.mlp.{proj}.weight"] = torch.randn(*shape, generator=gen).to(torch.bfloat16)
        total = sum(t.numel() * 2 for t in tensors.values())
        layer += 1
    largest = max(t.numel() * 2 for t in tensors.values())
    a, b = root / "a", root / "b"
    a.mkdir()
    b.mkdir()
    save_file(tensors, a / "model.safetensors", metadata={"format": "pt"})
    names = sorted(tensors)
    for name in (names[1], names[len(names) // 2], names[-2]):  # 3 differing tensors
        tensors[name] = tensors[name].clone()
        tensors[name].view(-1)[12345] += 1
    save_file(tensors, b / "model.safetensors", metadata={"format": "pt"})
    return a, b, total, largest


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, str, str, int]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return time.perf_counter() - start, proc.stdout, proc.stderr, proc.returncode


def rss_from(text: str) -> int:
    for line in text.splitlines():
        if line.startswith("RSS"):
            return int(line.split()[1]) * 1024
    return 0


def install_sft(target: Path) -> bool:
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                           "sft-cli"], capture_output=True, text=True)
    return proc.returncode == 0 and (target / "sft").is_dir()


def h2d_bandwidth() -> float:
    """Pinned host-to-device copy bandwidth in bytes/s (256 MB, best of 5)."""
    import torch

    host = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty_like(host, device="cuda")
    best = 0.0
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        best = max(best, host.numel() / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.1)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        # Generate in a child: the parent must stay small, because a forked child's ru_maxrss
        # starts from the parent's RSS (Linux keeps it across exec) and would hide ours.
        out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r});"
                              f"from bench_diff import write_pair; from pathlib import Path;"
                              f"print(*write_pair(Path({str(root)!r}), {args.gb})[2:])"],
                             check=True, capture_output=True, text=True).stdout.split()
        a, b, total, largest = root / "a", root / "b", int(out[0]), int(out[1])
        print(f"checkpoints: 2 x {total / 1e9:.2f} GB, 3 differing tensors, largest tensor {largest / 1e6:.0f} MB")
        for path in (a, b):  # warm the page cache for everyone
            with open(path / "model.safetensors", "rb") as handle:
                while handle.read(64 << 20):
                    pass
        env = dict(os.environ)
        results: dict[str, tuple[float, int]] = {}

        def measure(label: str, cmd: list[str], env=None, check=None) -> None:
            times, rss = [], 0
            for _ in range(args.repeat):
                seconds, out, err, code = timed(cmd, env)
                if check:
                    check(out, err, code)
                times.append(seconds)
                rss = max(rss, rss_from(err) or rss_from("RSS " + out.split()[-1] if out.split() else ""))
            results[label] = (statistics.median(times), rss)

        def check_ckptscope(out, err, code):
            data = json.loads(out)
            assert "CODE 1" in err and data["summary"]["different"] == 3, (code, err[-500:])

        measure("ckptscope", [sys.executable, "-c", RUN_CKPTSCOPE, "diff", "--json", "--device", args.device,
                              str(a), str(b)], env, check_ckptscope)

        def check_naive(out, err, code):
            assert code == 0 and out.split()[0] == "3", (out, err[-500:])

        measure("naive safe_open+torch.equal", [sys.executable, "-c", NAIVE, str(a / "model.safetensors"),
                                                str(b / "model.safetensors")], env, check_naive)
        sft_dir = root / "sft"
        if install_sft(sft_dir):
            sft_env = dict(env, PYTHONPATH=str(sft_dir) + os.pathsep + env.get("PYTHONPATH", ""))
            measure("sft-cli diff --delta", [sys.executable, "-c", RUN_SFT, "diff", "--delta",
                                             str(a / "model.safetensors"), str(b / "model.safetensors")], sft_env)
        else:
            print("sft-cli: not installable here, skipped")

        ours, ours_rss = results["ckptscope"]
        bound = 2 * largest + 300e6
        print(f"\n{'tool':<32}{'seconds':>9}{'GB/s':>8}{'peak RSS':>11}{'vs ckptscope':>14}")
        for label, (seconds, rss) in results.items():
            ratio = seconds / ours
            print(f"{label:<32}{seconds:>9.2f}{2 * total / 1e9 / seconds:>8.2f}{rss / 1e6:>9.0f}MB{ratio:>13.2f}x")
        print(f"\nckptscope peak RSS {ours_rss / 1e6:.0f} MB; bound 2 x largest + 300 MB = {bound / 1e6:.0f} MB: "
              f"{'OK' if ours_rss <= bound else 'EXCEEDED'}")
        for label, (seconds, _) in results.items():
            if label != "ckptscope":
                verdict = "met" if seconds / ours >= 2 else "NOT met"
                print(f"speed-up vs {label}: {seconds / ours:.2f}x (target >= 2x: {verdict})")
        if args.device == "cuda":
            bandwidth = h2d_bandwidth()
            achieved = 2 * total / ours
            print(f"pinned H2D bandwidth {bandwidth / 1e9:.1f} GB/s; CUDA diff {achieved / 1e9:.1f} GB/s = "
                  f"{100 * achieved / bandwidth:.0f} % (target >= 70 %)")
        shutil.rmtree(root / "a", ignore_errors=True)


if __name__ == "__main__":
    main()
