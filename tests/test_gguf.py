"""GGUF (llama.cpp): samples written by gguf-py's own writer, read by ckptscope's lazy reader and
compared with gguf-py's reader and dequantiser (bit for bit)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, load_sample_module, run_cli

gguf = pytest.importorskip("gguf", reason="gguf (gguf-py) is a dev dependency: pip install -e '.[dev]'")

from ckptscope.core.errors import CkptError  # noqa: E402
from ckptscope.ops.opening import open_checkpoint  # noqa: E402

DTYPE_OF = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I8": "int8",
            "I16": "int16", "I32": "int32", "I64": "int64"}
"""Plain ggml types -> ckptscope dtype; quantised types read as float32."""


@pytest.fixture(scope="module")
def gguf_samples(tmp_path_factory) -> dict[str, Path]:
    make = load_sample_module("make_gguf_samples")
    out = tmp_path_factory.mktemp("gguf")
    return {name: writer(out) for name, writer in make.WRITERS.items()}


@pytest.fixture(scope="module")
def tiny(gguf_samples) -> Path:
    return gguf_samples["tiny_llama.gguf"]


def _expected_dtype(qtype) -> str:
    return DTYPE_OF.get(qtype.name, "float32")


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a).astype(np.float32)).view(np.uint32)


# --- listing ------------------------------------------------------------------------------------


def test_inspect_json_lists_every_tensor_like_gguf_py(tiny):
    result = run_cli("inspect", str(tiny), "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["format"] == "gguf"
    ref = gguf.GGUFReader(tiny)
    listed = {t["name"]: t for t in doc["tensors"]}
    assert list(listed) == [t.name for t in ref.tensors]
    types = doc["metadata"]["gguf"]["ggml_types"]
    for t in ref.tensors:
        entry = listed[t.name]
        assert entry["shape"] == list(reversed(t.shape.tolist())), t.name  # numpy order
        assert entry["dtype"] == _expected_dtype(t.tensor_type), t.name
        assert types[t.name] == t.tensor_type.name
    seen = {types[n] for n in types}
    assert {"F32", "F16", "BF16", "Q8_0", "Q4_K", "Q6_K"} <= seen
    assert doc["metadata"]["gguf"]["version"] == 3 and doc["metadata"]["gguf"]["alignment"] == 32
    assert doc["metadata"]["gguf"]["kv"]["llama.block_count"] == 2
    assert doc["metadata"]["model_type"] == "llama"


def test_tensor_attrs_show_dims_and_block_layout(tiny):
    index = open_checkpoint(tiny).index()
    ref = {t.name: t for t in gguf.GGUFReader(tiny).tensors}
    for name, meta in index.tensors.items():
        assert meta.attr("ggml_type") == ref[name].tensor_type.name
        assert meta.attr("ggml_block")
        assert meta.attr("gguf_dims").startswith(str(ref[name].shape.tolist()))
        chunk = meta.chunks[0]
        assert chunk.byte_offset == ref[name].data_offset
        assert chunk.byte_length == ref[name].n_bytes
    q4k = index.tensors["blk.0.attn_q.weight"]
    assert q4k.attr("ggml_block").startswith("256-element super-blocks of 144 bytes (4.5 bits/element)")
    assert q4k.shape == (256, 256) and q4k.attr("stored_bytes") == str(256 * 144)
    assert index.tensors["blk.0.attn_k.weight"].shape == (128, 256)  # GGUF dims [256, 128]
    assert index.tensors["blk.0.ffn_down.weight"].shape == (256, 512)
    assert index.tensors["blk.0.attn_output.weight"].attr("ggml_block").startswith("32-element blocks of 34 bytes")
    assert index.tensors["output.weight"].attr("ggml_block").startswith("256-element super-blocks of 210 bytes")
    assert index.tensors["output_norm.weight"].attr("ggml_block") == "plain float32, 4 bytes per element"


def test_kv_metadata_objects_and_vocab_summary(tiny):
    index = open_checkpoint(tiny).index()
    objects = {o.name: o for o in index.objects}
    assert objects["general.architecture"].value == "llama"
    assert objects["llama.attention.head_count_kv"].value == 2
    assert objects["llama.context_length"].type == "gguf u32"
    tokens = objects["tokenizer.ggml.tokens"]
    assert tokens.type == "gguf array of 256 string"
    assert tokens.value["count"] == 256 and tokens.value["head"][:3] == ["<unk>", "<s>", "</s>"]
    assert len(tokens.value["head"]) < 16  # summarised, not dumped
    assert objects["tokenizer.ggml.scores"].value["count"] == 256
    # every KV gguf-py sees is an object (gguf-py adds its GGUF.* header fields)
    ref_keys = [k for k in gguf.GGUFReader(tiny).fields if not k.startswith("GGUF.")]
    assert [o.name for o in index.objects] == ref_keys


def test_ggml_type_table_matches_gguf_py():
    from ckptscope.formats.gguf.types import BY_ID

    for qtype, (block, size) in gguf.GGML_QUANT_SIZES.items():
        ours = BY_ID[int(qtype)]
        assert (ours.name, ours.block_size, ours.type_size) == (qtype.name, block, size)


def test_check_exits_0(gguf_samples):
    for path in gguf_samples.values():
        result = run_cli("check", str(path))
        assert result.code == 0, result.out + result.err
        assert "ok:" in result.out


def test_gguf_magic_wins_over_the_name(tiny, tmp_path):
    """Detection row 1: the magic, whatever the file is called (even *.safetensors)."""
    odd = tmp_path / "model.safetensors"
    shutil.copy(tiny, odd)
    assert open_checkpoint(odd).index().format == "gguf"
    assert open_checkpoint(tiny).index().format == "gguf"


# --- values -------------------------------------------------------------------------------------


def test_values_equal_gguf_dequantize_bitwise(tiny):
    reader = open_checkpoint(tiny)
    seen = set()
    for t in gguf.GGUFReader(tiny).tensors:
        ref = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type))
        ours = reader.read(t.name)
        assert ours.shape == tuple(reversed(t.shape.tolist())), t.name
        assert str(ours.dtype) == _expected_dtype(t.tensor_type), t.name
        assert np.array_equal(_bits(ours), _bits(ref.reshape(ours.shape))), t.name
        seen.add(t.tensor_type.name)
    assert seen == {"F32", "F16", "BF16", "Q8_0", "Q4_K", "Q6_K"}


def test_dequantisers_on_random_blocks_bitwise():
    """Every bit pattern matters (NaN/inf/subnormal scales, all 6-bit codes): random bytes."""
    from ckptscope.formats.gguf.dequant import BLOCK_DEQUANT

    rng = np.random.default_rng(0)
    for name, (block, size, fn) in BLOCK_DEQUANT.items():
        raw = rng.integers(0, 256, size=(64, size), dtype=np.uint8)
        with np.errstate(all="ignore"):  # random f16 scales include inf and NaN
            ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(64, block)
            ours = fn(raw)
        assert np.array_equal(_bits(ours), _bits(ref)), name


def test_region_reads_touch_only_the_rows_asked_for(tiny):
    reader = open_checkpoint(tiny)
    for name in ("blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.ffn_up.weight", "blk.1.attn_k.weight"):
        full = reader.read(name)
        part = reader.read(name, (slice(3, 17), slice(5, 200)))
        assert np.array_equal(_bits(part), _bits(full[3:17, 5:200])), name
        assert np.array_equal(_bits(reader.read(name, (slice(7, 8),))), _bits(full[7:8])), name


def test_every_quant_type_reads_exactly_as_gguf_py(gguf_samples):
    """all_quants.gguf: one tensor of every other type ckptscope reads (its own dequantisers, and
    the lattice IQ types / NVFP4 through the gguf package), each bit for bit gguf-py's value."""
    from ckptscope.formats.gguf.types import DELEGATED, DEQUANTISED

    path = gguf_samples["all_quants.gguf"]
    reader = open_checkpoint(path)
    seen = set()
    for t in gguf.GGUFReader(path).tensors:
        with np.errstate(all="ignore"):
            ref = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type))
        ours = reader.read(t.name)
        assert ours.dtype == np.float32 and ours.shape == (2, 256), t.name
        assert np.array_equal(_bits(ours), _bits(ref.reshape(ours.shape))), t.name
        assert np.array_equal(_bits(reader.read(t.name, (slice(1, 2),))), _bits(ours[1:2])), t.name
        seen.add(t.tensor_type.name)
    assert seen | {"Q8_0", "Q4_K", "Q6_K"} == set(DEQUANTISED) | set(DELEGATED)
    assert not reader.index().warnings


