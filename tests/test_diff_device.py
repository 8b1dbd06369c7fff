"""``diff --device auto`` without a usable GPU stays on the CPU, whatever the machine's device files
say (the GPU half is in test_diff_cuda.py, which needs one)."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from ckptscope.ops.diff import engine
from ckptscope.ops.diff.engine import DiffOptions, diff_checkpoints
from ckptscope.ops.diff.plan import plan_diff


def test_auto_with_a_device_node_but_no_cuda_stays_on_the_cpu(tmp_path, monkeypatch):
    """An NVIDIA device node with a torch that has no CUDA (a CPU wheel on a GPU box): past the
    threshold auto tries the GPU, finds none, and the diff finishes on the CPU with the same report."""
    g = torch.Generator().manual_seed(2)
    a = {"w": torch.randn(512, 64, generator=g), "v": torch.randn(100, generator=g)}
    b = {"w": a["w"] + 1e-3, "v": a["v"].clone()}
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    plan = lambda: plan_diff(tmp_path / "a.safetensors", tmp_path / "b.safetensors")  # noqa: E731
    cpu = diff_checkpoints(plan(), DiffOptions(device="cpu")).to_json()
    monkeypatch.setattr(engine, "_has_nvidia_device", lambda: True)
    monkeypatch.setattr(engine, "AUTO_CUDA_BYTES", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    tries = []
    take_up = engine.DiffEngine._take_up_cuda
    monkeypatch.setattr(engine.DiffEngine, "_take_up_cuda", lambda self: (tries.append(1), take_up(self)))
    auto = diff_checkpoints(plan(), DiffOptions(device="auto")).to_json()
    assert tries == [1]  # tried once, past the threshold
    assert auto == cpu and auto["device"] == "cpu"
    assert auto["summary"]["different"] == 1 and auto["summary"]["equal"] == 1
