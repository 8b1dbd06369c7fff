"""Rows 1-3: ``inspect`` on metadata-heavy checkpoints (tiny tensors, many of them).

The baseline is the least any tool can do: a bare Python that reads each shard's 8-byte header
length and ``json.loads`` the header. Both sides pay interpreter start-up, so the ratio shows what
ckptscope adds on top (imports, validation, the index, JSON out).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path

from abab import PY, BenchError, Config, Row, Side, ckptscope, pairs, spawn, warm

HEADERS = ("import json, os, struct, sys\n"
           "d = sys.argv[1]\n"
           "for f in sorted(os.listdir(d)):\n"
           "    if f.endswith('.safetensors'):\n"
           "        with open(os.path.join(d, f), 'rb') as h:\n"
           "            json.loads(h.read(struct.unpack('<Q', h.read(8))[0]))\n")

# The least any tool that prints what it read can do: orjson (the fastest well-kept JSON library here)
# parses every header and writes them back out as they are: no names sorted, no checks, no roles, no
# module of ckptscope imported. Rows 1-floor / 2-floor time it against HEADERS, so the table shows how
# much of the 1.2x target is left once the output alone is written.
FLOOR = ("import gc, os, struct, sys\n"
         "gc.disable()\n"
         "import orjson\n"
         "d = sys.argv[1]\n"
         "files = []\n"
         "for f in sorted(os.listdir(d)):\n"
         "    if f.endswith('.safetensors'):\n"
         "        with open(os.path.join(d, f), 'rb') as h:\n"
         "            files.append({'file': f, 'header': orjson.loads(h.read(struct.unpack('<Q', h.read(8))[0]))})\n"
         "sys.stdout.buffer.write(orjson.dumps({'path': d, 'files': files}))\n")

# Imports and a first call on a tiny checkpoint happen before the clock starts, so only the
# per-tensor work on the real one is timed (start-up is a constant; rows 1-2 cover it).
MARGINAL = r"""
import os, sys, time
from ckptscope.cli import main
def call(path):
    try:
        main(["inspect", "--json", path])
    except SystemExit as exc:
        if exc.code:
            raise
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
call(sys.argv[1])
start = time.perf_counter()
call(sys.argv[2])
sys.stdout.flush()
print("SECONDS", time.perf_counter() - start, file=sys.stderr)
"""

# Row 2-lin-floor: the same marginal time for the least there is to do, a bare ``json.loads`` of every
# header with the cyclic collector off (the most favourable case), no ckptscope module imported.
# If this alone is not constant per tensor over 1k..1M, the 10 % target is below the machine's floor.
MARGINAL_FLOOR = r"""
import gc, json, os, struct, sys, time
gc.disable()
def parse(d):
    out = []
    for f in sorted(os.listdir(d)):
        if f.endswith('.safetensors'):
            with open(os.path.join(d, f), 'rb') as h:
                out.append(json.loads(h.read(struct.unpack('<Q', h.read(8))[0])))
    return out
