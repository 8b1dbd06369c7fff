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


def _reports(a, b, **options):
    """The CPU and CUDA reports of one diff, as JSON, with small blocks so tensors span several."""
    cpu = diff_checkpoints(plan_diff(a, b), DiffOptions(device="cpu", block_bytes=64 * 1024, **options))
    cuda = diff_checkpoints(plan_diff(a, b), DiffOptions(device="cuda", block_bytes=64 * 1024, **options))
    assert cuda.device == "cuda" and cpu.device == "cpu"
    return cpu.to_json(), cuda.to_json()


def _same_metrics(cpu: dict, cuda: dict, rel: float = 1e-9) -> None:
    """Everything but the float sums bit for bit; the sums (float64, summed in another order on the GPU)
    to ``rel``."""
    import math

    assert cpu["summary"] == cuda["summary"]
    for x, y in zip(cpu["tensors"], cuda["tensors"], strict=True):
        for key in x:
            if isinstance(x[key], float) and isinstance(y[key], float) and not (math.isnan(x[key]) or math.isnan(y[key])):
                assert y[key] == pytest.approx(x[key], rel=rel, abs=1e-300), (x["name"], key)
            else:
                assert x[key] == y[key], (x["name"], key)


def test_dense_bf16_and_fp8_and_int_tensors(tmp_path):
    """Every element differs (a fine-tuned model against its base), over many blocks; fp8 and int
    tensors take the bitwise path."""
    g = torch.Generator().manual_seed(5)
    a = {"dense": torch.randn(2048, 1024, generator=g).to(torch.bfloat16),
         "fp8": torch.randn(256, 128, generator=g).to(torch.float8_e4m3fn),
         "ints": torch.randint(-1000, 1000, (4096,), generator=g, dtype=torch.int32)}
    b = {"dense": (a["dense"].float() + 1e-2 * torch.randn(2048, 1024, generator=g)).to(torch.bfloat16),
         "fp8": (a["fp8"].float() * 1.5).to(torch.float8_e4m3fn), "ints": a["ints"].clone()}
    b["ints"][123] += 1
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    cpu, cuda = _reports(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert cpu["summary"]["different"] == 3
    _same_metrics(cpu, cuda)


def test_tolerances_give_the_same_statuses(tmp_path):
    g = torch.Generator().manual_seed(7)
    a = {f"w{i}": torch.randn(300, 200, generator=g) for i in range(4)}
    b = {k: v + 10 ** -(3 + i) * torch.randn(300, 200, generator=g) for i, (k, v) in enumerate(a.items())}
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    cpu, cuda = _reports(tmp_path / "a.safetensors", tmp_path / "b.safetensors", atol=1e-4, rtol=1e-4)
    assert {t["status"] for t in cpu["tensors"]} == {"close", "different"}
    _same_metrics(cpu, cuda)


def test_mapped_diff_of_hf_against_megatron_on_cuda(tmp_path):
    """HF against its real megatron-core conversion (pieces of the fused QKV and gate/up rows sent to
    the GPU one by one), with one element changed on the HF side."""
    import shutil
    from pathlib import Path

    from safetensors.torch import load_file

    samples = Path(__file__).resolve().parents[1] / "sample_ckpts"
    hf = tmp_path / "hf"
    shutil.copytree(samples / "hf_llama_gqa", hf)
    state = load_file(str(hf / "model.safetensors"))
    state["model.layers.1.self_attn.k_proj.weight"][13, 5] += 0.5
    save_file(state, str(hf / "model.safetensors"), metadata={"format": "pt"})
    cpu, cuda = _reports(hf, samples / "mcore_llama_gqa")
    assert cpu["summary"]["different"] == 1
    _same_metrics(cpu, cuda)


def test_cli_diff_on_cuda_prints_the_cpu_report(tmp_path, cli):
    import json

    g = torch.Generator().manual_seed(11)
    a = {"x": torch.randn(1000, 100, generator=g).to(torch.bfloat16), "y": torch.randn(64, generator=g)}
    b = {"x": a["x"].clone(), "y": a["y"] * 2}
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    runs = {d: cli("diff", "--json", "--device", d, str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"))
            for d in ("cpu", "cuda")}
    assert runs["cpu"].code == runs["cuda"].code == 1, runs["cuda"].err
    cpu, cuda = json.loads(runs["cpu"].out), json.loads(runs["cuda"].out)
    assert cuda["device"] == "cuda" and cpu["device"] == "cpu"
    cpu.pop("device"), cuda.pop("device")
    _same_metrics(cpu, cuda)


def _two_files(tmp_path, rows: int = 2048):
    g = torch.Generator().manual_seed(13)
    a = {f"w{i}": torch.randn(rows, 256, generator=g).to(torch.bfloat16) for i in range(3)}
    b = {k: (v.float() + 1e-2 * torch.randn(rows, 256, generator=g)).to(torch.bfloat16) for k, v in a.items()}
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    return tmp_path / "a.safetensors", tmp_path / "b.safetensors"


def test_auto_takes_up_the_gpu_only_past_its_threshold(tmp_path):
    """auto starts on the CPU (importing torch and starting CUDA cost seconds that a small diff never
    earns back); once it has taken up the GPU, blocks run there and give the CPU's report."""
    from ckptscope.ops.diff.engine import DiffEngine

    a, b = _two_files(tmp_path)
    cpu = diff_checkpoints(plan_diff(a, b), DiffOptions(device="cpu", block_bytes=64 * 1024)).to_json()
    small = diff_checkpoints(plan_diff(a, b), DiffOptions(device="auto", block_bytes=64 * 1024)).to_json()
    assert small["device"] == "cpu" and small == cpu
    engine = DiffEngine(plan_diff(a, b), DiffOptions(device="auto", block_bytes=64 * 1024))
    assert engine.device == "cpu"
    engine._take_up_cuda()  # what compare starts on a thread past AUTO_CUDA_BYTES
    taken = engine.run().to_json()
    assert taken["device"] == "cuda"
    taken["device"] = "cpu"
    _same_metrics(cpu, taken)
