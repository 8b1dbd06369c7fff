"""The paper plan of docs/scaling.md: DeepSeek-V3 (671B, FP8 + scale_inv) HF -> torch_dist on
1, 4 and 16 nodes, from the bytes of every tensor and the per-GB costs measured on this machine.

The tensor list is generated from DeepSeek-V3's published ``config.json`` (the values below) and
its modeling code's parameter shapes; the checkpoint's index names every tensor but records no
shapes, so it would add nothing the config does not give. FP8 (e4m3) weights of the linears carry a
float32 ``weight_scale_inv`` per 128 x 128 block; norms, router, embeddings and heads are bf16
(the router's score-correction bias float32). Layer 61 is the MTP module.

    python bench/deepseek_v3_plan.py [--ranks-per-node 8] [--num-files 512] [--measure DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptscope.ops.parallel.partition import assign  # noqa: E402

CONFIG = {"hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
          "n_routed_experts": 256, "n_shared_experts": 1, "num_hidden_layers": 61, "first_k_dense_replace": 3,
          "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
          "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280, "num_nextn_predict_layers": 1,
          "weight_block_size": [128, 128]}

# Seconds per GiB measured on the dev machine (``--measure DIR`` redoes it; docs/scaling.md).
MEASURED_S_PER_GIB = {"read_cold": 1.09, "write_fsync": 3.27, "copy_file_range_fsync": 0.92, "crc32": 0.163}


def tensors() -> list[tuple[str, tuple[int, ...], int]]:
    """(name, shape, bytes) of every tensor of the HF checkpoint."""
    c = CONFIG
    h, heads, blk = c["hidden_size"], c["num_attention_heads"], c["weight_block_size"][0]
    out: list[tuple[str, tuple[int, ...], int]] = []

    def bf16(name, *shape):
        out.append((name, shape, 2 * math.prod(shape)))

    def fp8(name, rows, cols):
        out.append((name + ".weight", (rows, cols), rows * cols))
        scale = (math.ceil(rows / blk), math.ceil(cols / blk))
        out.append((name + ".weight_scale_inv", scale, 4 * math.prod(scale)))

    bf16("model.embed_tokens.weight", c["vocab_size"], h)
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    for i in range(c["num_hidden_layers"] + c["num_nextn_predict_layers"]):
        p = f"model.layers.{i}."
        bf16(p + "input_layernorm.weight", h)
        bf16(p + "post_attention_layernorm.weight", h)
        fp8(p + "self_attn.q_a_proj", c["q_lora_rank"], h)
        bf16(p + "self_attn.q_a_layernorm.weight", c["q_lora_rank"])
        fp8(p + "self_attn.q_b_proj", heads * qk, c["q_lora_rank"])
        fp8(p + "self_attn.kv_a_proj_with_mqa", c["kv_lora_rank"] + c["qk_rope_head_dim"], h)
        bf16(p + "self_attn.kv_a_layernorm.weight", c["kv_lora_rank"])
        fp8(p + "self_attn.kv_b_proj", heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"])
        fp8(p + "self_attn.o_proj", h, heads * c["v_head_dim"])
        if i < c["first_k_dense_replace"]:
            f = c["intermediate_size"]
            fp8(p + "mlp.gate_proj", f, h)
            fp8(p + "mlp.up_proj", f, h)
            fp8(p + "mlp.down_proj", h, f)
        else:
            f = c["moe_intermediate_size"]
            bf16(p + "mlp.gate.weight", c["n_routed_experts"], h)
            out.append((p + "mlp.gate.e_score_correction_bias", (c["n_routed_experts"],), 4 * c["n_routed_experts"]))
            for e in [f"experts.{e}." for e in range(c["n_routed_experts"])] + ["shared_experts."]:
                width = f * (c["n_shared_experts"] if e == "shared_experts." else 1)
                fp8(p + "mlp." + e + "gate_proj", width, h)
                fp8(p + "mlp." + e + "up_proj", width, h)
                fp8(p + "mlp." + e + "down_proj", h, width)
        if i >= c["num_hidden_layers"]:  # MTP module
            bf16(p + "enorm.weight", h)
            bf16(p + "hnorm.weight", h)
            bf16(p + "eh_proj.weight", h, 2 * h)
            bf16(p + "shared_head.norm.weight", h)
            bf16(p + "shared_head.head.weight", c["vocab_size"], h)
            bf16(p + "embed_tokens.weight", c["vocab_size"], h)
    bf16("model.norm.weight", h)
    bf16("lm_head.weight", c["vocab_size"], h)
    return out


def data_files(items: list[tuple[str, tuple[int, ...], int]], num_files: int) -> list[int]:
    """Bytes per torch_dist data file: items greedily to the smallest file, as the writer does."""
    sizes = [0] * num_files
    for _, _, nbytes in items:
        k = min(range(num_files), key=lambda f: sizes[f])
        sizes[k] += nbytes
    return sizes


def plan(nodes: int, ranks_per_node: int, files: list[int]) -> dict:
    world = nodes * ranks_per_node
    shares = assign(dict(enumerate(files)), world)
    per_rank = [sum(files[f] for f in share) for share in shares]
    per_node = [sum(per_rank[n * ranks_per_node:(n + 1) * ranks_per_node]) for n in range(nodes)]
    gib = 1024**3
    m = MEASURED_S_PER_GIB
    node_max = max(per_node) / gib  # a node's ranks share its disk / network link
    return {"nodes": nodes, "ranks": world, "max_rank_gb": max(per_rank) / 1e9,
            "imbalance": max(per_rank) / (sum(per_rank) / world), "max_node_gb": max(per_node) / 1e9,
            # the node's disk serialises its ranks: read every byte, write it (copy_file_range + fsync path
            # measured as one), CRC on each rank's own core
            "s_disk_bound": node_max * (m["read_cold"] + m["copy_file_range_fsync"]) + max(per_rank) / gib * m["crc32"],
            "s_write_bound": node_max * (m["read_cold"] + m["write_fsync"]) + max(per_rank) / gib * m["crc32"]}


def measure(directory: str) -> dict[str, float]:
    """Seconds per GiB of the operations a convert does, on one 1 GiB file under ``directory``."""
    import os
    import tempfile
    import time
    import zlib

    size = 1 << 30
    data = os.urandom(64 << 20) * (size // (64 << 20))
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        a, b = Path(tmp) / "a.bin", Path(tmp) / "b.bin"
        start = time.perf_counter()
        zlib.crc32(data)
        out["crc32"] = time.perf_counter() - start
        start = time.perf_counter()
        with open(a, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        out["write_fsync"] = time.perf_counter() - start
        del data
        start = time.perf_counter()
        with open(a, "rb") as src, open(b, "wb") as dst:
            offset = 0
            while offset < size:
                offset += os.copy_file_range(src.fileno(), dst.fileno(), size - offset, offset, offset)
            os.fsync(dst.fileno())
        out["copy_file_range_fsync"] = time.perf_counter() - start
        fd = os.open(a, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        start = time.perf_counter()
        with open(a, "rb") as handle:
            while handle.read(64 << 20):
                pass
        out["read_cold"] = time.perf_counter() - start
    return {k: round(v, 3) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--num-files", type=int, default=512)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--measure", metavar="DIR", help="measure the per-GiB costs under DIR and use them")
    args = parser.parse_args()
    if args.measure:
        MEASURED_S_PER_GIB.update(measure(args.measure))
        print(f"measured s/GiB: {MEASURED_S_PER_GIB}")
    items = tensors()
    total = sum(n for _, _, n in items)
    largest = max(items, key=lambda t: t[2])
    files = data_files(items, args.num_files)
    rows = [plan(n, args.ranks_per_node, files) for n in (1, 4, 16)]
    if args.json:
        print(json.dumps({"tensors": len(items), "bytes": total, "largest": largest[:3], "plans": rows}, indent=1))
        return
    print(f"{len(items)} tensors, {total / 1e9:.1f} GB; largest {largest[0]} {largest[1]} {largest[2] / 1e9:.2f} GB; "
          f"{args.num_files} data files of {min(files) / 1e9:.2f}-{max(files) / 1e9:.2f} GB")
    print("| nodes | ranks | GB per rank (max) | imbalance | GB per node (max) | hours (copy path) | hours (write path) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['nodes']} | {r['ranks']} | {r['max_rank_gb']:.1f} | {r['imbalance']:.3f} | {r['max_node_gb']:.0f} "
              f"| {r['s_disk_bound'] / 3600:.2f} | {r['s_write_bound'] / 3600:.2f} |")


if __name__ == "__main__":
    main()
