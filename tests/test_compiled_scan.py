"""The compiled safetensors header scan (``_scan.c``, issue 15) reads what the Python parser reads.

It may only hand a header back (None) for the Python parser to read; whatever it accepts must come
out as the Python parser's result, object for object and in order. The headers are the real writers'
(the safetensors library, every sample), hand variants a JSON writer may produce, and seeded random
mutations of them: for each, ``parse_safetensors_header`` runs with and without the scan and must
give the same header or the same error.
"""

from __future__ import annotations

import json
import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from ckptscope.core.errors import CkptError
from ckptscope.formats.safetensors import reader
from ckptscope.formats.safetensors.compiled import PURE_ENV, load_scan
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "sample_ckpts").rglob("*.safetensors"))

built = reader._compiled_scan is not None
needs_scan = pytest.mark.skipif(not built and not os.environ.get("CI"),
                                reason="the compiled scan was not built here (no C compiler at install)")


def test_ci_builds_the_scan():
    """CI installs on a machine with a C compiler: the scan must be there, or the speed is silently lost."""
    if not os.environ.get("CI"):
        pytest.skip("only CI promises a C compiler")
    assert built, "ckptscope.formats.safetensors._scan was not built by `pip install -e .`"


def test_the_pure_python_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv(PURE_ENV, "1")
    assert load_scan() is None


def _outcome(path: Path, compiled: bool, allow_truncated: bool = False):
    saved = reader._compiled_scan
    reader._compiled_scan = saved if compiled else None
    try:
        got = reader.parse_safetensors_header(path, path.name, allow_truncated=allow_truncated)
        return ("ok", got, list(got.tensors), list(got.metadata))
    except CkptError as exc:
        return ("error", str(exc))
    finally:
        reader._compiled_scan = saved


def _scanned(path: Path):
    blob = path.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    return reader._compiled_scan(blob[8:8 + length], 8 + length, path.name)


def _write(path: Path, raw: bytes, data: bytes) -> Path:
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """The safetensors library's own file: every dtype numpy has, a scalar, an empty tensor, rank 9, metadata."""
    path = tmp_path_factory.mktemp("scan") / "w.safetensors"
    arrays = {"a.weight": np.ones((2, 3), np.float32), "b": np.zeros(4, np.float16), "c": np.array(7, np.int64),
              "e": np.zeros((0, 5), np.float32), "m": np.array([True, False]), "u8": np.arange(3, dtype=np.uint8),
              "i16": np.arange(6, dtype=np.int16).reshape(2, 3), "d": np.ones(2, np.float64),
              "deep": np.zeros((1,) * 9, np.int32), "naïve.名前": np.ones(1, np.float32)}
    save_file(arrays, str(path), metadata={"format": "pt", "note": "ünïcode"})
    return path


@needs_scan
@pytest.mark.parametrize("path", SAMPLES + [None], ids=[str(p.relative_to(ROOT)) for p in SAMPLES] + ["written"])
def test_files_the_writers_make_take_the_scan_and_read_the_same(path, written):
    path = path or written
    assert _scanned(path) is not None, "the common header went to the slow path"
    fast, slow = _outcome(path, True), _outcome(path, False)
    assert fast[0] == "ok" and fast == slow
    for a, b in zip(fast[1].tensors.values(), slow[1].tensors.values()):
        assert a == b and hash(a) == hash(b) and type(a.shape[0] if a.shape else 0) is int


