"""Rows 4-6: convert HF <-> torch_dist and merge FSDP2 shards, against copying the same bytes.

``cp`` is the yardstick of a tool that rewrites a checkpoint: it reads and writes every byte once
and transforms nothing (on one thread, with ``copy_file_range``; ckptscope's writers reserve their
files and fill them from two threads, which is how they can beat it). Both sides read a warm source and write through the page cache into
a fresh dir; the previous output is removed and ``sync`` run before each run (abab.Side.out).
Rows 4 and 5 are repeated with one competing CPU-bound process, since a converter that leans on
the CPU (or on threads) degrades where ``cp`` does not.
"""

from __future__ import annotations

import importlib.util
import subprocess

from abab import PY, BenchError, Config, CpuHog, Row, Side, ckptscope, gb_text, mb_text, pairs, size_of, verify, warm


def _llama(cfg: Config):
    return cfg.data("llama", "llama_hf", gb=cfg.gb)


def _mcore(cfg: Config):
    """Row 4's output, made once (untimed) as row 5's source."""
    src, info = _llama(cfg)
    dst = cfg.work / "mcore"
    if not dst.exists():
        proc = subprocess.run(ckptscope("convert", src, dst, "--to", "mcore"), capture_output=True, text=True)
        if proc.returncode:
            raise BenchError(f"convert --to mcore failed:\n{proc.stderr[-1500:]}")
    return dst, info


def _convert_rows(cfg: Config, id: str, src, to: str, label: str, check=None) -> list[Row]:
    warm(src)
    a = Side(ckptscope("convert", src, cfg.work / "out_a", "--to", to), out=cfg.work / "out_a")
    b = Side(["cp", "-r", str(src), str(cfg.work / "out_b")], out=cfg.work / "out_b")
    what = f"convert {label} ({gb_text(size_of(src))}) vs cp -r"
    rows = [Row.from_pairs(id, what, pairs(a, b, cfg.pairs, check), target=1.0, target_max=1.2)]
    with CpuHog():
        raw = pairs(a, b, cfg.pairs)
    rows.append(Row.from_pairs(f"{id}-load", what + ", 1 CPU hog running", raw, target=1.5))
    return rows


def row4(cfg: Config) -> list[Row]:
    src, _ = _llama(cfg)
    return _convert_rows(cfg, "4", src, "mcore", "HF -> torch_dist",
                         verify("torch_dist_of_hf", src=src, out=cfg.work / "out_a"))


def row5(cfg: Config) -> list[Row]:
    src, _ = _mcore(cfg)
    hf, _ = _llama(cfg)

    # The HF we get back must be the original bit for bit, as safetensors reads both.
    return _convert_rows(cfg, "5", src, "hf", "torch_dist -> HF", verify("same_hf_tensors", src=hf, out=cfg.work / "out_a"))


def row6(cfg: Config) -> list[Row]:
    """verl FSDP2 actor dir (DTensor state dicts, 2 ranks, f32) -> HF, vs ``cp`` of the rank files.
    Peak RSS must stay under the largest tensor + 300 MB: a merge that streams one tensor at a time."""
    src, info = cfg.data("fsdp2", "fsdp2_verl", gb=cfg.gb)
    shards = sorted(src.glob("model_world_size_*_rank_*.pt"))
    warm(src)
    out_b = cfg.work / "out_b"
    a = Side(ckptscope("merge", src, cfg.work / "out_a"), out=cfg.work / "out_a")
    b = Side(["cp", "-t", str(out_b), *map(str, shards)], out=out_b, prepare=lambda: out_b.mkdir())
    raw = pairs(a, b, cfg.pairs, verify("merged_fsdp2", out=cfg.work / "out_a", gb=cfg.gb, world=len(shards)))
    rss = max(p["a_rss"] for p in raw)
    bound = info["largest"] + 300e6
    rows = [Row.from_pairs("6", f"merge FSDP2 shards -> HF ({gb_text(size_of(*shards))}, {len(shards)} ranks) "
                           "vs cp of the shard files", raw, target=1.0, ok_extra=rss <= bound,
                           note=f"peak RSS {mb_text(rss)} (bound largest tensor + 300 MB = {mb_text(bound)}: "
                                f"{'OK' if rss <= bound else 'EXCEEDED'})",
                           extra={"peak_rss": rss, "rss_bound": bound})]
    rows.append(_verl_peer(cfg, src))
    return rows


def _verl_peer(cfg: Config, src) -> Row:
    what = "merge FSDP2 shards -> HF vs verl model_merger (peer)"
    if importlib.util.find_spec("verl") is None:
        return Row("6-verl", what, skipped="verl not installed")
    a = Side(ckptscope("merge", src, cfg.work / "out_a"), out=cfg.work / "out_a")
    b = Side([PY, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(src),
              "--target_dir", str(cfg.work / "out_b")], out=cfg.work / "out_b")
    try:
        return Row.from_pairs("6-verl", what, pairs(a, b, cfg.pairs), target=1.0)
    except BenchError as exc:
        return Row("6-verl", what, skipped=f"verl model_merger failed: {str(exc).splitlines()[0]}")

