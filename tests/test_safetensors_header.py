"""The safetensors header loop (issue 15's fast path) accepts and refuses exactly what it did.

Well-formed files come from safetensors' own writer; the damaged ones are its output with the header
edited by hand (the only way to get a header the writer refuses to produce), each checked for the one
clear error or warning the reader gives. Every test runs twice: with the compiled scan (``_scan.c``,
where it was built) and with the Python parser alone (``CKPTSCOPE_PURE_PYTHON=1``).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from ckptscope.core.errors import CkptError
from ckptscope.core.tensor import Chunk, Encoding, TensorMeta
from ckptscope.formats.safetensors import reader
from ckptscope.formats.safetensors.compiled import PURE_ENV
from ckptscope.formats.safetensors.reader import parse_safetensors_header


@pytest.fixture(autouse=True, params=["compiled", "python"])
def parser(request, monkeypatch) -> str:
    """Both header parsers, in this process and in the CLI's."""
    if request.param == "python":
        monkeypatch.setattr(reader, "_compiled_scan", None)
        monkeypatch.setenv(PURE_ENV, "1")
    elif reader._compiled_scan is None:
        pytest.skip("the compiled scan was not built here (no C compiler at install)")
    return request.param


def _write(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def _header(path: Path) -> tuple[dict, bytes]:
    blob = path.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + length]), blob[8 + length:]


@pytest.fixture
def written(tmp_path) -> Path:
    path = tmp_path / "w.safetensors"
    save_file({"a": np.ones((2, 3), np.float32), "b": np.zeros(4, np.float16), "c": np.array(7, np.int64),
               "e": np.zeros((0, 5), np.float32), "m": np.array([True, False])}, str(path))
    return path


def test_metas_are_the_constructors_objects(written):
    parsed = parse_safetensors_header(written, "w.safetensors")
    header, _ = _header(written)
    start = written.stat().st_size - len(_header(written)[1])
    assert list(parsed.tensors) == [n for n in header if n != "__metadata__"]
    for name, meta in parsed.tensors.items():
        entry = header[name]
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        expected = TensorMeta(name, meta.dtype, shape,
                              (Chunk((0,) * len(shape), shape, "w.safetensors", start + begin, end - begin, Encoding.RAW),))
        assert meta == expected and hash(meta) == hash(expected)
    assert parsed.warnings == () and parsed.truncated == ()


def test_header_order_need_not_be_data_order(written, tmp_path):
    header, data = _header(written)
    reordered = dict(reversed(list(header.items())))
    parsed = parse_safetensors_header(_write(tmp_path / "r.safetensors", reordered, data), "r")
    assert set(parsed.tensors) == set(parse_safetensors_header(written, "w").tensors)
    assert parsed.warnings == ()


@pytest.mark.parametrize("reverse", [False, True])
def test_overlap_is_an_error_in_either_order(written, tmp_path, reverse):
    header, data = _header(written)
    names = [n for n in header if n != "__metadata__" and header[n]["data_offsets"][1] > header[n]["data_offsets"][0]]
    first, second = sorted(names, key=lambda n: header[n]["data_offsets"][0])[:2]
    # the second tensor moved 4 bytes back into the first one (same length, so sizes still agree)
    begin, end = header[second]["data_offsets"]
    header[second]["data_offsets"] = [begin - 4, end - 4]
    if reverse:
        header = dict(reversed(list(header.items())))
    with pytest.raises(CkptError, match="overlap"):
        parse_safetensors_header(_write(tmp_path / "o.safetensors", header, data), "o")