def _variants(raw: bytes) -> dict[str, bytes]:
    """Headers a JSON writer may produce for the same tensors, and headers no reader should accept."""
    header = json.loads(raw)
    names = [n for n in header if n != "__metadata__"]
    first = names[0]

    def dumps(value, **kw) -> bytes:  # as the safetensors library writes names: UTF-8, not \u escapes
        return json.dumps(value, ensure_ascii=False, **kw).encode()

    out = {
        "python json.dumps (spaces)": dumps(header),
        "pretty-printed": dumps(header, indent=2),
        "keys reordered": dumps({n: dict(reversed(list(v.items()))) if n != "__metadata__" else v
                                 for n, v in header.items()}),
        "metadata last": dumps({**{n: header[n] for n in names}, "__metadata__": header["__metadata__"]}),
        "no metadata": dumps({n: header[n] for n in names}),
        "metadata null": dumps({"__metadata__": None, **{n: header[n] for n in names}}),
        "metadata empty": dumps({"__metadata__": {}, **{n: header[n] for n in names}}),
        "metadata number": dumps({"__metadata__": {"step": 5}, **{n: header[n] for n in names}}),
        "metadata list": dumps({"__metadata__": [], **{n: header[n] for n in names}}),
        "escaped names": json.dumps(header, ensure_ascii=True).encode(),
        "space padding": raw + b"       ",
        "NUL padding": raw + b"\0\0\0\0",
        "newline then NUL": raw + b"\n\0",
        "NUL then newline": raw + b"\0\n",
        "leading whitespace": b" \n\t" + raw,
        "leading NUL": b"\0" + raw,
        "trailing garbage": raw + b"x",
        "two objects": raw + raw,
        "trailing comma": raw[:-1] + b",}",
        "duplicate tensor": raw[:-1] + b"," + dumps({first: header[first]})[1:],
        "duplicate metadata": raw[:-1] + b',"__metadata__":{"a":"b"}}',
        "extra key in an entry": dumps({**header, first: {**header[first], "extra": 1}}),
        "duplicate key in an entry": raw.replace(b'"dtype":', b'"dtype":"F32","dtype":', 1),
        "float offset": raw.replace(b'"data_offsets":[0,', b'"data_offsets":[0.0,', 1),
        "exponent offset": raw.replace(b'"data_offsets":[0,', b'"data_offsets":[0e0,', 1),
        "negative offset": raw.replace(b'"data_offsets":[0,', b'"data_offsets":[-0,', 1),
        "leading zero": raw.replace(b'"data_offsets":[0,', b'"data_offsets":[00,', 1),
        "true as a size": dumps({**header, first: {**header[first], "shape": [True] * len(header[first]["shape"])}}),
        "huge offset": dumps({**header, first: {**header[first], "data_offsets": [2 ** 60, 2 ** 60]}}),
        "huge shape": dumps({**header, first: {**header[first], "shape": [2 ** 40, 2 ** 40]}}),
        "one offset": dumps({**header, first: {**header[first], "data_offsets": [0]}}),
        "unknown dtype": dumps({**header, first: {**header[first], "dtype": "F99"}}),
        "dtype not a string": dumps({**header, first: {**header[first], "dtype": 32}}),
        "entry a list": dumps({**header, first: [1, 2]}),
        "not an object": b"[]",
        "empty object": b"{}",
        "cut short": raw[: len(raw) // 2],
        "bad UTF-8": raw.replace(first.encode(), b"\xff\xfe", 1),
        "control byte in a name": raw.replace(first.encode(), b"a\x01b", 1),
        "lone surrogate": json.dumps({**{n: header[n] for n in names}, "x\ud800": header[first]}).encode(),
    }
    return out


@needs_scan
def test_variants_and_mutations_read_the_same_either_way(written, tmp_path):
    blob = written.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    raw, data = blob[8:8 + length].rstrip(b" "), blob[8 + length:]
    cases = _variants(raw)
    rng = random.Random(15)
    alphabet = b'{}[],:" 0123456789.-eE\\\x00\ntfnula'
    for i in range(400):  # seeded byte edits of the real header: most break it, some keep it valid
        edit = bytearray(raw)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(edit))
            kind = rng.random()
            if kind < 0.4:
                edit[at] = rng.choice(alphabet)
            elif kind < 0.7:
                del edit[at]
            else:
                edit.insert(at, rng.choice(alphabet))
        cases[f"mutation {i}"] = bytes(edit)
    accepted = []
    for k, (what, header) in enumerate(cases.items()):
        path = _write(tmp_path / f"v{k}.safetensors", header, data)
        for truncated_ok in (False, True):
            fast, slow = _outcome(path, True, truncated_ok), _outcome(path, False, truncated_ok)
            assert fast == slow, what
        if _scanned(path) is not None:
            accepted.append(what)
    # the ordinary spellings do take the fast path: if they stopped doing so, the speed would be lost silently
    for what in ("python json.dumps (spaces)", "pretty-printed", "keys reordered", "metadata last", "no metadata",
                 "metadata empty", "space padding", "NUL padding", "newline then NUL", "leading whitespace"):
        assert what in accepted, what
    assert any(w.startswith("mutation") for w in accepted)  # some still scan (a changed digit, an added space)
    for what in ("escaped names", "trailing garbage", "duplicate tensor", "extra key in an entry", "float offset",
                 "NUL then newline", "metadata number", "bad UTF-8", "lone surrogate"):
        assert what not in accepted, what  # read (or refused) by the Python parser