def test_inspect_shows_every_type_with_its_block_layout(gguf_samples):
    from ckptscope.formats.gguf.types import BY_NAME

    for sample in ("all_quants.gguf", "other_quants.gguf"):
        path = gguf_samples[sample]
        result = run_cli("inspect", str(path))
        assert result.code == 0, result.err
        text = " ".join(result.out.split())
        index = open_checkpoint(path).index()
        for meta in index.tensors.values():
            gtype = BY_NAME[meta.attr("ggml_type")]
            assert meta.attr("ggml_block") == gtype.describe()
            if gtype.quantized:
                head = f"{gtype.block_size}-element {'super-blocks' if gtype.block_size >= 256 else 'blocks'} " \
                       f"of {gtype.type_size} bytes"
                assert f"ggml {gtype.name} 1 tensor" in text and head in text, gtype.name
                assert f"{gtype.name} (" in text  # the tree names each tensor's stored type


def test_unreadable_type_is_listed_and_refuses_values(gguf_samples):
    """Q8_1, Q8_K (llama.cpp's intermediate types) and Q1_0: listed with their layout, no values."""
    path = gguf_samples["other_quants.gguf"]
    result = run_cli("inspect", str(path), "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["metadata"]["gguf"]["ggml_types"]["q8_1.weight"] == "Q8_1"
    assert doc["metadata"]["gguf"]["tensor_types"]["Q8_K"]["block"].startswith("256-element super-blocks of 292 bytes")
    reader = open_checkpoint(path)
    assert reader.read("attn_norm.weight").shape == (64,)
    assert any("Q1_0, Q8_1, Q8_K" in w for w in reader.index().warnings)
    for name, gtype in (("q8_1.weight", "Q8_1"), ("q8_k.weight", "Q8_K"), ("q1_0.weight", "Q1_0")):
        with pytest.raises(CkptError, match=f"ggml type {gtype} is listed but not readable"):
            reader.read(name)
    result = run_cli("diff", str(path), str(path))  # diff reads values
    assert result.code == 2
    assert len(result.err.strip().splitlines()) == 1
    assert "not readable" in result.err, result.err


def test_lattice_types_without_the_gguf_package_refuse_in_one_line(gguf_samples):
    """IQ2_XS etc. need gguf-py's code book grids: without the optional package, one clear line."""
    path = gguf_samples["all_quants.gguf"]
    probe = subprocess.run([sys.executable, "-c", "import sys; sys.modules['gguf'] = None\n"
                            "from ckptscope.core.errors import CkptError\n"
                            "from ckptscope.formats import open_checkpoint\n"
                            f"r = open_checkpoint({str(path)!r})\n"
                            "r.read('q4_0.weight'); r.read('q5_k.weight')\n"
                            "try:\n    r.read('iq2_xs.weight')\n"
                            "except CkptError as e:\n    print(e.problem)\n"],
                           capture_output=True, text=True, cwd=REPO)
    assert probe.returncode == 0, probe.stderr
    assert "iq2_xs.weight: IQ2_XS values need the optional gguf package" in probe.stdout
    assert "pip install 'ckptscope[gguf]'" in probe.stdout


# --- damage -------------------------------------------------------------------------------------


@pytest.mark.parametrize("keep", [3, 10, 100, 3000, -100])
def test_truncated_file_is_one_line_exit_2(tiny, tmp_path, keep):
    data = tiny.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:keep] if keep > 0 else data[:keep])
    for command in ("inspect", "check"):
        result = run_cli(command, str(cut))
        assert result.code == 2, (command, result)
        lines = result.err.strip().splitlines()
        assert len(lines) == 1 and str(cut) in lines[0], lines
        assert "truncated" in lines[0] or "not a GGUF" in lines[0], lines