def test_hole_and_trailing_bytes_are_read_but_make_the_file_unloadable(written, tmp_path, cli):
    """Bytes that belong to no tensor: every tensor still reads (a warning), but the safetensors library
    refuses the file ("file not fully covered"), and so does transformers. check said ok (a probe); it is
    an ``unloadable-file`` problem now."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    header, data = _header(written)
    path = _write(tmp_path / "h.safetensors", header, data + b"\0" * 8)
    parsed = parse_safetensors_header(path, "h.safetensors")
    assert parsed.warnings == ("h.safetensors: 8 bytes of the data buffer belong to no tensor",)
    assert parsed.unloadable == parsed.warnings[0]
    with pytest.raises(SafetensorError, match="not fully covered"):
        load_file(str(path))
    result = cli("check", str(path))
    assert result.code == 1 and "unloadable-file: h.safetensors: 8 bytes" in result.out, result.out
    assert cli("check", str(written)).code == 0
    # a gap between two tensors, not at the end: the same
    gap = dict(header)
    names = sorted((n for n in gap if n != "__metadata__"), key=lambda n: gap[n]["data_offsets"][0])
    cut = gap[names[-1]]["data_offsets"][0]
    for name in names[-1:]:
        begin, end = gap[name]["data_offsets"]
        gap[name] = {**gap[name], "data_offsets": [begin + 8, end + 8]}
    gapped = _write(tmp_path / "g.safetensors", gap, data[:cut] + b"\0" * 8 + data[cut:])
    assert parse_safetensors_header(gapped, "g.safetensors").unloadable is not None
    with pytest.raises(SafetensorError):
        load_file(str(gapped))


def test_truncated_file(written, tmp_path):
    header, data = _header(written)
    path = _write(tmp_path / "t.safetensors", header, data[:-4])
    with pytest.raises(CkptError, match="truncated safetensors file: tensor .* ends at byte"):
        parse_safetensors_header(path, "t")
    parsed = parse_safetensors_header(path, "t", allow_truncated=True)
    cut = [n for n in header if n != "__metadata__" and header[n]["data_offsets"][1] > len(data) - 4]
    assert cut and parsed.truncated == tuple(cut)  # in header order
    assert "truncated: the header places data up to byte" in parsed.warnings[0]


@pytest.mark.parametrize("edit, message", [
    (lambda e: e.update(dtype="F99"), "unknown safetensors dtype"),
    (lambda e: e.update(shape=[2, 2]), "spans 24 bytes but float32\\[2, 2\\] needs 16"),
    (lambda e: e.update(shape=[-2, -3]), "negative sizes or offsets"),
    (lambda e: e.pop("data_offsets"), "lacks dtype/shape/data_offsets"),
    (lambda e: e.update(shape="2x3"), "lacks dtype/shape/data_offsets"),
    # the safetensors library refuses non-integer sizes; int() read 2.9 as 2 and "3" as 3 (a probe)
    (lambda e: e.update(shape=[2.9, 3]), "or they are not integers"),
    (lambda e: e.update(shape=["2", 3]), "or they are not integers"),
    (lambda e: e.update(data_offsets=[float(x) for x in e["data_offsets"]]), "or they are not integers"),
])
def test_bad_entries_name_their_problem(written, tmp_path, edit, message):
    header, data = _header(written)
    edit(header["a"])
    with pytest.raises(CkptError, match=message):
        parse_safetensors_header(_write(tmp_path / "b.safetensors", header, data), "b")


def test_an_entry_that_is_not_an_object(written, tmp_path):
    header, data = _header(written)
    header["a"] = [1, 2]
    with pytest.raises(CkptError, match="entry 'a' is not an object"):
        parse_safetensors_header(_write(tmp_path / "n.safetensors", header, data), "n")


@pytest.mark.parametrize("header, said", [
    ('{"a":{"dtype":"F32","shape":[1e400],"data_offsets":[0,4]}}', "not integers"),  # an infinite shape
    ('{"a":{"dtype":"F32","shape":[' + "9" * 5000 + '],"data_offsets":[0,4]}}', "bad safetensors header JSON"),
    ("[" * 200_000 + "]" * 200_000, "bad safetensors header JSON"),  # nesting past the recursion limit
])
def test_hostile_headers_are_bad_headers_not_internal_errors(tmp_path, header, said):
    """These ended in ``internal error: OverflowError / ValueError / RecursionError`` (a fuzz probe)."""
    raw = header.encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 16)
    with pytest.raises(CkptError, match=said):
        parse_safetensors_header(path, path.name)


def test_a_tensor_name_with_a_lone_surrogate_prints_escaped(tmp_path):
    """JSON can spell a lone surrogate (\\ud800) that UTF-8 cannot: the human view ended in a two-line
    internal UnicodeEncodeError; it now prints the name escaped."""
    from tests.conftest import run_cli

    raw = json.dumps({"a\ud800b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    result = run_cli("inspect", str(path))
    assert result.code == 0 and "a\\ud800b" in result.out, result.err


def test_an_hf_model_with_trailing_bytes_converts_whole_with_a_warning(tmp_path, cli):
    """convert reads every tensor from its own byte range, so it writes a whole model from a shard the
    safetensors library refuses, and says what it found; check lists the shard."""
    import shutil

    src = tmp_path / "hf"
    shutil.copytree(Path(__file__).resolve().parents[1] / "sample_ckpts" / "hf_llama_gqa", src)
    with open(src / "model.safetensors", "ab") as handle:
        handle.write(b"junk")
    assert "unloadable-file: model.safetensors" in cli("check", str(src)).out
    result = cli("convert", str(src), str(tmp_path / "back"), "--to", "hf", "--arch", "llama")
    assert result.code == 0 and "4 bytes of the data buffer belong to no tensor" in result.err, result.err
    assert cli("check", str(tmp_path / "back")).code == 0
