"""FP8 block-scaled weights (DeepSeek-V3 layout: ``float8_e4m3fn`` weight + ``weight_scale_inv`` per
128x128 block): one logical tensor, read dequantised bit for bit as transformers and DeepSeek's
release dequantise it, in inspect, stats, the values pager, diff (dequantised and ``--raw``) and
convert (to bf16, judged by transformers and safetensors; keeping FP8: tests/test_fp8_keep.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.blockscaled_fixtures import write_fp8_llama
from tests.conftest import run_cli

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

from ckptscope.ops.opening import open_checkpoint  # noqa: E402
from ckptscope.ops.stats import tensor_stats  # noqa: E402
from ckptscope.ops.values import parse_selection, read_page  # noqa: E402

DOWN = "model.layers.0.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def fp8_dir(tmp_path_factory) -> Path:
    """Hidden 200, intermediate 300: every projection has partial edge blocks."""
    return write_fp8_llama(tmp_path_factory.mktemp("fp8") / "llama")


@pytest.fixture(scope="module")
def stored(fp8_dir) -> dict:
    return load_file(str(fp8_dir / "model.safetensors"))


def _bits(array) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)


def _deepseek_weight_dequant(x, s, block: int = 128):
    """DeepSeek-V3 ``inference/kernel.py`` ``weight_dequant``: each block's ``x.float() * s`` (masked edges)."""
    y = torch.empty(x.shape, dtype=torch.float32)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            tile = (slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block))
            y[tile] = x[tile].to(torch.float32) * s[i, j]
    return y


def test_logical_tensor_replaces_the_pair(fp8_dir):
    index = open_checkpoint(fp8_dir).index()
    names = set(index.tensors)
    assert not any(n.endswith("_scale_inv") for n in names)
    meta = index.tensors[DOWN]
    assert (meta.dtype, meta.shape) == ("float32", (200, 300))
    assert meta.quantization == {"scheme": "fp8_block", "block": [128, 128], "payload": DOWN,
                                 "payload_dtype": "float8_e4m3fn", "scale": DOWN + "_scale_inv",
                                 "scale_dtype": "float32", "stored_bytes": 200 * 300 + 2 * 3 * 4}
    assert index.tensors["model.norm.weight"].quantization is None


def test_dequantised_bitwise_equal_to_transformers_and_deepseek(fp8_dir, stored):
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    reader = open_checkpoint(fp8_dir)
    quantised = [n for n, t in reader.index().tensors.items() if t.quantization]
    assert len(quantised) == 7
    for name in quantised:
        w, s = stored[name], stored[name + "_scale_inv"]
        ref = _dequantize_fp8_weight(w, s, [128, 128], torch.float32).numpy()
        ours = reader.read(name)
        assert ours.dtype == np.float32
        assert np.array_equal(_bits(ours), _bits(ref)), name
        assert np.array_equal(_bits(ours), _bits(_deepseek_weight_dequant(w, s).numpy())), name
        # regions across block edges and inside the partial edge blocks
        for rows, cols in ((slice(0, 1), slice(0, 1)), (slice(100, 170), slice(120, 260)),
                           (slice(127, 129), slice(127, 129)), (slice(w.shape[0] - 5, None), slice(250, None))):
            assert np.array_equal(_bits(reader.read(name, (rows, cols))), _bits(ref[rows, cols])), (name, rows)


def test_transformers_from_pretrained_agrees_on_whole_blocks(tmp_path):
    """transformers' own FP8 loader (dequantising on CPU) against our read, shapes multiples of 128."""
    from transformers import AutoModelForCausalLM

    path = write_fp8_llama(tmp_path / "llama256", hidden=256, intermediate=384)
    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    reader = open_checkpoint(path)
    state = model.state_dict()
    quantised = [n for n, t in reader.index().tensors.items() if t.quantization]
    assert len(quantised) == 7
    for name in quantised:
        assert np.array_equal(_bits(reader.read(name)), _bits(state[name].numpy())), name