def test_bad_version_and_garbage(tmp_path):
    v1 = tmp_path / "v1.gguf"
    v1.write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))
    result = run_cli("inspect", str(v1))
    assert result.code == 2 and "version 1" in result.err and len(result.err.strip().splitlines()) == 1
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\x00" * 64)
    result = run_cli("inspect", str(junk))
    assert result.code == 2 and "not a GGUF file" in result.err and len(result.err.strip().splitlines()) == 1


def test_empty_gguf_without_tensors(tmp_path):
    path = tmp_path / "empty.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    index = open_checkpoint(path).index()
    assert len(index) == 0 and index.objects[0].value == "llama"


def test_big_endian_file(tmp_path):
    path = tmp_path / "be.gguf"
    writer = gguf.GGUFWriter(path, "llama", endianess=gguf.GGUFEndian.BIG)
    values = np.arange(24, dtype=np.float32).reshape(4, 6)
    writer.add_tensor("w", values)
    writer.add_tensor("h", values.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = open_checkpoint(path)
    index = reader.index()
    assert index.metadata["gguf"]["big_endian"] and index.tensors["w"].shape == (4, 6)
    assert np.array_equal(reader.read("w"), values)
    assert np.array_equal(reader.read("h"), values.astype(np.float16))


# --- laziness -----------------------------------------------------------------------------------


def test_indexing_imports_no_torch(tiny):
    code = (
        "import sys, json\n"
        "from ckptscope.ops.opening import open_checkpoint\n"
        f"ix = open_checkpoint({str(tiny)!r}).index()\n"
        "print(json.dumps({'n': len(ix.tensors), 'torch': 'torch' in sys.modules,\n"
        "                  'gguf': 'gguf' in sys.modules, 'numpy': 'numpy' in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert json.loads(out) == {"n": 21, "torch": False, "gguf": False, "numpy": False}


def test_cli_inspect_imports_no_torch(tiny):
    code = (
        "import sys\n"
        "from ckptscope.cli import main\n"
        "try:\n"
        f"    main(['inspect', '--json', {str(tiny)!r}])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "bad = [m for m in ('torch', 'gguf') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True)


# --- towards diff against the HF model: names and the Q/K permutation ---------------------------


def _llama_gguf(path: Path, state: dict, qtype: str, n_head: int, n_kv: int) -> Path:
    """An HF Llama state dict written the way convert_hf_to_gguf.py writes it (names, Q/K permuted,
    head counts in the metadata), F32 or quantised by gguf-py (``qtype``) where it is 2-D."""
    from ckptscope.mappings.gguf_names import hf_to_gguf_name, permute_qk, qk_heads

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    for hf_name, values in state.items():
        name = hf_to_gguf_name(hf_name)
        heads = qk_heads(name, n_head, n_kv)
        data = np.ascontiguousarray(permute_qk(values, heads) if heads else values)
        if qtype == "F32" or data.ndim == 1:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, gguf.GGMLQuantizationType[qtype]),
                              raw_dtype=gguf.GGMLQuantizationType[qtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_hf_names_and_qk_permutation_round_trip(tmp_path, make_samples):
    """A transformers Llama written to GGUF the way convert_hf_to_gguf.py writes it (llama.cpp
    names, Q/K permuted), read back by ckptscope: names map back and unpermuting gives HF's
    weights exactly (F32) or within the quantisation error (Q8_0)."""
    from ckptscope.mappings.gguf_names import gguf_to_hf_name, hf_to_gguf_name, qk_heads, unpermute_qk

    cfg = make_samples.TINY_LLAMA
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    state = {k: v.float().numpy() for k, v in make_samples.tiny_llama(dtype="float32").state_dict().items()}
    for hf_name in state:
        name = hf_to_gguf_name(hf_name)
        assert name is not None and gguf_to_hf_name(name) == hf_name, hf_name
    for qtype in ("F32", "Q8_0"):
        path = _llama_gguf(tmp_path / f"hf_{qtype}.gguf", state, qtype, n_head, n_kv)
        reader = open_checkpoint(path)
        assert {gguf_to_hf_name(n) for n in reader.index().tensors} == set(state)
        for name in reader.index().tensors:
            hf = state[gguf_to_hf_name(name)]
            heads = qk_heads(name, n_head, n_kv)
            values = reader.read(name)
            back = unpermute_qk(values, heads) if heads else values
            if heads:
                assert not np.array_equal(values, hf) or qtype != "F32", name  # it really was permuted
            if qtype == "F32" or hf.ndim == 1:
                assert np.array_equal(back, hf), name
            else:
                err = np.abs(back - hf).max() / np.abs(hf).max()
                assert err < 0.01, (name, err)


def test_diff_hf_dir_against_its_gguf_across_naming(tmp_path, make_samples):
    """`ckptscope diff HF_DIR model.gguf`: llama.cpp names paired with HF's and the q/k rope
    permutation undone, so an F32 export is identical; a Q8_0 export differs by its quantisation
    error only (small rel_l2), reported per HF tensor with a note that says so."""
    cfg = make_samples.TINY_LLAMA
    model = make_samples.tiny_llama(dtype="float32")
    hf_dir = tmp_path / "hf"
    model.save_pretrained(hf_dir)
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    exact = _llama_gguf(tmp_path / "f32.gguf", state, "F32", cfg["num_attention_heads"], cfg["num_key_value_heads"])
    result = run_cli("diff", str(hf_dir), str(exact), "--json")
    assert result.code == 0, result.out[-2000:] + result.err
    doc = json.loads(result.out)
    assert doc["mapping"] == "gguf->hf" and doc["summary"]["equal"] == len(state)
    assert any("un-permuted" in note for note in doc["notes"])
    quantised = _llama_gguf(tmp_path / "q8.gguf", state, "Q8_0", cfg["num_attention_heads"],
                            cfg["num_key_value_heads"])
    result = run_cli("diff", str(hf_dir), str(quantised), "--json")
    assert result.code == 1
    doc = json.loads(result.out)
    by_name = {t["name"]: t for t in doc["tensors"]}
    q = by_name["model.layers.0.self_attn.q_proj.weight"]
    assert q["status"] == "different" and 0 < q["rel_l2"] < 0.01
    assert by_name["model.norm.weight"]["status"] == "equal"  # 1-D tensors stay F32
    assert any("quantisation error" in note for note in doc["notes"])
    assert not any(t["status"] in ("only_a", "only_b") for t in doc["tensors"])


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q5_1", "MXFP4"])
def test_diff_reports_quantisation_error_per_tensor(tmp_path, make_samples, qtype):
    """Each quantised pair gets a quant_error record: relative RMS error against the HF side, max
    abs, the bound its type implies; the summary counts the tensors whose difference is quantisation
    error. A GGUF quantised from a different model is flagged beyond it (and listed first)."""
    cfg = make_samples.TINY_LLAMA
    model = make_samples.tiny_llama(dtype="float32")
    hf_dir = tmp_path / "hf"
    model.save_pretrained(hf_dir)
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    path = _llama_gguf(tmp_path / "q.gguf", state, qtype, *heads)
    result = run_cli("diff", str(hf_dir), str(path), "--json")
    assert result.code == 1, result.err
    doc = json.loads(result.out)
    from ckptscope.mappings.gguf_names import hf_to_gguf_name, qk_heads, unpermute_qk

    quantised = [t for t in doc["tensors"] if "quant_error" in t]
    assert len(quantised) == sum(1 for v in state.values() if v.ndim == 2)
    ref = {x.name: x for x in gguf.GGUFReader(path).tensors}
    for t in quantised:
        q = t["quant_error"]
        hf = state[t["name"]].astype(np.float64)
        name = hf_to_gguf_name(t["name"])  # the GGUF side read back by gguf-py, un-permuted here
        values = np.asarray(gguf.quants.dequantize(ref[name].data, ref[name].tensor_type)).reshape(hf.shape)
        n_heads = qk_heads(name, *heads)
        deq = (unpermute_qk(values, n_heads) if n_heads else values).astype(np.float64)
        want = np.linalg.norm(deq - hf) / np.linalg.norm(hf)
        assert (q["side"], q["ggml_type"]) == ("B", qtype)
        assert q["rel_rms"] == pytest.approx(want, rel=1e-6) and q["within"] is True
        assert q["max_abs"] == pytest.approx(np.abs(deq - hf).max(), rel=1e-6)
        assert 0 < q["rel_rms"] <= q["expected_rel_rms"]
    assert doc["summary"]["quantization_error"] == len(quantised) and doc["summary"]["beyond_quantization"] == 0
    assert any("are within the relative RMS error their types imply" in n for n in doc["notes"])

    rng = np.random.default_rng(3)
    q_proj = "model.layers.1.self_attn.q_proj.weight"
    other = dict(state, **{q_proj: state[q_proj] + 0.5 * np.abs(state[q_proj]).mean()
                           * rng.standard_normal(state[q_proj].shape).astype(np.float32)})
    wrong = _llama_gguf(tmp_path / "wrong.gguf", other, qtype, *heads)
    result = run_cli("diff", str(wrong), str(hf_dir), "--json")  # the GGUF on side A this time
    doc = json.loads(result.out)
    by_name = {t["name"]: t["quant_error"] for t in doc["tensors"] if "quant_error" in t}
    assert by_name[q_proj]["side"] == "A" and by_name[q_proj]["within"] is False
    assert sum(not q["within"] for q in by_name.values()) == 1
    assert doc["summary"]["beyond_quantization"] == 1
    assert any(f"1 are NOT (first: {q_proj}" in n for n in doc["notes"])
    text = run_cli("diff", str(wrong), str(hf_dir), "--plain", "--top", "3")
    rows = [line for line in text.out.split("differing tensors")[1].splitlines() if "different" in line]
    assert q_proj in rows[0] and "> " in rows[0]  # what quantisation does not explain comes first
