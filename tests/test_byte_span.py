"""``CheckpointReader.byte_span``: when it names a file range, that range holds exactly the bytes
``read`` returns; contiguous boxes get one, boxes that cut rows get None."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from ckptscope.formats import open_checkpoint

SAMPLES = Path(__file__).resolve().parents[1] / "sample_ckpts"


def _bytes_at(span) -> bytes:
    path, offset, length = span
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read(length)


def test_spans_of_a_safetensors_tensor(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": np.arange(60, dtype=np.float32).reshape(3, 4, 5), "b": np.arange(7, dtype=np.int16)}, str(path))
    reader = open_checkpoint(path)
    contiguous = [None, (slice(1, 3),), (slice(1, 2), slice(1, 3)), (slice(2, 3), slice(3, 4), slice(1, 4)),
                  (slice(0, 3), slice(0, 4), slice(0, 5))]
    cutting = [(slice(None), slice(1, 2)), (slice(0, 2), slice(1, 3)), (slice(None), slice(None), slice(0, 2))]
    for region in contiguous:
        span = reader.byte_span("a", region)
        assert span is not None, region
        assert _bytes_at(span) == reader.read("a", region).tobytes(), region
    for region in cutting:
        assert reader.byte_span("a", region) is None, region
    assert _bytes_at(reader.byte_span("b")) == np.arange(7, dtype=np.int16).tobytes()


def test_spans_inside_torch_dist_items_and_per_layer_views():
    reader = open_checkpoint(SAMPLES / "megatron_torch_dist" / "iter_0000010")
    index = reader.index()
    names = list(index.views)[:6] + [n for n, t in index.tensors.items() if len(t.chunks) == 1][:6]
    assert names
    checked = 0
    for name in names:
        span = reader.byte_span(name)
        if span is None:
            continue
        assert _bytes_at(span) == np.ascontiguousarray(reader.read(name)).tobytes(), name
        checked += 1
    assert checked >= 4
    # a TP-sharded tensor: each stored chunk's own box is one run, a box across two chunks is not
    sharded = [t for t in index.tensors.values() if len(t.chunks) == 2 and len(t.shape) == 2][:4]
    assert sharded
    for meta in sharded:
        for chunk in meta.chunks:
            box = tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.shape))
            span = reader.byte_span(meta.name, box)
            assert span is not None and _bytes_at(span) == np.ascontiguousarray(reader.read(meta.name, box)).tobytes()
        assert reader.byte_span(meta.name) is None
