"""Readers return exactly what the real writers wrote: names, dtypes, shapes and values."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ckptscope.formats import detect_format, open_checkpoint


def as_torch(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """numpy (ml_dtypes for bf16/fp8) -> torch, by reinterpreting the bytes."""
    if dtype.is_floating_point and dtype.itemsize <= 2 and dtype not in (torch.float16,):
        raw = np.array(array, order="C").view(np.uint8 if dtype.itemsize == 1 else np.int16)
        return torch.from_numpy(raw).view(dtype)
    return torch.from_numpy(np.array(array, order="C"))


def assert_bitwise(array: np.ndarray, expected: torch.Tensor) -> None:
    got = as_torch(array, expected.dtype)
    assert got.shape == expected.shape
    # Compare bytes, so NaNs and -0.0 count as equal only when their bits are.
    assert got.contiguous().reshape(-1).view(torch.uint8).tolist() == \
        expected.contiguous().reshape(-1).view(torch.uint8).tolist()


def test_single_safetensors_every_dtype(samples):
    path = samples["dtypes.safetensors"]
    expected = load_file(path)
    reader = open_checkpoint(path)
    index = reader.index()
    assert index.format == "safetensors"
    assert set(index.tensors) == set(expected)
    for name, tensor in expected.items():
        meta = index.tensors[name]
        assert meta.dtype == str(tensor.dtype).removeprefix("torch.")
        assert meta.shape == tuple(tensor.shape)
        assert meta.nbytes == tensor.numel() * tensor.element_size()
        assert_bitwise(reader.read(name), tensor)
    with safe_open(path, "pt") as handle:
        assert index.metadata["__metadata__"] == handle.metadata()


def test_region_reads_match_slices(samples):
    path = samples["dtypes.safetensors"]
    expected = load_file(path)
    reader = open_checkpoint(path)
    assert_bitwise(reader.read("float32.matrix", (slice(2, 5), slice(1, 3))), expected["float32.matrix"][2:5, 1:3])
    assert_bitwise(reader.read("bfloat16.cube", (slice(1, 2),)), expected["bfloat16.cube"][1:2])
    assert reader.read("float32.matrix", (slice(3, 3),)).shape == (0, 5)


def test_hf_sharded_matches_transformers_output(samples):
    path = samples["hf_llama_sharded"]
    weight_map = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    reader = open_checkpoint(path)
    index = reader.index()
    assert index.format == "hf"
    assert set(index.tensors) == set(weight_map)
    for name, shard in weight_map.items():
        assert index.tensors[name].files == (shard,)
    for shard in sorted(set(weight_map.values())):
        for name, tensor in load_file(path / shard).items():
            assert_bitwise(reader.read(name), tensor)
    assert index.metadata["architectures"] == ["LlamaForCausalLM"]
    assert {o.name for o in index.objects} >= {"config", "generation_config"}
    assert index.metadata["index"]["total_size"] == index.total_bytes
    assert not index.warnings


def test_hf_single_file_dir(samples):
    reader = open_checkpoint(samples["hf_llama_single"])
    expected = load_file(samples["hf_llama_single"] / "model.safetensors")
    assert set(reader.index().tensors) == set(expected)
    name = "model.layers.2.self_attn.k_proj.weight"
    assert_bitwise(reader.read(name, (slice(4, 9),)), expected[name][4:9])


def test_hf_bin_shards(samples):
    path = samples["hf_llama_bin"]
    reader = open_checkpoint(path)
    index = reader.index()
    assert index.metadata["weights"] == "pytorch_model.bin"
    for shard in sorted(path.glob("pytorch_model-*.bin")):
        for name, tensor in torch.load(shard, weights_only=True).items():
            assert index.tensors[name].files == (shard.name,)
            assert_bitwise(reader.read(name), tensor)


def test_nested_torch_file_keeps_full_paths_and_objects(samples):
    path = samples["megatron_style.pt"]
    expected = torch.load(path, weights_only=False)
    reader = open_checkpoint(path)
    index = reader.index()
    assert index.format == "torch"
    for name, tensor in expected["model"].items():
        assert_bitwise(reader.read(f"model.{name}"), tensor)
    assert_bitwise(reader.read("optimizer.state.0.exp_avg"), expected["optimizer"]["state"][0]["exp_avg"])
    assert_bitwise(reader.read("rng_state.0.torch_rng_state"), expected["rng_state"][0]["torch_rng_state"])
    view = expected["extra.transposed_view"]
    assert index.tensors["extra.transposed_view"].chunks[0].encoding.value == "strided"
    assert_bitwise(reader.read("extra.transposed_view"), view)
    assert_bitwise(reader.read("extra.transposed_view", (slice(1, 3), slice(0, 2))), view[1:3, 0:2])
    objects = {o.name: o for o in index.objects}
    assert objects["args"].type == "argparse.Namespace"
    assert objects["args"].value["num_layers"] == expected["args"].num_layers
    assert objects["iteration"].value == 20 and index.iteration == 20
    assert objects["optimizer.param_groups"].value[0]["lr"] == 3e-4
    assert_bitwise(reader.read("optimizer.state.0.step"), expected["optimizer"]["state"][0]["step"])
    assert objects["checkpoint_version"].value == 3.0


def test_legacy_torch_file(samples):
    path = samples["legacy_format.pt"]
    expected = torch.load(path, weights_only=True)
    reader = open_checkpoint(path)
    assert reader.index().format == "torch-legacy"
    for name, tensor in expected.items():
        assert_bitwise(reader.read(name), tensor)


def test_shared_storage_and_buffer_saves(tmp_path):
    """Tied weights share a storage; a buffer save uses the ``archive/`` prefix."""
    import io

    emb = torch.randn(10, 4)
    buf = io.BytesIO()
    torch.save({"embed": emb, "lm_head": emb, "half": emb[5:]}, buf)
    path = tmp_path / "tied.bin"
    path.write_bytes(buf.getvalue())
    reader = open_checkpoint(path)
    index = reader.index()
    assert index.tensors["embed"].attr("shares_storage_with") == "lm_head,half"
    assert_bitwise(reader.read("half"), emb[5:])
    assert_bitwise(reader.read("lm_head", (slice(9, 10),)), emb[9:10])


def test_v3_rebuild_dtypes(tmp_path):
    """uint16 and float8 tensors pickle via ``_rebuild_tensor_v3`` on untyped storages."""
    path = tmp_path / "newdtypes.pt"
    state = {"u16": torch.arange(5, dtype=torch.int32).to(torch.uint16), "f8": torch.randn(6).to(torch.float8_e4m3fn),
             "e8m0": torch.ones(3).to(torch.float8_e8m0fnu)}
    torch.save(state, path)
    reader = open_checkpoint(path)
    for name, tensor in state.items():
        assert reader.index().tensors[name].dtype == str(tensor.dtype).removeprefix("torch.")
        assert_bitwise(reader.read(name), tensor)


def test_detection_order(samples):
    assert detect_format(samples["dtypes.safetensors"]).format_name == "safetensors"
    assert detect_format(samples["megatron_style.pt"]).format_name == "torch"
    assert detect_format(samples["legacy_format.pt"]).format_name == "torch-legacy"
    assert detect_format(samples["hf_llama_bin"]).format_name == "hf"


def test_safetensors_without_suffix_is_sniffed(samples, tmp_path):
    copy = tmp_path / "weights.data"
    copy.write_bytes(samples["dtypes.safetensors"].read_bytes())
    assert open_checkpoint(copy).index().format == "safetensors"


def test_indexing_never_imports_torch_or_numpy(samples):
    """Metadata paths stay cheap: listing every sample imports neither torch nor numpy."""
    paths = [str(p) for p in samples.values()]
    code = (
        "import sys\n"
        "from ckptscope.formats import open_checkpoint\n"
        f"for p in {paths!r}:\n"
        "    open_checkpoint(p).index()\n"
        "bad = [m for m in ('torch', 'numpy', 'textual', 'safetensors') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_trusted_and_safe_reads_agree_on_bin_shards(samples):
    safe = open_checkpoint(samples["hf_llama_bin"])
    trusted = open_checkpoint(samples["hf_llama_bin"], trust_pickle=True)
    assert set(safe.index().tensors) == set(trusted.index().tensors)
    for name in safe.index().tensors:
        assert safe.read(name).tobytes() == trusted.read(name).tobytes()
        assert safe.read(name, (slice(1, 2),)).tobytes() == trusted.read(name, (slice(1, 2),)).tobytes()


def test_views_that_do_not_overlap_are_not_shared(tmp_path):
    """Slices of one flat buffer (DeepSpeed's zero_to_fp32, Megatron's DDP param buffers) are separate
    data: only tensors whose bytes overlap are marked as sharing a storage (tied)."""
    flat = torch.randn(30)
    torch.save({"a": flat[:10].view(2, 5), "b": flat[10:30], "tied_b": flat[10:30], "tail": flat[25:]},
               tmp_path / "flat.pt")
    tensors = open_checkpoint(tmp_path / "flat.pt").index().tensors
    assert tensors["a"].attr("shares_storage_with") is None
    assert tensors["b"].attr("shares_storage_with") == "tied_b,tail"
    assert tensors["tail"].attr("shares_storage_with") == "b,tied_b"
