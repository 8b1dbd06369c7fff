#!/usr/bin/env python
"""``ckptscope convert`` HF -> torch_dist -> HF throughput against ``cp -r``, and peak RSS.

    python bench/bench_convert.py [--gb 1.5] [--dir /tmp] [--repeat 1]

Writes a Llama-shaped HF checkpoint of about ``--gb`` GB (bf16, GQA, real safetensors writer,
config.json), warms the page cache, then times in fresh processes, ``--repeat`` times each:

* ``ckptscope convert HF MCORE --to mcore`` (torch_dist), right after ``cp -r HF`` (the baseline:
  the same bytes, no transform);
* ``ckptscope convert MCORE HF2 --to hf``, right after ``cp -r MCORE``;

and prints for each the medians of cp's and its own time, its throughput as a fraction of cp's
(median of the per-run ratios; target >= 50 %), its peak RSS against the bound 2 x largest
tensor + 300 MB, and whether HF2 is bit-identical to HF (``ckptscope diff``).
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

RUN = r"""
import resource, sys
from ckptscope.cli import main
code = 0
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("RSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "CODE", code, file=sys.stderr)
"""


def write_hf(root: Path, gigabytes: float) -> tuple[int, int]:
    import torch
    from safetensors.torch import save_file

    hidden, heads, kv, ffn, vocab = 2048, 16, 4, 5632, 32000
    head_dim = hidden // heads
    per_layer = 2 * (hidden * hidden + 2 * kv * head_dim * hidden + hidden * hidden + 3 * ffn * hidden)
    layers = max(2, int((gigabytes * 1e9 - 4 * vocab * hidden) / per_layer))
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": rand(vocab, hidden), "lm_head.weight": rand(vocab, hidden),
               "model.norm.weight": rand(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": rand(hidden), p + "post_attention_layernorm.weight": rand(hidden),
            p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": rand(kv * head_dim, hidden),
            p + "self_attn.v_proj.weight": rand(kv * head_dim, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": rand(ffn, hidden), p + "mlp.up_proj.weight": rand(ffn, hidden),
            p + "mlp.down_proj.weight": rand(hidden, ffn),
        })
    root.mkdir()
    save_file(tensors, root / "model.safetensors", metadata={"format": "pt"})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv, "vocab_size": vocab, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "hidden_act": "silu"}
    (root / "config.json").write_text(json.dumps(config))
    total = sum(t.numel() * 2 for t in tensors.values())
    largest = max(t.numel() * 2 for t in tensors.values())
    return total, largest


def run(cmd: list[str]) -> tuple[float, int, str]:
    """One timed step. Dirty pages are flushed first: otherwise a step pays for the previous one's
    writeback, which on this kind of box swings a 1.4 GB write between 0.6 s and 6 s."""
    os.sync()
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    rss = 0
    for line in proc.stderr.splitlines():
        if line.startswith("RSS"):
            rss = int(line.split()[1]) * 1024
    return seconds, rss, proc.stderr + proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.5)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each step (median reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        hf = root / "hf"
        # Generate in a child so this process stays small: a forked child's ru_maxrss starts from
        # the parent's RSS (Linux keeps it across exec) and would hide the converter's own peak.
        out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r});"
                              f"from bench_convert import write_hf; from pathlib import Path;"
                              f"print(*write_hf(Path({str(hf)!r}), {args.gb}))"],
                             check=True, capture_output=True, text=True).stdout.split()
        total, largest = int(out[0]), int(out[1])
        print(f"HF checkpoint {total / 1e9:.2f} GB, largest tensor {largest / 1e6:.0f} MB")
        with open(hf / "model.safetensors", "rb") as handle:
            while handle.read(64 << 20):
                pass
        steps = [("HF -> torch_dist", hf, [str(hf), str(root / "mcore"), "--to", "mcore"], root / "mcore"),
                 ("torch_dist -> HF", root / "mcore", [str(root / "mcore"), str(root / "hf2"), "--to", "hf"],
                  root / "hf2")]
        bound = 2 * largest + 300e6
        # This box's write speed drifts by several x within a minute, so cp is timed right before
        # each step, copying that step's source, and each step is compared with its own cp.
        results: dict[str, list[tuple[float, float, int]]] = {label: [] for label, *_ in steps}
        for rep in range(args.repeat):
            for label, source, argv, dst in steps:
                if dst.exists() and (rep or label != steps[0][0]):
                    shutil.rmtree(dst)
                cp_seconds, _, _ = run(["cp", "-r", str(source), str(root / "cp")])
                shutil.rmtree(root / "cp")
                seconds, rss, output = run([sys.executable, "-c", RUN, "convert", *argv])
                if "CODE 0" not in output:
                    print(f"{label}: FAILED\n{output[-2000:]}")
                    return
                results[label].append((cp_seconds, seconds, rss))
        med = statistics.median
        print(f"\n{'step':<20}{'cp -r s':>9}{'step s':>9}{'GB/s':>8}{'vs cp':>8}{'peak RSS':>11}   (median of {args.repeat})")
        for label, rows in results.items():
            cp_s, step_s = med(r[0] for r in rows), med(r[1] for r in rows)
            share = med(r[0] / r[1] for r in rows)
            rss = max(r[2] for r in rows)
            print(f"{label:<20}{cp_s:>9.2f}{step_s:>9.2f}{total / 1e9 / step_s:>8.2f}{100 * share:>7.0f}%"
                  f"{rss / 1e6:>9.0f}MB  (target >= 50 %: {'met' if share >= 0.5 else 'NOT met'}; RSS bound "
                  f"{bound / 1e6:.0f} MB: {'OK' if rss <= bound else 'EXCEEDED'})")
            print(f"{'':<20}each run, cp s / step s: " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b, _ in rows))
        _, _, output = run([sys.executable, "-c", RUN, "diff", "--json", str(hf), str(root / "hf2")])
        print("round trip bit-identical:", "yes" if "CODE 0" in output else "NO")


if __name__ == "__main__":
    main()
