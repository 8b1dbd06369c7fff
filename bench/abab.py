"""Shared machinery of the benchmarks: A/B ratios from alternating fresh processes.

This box is shared and noisy (2 cores, load from other jobs that comes and goes within seconds),
so a single wall time says little. Every figure is instead the ratio A/B of two commands run
back to back, ABAB..., each in a fresh process, on the same bytes with the page cache in the same
state for both sides: a load burst then hits both sides of a pair alike, and the median of the
per-pair ratios with its [min-max] spread shows how much to trust it.

* ``generate``: data generators run in a child process (``data.py``), so this process stays small;
  a child's peak RSS starts at its parent's (Linux keeps ``ru_maxrss`` across fork + exec).
* ``spawn``: one timed run, with the child's own peak RSS from ``os.wait4`` (per child, where
  ``getrusage(RUSAGE_CHILDREN)`` would be the max over every child so far).
* ``pairs``: the ABAB timer. Warm inputs (``warm``) are read once before the pairs. For write-heavy
  sides (``Side.out``) the previous output is removed and ``sync`` is run before each run, outside
  the timed region, so no run pays for another's writeback.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
PY = sys.executable

# A vforked child execs with its parent's peak RSS as its own ru_maxrss floor; a forked one starts
# from the parent's current RSS (~17 MB here, about a bare interpreter's own). So: plain fork.
subprocess._USE_VFORK = False
subprocess._USE_POSIX_SPAWN = False


class BenchError(RuntimeError):
    """A command failed or gave a wrong answer: the row is reported as an error, not timed."""


def ckptscope(*args: str) -> list[str]:
    """The installed package, through this interpreter (the pyenv shim would add ~1 s per run)."""
    return [PY, "-m", "ckptscope", *map(str, args)]


def generate(func: str, **kwargs) -> dict:
    """Run ``data.<func>(**kwargs)`` in a child process and return its JSON result."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import data; "
            "print(json.dumps(getattr(data, sys.argv[2])(**json.loads(sys.argv[3]))))")
    proc = subprocess.run([PY, "-c", code, str(BENCH), func, json.dumps(kwargs)], capture_output=True, text=True)
    if proc.returncode:
        raise BenchError(f"data.{func} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def verify(func: str, **kwargs) -> Callable[["Run"], None]:
    """A ``pairs`` check that runs ``verify.<func>(**kwargs)`` in a child process: it imports torch and
    reads whole outputs, and this process must stay small (its RSS is every child's ``ru_maxrss``
    floor). Raises ``BenchError`` with the child's complaint."""
    def check(_run: "Run") -> None:
        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import verify; "
                "getattr(verify, sys.argv[2])(**json.loads(sys.argv[3]))")
        proc = subprocess.run([PY, "-c", code, str(BENCH), func, json.dumps(kwargs, default=str)],
                              capture_output=True, text=True)
        if proc.returncode:
            raise BenchError(f"output check verify.{func} failed:\n{proc.stderr[-2000:]}")
    return check


def files_under(*paths: Path) -> list[Path]:
    out: list[Path] = []
    for path in map(Path, paths):
        out += [p for p in sorted(path.rglob("*")) if p.is_file()] if path.is_dir() else [path]
    return out


def size_of(*paths: Path) -> int:
    return sum(p.stat().st_size for p in files_under(*paths))


def warm(*paths: Path) -> None:
    """Read every file once so both sides start from a warm page cache."""
    for path in files_under(*paths):
        with open(path, "rb") as handle:
            while handle.read(1 << 20):
                pass


def remove(path: Path | None) -> None:
    if path is not None and os.path.lexists(path):
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


@dataclass
class Run:
    seconds: float
    rss: int
    """Peak RSS of the child (and its waited-for descendants), bytes."""
    code: int
    stdout: str = ""
    stderr: str = ""


def spawn(cmd: list[str], env: dict | None = None, capture: bool = False) -> Run:
    """Run ``cmd`` in a fresh process; wall time from fork to reap, peak RSS via ``os.wait4``.
    stdout goes to /dev/null unless ``capture`` (then to a temp file, read after the clock stops)."""
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out if capture else subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Run(seconds, usage.ru_maxrss * 1024, proc.returncode,
                   out.read().decode(errors="replace"), err.read().decode(errors="replace"))


