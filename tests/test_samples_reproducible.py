"""`sample_ckpts/make_samples.py` writes the same bytes every time: two runs in two fresh processes
(different memory addresses, different hash seeds) give identical files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _generate(out: Path, seed: str) -> dict[str, bytes]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    subprocess.run([sys.executable, str(REPO / "sample_ckpts" / "make_samples.py"), str(out)], check=True,
                   capture_output=True, env=env, timeout=300)
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_make_samples_is_byte_reproducible(tmp_path):
    first = _generate(tmp_path / "one", "1")
    second = _generate(tmp_path / "two", "2")
    assert first.keys() == second.keys() and "legacy_format.pt" in first
    assert [name for name in first if first[name] != second[name]] == []


def test_reproducible_legacy_file_still_loads_in_torch(tmp_path):
    import torch

    files = tmp_path / "one"
    _generate(files, "0")
    state = torch.load(files / "legacy_format.pt", weights_only=True)
    torch.manual_seed(4)
    expected = {"encoder.weight": torch.randn(8, 4), "encoder.bias": torch.randn(8),
                "decoder.weight": torch.randn(4, 8).double(), "steps": torch.tensor([3, 1, 4], dtype=torch.int32)}
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[k], expected[k]) and state[k].dtype == expected[k].dtype for k in expected)
