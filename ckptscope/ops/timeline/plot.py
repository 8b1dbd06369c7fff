"""``timeline --plot PNG``: one picture for a report or an issue, drawn with matplotlib (the optional
``plot`` extra: ``pip install 'ckptscope[plot]'``).

Top: a heatmap of log10 relative change, modules x steps (NaN-holding cells hatched). Bottom: one
curve per repeated layer (all its tensors together) plus the embeddings / head / final norm, so a
layer that stops moving or jumps stands out. Flags are marked on the step they belong to.
The file is written to a temporary sibling and renamed into place.
"""

from __future__ import annotations

import math
from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.ops.atomic import atomic_output


def check_plotting() -> None:
    """Fail fast (before any reading) when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CkptError("--plot needs matplotlib: pip install 'ckptscope[plot]'") from None


def _log(value: float) -> float:
    if value > 0 and math.isfinite(value):
        return math.log10(value)
    return math.nan


def write_plot(result, path: str | Path) -> Path:
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    dst = Path(path)
    if not dst.parent.is_dir():
        raise CkptError("the destination's parent directory does not exist", dst)
    steps = [f"{a}->{b}" for a, b in result.steps]
    rows = result.modules
    grid = np.array([[_log(c) for c in s.change] for s in rows], dtype=float).reshape(len(rows), len(steps))
    height = 3 + 0.22 * len(rows)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, 0.6 * len(steps) + 5), height + 4),
                                      gridspec_kw={"height_ratios": [height, 4]})
    image = top.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="viridis", interpolation="nearest")
    top.set_yticks(range(len(rows)), [s.name for s in rows], fontsize=7)
    top.set_xticks(range(len(steps)), steps, rotation=45, ha="right", fontsize=7)
    top.set_title(f"{result.root}: log10 relative change per module")
    fig.colorbar(image, ax=top, fraction=0.03)
    for r, s in enumerate(rows):
        for k in range(len(steps)):
            if s.nan[k + 1] or s.inf[k + 1]:
                top.text(k, r, "NaN" if s.nan[k + 1] else "Inf", ha="center", va="center", fontsize=6, color="red")
            elif s.change[k] == 0:
                top.text(k, r, "0", ha="center", va="center", fontsize=6, color="black")
    outside = [s for s in rows if s.layer is None]
    for s in [*result.layers, *outside]:
        still = " (unchanged)" if not any(s.change) else ""
        bottom.plot(range(len(steps)), [_log(c) for c in s.change], marker=".", linewidth=1, label=s.name + still)
    for flag in result.flags:
        if flag.kind in ("exploding", "stale", "nan", "inf") and flag.iteration in result.iterations[1:]:
            bottom.axvline(result.iterations.index(flag.iteration) - 1, color="red", alpha=0.15)
    bottom.set_xticks(range(len(steps)), steps, rotation=45, ha="right", fontsize=7)
    bottom.set_ylabel("log10 relative change")
    bottom.set_title("per layer (red: steps with flags)")
    if len(result.layers) + len(outside) <= 24:
        bottom.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    with atomic_output(dst, directory=False, overwrite=True) as staging:
        fig.savefig(staging, format="png", dpi=110)
    plt.close(fig)
    return dst