@dataclass
class Side:
    """One side of a pair: a command, the output it writes (removed + ``sync`` before each run)
    and the exit codes that mean success."""

    cmd: list[str]
    out: Path | None = None
    ok: tuple[int, ...] = (0,)
    env: dict | None = None
    prepare: Callable[[], None] | None = None
    """Extra untimed set-up before each run (e.g. create the directory ``cp -t`` copies into)."""

    def run(self, capture: bool = False) -> Run:
        remove(self.out)
        if self.prepare:
            self.prepare()
        if self.out is not None:
            os.sync()  # the previous run's dirty pages are written back now, not during this run
        result = spawn(self.cmd, self.env, capture)
        # An uncaught exception exits 1, which some sides accept (diff's "differences found"): a
        # traceback is a failed run whatever the exit code.
        if result.code not in self.ok or "Traceback (most recent call last)" in result.stderr:
            raise BenchError(f"exit {result.code}: {' '.join(map(str, self.cmd))}\n{result.stderr[-1500:]}")
        return result


def pairs(a: Side, b: Side, n: int, check: Callable[[Run], None] | None = None,
          check_every: bool = False) -> list[dict]:
    """``n`` ABAB pairs after one untimed warm-up pair (pays one-off costs such as first reads of
    the interpreter's own files, and lets ``check`` validate A's output). With ``check_every`` every
    timed A run's stdout is kept (in a temp file, read after the clock stops) and checked too: for
    commands whose answer is a small report. Outputs are removed at the end. Returns every raw pair."""
    first = a.run(capture=check is not None)
    if check:
        check(first)
    b.run()
    raw = []
    for _ in range(n):
        ra = a.run(capture=check_every)
        if check_every and check:
            check(ra)
        rb = b.run()
        raw.append({"a_s": round(ra.seconds, 5), "b_s": round(rb.seconds, 5),
                    "ratio": round(ra.seconds / rb.seconds, 4), "a_rss": ra.rss, "b_rss": rb.rss})
    remove(a.out)
    remove(b.out)
    return raw


class CpuHog:
    """One competing CPU-bound process (``while True: pass``) for the duration of a ``with``."""

    def __enter__(self) -> "CpuHog":
        self.proc = subprocess.Popen([PY, "-c", "while True: pass"])
        time.sleep(0.5)  # let it get scheduled before the first pair
        return self

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


BASELINE_SPREAD = 2.0
"""A ratio row whose baseline (B) took more than this many times as long in one pair as in another
measured the machine, not the tool: in one run `cp -r` copied the same 1.5 GB from a warm cache in
0.4 s in some pairs and 3.5 s in others (write-back stalls on the shared disk, mounted with
``discard``), and a ckptscope that took 0.5 s read as 0.16x of `cp`. A row with more than one such
pair is UNSTABLE: neither pass nor fail; rerun it."""


