"""The CUDA diff path gives the same report as the CPU path (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from ckptscope.ops.diff.engine import DiffOptions, diff_checkpoints
from ckptscope.ops.diff.plan import plan_diff

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_cuda_and_cpu_reports_are_identical(tmp_path):
    g = torch.Generator().manual_seed(3)
    a = {"w": torch.randn(512, 300, generator=g), "h": torch.randn(1000, generator=g).to(torch.bfloat16),
         "nan": torch.tensor([1.0, float("nan"), 2.0]), "same": torch.ones(7), "cast": torch.randn(9, generator=g)}
    b = {k: v.clone() for k, v in a.items()}
    b["w"][17, 5] += 0.125
    b["w"] += 1e-6 * torch.randn(512, 300, generator=g)
    b["h"][999] = -b["h"][999]
    b["nan"][2] = float("nan")
    b["cast"] = a["cast"].to(torch.bfloat16)
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    cpu = diff_checkpoints(plan_diff(tmp_path / "a.safetensors", tmp_path / "b.safetensors"),
                           DiffOptions(device="cpu", block_bytes=64 * 1024))
    cuda = diff_checkpoints(plan_diff(tmp_path / "a.safetensors", tmp_path / "b.safetensors"),
                            DiffOptions(device="cuda", block_bytes=64 * 1024))
    assert cuda.device == "cuda"
    assert [r.to_json() for r in cuda.results] == [r.to_json() for r in cpu.results]
