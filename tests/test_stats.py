"""ops.stats: streamed statistics and corner peeks, checked against torch on real files."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ckptscope.core.errors import CkptError
from ckptscope.formats import open_checkpoint
from ckptscope.ops.stats import iter_regions, tensor_stats
from ckptscope.ops.values import parse_selection, read_page


def reference(t: torch.Tensor) -> dict[str, float]:
    x = t.double().flatten()
    finite = x[torch.isfinite(x)]
    return {"min": finite.min().item(), "max": finite.max().item(), "mean": finite.mean().item(),
            "std": finite.std(unbiased=False).item(), "abs_mean": finite.abs().mean().item(),
            "zeros": int((x == 0).sum()), "nan": int(torch.isnan(x).sum()),
            "pos_inf": int(torch.isposinf(x).sum()), "neg_inf": int(torch.isneginf(x).sum())}


def check(stats, t: torch.Tensor) -> None:
    ref = reference(t)
    assert stats.count == t.numel()
    for key in ("min", "max", "abs_mean"):
        assert getattr(stats, key) == pytest.approx(ref[key], rel=1e-12, abs=1e-12), key
    assert stats.mean == pytest.approx(ref["mean"], rel=1e-9, abs=1e-12)
    assert stats.std == pytest.approx(ref["std"], rel=1e-9, abs=1e-12)
    for key in ("zeros", "nan", "pos_inf", "neg_inf"):
        assert getattr(stats, key) == ref[key], key


@pytest.mark.parametrize("block", [1 << 22, 1000, 7])
def test_stats_match_torch_any_block_size(samples, block):
    folder = samples["hf_llama_sharded"]
    tensors = {}
    for shard in folder.glob("*.safetensors"):
        tensors.update(load_file(shard))
    with open_checkpoint(folder) as reader:
        for name in ("model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight"):
            stats = tensor_stats(reader, name, block_elems=block)
            check(stats, tensors[name])
            counts, _ = np.histogram(tensors[name].double().numpy(), bins=len(stats.hist_counts),
                                     range=(stats.hist_lo, stats.hist_hi))
            assert list(stats.hist_counts) == counts.tolist()


def test_special_values_and_dtypes(tmp_path):
    weird = torch.tensor([[0.0, 1.5, float("nan"), -2.0], [float("inf"), 0.0, -float("inf"), 3.25]])
    tensors = {
        "weird": weird, "bf16": torch.randn(33, 17).bfloat16(), "ints": torch.arange(-5, 20, dtype=torch.int64),
        "mask": torch.tensor([True, False, True, True]), "scalar": torch.tensor(7.0),
        "fp8": (torch.randn(8, 8) * 3).to(torch.float8_e4m3fn), "allnan": torch.full((3,), float("nan")),
        "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "w.safetensors"
    save_file(tensors, path)
    with open_checkpoint(path) as reader:
        for name in ("weird", "bf16", "ints", "scalar", "fp8"):
            check(tensor_stats(reader, name, block_elems=5), tensors[name].float() if name == "fp8" else tensors[name])
        mask = tensor_stats(reader, "mask")
        assert (mask.min, mask.max, mask.mean, mask.zeros) == (0.0, 1.0, 0.75, 1)
        weird_stats = tensor_stats(reader, "weird")
        assert (weird_stats.nan, weird_stats.pos_inf, weird_stats.neg_inf, weird_stats.finite) == (1, 1, 1, 5)
        assert sum(weird_stats.hist_counts) == 5
        allnan = tensor_stats(reader, "allnan")
        assert allnan.nan == 3 and math.isnan(allnan.mean) and allnan.hist_counts == ()
        empty = tensor_stats(reader, "empty")
        assert empty.count == 0 and math.isnan(empty.min)


def test_should_stop_cancels_between_regions(samples):
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 2

    with open_checkpoint(samples["hf_llama_single"]) as reader:
        assert tensor_stats(reader, "model.embed_tokens.weight", block_elems=64, should_stop=stop) is None
    assert len(calls) == 3


def test_stats_read_in_bounded_regions(samples):
    """Every read is a region of at most block_elems elements: memory stays bounded."""
    with open_checkpoint(samples["hf_llama_single"]) as reader:
        seen = []
        original = reader.read

        def spy(name, region=None):
            out = original(name, region)
            seen.append(out.size)
            return out

        reader.read = spy  # observe the real reader, not a mock
        tensor_stats(reader, "model.embed_tokens.weight", block_elems=1000)
    assert max(seen) <= 1000 and sum(seen) == 2 * 256 * 64  # two passes over 16,384 values


@pytest.mark.parametrize("shape", [(), (0,), (10,), (7, 3), (4, 5, 6), (2, 3, 4, 5), (3, 1000)])
@pytest.mark.parametrize("block", [1, 6, 25, 10**6])
def test_iter_regions_tile_exactly(shape, block):
    seen = np.zeros(shape, dtype=np.int32)
    for region in iter_regions(shape, block):
        box = seen[region]
        assert box.size <= block
        seen[region] += 1
    assert (seen == 1).all()


def test_value_pages_match_torch(samples):
    """The Values tab's pages (ops.values.read_page) on a pickle, a strided view, a 3-D bf16 tensor
    and a scalar, against torch / safetensors loading the same files."""
    tensors = torch.load(samples["megatron_style.pt"], weights_only=False)

    def page(reader, name, text, rows, cols):
        return read_page(reader, name, parse_selection(text, reader.meta(name).shape), rows=rows, cols=cols)

    with open_checkpoint(samples["megatron_style.pt"]) as reader:
        corner = page(reader, "model.lm_head.weight", "", 5, 4)
        np.testing.assert_array_equal(corner.values, tensors["model"]["lm_head.weight"][:5, :4].numpy())
        view = page(reader, "extra.transposed_view", "", 2, 2)  # a strided view
        np.testing.assert_array_equal(view.values, tensors["extra.transposed_view"][:2, :2].numpy())
    with open_checkpoint(samples["dtypes.safetensors"]) as reader:
        cube = page(reader, "bfloat16.cube", "", 2, 3)
        ref = load_file(samples["dtypes.safetensors"])["bfloat16.cube"]
        assert cube.title().startswith("bfloat16.cube[0, 0:2, 0:3]")
        np.testing.assert_array_equal(cube.values.astype(np.float32), ref[0, :2, :3].float().numpy())
        assert float(page(reader, "scalar.step", "", 1, 1).values[0, 0]) == 1234.5


def test_packed_dtype_is_a_clear_error(tmp_path):
    import json
    import struct

    path = tmp_path / "f4.safetensors"

    header = json.dumps({"packed": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x00\x00")
    with open_checkpoint(path) as reader, pytest.raises(CkptError, match="cannot be read as numbers"):
        tensor_stats(reader, "packed")