parse(sys.argv[1])
start = time.perf_counter()
parse(sys.argv[2])
print("SECONDS", time.perf_counter() - start, file=sys.stderr)
"""


def _check_json(tensors: int):
    def check(run) -> None:
        got = len(json.loads(run.stdout)["tensors"])
        if got != tensors:
            raise BenchError(f"inspect --json listed {got} tensors, expected {tensors}")
    return check


def _vs_headers(cfg: Config, id: str, tensors: int, shards: int) -> Row:
    path, _ = cfg.data(f"hf_{tensors}", "many_tensors", tensors=tensors, shards=shards)
    warm(path)
    raw = pairs(Side(ckptscope("inspect", "--json", path)), Side([PY, "-c", HEADERS, str(path)]), cfg.pairs,
                check=_check_json(tensors))
    return Row.from_pairs(id, f"inspect --json, {tensors:,} tensors / {shards} shards vs bare header json.loads",
                          raw, target=1.2)


def _floor(cfg: Config, id: str, tensors: int, shards: int) -> Row:
    """The FLOOR script against the same baseline: no target, the limit the 1.2x target leaves."""
    what = f"floor: orjson parse + dump of the headers as they are, {tensors:,} tensors, vs bare json.loads"
    try:
        import orjson  # noqa: F401
    except ImportError:
        return Row(id, what, skipped="orjson is not installed")
    path, _ = cfg.data(f"hf_{tensors}", "many_tensors", tensors=tensors, shards=shards)
    warm(path)
    raw = pairs(Side([PY, "-c", FLOOR, str(path)]), Side([PY, "-c", HEADERS, str(path)]), cfg.pairs)
    return Row.from_pairs(id, what, raw, note="no target: what any Python tool that prints the headers pays")


def row1(cfg: Config) -> list[Row]:
    return [_vs_headers(cfg, "1", 20_000, 40), _floor(cfg, "1-floor", 20_000, 40)]


def row2(cfg: Config) -> list[Row]:
    return [_vs_headers(cfg, "2", 100_000, 160), _floor(cfg, "2-floor", 100_000, 160)]


def row2_linearity(cfg: Config) -> list[Row]:
    """ms per 1k tensors at 1k..100k (1M in the full run), 625 tensors per shard as in row 2. The
    sizes run round-robin, one fresh process each, so load hits every size alike; each round
    gives max/min of ms-per-1k over the sizes, and the row reports those per-round ratios."""
    sizes = [1_000, 10_000, 100_000] + ([] if cfg.quick else [1_000_000])
    tiny, _ = cfg.data("hf_16", "many_tensors", tensors=16, shards=2)
    paths = {n: cfg.data(f"hf_{n}", "many_tensors", tensors=n, shards=max(2, n // 625))[0] for n in sizes}
    warm(tiny, *paths.values())

    def once(script: str, n: int) -> float:
        run = spawn([PY, "-c", script, str(tiny), str(paths[n])])
        if run.code:
            raise BenchError(f"inspect --json of {n:,} tensors failed:\n{run.stderr[-1500:]}")
        return float(run.stderr.split("SECONDS")[-1]) * 1000 / (n / 1000)

    for n in sizes:  # warm-up round, untimed
        once(MARGINAL, n)
    rounds, floor_rounds = [], []
    for _ in range(cfg.pairs):  # ckptscope and the floor alternate per size, so load hits both alike
        ours, floor = {}, {}
        for n in sizes:
            ours[n] = once(MARGINAL, n)
            floor[n] = once(MARGINAL_FLOOR, n)
        rounds.append(ours)
        floor_rounds.append(floor)
    over = "/".join(f"{n // 1000}k" for n in sizes)
    # The target is over 1k..1M: --quick leaves 1M out, so it measures the row but gives no verdict.
    return [_spread_row("2-lin", f"inspect --json linearity: max/min of ms per 1k tensors over {over} "
                        "(start-up excluded)", rounds, sizes, target=None if cfg.quick else 1.1,
                        extra="--quick: no 1M point, so no verdict" if cfg.quick else ""),
            _spread_row("2-lin-floor", f"floor: the same for a bare json.loads of the headers, collector off, over {over}",
                        floor_rounds, sizes, target=None, digits=2,
                        extra="no target: the least any Python reader does per tensor")]


def _spread_row(id: str, what: str, rounds: list[dict[int, float]], sizes: list[int], *, target: float | None,
                digits: int = 1, extra: str = "") -> Row:
    """Each round's max/min of ms per 1k tensors over the sizes; the note gives the median per size."""
    values = [max(r.values()) / min(r.values()) for r in rounds]
    per_size = {n: statistics.median(r[n] for r in rounds) for n in sizes}
    note = "median ms per 1k tensors: " + ", ".join(f"{n // 1000}k {v:.{digits}f}" for n, v in per_size.items())
    return Row(id, what, kind="spread", target=target, values=values,
               raw=[{str(n): round(v, 3) for n, v in r.items()} for r in rounds],
               note=f"{note}; {extra}" if extra else note)


def _sft(cfg: Config) -> Path | None:
    """sft-cli installed with --no-deps into the work dir (it never pulls torch that way); its
    own deps (typer, safetensors, numpy, textual) are ckptscope's or already here."""
    target = cfg.work / "sft"
    if not (target / "sft").is_dir():
        proc = subprocess.run([PY, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                               "sft-cli"], capture_output=True, text=True)
        if proc.returncode or not (target / "sft").is_dir():
            return None
    probe = subprocess.run([PY, "-c", "import sft.cli"], env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
                           capture_output=True)
    return target if probe.returncode == 0 else None


def row3(cfg: Config) -> list[Row]:
    what = "inspect (human, >/dev/null), 1 file / 100,000 tensors vs sft-cli `sft info`"
    target = _sft(cfg)
    if target is None:
        return [Row("3", what, skipped="sft-cli not installable or not importable here")]
    path, _ = cfg.data("single_100000", "many_tensors", tensors=100_000, shards=1)
    file = path / "model.safetensors"
    warm(file)
    env = dict(os.environ, PYTHONPATH=str(target))
    raw = pairs(Side(ckptscope("inspect", file)), Side([PY, str(target / "bin" / "sft"), "info", str(file)], env=env),
                cfg.pairs)
    return [Row.from_pairs("3", what, raw, target=1.0, strict=True,
                           note="the issue: faster than sft-cli (which prints a summary only)")]

