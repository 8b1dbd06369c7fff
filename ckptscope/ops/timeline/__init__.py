"""``ckptscope timeline``: how a training run's weights moved from save to save.

For a save root with several iterations (Megatron ``iter_*``, torchtitan ``step-N``, HF Trainer
``checkpoint-N``, verl ``global_step_N``, DeepSpeed ``global_stepN``), per tensor, per module and per
layer, for each consecutive pair of iterations: the relative change ``||W_t - W_{t-1}|| / ||W_{t-1}||``,
the norm ``||W_t||``, max ``|dW|``, NaN / Inf counts; where Adam's ``exp_avg_sq`` is saved, its mean and
the implied per-parameter step size ``lr / (sqrt(v) + eps)``; and flags with a reason (``flags.py``).
Adam state saved under parameter names is used as is; HF Trainer's positional ``optimizer.pt``
(``optim_hf.py``) and Megatron's flat distributed-optimizer buffers (``optim_megatron.py``) are named
only where every entry is verified against its parameter, else left out with the reason.

Public API (what the CLI and the TUI call)::

    from ckptscope.ops.timeline import build_timeline_plan, run_timeline, TimelineOptions

    plan = build_timeline_plan(root, iterations="1000:5000", include=(), exclude=(), sample=None)
    try:
        result = run_timeline(plan, progress=lambda done, total: ..., options=TimelineOptions())
    finally:
        plan.close()
    result.iterations          # [1000, 2000, ...], oldest first
    result.modules             # [Series]: .name, .layer, .norm[i], .change[k], .max_abs_change[k], .nan[i], .inf[i]
    result.layers, result.tensors, result.model
    result.moment_modules      # [MomentSeries]: .exp_avg_sq_mean[i], .step_size_mean[i] (None where unknown)
    result.flags               # [Flag]: .kind (stale|nan|inf|exploding|frozen), .iteration, .subject, .reason
    result.to_json(), result.csv_rows()

Per-step lists (``change``, ``abs_change``, ``max_abs_change``) have one entry fewer than the
iterations: entry ``k`` is the step from ``iterations[k]`` to ``iterations[k + 1]``. Modules and layers
are sums of their tensors (``series.py``). ``build_timeline_plan`` opens metadata only and raises
``CkptError`` on bad input; ``run_timeline`` reads every tensor once (``engine.py``); ``cancelled`` lets
a UI stop it between blocks.
"""

from ckptscope.ops.timeline.engine import TimelineOptions, TimelineResult, run_timeline
from ckptscope.ops.timeline.flags import Flag
from ckptscope.ops.timeline.plan import TimelinePlan, build_timeline_plan, module_of
from ckptscope.ops.timeline.series import MomentSeries, Series

__all__ = ["Flag", "MomentSeries", "Series", "TimelineOptions", "TimelinePlan", "TimelineResult",
           "build_timeline_plan", "module_of", "run_timeline"]
