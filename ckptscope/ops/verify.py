"""``ckptscope verify``: convert to a target and back in a temporary directory, then diff bitwise.

A round trip alone can hide a symmetric bug (MAPPING.md P2), which is why the mapping layer has a
single source of truth and why the tests also compare against independently converted checkpoints;
``verify`` is the user's quick proof that nothing is lost or changed on the way.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ckptscope.ops.convert.execute import execute_convert
from ckptscope.ops.convert.plan import plan_convert
from ckptscope.ops.diff.engine import DiffOptions, DiffReport, diff_checkpoints
from ckptscope.ops.diff.plan import plan_diff


def verify_round_trip(src: str | Path, *, via: str = "mcore", tp: int = 1, pp: int = 1, ep: int = 1,
                      spec: str = "local", ckpt_format: str = "torch_dist", arch: str | None = None,
                      hf_config: str | Path | None = None, skip_unknown: bool = False) -> DiffReport:
    """SRC's model -> ``via`` -> back to SRC's family, compared with SRC's model bit for bit (dtypes
    included). Training state is neither converted nor compared; unknown entries refuse, or with
    ``skip_unknown`` are left out of both."""
    back_to = "hf" if via == "mcore" else "mcore"
    with tempfile.TemporaryDirectory(prefix="ckptscope-verify-") as tmp:
        there, back = Path(tmp) / "there", Path(tmp) / "back"
        execute_convert(plan_convert(src, there, to=via, tp=tp, pp=pp, ep=ep, spec=spec, ckpt_format=ckpt_format,
                                     arch=arch, hf_config=hf_config, skip_unknown=skip_unknown))
        execute_convert(plan_convert(there, back, to=back_to, arch=arch, hf_config=hf_config,
                                     ckpt_format=ckpt_format))
        report = diff_checkpoints(plan_diff(src, back, mapping="auto", compare_unknown=not skip_unknown),
                                  DiffOptions(device="cpu"))
    layout = f"tp {tp}, pp {pp}" + (f", ep {ep}" if ep > 1 else "") + (", te spec" if spec == "te" else "")
    report.a, report.b = str(src), f"{src} -> {via} ({layout}, {ckpt_format}) -> {back_to}"
    return report
