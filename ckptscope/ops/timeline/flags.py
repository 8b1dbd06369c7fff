"""Flags with a reason: what in a timeline deserves a look.

* ``frozen``: a tensor whose relative change is at most ``frozen_below`` (default 0: exactly
  unchanged) for one or more consecutive steps while other tensors moved in each of them; one flag
  per run of such steps.
* ``exploding``: a step whose relative change exceeds ``factor`` x the median of the tensor's own
  earlier changes, or whose norm exceeds ``factor`` x the norm one iteration before. Compared with the
  tensor's own history, so a layer that always moves a lot is not flagged for it. Needs one earlier
  step; a step into a ``stale`` iteration is not judged (the stale flag explains it), nor kept as
  history.
* ``nan`` / ``inf``: the first iteration where a tensor holds NaN (or +-Inf), with how many.
* ``stale``: an iteration whose model weights are exactly those of an earlier one (all tensors equal,
  confirmed byte by byte): a resume that reloaded the wrong save, or saves with no training between.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from ckptscope.core.roles import is_lora_tensor
from ckptscope.core.units import plural
from ckptscope.ops.timeline.series import Series

KINDS = ("stale", "nan", "inf", "exploding", "frozen")
DEFAULT_FACTOR = 10.0


@dataclass(frozen=True)
class Flag:
    kind: str
    """One of ``KINDS``."""
    iteration: int
    """Where it is seen: the first iteration with NaN, the iteration a step ends at, the stale iteration."""
    subject: str
    """The tensor (``model`` for ``stale``)."""
    module: str | None
    reason: str
    since: int | None = None
    """``frozen``: the iteration it stops changing after; ``stale``: the earlier iteration it equals."""
    until: int | None = None
    """``frozen``: the last iteration of the run."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "iteration": self.iteration, "subject": self.subject, "module": self.module,
                "reason": self.reason, "since": self.since, "until": self.until}


def _g(value: float) -> str:
    return f"{value:.3g}"


def nonfinite_flags(series: list[Series], labels: list[int]) -> list[Flag]:
    out = []
    for s in series:
        for kind, counts, word in (("nan", s.nan, "NaN"), ("inf", s.inf, "Inf")):
            first = next((k for k, c in enumerate(counts) if c), None)
            if first is None:
                continue
            where = " (already in the first iteration read)" if first == 0 else ""
            out.append(Flag(kind, labels[first], s.name, s.module,
                            f"{plural(counts[first], word + ' value')} first seen at iteration {labels[first]}{where}"))
    return out


def lora_base_weights(names: list[str]) -> set[str]:
    """In a LoRA run, the base model's weights, which stay put by design: every tensor but the adapter's
    (``lora_A`` / ``lora_B``) and PEFT's trained copies (``modules_to_save``) in a whole PEFT-wrapped state dict
    (verl's saves: ``.base_layer`` names). A saved adapter (the Trainer's checkpoints) holds no base weight: its
    other tensors are the ``modules_to_save`` copies, trained (a probe: a trained ``lm_head`` was called a base
    weight and never flagged). Empty outside LoRA runs."""
    if not any(map(is_lora_tensor, names)) or not any(".base_layer." in n for n in names):
        return set()
    return {n for n in names if not is_lora_tensor(n) and ".modules_to_save." not in n}


def frozen_flags(series: list[Series], labels: list[int], threshold: float, stale_steps: set[int]) -> list[Flag]:
    """Runs of steps where a tensor stays put (``change <= threshold``) while another one moves. In a
    LoRA run (PEFT-wrapped names with ``lora_A`` / ``lora_B``) only the adapter's tensors are judged: the
    base weights stay put by design (every one of them was flagged, exit 1; a probe with verl's LoRA)."""
    steps = len(labels) - 1
    moving = [any(s.change[k] > threshold for s in series) and k not in stale_steps for k in range(steps)]
    out = []
    what = "unchanged" if threshold == 0 else f"relative change <= {threshold:g}"
    frozen_by_design = lora_base_weights([s.name for s in series])
    by_name = {s.name: s for s in series}
    for s in series:
        if s.name in frozen_by_design:
            continue
        # LoRA's lora_B starts at zero, and while it is zero lora_A gets no gradient: A stays put by design (a
        # probe: every lora_A flagged frozen at the first step of a Trainer run)
        partner = by_name.get(s.name.replace(".lora_A.", ".lora_B.")) if ".lora_A." in s.name else None

        def still(k: int) -> bool:
            return moving[k] and s.change[k] <= threshold and not (partner is not None and partner.norm[k] == 0)

        k = 0
        while k < steps:
            if not still(k):
                k += 1
                continue
            end = k
            while end + 1 < steps and still(end + 1):
                end += 1
            count = end - k + 1
            out.append(Flag("frozen", labels[k + 1], s.name, s.module,
                            f"{what} from iteration {labels[k]} to {labels[end + 1]} ({count} "
                            f"{'saves' if count != 1 else 'save'} apart) while other tensors moved",
                            since=labels[k], until=labels[end + 1]))
            k = end + 1
    return out


def exploding_flags(series: list[Series], labels: list[int], factor: float, stale_steps: set[int]) -> list[Flag]:
    out = []
    for s in series:
        history: list[float] = []
        for k, change in enumerate(s.change):
            if k in stale_steps:
                continue
            reasons = []
            usable = [h for h in history if h > 0 and math.isfinite(h)]
            if usable and math.isfinite(change):
                median = statistics.median(usable)
                if change > factor * median:
                    reasons.append(f"relative change {_g(change)} is {_g(change / median)}x its median so far "
                                   f"({_g(median)})")
            before, after = s.norm[k], s.norm[k + 1]
            if before > 0 and math.isfinite(after) and after > factor * before:
                reasons.append(f"norm grew {_g(after / before)}x since iteration {labels[k]} "
                               f"({_g(before)} -> {_g(after)})")
            if reasons:
                out.append(Flag("exploding", labels[k + 1], s.name, s.module, "; ".join(reasons)))
            if math.isfinite(change):
                history.append(change)
    return out


def stale_flag(labels: list[int], later: int, earlier: int) -> Flag:
    if earlier == later - 1:
        reason = (f"weights equal iteration {labels[earlier]}'s exactly: nothing was trained between the saves "
                  f"(or a resume saved before training)")
    else:
        reason = (f"weights equal iteration {labels[earlier]}'s exactly, not the ones of iteration "
                  f"{labels[later - 1]} before it: a resume that reloaded an older save?")
    return Flag("stale", labels[later], "model", None, reason, since=labels[earlier])


def sort_flags(flags: list[Flag]) -> list[Flag]:
    return sorted(flags, key=lambda f: (f.iteration, KINDS.index(f.kind), f.subject))
