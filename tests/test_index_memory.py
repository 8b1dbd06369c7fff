"""Regression guards (issue 15) on a 20,000-tensor HF checkpoint: its index stays small per tensor,
and ``inspect`` of it (as a user runs it, JSON and human) imports neither torch nor numpy.

Memory, not time: bytes allocated by ``index()`` per tensor, measured with tracemalloc, so the guard
holds on a loaded CI machine. Measured 529 B retained / 668 B peak per tensor (one ``TensorMeta`` with
its ``Chunk``, name strings, dict slots; Python 3.11). The bounds leave about a fifth of headroom: a
change that keeps one more small dict per tensor (~200 B: 733 / 861 measured by a reviewer's mutant)
fails here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from safetensors.numpy import save_file

from ckptscope.formats.registry import open_checkpoint

RETAINED_PER_TENSOR = 640
PEAK_PER_TENSOR = 800


@pytest.fixture(scope="module")
def hf_20k(tmp_path_factory):
    """40 shards x 500 tensors written by safetensors' own writer, with the index transformers writes."""
    root = tmp_path_factory.mktemp("hf20k")
    shards, per = 40, 500
    weight_map = {}
    for s in range(shards):
        tensors = {f"model.layers.{s * per + i}.mlp.down_proj.weight": np.zeros((2, 2), np.float32)
                   for i in range(per)}
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(root / file))
        weight_map.update(dict.fromkeys(tensors, file))
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return root


def test_index_bytes_per_tensor_stay_bounded(hf_20k):
    tracemalloc.start()
    try:
        reader = open_checkpoint(hf_20k)
        index = reader.index()
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    count = len(index.tensors)
    assert count == 20_000
    assert retained / count <= RETAINED_PER_TENSOR, f"{retained / count:.0f} B retained per tensor"
    assert peak / count <= PEAK_PER_TENSOR, f"{peak / count:.0f} B peak per tensor"
    reader.close()


@pytest.mark.parametrize("as_json", [True, False])
def test_inspect_of_20k_tensors_imports_neither_torch_nor_numpy(hf_20k, as_json):
    """Start-up matters at this size (issue 15): ``import numpy`` alone costs more than the index. In a
    fresh interpreter, as the CLI runs; this test process has numpy loaded, so it cannot tell."""
    args = ["inspect", "--json", str(hf_20k)] if as_json else ["inspect", str(hf_20k)]
    code = (
        "import sys\n"
        "from ckptscope.cli import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "print(sorted(m for m in ('torch', 'numpy', 'ml_dtypes', 'textual') if m in sys.modules), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    if as_json:
        assert json.loads(proc.stdout)["metadata"]["num_tensors"] == 20_000
    else:
        assert re.search(r"^tensors +20000\b", proc.stdout, re.M), proc.stdout[:500]
    assert proc.stderr.strip().splitlines()[-1] == "[]", proc.stderr[-2000:]