@needs_scan
def test_layout_problems_found_after_the_scan_are_the_same(written, tmp_path):
    """Out-of-order entries, overlaps, holes and a short file: the checks after the scan see the same facts."""
    blob = written.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    header, data = json.loads(blob[8:8 + length]), blob[8 + length:]
    spans = {n: header[n]["data_offsets"] for n in header if n != "__metadata__"}
    names = sorted((n for n, (b, e) in spans.items() if e > b), key=lambda n: spans[n][0])
    reversed_order = dict(reversed(list(header.items())))
    overlap = json.loads(json.dumps(header))
    b, e = overlap[names[1]]["data_offsets"]
    overlap[names[1]]["data_offsets"] = [b - 2, e - 2]
    cases = {"reversed": (reversed_order, data), "overlap": (overlap, data), "trailing": (header, data + b"\0" * 8),
             "short": (header, data[:-3])}
    for what, (h, d) in cases.items():
        path = _write(tmp_path / f"{what}.safetensors", json.dumps(h, ensure_ascii=False).encode(), d)
        assert _scanned(path) is not None, what
        for truncated_ok in (False, True):
            assert _outcome(path, True, truncated_ok) == _outcome(path, False, truncated_ok), what


def test_inspect_json_is_the_same_with_and_without_the_scan():
    """The CLI, end to end, on the sharded sample and the every-dtype file."""
    for sample in ("hf_llama_sharded", "dtypes.safetensors"):
        path = str(ROOT / "sample_ckpts" / sample)
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", PURE_ENV)}
        fast = run_cli("inspect", "--json", path, env=env)
        slow = run_cli("inspect", "--json", path, env={**env, PURE_ENV: "1"})
        assert fast.code == slow.code == 0 and fast.out == slow.out, (fast.err, slow.err)


def test_version_says_whether_the_scan_is_compiled(monkeypatch):
    """A user who finds a huge header slow can see why: compiled, switched off, or never built."""
    from ckptscope.core import native

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", PURE_ENV)}
    shown = run_cli("--version", env=env)
    assert shown.code == 0 and shown.out.startswith("ckptscope, version")
    assert ("safetensors header scan: compiled" in shown.out) == built, shown.out
    off = run_cli("--version", env={**env, PURE_ENV: "1"})
    assert off.code == 0 and f"safetensors header scan: Python ({PURE_ENV} is set)" in off.out
    monkeypatch.delenv(PURE_ENV, raising=False)
    monkeypatch.setattr(native, "COMPILED_PARTS", {"ckptscope.formats.safetensors._absent": "a part"})
    assert native.compiled_status() == [("a part", "Python (not built: the install found no C compiler or Python "
                                                    "headers; reinstall where it can)")]
