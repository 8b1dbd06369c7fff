"""GPT-OSS MXFP4 experts (``*_blocks`` + ``*_scales``): one logical tensor per pair, with the name and
shape of transformers' unquantised parameter, read dequantised bit for bit as transformers'
``integrations.mxfp4`` dequantises it (float32), region by region, and as transformers'
``from_pretrained`` loads a GPT-OSS MXFP4 dir on CPU; convert to bf16 loads back in transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.blockscaled_fixtures import write_gpt_oss_experts, write_gpt_oss_mxfp4_dir
from tests.conftest import run_cli

torch = pytest.importorskip("torch")
mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")

from safetensors.torch import load_file  # noqa: E402

from ckptscope.ops.opening import open_checkpoint  # noqa: E402
from ckptscope.ops.stats import tensor_stats  # noqa: E402

PREFIX = "model.layers.0.mlp.experts."
SYNTHETIC = "model.layers.1.mlp.experts.down_proj"


@pytest.fixture(scope="module")
def experts(tmp_path_factory) -> Path:
    return write_gpt_oss_experts(tmp_path_factory.mktemp("mxfp4"))


def _reference(stored: dict, name: str) -> np.ndarray:
    return mxfp4.convert_moe_packed_tensors(stored[name + "_blocks"], stored[name + "_scales"],
                                            dtype=torch.float32).numpy()


def _bits(array) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)


def test_pairs_become_transformers_parameters(experts):
    index = open_checkpoint(experts).index()
    assert not any(n.endswith(("_blocks", "_scales")) for n in index.tensors)
    gate_up, down = index.tensors[PREFIX + "gate_up_proj"], index.tensors[PREFIX + "down_proj"]
    # GptOssExperts: gate_up_proj [E, hidden, 2 * intermediate], down_proj [E, intermediate, hidden]
    assert (gate_up.dtype, gate_up.shape) == ("float32", (2, 96, 128))
    assert down.shape == (2, 64, 96)
    assert gate_up.quantization["scheme"] == "mxfp4" and gate_up.quantization["block"] == [32]
    assert gate_up.quantization["scale"] == PREFIX + "gate_up_proj_scales"
    assert gate_up.quantization["stored_bytes"] == 2 * 128 * 3 * 17
    assert index.tensors[PREFIX + "gate_up_proj_bias"].quantization is None


def test_dequantised_bitwise_equal_to_transformers(experts):
    stored = load_file(str(experts))
    reader = open_checkpoint(experts)
    for name in (PREFIX + "gate_up_proj", PREFIX + "down_proj", SYNTHETIC):
        ref = _reference(stored, name)
        ours = reader.read(name)
        assert ours.shape == ref.shape and ours.dtype == np.float32
        assert np.array_equal(_bits(ours), _bits(ref)), name
        for box in ((slice(1, 2), slice(20, 70), slice(5, 33)), (slice(0, 2), slice(31, 33)),
                    (slice(0, 1), slice(0, 1), slice(0, 1)), (slice(1, 2), slice(ref.shape[1] - 3, None))):
            assert np.array_equal(_bits(reader.read(name, box)), _bits(ref[box])), (name, box)


def test_synthetic_layer_covers_every_code_and_exponent(experts):
    """Every nibble and every finite exponent, against the OCP formula in float64 rounded once to float32:
    2**-127 scales give float32 subnormals (exact), 6 * 2**127 overflows float32 to inf, as transformers'."""
    stored = load_file(str(experts))
    blocks, scales = stored[SYNTHETIC + "_blocks"], stored[SYNTHETIC + "_scales"]
    assert torch.unique(blocks).numel() == 256 and torch.unique(scales).numel() == 255
    lut = np.array(mxfp4.FP4_VALUES, dtype=np.float64)
    codes = np.stack([blocks.numpy() & 0x0F, blocks.numpy() >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    exact = lut[codes] * np.exp2(scales.numpy().astype(np.float64) - 127)[..., None]
    with np.errstate(over="ignore"):
        expected = exact.astype(np.float32).reshape(2, 64, 288).swapaxes(1, 2)
    values = open_checkpoint(experts).read(SYNTHETIC)
    assert np.array_equal(_bits(values), _bits(expected))
    assert not np.isnan(values).any() and np.isinf(values).any()
    assert np.abs(values[values != 0]).min() == 2.0 ** -128  # 0.5 * 2**-127: a float32 subnormal


def test_quantisation_error_against_the_original(experts):
    """The fixture's quantiser is sane and the logical orientation is transformers': diff against the
    unquantised parameters pairs by name and shape, and differs only by the MXFP4 rounding."""
    result = run_cli("diff", str(experts), str(experts.parent / "original.safetensors"), "--json",
                     "--include", PREFIX + "*_proj")
    assert result.code == 1, result.err
    doc = json.loads(result.out)
    rows = {r["name"]: r for r in doc["tensors"]}
    assert set(rows) == {PREFIX + "gate_up_proj", PREFIX + "down_proj"}
    for row in rows.values():
        assert row["status"] == "different" and row["shape_a"] == row["shape_b"]
        assert row["cosine"] > 0.98 and row["rel_l2"] < 0.2
    assert any("mxfp4" in note for note in doc["notes"])


def test_inspect_json_stats_and_raw_diff(experts):
    result = run_cli("inspect", str(experts), "--json")
    assert result.code == 0, result.err
    entry = next(t for t in json.loads(result.out)["tensors"] if t["name"] == PREFIX + "down_proj")
    assert entry["shape"] == [2, 64, 96]
    assert entry["quantization"]["payload"] == PREFIX + "down_proj_blocks"
    ref = _reference(load_file(str(experts)), PREFIX + "down_proj").astype(np.float64)
    stats = tensor_stats(open_checkpoint(experts), PREFIX + "down_proj", block_elems=500)
    assert (stats.min, stats.max, stats.count) == (ref.min(), ref.max(), ref.size)
    raw = run_cli("diff", str(experts), str(experts), "--json", "--raw")
    assert raw.code == 0, raw.err
    names = {r["name"] for r in json.loads(raw.out)["tensors"]}
    assert PREFIX + "down_proj_blocks" in names and PREFIX + "down_proj_scales" in names


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory) -> Path:
    return write_gpt_oss_mxfp4_dir(tmp_path_factory.mktemp("gptoss") / "mxfp4")


def test_transformers_from_pretrained_agrees(gpt_oss_dir, tmp_path):
    """transformers loads the MXFP4 dir dequantised on CPU (no triton): its float32 experts are ours,
    bit for bit; and our bf16 conversion loads as the same bf16 model transformers makes of it."""
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(gpt_oss_dir, dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    state = model.state_dict()
    reader = open_checkpoint(gpt_oss_dir)
    for proj, shape in (("gate_up_proj", (4, 64, 192)), ("down_proj", (4, 96, 64))):
        name = "model.layers.0.mlp.experts." + proj
        assert reader.meta(name).shape == shape == tuple(state[name].shape)
        assert np.array_equal(_bits(reader.read(name)), _bits(state[name].numpy())), name

    out = tmp_path / "bf16"
    result = run_cli("convert", str(gpt_oss_dir), str(out), "--to", "hf", "--dtype", "bfloat16")
    assert result.code == 0, result.err
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    ours, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    theirs = AutoModelForCausalLM.from_pretrained(gpt_oss_dir, dtype=torch.bfloat16)
    mine, reference = ours.state_dict(), theirs.state_dict()
    assert set(mine) == set(reference)
    for name, value in reference.items():
        assert mine[name].dtype == torch.bfloat16 and torch.equal(mine[name], value), name