def test_region_reads_touch_only_the_blocks_they_meet(fp8_dir):
    reader = open_checkpoint(fp8_dir)
    reader.index()
    seen = []
    original = reader._read_stored

    def spy(meta, bounds):
        seen.append((meta.name, bounds))
        return original(meta, bounds)

    reader._read_stored = spy
    reader.read(DOWN, (slice(130, 140), slice(5, 20)))
    assert seen == [(DOWN, ((130, 140), (5, 20))), (DOWN + "_scale_inv", ((1, 2), (0, 1)))]


def test_inspect_json_and_human(fp8_dir):
    result = run_cli("inspect", str(fp8_dir), "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    entry = next(t for t in doc["tensors"] if t["name"] == DOWN)
    assert entry["dtype"] == "float32" and entry["shape"] == [200, 300]
    assert entry["nbytes"] == 200 * 300 + 2 * 3 * 4  # stored: fp8 payload + float32 scales
    assert doc["metadata"]["bytes_per_dtype"]["fp8_block"] == sum(
        t["nbytes"] for t in doc["tensors"] if "quantization" in t)
    assert entry["quantization"]["scheme"] == "fp8_block"
    assert entry["quantization"]["block"] == [128, 128]
    assert entry["quantization"]["scale"] == DOWN + "_scale_inv"
    assert not any(t["name"].endswith("_scale_inv") for t in doc["tensors"])
    human = run_cli("inspect", str(fp8_dir))
    assert human.code == 0, human.err
    assert "float8_e4m3fn 128x128 blocks + weight_scale_inv" in human.out


def test_stats_and_values_pager_see_dequantised_values(fp8_dir, stored):
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    ref = _dequantize_fp8_weight(stored[DOWN], stored[DOWN + "_scale_inv"], [128, 128], torch.float32).double()
    reader = open_checkpoint(fp8_dir)
    stats = tensor_stats(reader, DOWN, block_elems=1000)  # many region reads, cutting blocks
    assert stats.count == 60000 and stats.finite == 60000
    assert stats.min == ref.min().item() and stats.max == ref.max().item()
    assert stats.mean == pytest.approx(ref.mean().item(), rel=1e-9, abs=1e-12)
    page = read_page(reader, DOWN, parse_selection("", (200, 300)), row=120, col=125, rows=16, cols=8)
    assert np.array_equal(_bits(page.values), _bits(ref.float().numpy()[120:136, 125:133]))


@pytest.fixture(scope="module")
def requantised(fp8_dir, stored, tmp_path_factory) -> Path:
    """Same values, other bytes: block (0, 0) of down_proj halved in the payload, its scale doubled."""
    out = tmp_path_factory.mktemp("fp8b") / "llama"
    shutil.copytree(fp8_dir, out)
    tensors = dict(stored)
    w, s = tensors[DOWN].float(), tensors[DOWN + "_scale_inv"].clone()
    w[:128, :128] *= 0.5
    s[0, 0] *= 2
    tensors[DOWN], tensors[DOWN + "_scale_inv"] = w.to(torch.float8_e4m3fn), s
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_diff_dequantised_and_raw(fp8_dir, requantised):
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    b = load_file(str(requantised / "model.safetensors"))
    same = _dequantize_fp8_weight(b[DOWN], b[DOWN + "_scale_inv"], [128, 128], torch.float32)
    a = load_file(str(fp8_dir / "model.safetensors"))
    assert torch.equal(same, _dequantize_fp8_weight(a[DOWN], a[DOWN + "_scale_inv"], [128, 128], torch.float32))

    result = run_cli("diff", str(fp8_dir), str(requantised), "--json")
    assert result.code == 0, result.out + result.err
    doc = json.loads(result.out)
    assert any("dequantised" in note for note in doc["notes"])

    raw = run_cli("diff", str(fp8_dir), str(requantised), "--json", "--raw")
    assert raw.code == 1, raw.err
    rows = {r["name"]: r for r in json.loads(raw.out)["tensors"]}
    assert DOWN + "_scale_inv" in rows and len(rows) == 19  # 12 logical + 7 scale tensors, as stored
    assert rows[DOWN]["dtype_a"] == "float8_e4m3fn" and rows[DOWN]["num_diff"] == 128 * 128
    differing = sorted(n for n, r in rows.items() if r["status"] != "equal")
    assert differing == [DOWN, DOWN + "_scale_inv"]


def test_convert_to_bf16_dequantises(fp8_dir, stored, tmp_path):
    from transformers import AutoModelForCausalLM
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    out = tmp_path / "bf16"
    result = run_cli("convert", str(fp8_dir), str(out), "--to", "hf", "--dtype", "bfloat16")
    assert result.code == 0, result.err
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["torch_dtype"] == "bfloat16"
    written = load_file(str(out / "model.safetensors"))
    assert not any(n.endswith("_scale_inv") for n in written)
    for name, value in written.items():
        if name + "_scale_inv" in stored:
            ref = _dequantize_fp8_weight(stored[name], stored[name + "_scale_inv"], [128, 128], torch.float32)
            assert value.dtype == torch.bfloat16 and torch.equal(value, ref.to(torch.bfloat16)), name
        else:
            assert torch.equal(value, stored[name]), name
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert torch.equal(model.state_dict()[DOWN].to(torch.bfloat16), written[DOWN])


def test_convert_keeping_fp8_cuts_no_block(fp8_dir, stored, tmp_path):
    """Without --dtype, HF -> HF keeps the FP8 bytes and scales verbatim; Megatron's qkv interleave would
    cut the 128-row blocks (50-row heads), so that is refused (tests/test_fp8_keep.py covers the rest)."""
    result = run_cli("convert", str(fp8_dir), str(tmp_path / "hf"), "--to", "hf")
    assert result.code == 0, result.err
    written = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert written.keys() == stored.keys()
    assert all(torch.equal(written[n].view(torch.uint8), stored[n].view(torch.uint8)) for n in stored)
    result = run_cli("convert", str(fp8_dir), str(tmp_path / "out"), "--to", "mcore", "--tp", "2")
    assert result.code == 2 and "128-wide FP8 scale block" in result.err and "--dtype bfloat16" in result.err
    assert "Traceback" not in result.err
    assert not (tmp_path / "out").exists()


def test_check_and_rename_work_on_the_stored_tensors(fp8_dir, stored, tmp_path):
    """Storage-level commands see the payload and its scales apart: check covers every byte, and a
    rename carries both (bytes verbatim), so the output still reads as the same logical tensors."""
    checked = run_cli("check", str(fp8_dir))
    assert checked.code == 0 and "19 tensors" in checked.out, checked.out + checked.err
    out = tmp_path / "renamed"
    result = run_cli("rename", str(fp8_dir), str(out), "--sub", r"\.mlp\.", ".feed_forward.")
    assert result.code == 0, result.err
    written = load_file(str(out / "model.safetensors"))
    assert len(written) == len(stored) == 19
    for name, value in stored.items():
        new = name.replace(".mlp.", ".feed_forward.")
        assert written[new].dtype == value.dtype and torch.equal(written[new].view(torch.uint8),
                                                                   value.view(torch.uint8)), name
    renamed = open_checkpoint(out)
    new_down = DOWN.replace(".mlp.", ".feed_forward.")
    assert renamed.meta(new_down).quantization["scale"] == new_down + "_scale_inv"
    assert np.array_equal(_bits(renamed.read(new_down)), _bits(open_checkpoint(fp8_dir).read(DOWN)))


def test_convert_to_mcore_dequantised_loads_in_megatron(fp8_dir, tmp_path):
    """FP8 -> Megatron-Core torch_dist (float32, dequantised) is loaded by megatron-core and gives the
    logits transformers gives for the float32 HF conversion (whose values are checked bit for bit
    against transformers' dequantisation above)."""
    pytest.importorskip("megatron.core")
    from tests.mcore_reference import hf_logits, iteration_dir, mcore_logits_from_dist, tokens_for

    hf32, mcore = tmp_path / "hf32", tmp_path / "mcore"
    for target, args in ((hf32, ["--to", "hf"]), (mcore, ["--to", "mcore", "--tp", "2"])):
        result = run_cli("convert", str(fp8_dir), str(target), *args, "--dtype", "float32")
        assert result.code == 0, result.err
    tokens = tokens_for(260)
    want = hf_logits(hf32, tokens)
    got = mcore_logits_from_dist(iteration_dir(mcore), hf32, tokens)
    assert torch.isfinite(got).all()
    assert (got[..., :260] - want).abs().max().item() <= 1e-5
