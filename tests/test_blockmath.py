"""The block primitives of diff and timeline (ops/blockmath.py) and the zero-copy read they use.

``sum_squares`` widens each piece to float64 (narrow floats via float32) and lets BLAS sum the
squares; these tests pin that it equals the exact sum, including where a float32 square would
overflow or underflow, and that NaN and inf propagate.
"""

from __future__ import annotations

import ctypes
import math
import os

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from ckptscope.core.errors import CkptError
from ckptscope.formats.registry import open_checkpoint
from ckptscope.ops.blockmath import PIECE, buffer_address, memcmp, same_bytes, single_threaded_blas, sum_squares

NARROW = [ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]


def _reference(values: np.ndarray) -> float:
    wide = values.astype(np.float64).ravel()
    return math.fsum(float(x) * float(x) for x in wide)


@pytest.mark.parametrize("dtype", NARROW + [np.float32, np.float64, np.int32])
def test_sum_squares_equals_exact_sum(dtype):
    rng = np.random.default_rng(7)
    values = (rng.standard_normal(3 * PIECE + 17) * 4).astype(dtype)
    got, ref = sum_squares(values), _reference(values)
    assert got == pytest.approx(ref, rel=1e-13)


@pytest.mark.parametrize("case, values", [
    ("square overflows float32", [3e30, -2e25, 1.0]),
    ("square underflows float32", [1e-25, -3e-30, 2e-28]),
    ("all zero", [0.0, -0.0, 0.0]),
])
def test_sum_squares_is_exact_where_float32_squares_fail(case, values):
    array = np.array(values, dtype=ml_dtypes.bfloat16)
    got = sum_squares(array)
    assert got == pytest.approx(_reference(array), rel=1e-13, abs=0.0), case
    assert math.isfinite(got)


def test_sum_squares_propagates_nan_and_inf():
    assert math.isnan(sum_squares(np.array([1.0, np.nan], dtype=ml_dtypes.bfloat16)))
    assert sum_squares(np.array([1.0, np.inf], dtype=ml_dtypes.bfloat16)) == math.inf
    assert sum_squares(np.zeros(0, dtype=np.float32)) == 0.0


def test_same_bytes():
    a = np.arange(PIECE * 3, dtype=np.float32)
    b = a.copy()
    assert same_bytes(a, b)
    b[-1] = -b[-1] - 1
    assert not same_bytes(a, b)
    assert not same_bytes(a, a[:-1])
    assert same_bytes(a.view(np.uint32), a)  # bytes, not values, are compared
    assert same_bytes(a.reshape(3, -1)[:, ::2], a.reshape(3, -1)[:, ::2].copy())  # non-contiguous


def test_memcmp_on_buffer_addresses():
    a, b = bytearray(b"\x00" * 4096), bytearray(b"\x00" * 4096)
    assert memcmp(buffer_address(a), buffer_address(b), len(a)) == 0
    b[4095] = 1
    assert memcmp(buffer_address(a), buffer_address(b), len(a)) != 0
    assert memcmp(buffer_address(a), buffer_address(b), 4095) == 0  # only the first length bytes


def test_single_threaded_blas_limits_and_restores():
    import threadpoolctl
    before = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    with single_threaded_blas():
        inside = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
        assert inside and set(inside) == {1}
    after = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    assert after == before


def test_read_mapped_is_a_view_with_the_values_of_read(tmp_path):
    rng = np.random.default_rng(3)
    tensors = {"w": (rng.standard_normal((64, 32))).astype(ml_dtypes.bfloat16),
               "b": rng.standard_normal(32).astype(np.float32)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with open_checkpoint(tmp_path) as reader:
        for name, region in (("w", None), ("w", (slice(8, 20),)), ("b", (slice(3, 9),))):
            view, copy = reader.read_mapped(name, region), reader.read(name, region)
            assert view.dtype == copy.dtype and view.shape == copy.shape
            assert same_bytes(view, copy)
            assert not view.flags.writeable  # a view of the mapped file, not a fresh copy
            assert copy.flags.writeable
        # a region that is not one contiguous run is read (copied) as before
        cols = reader.read_mapped("w", (slice(0, 4), slice(0, 5)))
        np.testing.assert_array_equal(cols.view(np.uint16), tensors["w"][:4, :5].view(np.uint16))


def test_read_mapped_on_a_truncated_file_is_one_clear_error(tmp_path):
    save_file({"w": np.ones((256, 64), np.float32)}, str(tmp_path / "model.safetensors"))
    with open_checkpoint(tmp_path) as reader:
        reader.index()
        path = tmp_path / "model.safetensors"
        path.write_bytes(path.read_bytes()[:-1024])
        with pytest.raises(CkptError, match="truncated"):
            reader.read_mapped("w")


def _two_files(tmp_path, size: int, flip: int | None):
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"\x00" * 3 + data)  # the same bytes at another (unaligned) offset in a
    changed = bytearray(data)
    if flip is not None:
        changed[flip] ^= 0x10
    b.write_bytes(bytes(changed))
    return str(a), str(b)


@pytest.mark.parametrize("flip", [None, 0, 4095, 4096, 5 * (1 << 20) + 17, 6 * (1 << 20) - 1])
@pytest.mark.parametrize("mapped", [True, False])
def test_same_range_finds_any_differing_byte(tmp_path, monkeypatch, flip, mapped):
    """diff's byte-equality test: every byte of the range counts, from unaligned offsets, whether
    the ranges are compared mapped (``map_range``) or read through buffers (where mmap is missing)."""
    import ckptscope.ops.blockio as blockio

    if not mapped:
        monkeypatch.setattr(blockio, "map_range", lambda *args: None)
    path_a, path_b = _two_files(tmp_path, 6 * (1 << 20), flip)
    reader = blockio.ByteReader()
    try:
        assert reader.same_range(path_a, 3, path_b, 0, 6 * (1 << 20)) is (flip is None)
        if flip is not None and flip > 0:  # the bytes before the difference are equal
            assert reader.same_range(path_a, 3, path_b, 0, flip) is True
    finally:
        reader.close()


def test_map_range_gives_the_bytes_of_an_unaligned_range(tmp_path):
    from ckptscope.ops.blockmath import map_range, unmap_range

    path_a, _ = _two_files(tmp_path, 100_000, None)
    data = open(path_a, "rb").read()
    fd = os.open(path_a, os.O_RDONLY)
    try:
        mapped = map_range(fd, 70_001, 20_000)
        if mapped is None:
            pytest.skip("no libc mmap on this platform")
        assert ctypes.string_at(mapped[2], 20_000) == data[70_001:90_001]
        unmap_range(mapped)
        assert map_range(fd, 5, 0) is None  # nothing to map
    finally:
        os.close(fd)


def test_same_range_on_a_file_cut_short_is_one_clear_error(tmp_path):
    """A file truncated after the index was read is the error that names it, never SIGBUS (a mapped
    page past the end of a file kills the process)."""
    from ckptscope.ops.blockio import ByteReader

    path_a, path_b = _two_files(tmp_path, 1 << 20, None)
    with open(path_b, "r+b") as handle:
        handle.truncate(1000)
    reader = ByteReader()
    try:
        with pytest.raises(CkptError, match="truncated"):
            reader.same_range(path_a, 3, path_b, 0, 1 << 20)
    finally:
        reader.close()
