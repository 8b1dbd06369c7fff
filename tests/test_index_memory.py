"""Regression guard (issue 15): the index of a 20,000-tensor HF checkpoint stays small per tensor.

Memory, not time: bytes allocated by ``index()`` per tensor, measured with tracemalloc, so the guard
holds on a loaded CI machine. Measured 589 B retained / 748 B peak per tensor when the guard was
written (one ``TensorMeta`` with its ``Chunk``, name strings, dict slots); the bounds leave about a
third of headroom, so a change that adds a per-tensor dict or list (hundreds of bytes) fails here.
"""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
from safetensors.numpy import save_file

from ckptscope.formats.registry import open_checkpoint

RETAINED_PER_TENSOR = 800
PEAK_PER_TENSOR = 1000


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
