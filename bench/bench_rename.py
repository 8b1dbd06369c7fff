#!/usr/bin/env python
"""Rename speed against ``cp`` of the same files, measured in the same run.

    python bench/bench_rename.py [--gb 1.5] [--dir /tmp] [--case safetensors|dcp|all]

Writes a sharded safetensors checkpoint of about ``--gb`` GB with the real safetensors writer
(bf16 Llama-shaped tensors in 4 shards + index), then times ``cp -r`` of the directory and
``ckptscope rename`` of every tensor (header-only rewrite, bytes copied verbatim). The page cache
is warmed once first so neither side pays a cold read. Prints seconds, GB/s and the ratio
rename / cp (target: <= 1.0).

The ``dcp`` case writes a DCP directory of about ``--gb`` GB with
``torch.distributed.checkpoint.save(no_dist=True)`` and times ``cp -r`` against ``ckptscope
rename`` of every tensor: only ``.metadata`` is regenerated and the ``.distcp`` files are hard
links, so the rename should cost about the same whatever the size (reported as seconds per GB).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_checkpoint(root: Path, gigabytes: float) -> int:
    import torch
    from safetensors.torch import save_file

    hidden, layers_per_shard, shards = 2048, 0, 4
    per_layer = 4 * hidden * hidden + 3 * hidden * (hidden * 3)  # attention + mlp, in elements
    layers = max(4, int(gigabytes * 1e9 / (per_layer * 2)))
    layers_per_shard = -(-layers // shards)
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for layer in range(s * layers_per_shard, min(layers, (s + 1) * layers_per_shard)):
            p = f"model.layers.{layer}"
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                tensors[f"{p}.self_attn.{proj}.weight"] = torch.empty(hidden, hidden, dtype=torch.bfloat16).normal_()
            tensors[f"{p}.mlp.gate_proj.weight"] = torch.empty(3 * hidden, hidden, dtype=torch.bfloat16).normal_()
            tensors[f"{p}.mlp.up_proj.weight"] = torch.empty(3 * hidden, hidden, dtype=torch.bfloat16).normal_()
            tensors[f"{p}.mlp.down_proj.weight"] = torch.empty(hidden, 3 * hidden, dtype=torch.bfloat16).normal_()
        save_file(tensors, root / name, metadata={"format": "pt"})
        for key, value in tensors.items():
            weight_map[key] = name
            total += value.numel() * 2
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total


def write_dcp_checkpoint(root: Path, gigabytes: float) -> int:
    """A single-process DCP save of Llama-shaped bf16 layers (default torch_save serialisation)."""
    import torch
    import torch.distributed.checkpoint as dcp

    hidden = 2048
    per_layer = 4 * hidden * hidden + 3 * hidden * (hidden * 3)
    layers = max(4, int(gigabytes * 1e9 / (per_layer * 2)))
    state: dict[str, torch.Tensor] = {}
    for layer in range(layers):
        p = f"layers.{layer}"
        for proj in ("wq", "wk", "wv", "wo"):
            state[f"{p}.attention.{proj}.weight"] = torch.empty(hidden, hidden, dtype=torch.bfloat16).normal_()
        for proj, shape in (("w1", (3 * hidden, hidden)), ("w3", (3 * hidden, hidden)), ("w2", (hidden, 3 * hidden))):
            state[f"{p}.feed_forward.{proj}.weight"] = torch.empty(*shape, dtype=torch.bfloat16).normal_()
    dcp.save({"model": state}, checkpoint_id=str(root), no_dist=True)
    return sum(t.numel() * 2 for t in state.values())


def bench_dcp(work: Path, gigabytes: float, repeat: int) -> None:
    src = work / "dcp_src"
    nbytes = write_dcp_checkpoint(src, gigabytes)
    size_gb = sum(p.stat().st_size for p in src.iterdir()) / 1e9
    files = len(list(src.glob("*.distcp")))
    subprocess.run(["cat", *map(str, src.iterdir())], check=True, stdout=subprocess.DEVNULL)  # warm cache
    cp_times, rename_times = [], []
    for i in range(repeat):
        cp_times.append(timed(["cp", "-r", str(src), str(work / f"dcp_cp{i}")]))
        shutil.rmtree(work / f"dcp_cp{i}")
        rename_times.append(timed([sys.executable, "-m", "ckptscope", "rename", str(src), str(work / f"dcp_rn{i}"),
                                   "--sub", r"^model\.layers\.", "model.blocks."]))
        shutil.rmtree(work / f"dcp_rn{i}")
    cp_s, rn_s = min(cp_times), min(rename_times)
    print(f"DCP checkpoint: {size_gb:.2f} GB on disk, {nbytes / 1e9:.2f} GB of tensors, {files} .distcp files")
    print(f"cp -r:            {cp_s:.3f} s  ({cp_s / size_gb:.3f} s/GB)")
    print(f"ckptscope rename: {rn_s:.3f} s  ({rn_s / size_gb:.3f} s/GB; .metadata regenerated, data hard-linked)")
    print(f"ratio rename / cp: {rn_s / cp_s:.2f}  (best of {repeat})")


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=1.5)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--case", choices=("safetensors", "dcp", "all"), default="all")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ckptscope-bench-", dir=args.dir))
    try:
        if args.case in ("dcp", "all"):
            bench_dcp(work, args.gb, args.repeat)
        if args.case == "dcp":
            return 0
        src = work / "src"
        src.mkdir()
        nbytes = write_checkpoint(src, args.gb)
        size_gb = sum(p.stat().st_size for p in src.iterdir()) / 1e9
        subprocess.run(["cat", *map(str, src.iterdir())], check=True, stdout=subprocess.DEVNULL)  # warm cache
        cp_times, rename_times = [], []
        for i in range(args.repeat):
            cp_times.append(timed(["cp", "-r", str(src), str(work / f"cp{i}")]))
            shutil.rmtree(work / f"cp{i}")
            rename_times.append(timed([sys.executable, "-m", "ckptscope", "rename", str(src), str(work / f"rn{i}"),
                                       "--sub", r"^model\.", "backbone."]))
            shutil.rmtree(work / f"rn{i}")
        cp_s, rn_s = min(cp_times), min(rename_times)
        print(f"checkpoint: {size_gb:.2f} GB on disk, {nbytes / 1e9:.2f} GB of tensors, 4 shards")
        print(f"cp -r:            {cp_s:.3f} s  ({size_gb / cp_s:.2f} GB/s, {cp_s / size_gb:.3f} s/GB)")
        print(f"ckptscope rename: {rn_s:.3f} s  ({size_gb / rn_s:.2f} GB/s, {rn_s / size_gb:.3f} s/GB)")
        print(f"ratio rename / cp: {rn_s / cp_s:.2f}  (best of {args.repeat}; target <= 1.0)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
