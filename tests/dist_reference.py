"""Shared by test_dcp.py and test_megatron_dist.py: the writers' own loaders, used as ground truth.

Only tests import torch here; ckptscope itself never does on these paths.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_ckpts"
MEGATRON_ITER = SAMPLES / "megatron_torch_dist" / "iter_0000010"


def generators():
    """sample_ckpts/make_dist_samples.py as a module (on sys.path so spawned ranks can import it)."""
    if str(SAMPLES) not in sys.path:
        sys.path.insert(0, str(SAMPLES))
    return importlib.import_module("make_dist_samples")


def torch_dcp_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a DCP dir loaded by torch's own reader (``dcp.load(no_dist=True)`` into
    targets allocated from ``.metadata``, which also works for Megatron, FORMATS.md §4.2)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = FileSystemReader(str(path)).read_metadata()
    state = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
             if isinstance(v, TensorStorageMetadata)}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return {k: as_numpy(v) for k, v in state.items()}


def as_numpy(tensor) -> np.ndarray:
    """float64 for floats (bf16 has no numpy dtype), the exact dtype for the rest."""
    if tensor.is_floating_point():
        return tensor.detach().double().numpy()
    return tensor.detach().numpy()


def values(array: np.ndarray) -> np.ndarray:
    """ckptscope's arrays (ml_dtypes bf16 etc.) in the same comparable form."""
    return array.astype(np.float64) if array.dtype.kind in "fV" or "bfloat" in str(array.dtype) else array


def assert_no_torch_on_metadata_path(path: Path, read: str | None = None) -> None:
    """Index (and optionally read one tensor) in a fresh interpreter; neither may import torch/megatron."""
    code = (
        "import sys, json\n"
        "from ckptscope.formats import open_checkpoint\n"
        f"r = open_checkpoint({str(path)!r})\n"
        "ix = r.index()\n"
        f"name = {read!r}\n"
        "if name: r.read(name)\n"
        "print(json.dumps({'n': len(ix.tensors), 'torch': 'torch' in sys.modules,\n"
        "                  'megatron': any(m.split('.')[0] == 'megatron' for m in sys.modules)}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["n"] > 0
    assert report["torch"] is False
    assert report["megatron"] is False