@dataclass
class Row:
    """One line of the table. ``kind``: ``ratio`` (A/B per pair), ``seconds`` (absolute, median of
    fresh runs) or ``spread`` (max/min of a quantity that should be constant)."""

    id: str
    what: str
    kind: str = "ratio"
    target: float | None = None
    target_max: float | None = None
    """Bound on the worst pair as well (``max of pairs <= target_max``)."""
    values: list[float] = field(default_factory=list)
    raw: list = field(default_factory=list)
    note: str = ""
    extra: dict = field(default_factory=dict)
    error: str = ""
    skipped: str = ""
    ok_extra: bool | None = None
    """A second criterion the row must meet as well (e.g. peak RSS), None if there is none."""
    strict: bool = False
    """The median must be below ``target``, not merely at it ("faster than the peer")."""
    baseline_suspect: str = ""
    """Set by ``flag_slow_baselines``: why this row's baseline is not to be believed."""

    @classmethod
    def from_pairs(cls, id: str, what: str, raw: list[dict], **kw) -> "Row":
        return cls(id, what, values=[p["ratio"] for p in raw], raw=raw, **kw)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def baseline_times(self) -> list[float]:
        """Seconds of every timed baseline (B) run of a ratio row; empty for other rows."""
        if self.kind != "ratio":
            return []
        return [p["b_s"] for p in self.raw if isinstance(p, dict) and "b_s" in p]

    @property
    def baseline_spread(self) -> float | None:
        """Slowest over fastest baseline run of a ratio row (None for other rows)."""
        times = self.baseline_times
        if len(times) < 2 or min(times) <= 0:
            return None
        return max(times) / min(times)

    @property
    def stalled_pairs(self) -> int:
        """Pairs whose baseline took over ``BASELINE_SPREAD`` times the row's fastest baseline."""
        times = self.baseline_times
        if len(times) < 2 or min(times) <= 0:
            return 0
        return sum(t > BASELINE_SPREAD * min(times) for t in times)

    @property
    def unstable(self) -> bool:
        """The baseline itself swung by more than ``BASELINE_SPREAD`` (see there) in more than one
        pair (one stalled pair is what the median is for), or was far slower than the same
        baseline in another row (``flag_slow_baselines``)."""
        return bool(self.baseline_suspect) or self.stalled_pairs > 1

    @property
    def baseline_median(self) -> float | None:
        times = self.baseline_times
        return statistics.median(times) if times else None

    @property
    def passed(self) -> bool | None:
        if self.error or self.skipped or not self.values or self.target is None or self.unstable:
            return None
        strict = self.strict or self.kind == "seconds"
        ok = self.median < self.target if strict else self.median <= self.target
        if self.target_max is not None:
            ok = ok and max(self.values) <= self.target_max
        return ok and self.ok_extra is not False

    def target_text(self) -> str:
        if self.target is None:
            return "-"
        unit = " s" if self.kind == "seconds" else "x"
        text = f"{'<' if self.strict or self.kind == 'seconds' else '<='} {self.target:g}{unit}"
        if self.target_max is not None:
            text += f", max <= {self.target_max:g}x"
        return text

    def measured_text(self) -> str:
        if self.error:
            return "ERROR"
        if self.skipped:
            return "skipped"
        unit = " s" if self.kind == "seconds" else "x"
        return f"{self.median:.2f}{unit} [{min(self.values):.2f}-{max(self.values):.2f}]"

    def to_json(self) -> dict:
        out = {"id": self.id, "what": self.what, "kind": self.kind, "target": self.target,
               "target_max": self.target_max, "passed": self.passed, "note": self.note,
               "unstable": self.unstable, "baseline_spread": self.baseline_spread}
        if self.values:
            out.update(median=self.median, min=min(self.values), max=max(self.values), values=self.values)
        out.update(raw=self.raw, **self.extra)
        if self.error:
            out["error"] = self.error
        if self.skipped:
            out["skipped"] = self.skipped
        return out


COPY_ROWS = ("4", "4-load", "5", "5-load", "6", "7", "7-load")
"""Rows whose baseline is the same work: `cp` of a ~1.5 GB model from a warm cache."""


def flag_slow_baselines(rows: list[Row]) -> None:
    """A copy row whose `cp` took more than ``BASELINE_SPREAD`` times the fastest copy row's, for
    as many bytes, timed the disk's write-back, not a copy (one run: `cp` of 1.43 GB took 2.4-3.1 s in
    every pair of row 6 while row 4's 1.52 GB took 0.37 s): mark it, so it is neither pass nor fail."""
    medians = {row.id: row.baseline_median for row in rows if row.id in COPY_ROWS and row.baseline_median}
    if len(medians) < 2:
        return
    fastest = min(medians.values())
    for row in rows:
        median = medians.get(row.id)
        if median is not None and median > BASELINE_SPREAD * fastest:
            row.baseline_suspect = (f"its baseline's median {median:.2f} s is over {BASELINE_SPREAD:g}x "
                                    f"the fastest copy row's {fastest:.2f} s for about as many bytes")


@dataclass
class Config:
    quick: bool
    pairs: int
    gb: float
    """Size of the Llama-shaped checkpoints of the write-heavy rows."""
    work: Path
    _cache: dict = field(default_factory=dict)

    def data(self, name: str, func: str, **kwargs) -> tuple[Path, dict]:
        """A generated data set under ``work``, made once per run and shared by the rows."""
        if name not in self._cache:
            path = self.work / name
            print(f"  generating {name} ({func} {kwargs}) ...", file=sys.stderr, flush=True)
            self._cache[name] = (path, generate(func, path=str(path), **kwargs))
        return self._cache[name]


def gb_text(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB"


def mb_text(nbytes: float) -> str:
    return f"{nbytes / 1e6:.0f} MB"
