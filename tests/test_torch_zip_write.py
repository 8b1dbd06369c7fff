"""The torch-free ``torch.save`` container writer: torch loads what it writes, bit for bit."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile

import ml_dtypes
import numpy as np
import pytest
import torch

from ckptscope.core.dtypes import dtype_by_name
from ckptscope.formats import open_checkpoint
from ckptscope.formats.torch_save.zip_container import TorchZipWriter, crc32, tensor_pickle, write_torch_save

ARRAYS = {
    "bfloat16": np.linspace(-3, 3, 24, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(2, 3, 4),
    "float16": np.linspace(-1, 1, 10, dtype=np.float16),
    "float32": np.random.default_rng(0).standard_normal((5, 7), dtype=np.float32),
    "float8_e4m3fn": np.arange(6, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn).reshape(2, 3),
    "int64": np.arange(3, dtype=np.int64),
    "uint16": np.arange(5, dtype=np.uint16),
    "bool": np.array([True, False, True]),
}


def as_torch(array: np.ndarray, name: str) -> torch.Tensor:
    raw = torch.from_numpy(np.ascontiguousarray(array).reshape(-1).view(np.uint8).copy())
    return raw.view(getattr(torch, name)).reshape(array.shape)


def container(array: np.ndarray, name: str, *, prefix: bytes = b"") -> bytes:
    out = io.BytesIO()
    out.write(prefix)
    length = write_torch_save(out.write, tensor_pickle(dtype_by_name(name), array.shape),
                              [("0", np.ascontiguousarray(array).reshape(-1).view(np.uint8), None)])
    raw = out.getvalue()[len(prefix):]
    assert len(raw) == length
    return raw


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_torch_loads_each_dtype_bitwise(name):
    array = ARRAYS[name]
    raw = container(array, name, prefix=b"x" * 13)  # an item in the middle of a .distcp file
    assert zipfile.ZipFile(io.BytesIO(raw)).testzip() is None  # CRCs and sizes check out
    loaded = torch.load(io.BytesIO(raw), weights_only=True)
    expected = as_torch(array, name)
    assert loaded.dtype == expected.dtype and loaded.shape == expected.shape
    assert torch.equal(loaded.view(torch.uint8), expected.view(torch.uint8))


def test_records_are_aligned_and_named_like_torch(tmp_path):
    array = ARRAYS["bfloat16"]
    ours = zipfile.ZipFile(io.BytesIO(container(array, "bfloat16")))
    theirs_buf = io.BytesIO()
    torch.save(as_torch(array, "bfloat16"), theirs_buf)
    theirs = zipfile.ZipFile(io.BytesIO(theirs_buf.getvalue()))
    assert [i.filename for i in ours.infolist()] == [i.filename for i in theirs.infolist()]
    for info in ours.infolist():
        assert info.flag_bits == 0x0808 and info.compress_type == zipfile.ZIP_STORED
    assert ours.read("archive/data.pkl") == theirs.read("archive/data.pkl")  # the same pickle, opcode for opcode
    path = tmp_path / "t.pt"
    path.write_bytes(container(array, "bfloat16"))
    mapped = torch.load(path, mmap=True, weights_only=True)  # mmap needs the 64-byte alignment
    assert torch.equal(mapped.float(), as_torch(array, "bfloat16").float())


def test_zip64_records_load(tmp_path):
    """Records of 4 GiB and more get zip64 sizes; forced here on small data."""
    array = ARRAYS["float32"]
    out = io.BytesIO()
    writer = TorchZipWriter(out.write)
    writer.zip64_from = 100
    writer.record("data.pkl", tensor_pickle(dtype_by_name("float32"), array.shape))
    for name, value in ((".format_version", b"1"), (".storage_alignment", b"64"), ("byteorder", b"little")):
        writer.record(name, value)
    data = array.reshape(-1).view(np.uint8)
    writer.record("data/0", data, crc32(data))
    writer.record("version", b"3\n")
    writer.finish()
    raw = out.getvalue()
    assert zipfile.ZipFile(io.BytesIO(raw)).testzip() is None
    assert torch.equal(torch.load(io.BytesIO(raw), weights_only=True), as_torch(array, "float32"))


def test_ckptscope_reads_it_back(tmp_path):
    path = tmp_path / "t.pt"
    path.write_bytes(container(ARRAYS["bfloat16"], "bfloat16"))
    reader = open_checkpoint(path)
    (meta,) = reader.index().tensors.values()
    assert meta.shape == (2, 3, 4) and meta.dtype == "bfloat16"
    assert np.array_equal(reader.read(meta.name).view(np.uint16), ARRAYS["bfloat16"].view(np.uint16))


def test_writing_never_imports_torch(tmp_path):
    code = (
        "import sys, io\n"
        "from ckptscope.core.dtypes import dtype_by_name\n"
        "from ckptscope.formats.torch_save.zip_container import write_torch_save, tensor_pickle\n"
        "write_torch_save(io.BytesIO().write, tensor_pickle(dtype_by_name('bfloat16'), (2, 2)), [('0', bytes(8), None)])\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
