"""The numbers of a timeline: sums of squares per tensor and iteration, turned into norms and
relative changes per tensor and per module.

Everything is kept as float64 sums so that a module is exactly the sum of its tensors: a module's
norm is ``sqrt(sum of its tensors' ||W||^2)`` and its relative change ``sqrt(sum ||dW||^2) /
sqrt(sum ||W_prev||^2)``, i.e. the norms of the module's parameters taken as one flat vector.

Non-finite elements are counted (``nan``, ``inf``) and left out of every norm: a change is over the
elements finite in both iterations, and its denominator ``||W_prev||`` over the same elements, so a
single NaN does not hide how the rest of the tensor moves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sums:
    """Accumulated over blocks of one tensor (or over the tensors of a module)."""

    n: int
    """Iterations."""
    numel: int = 0
    sq: list[float] = field(default_factory=list)
    """Per iteration: sum of squares of the finite elements."""
    nan: list[int] = field(default_factory=list)
    inf: list[int] = field(default_factory=list)
    dsq: list[float] = field(default_factory=list)
    """Per consecutive pair: sum of squared differences over elements finite in both."""
    psq: list[float] = field(default_factory=list)
    """Per pair: sum of squares of the earlier iteration over the same elements."""
    dmax: list[float] = field(default_factory=list)
    """Per pair: max |difference| over the same elements."""

    def __post_init__(self) -> None:
        n = self.n
        for name, size, zero in (("sq", n, 0.0), ("nan", n, 0), ("inf", n, 0),
                                 ("dsq", n - 1, 0.0), ("psq", n - 1, 0.0), ("dmax", n - 1, 0.0)):
            if not getattr(self, name):
                setattr(self, name, [zero] * size)

    def add(self, other: "Sums") -> None:
        self.numel += other.numel
        for name in ("sq", "nan", "inf", "dsq", "psq"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for k, value in enumerate(theirs):
                mine[k] += value
        self.dmax = [max(a, b) for a, b in zip(self.dmax, other.dmax)]


@dataclass
class Series:
    """One tensor or module through the iterations (lists in iteration order; per-pair lists have one
    entry fewer: entry ``k`` is the step from iteration ``k`` to ``k + 1``)."""

    name: str
    module: str | None
    layer: str | None
    numel: int
    norm: list[float]
    nan: list[int]
    inf: list[int]
    change: list[float]
    """Relative change ``||W_t - W_{t-1}|| / ||W_{t-1}||`` (``inf`` when ``W_{t-1}`` is all zero and ``W_t`` is not)."""
    abs_change: list[float]
    max_abs_change: list[float]
    fingerprint: list[tuple] = field(default_factory=list, repr=False)
    """Per iteration (sum of squares, NaN count, Inf count): equal weights give equal fingerprints
    (blocks are summed in a fixed order), so only iterations whose fingerprints all match are
    compared byte by byte for the ``stale`` flag."""

    def to_json(self, labels: list[int]) -> dict[str, Any]:
        return {"name": self.name, "module": self.module, "layer": self.layer, "numel": self.numel,
                "iterations": labels, "norm": [_num(v) for v in self.norm], "nan": self.nan, "inf": self.inf,
                "steps": [f"{a}->{b}" for a, b in zip(labels, labels[1:])],
                "rel_change": [_num(v) for v in self.change], "abs_change": [_num(v) for v in self.abs_change],
                "max_abs_change": [_num(v) for v in self.max_abs_change]}


def series_of(name: str, module: str | None, layer: str | None, sums: Sums) -> Series:
    change = []
    for d, p in zip(sums.dsq, sums.psq):
        if p > 0:
            change.append(math.sqrt(d) / math.sqrt(p))
        else:
            change.append(0.0 if d == 0 else math.inf)
    return Series(name, module, layer, sums.numel, [math.sqrt(v) for v in sums.sq], list(sums.nan), list(sums.inf),
                  change, [math.sqrt(v) for v in sums.dsq], list(sums.dmax),
                  list(zip(sums.sq, sums.nan, sums.inf)))


@dataclass
class MomentSums:
    """Adam ``exp_avg_sq`` of one parameter (or module), per iteration: sum of v and how many finite
    entries (``present`` False where the save lacks it)."""

    n: int
    v: list[float] = field(default_factory=list)
    count: list[int] = field(default_factory=list)
    present: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.v = self.v or [0.0] * self.n
        self.count = self.count or [0] * self.n
        self.present = self.present or [False] * self.n

    def add(self, other: "MomentSums") -> None:
        for k in range(self.n):
            self.v[k] += other.v[k]
            self.count[k] += other.count[k]
            self.present[k] = self.present[k] or other.present[k]


@dataclass
class MomentSeries:
    """Per-parameter / per-module Adam statistics: mean ``exp_avg_sq`` (v) and the implied step size
    ``lr / (sqrt(v) + eps)`` at that mean v, with the LR the save recorded for its next step (None where
    unknown). At the mean v, not the mean of the step sizes: entries with v ~ 0 (rows no batch touched)
    would make that mean ``lr / eps`` whatever the rest does."""

    name: str
    module: str | None
    layer: str | None
    exp_avg_sq_mean: list[float | None]
    step_size_mean: list[float | None]

    def to_json(self, labels: list[int]) -> dict[str, Any]:
        return {"name": self.name, "module": self.module, "layer": self.layer, "iterations": labels,
                "exp_avg_sq_mean": [_num(v) for v in self.exp_avg_sq_mean],
                "step_size_mean": [_num(v) for v in self.step_size_mean]}


def moments_of(name: str, module: str | None, layer: str | None, sums: MomentSums,
               lr: list[float | None], eps: float) -> MomentSeries:
    means, steps = [], []
    for k in range(sums.n):
        if not sums.present[k] or sums.count[k] == 0:
            means.append(None)
            steps.append(None)
            continue
        mean = sums.v[k] / sums.count[k]
        means.append(mean)
        steps.append(lr[k] / (math.sqrt(mean) + eps) if lr[k] is not None else None)
    return MomentSeries(name, module, layer, means, steps)


def _num(value: float | None) -> float | None:
    """JSON has no NaN / Infinity: those become null (the nan / inf counts say why)."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.12g}") if value else 0.0
