"""The block primitives that diff and timeline spend most of their CPU in, made cheap.

* ``sum_squares``: the float64 sum of squares of a block, in cache-sized pieces: each piece is
  widened to float64 (16-bit and 8-bit floats via float32, where ml_dtypes' casts are fast) and
  dotted with itself by BLAS ``ddot``. For every dtype up to 32 bits each square is exact in
  float64 (a float32 square needs 48 bits of mantissa and twice float32's exponent range, well
  inside float64's), so only the summation rounds.
* ``same_bytes`` / ``memcmp``: are two runs of bytes equal, at ``memcmp`` speed with no temporary
  (``np.array_equal`` builds a boolean array as large as the block first).
* ``single_threaded_blas``: BLAS on one thread while blocks run on our own worker threads. OpenBLAS
  spreads a ``ddot`` over 10k elements across every core; beside our workers that spent 10-50x the
  CPU time on a busy machine, and the sum's rounding depended on the thread count.

All release the GIL for the bulk of their work, so blocks on several threads use several cores.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

PIECE = 1 << 16
"""Elements per piece: a float64 piece is 512 KB and a float32 one 256 KB, inside L2 together."""

_local = threading.local()


def _scratch(dtype: str) -> "np.ndarray":
    import numpy as np

    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {"f4": np.empty(PIECE, np.float32), "f8": np.empty(PIECE, np.float64)}
    return bufs[dtype]


def _narrow_float(values: "np.ndarray") -> bool:
    """A float of at most 16 bits (numpy's float16 or an ml_dtypes bf16 / fp8 type)."""
    dt = values.dtype
    return dt.itemsize <= 2 and (dt.kind == "f" or (dt.kind == "V" and dt.names is None and dt.fields is None
                                                     and dt.type.__module__.startswith("ml_dtypes")))


def is_float(values: "np.ndarray") -> bool:
    """A floating dtype, numpy's own or an ml_dtypes one (bf16, fp8)."""
    return values.dtype.kind == "f" or _narrow_float(values)


def widen(piece: "np.ndarray", out: "np.ndarray") -> "np.ndarray":
    """``piece`` (flat, at most ``PIECE`` elements) as float64 in ``out[:piece.size]``; 8- and 16-bit
    floats via this thread's float32 scratch (exact, and ml_dtypes' casts to float32 are several
    times faster than to float64). Returns the filled part of ``out``."""
    import numpy as np

    out = out[:piece.size]
    if _narrow_float(piece):
        narrow = _scratch("f4")[:piece.size]
        np.copyto(narrow, piece, casting="unsafe")
        np.copyto(out, narrow)
    else:
        np.copyto(out, piece, casting="unsafe")
    return out


def sum_squares(values: "np.ndarray") -> float:
    """``sum(x * x)`` in float64 over every element of ``values`` (NaN / inf propagate). Run it
    inside ``single_threaded_blas`` when several threads call it."""
    import numpy as np

    flat = values.reshape(-1)
    wide = _scratch("f8")
    total = 0.0
    for lo in range(0, flat.size, PIECE):
        out = widen(flat[lo:lo + PIECE], wide)
        total += float(np.dot(out, out))
    return total


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """numpy's BLAS limited to one thread for the duration (see the module docstring). Imports
    numpy: the limit reaches only BLAS libraries already loaded."""
    import numpy  # noqa: F401
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _libc() -> ctypes.CDLL:
    """The C library: the process's own symbols on Linux (``ctypes.util`` would import
    ``subprocess`` and may run ``ldconfig``), looked up by name on macOS."""
    if sys.platform == "darwin":
        from ctypes.util import find_library

        return ctypes.CDLL(find_library("c"))
    return ctypes.CDLL(None)


def _load_memcmp():
    """libc's ``memcmp`` through ctypes (which releases the GIL around the call), or None."""
    try:
        if sys.platform == "win32":
            func = ctypes.cdll.msvcrt.memcmp
        else:
            func = _libc().memcmp
    except (OSError, AttributeError):
        return None
    func.restype = ctypes.c_int
    func.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    return func


_memcmp = _load_memcmp()


def _load_mapping():
    """libc's ``mmap`` and ``munmap`` through ctypes, or None (Windows, or a libc without them)."""
    if sys.platform == "win32":
        return None
    try:
        libc = _libc()
        map_, unmap_ = libc.mmap, libc.munmap
    except (OSError, AttributeError):
        return None
    map_.restype = ctypes.c_void_p
    map_.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64)
    unmap_.restype = ctypes.c_int
    unmap_.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    return map_, unmap_


_mapping = _load_mapping()
_MAP_FAILED = ctypes.c_void_p(-1).value


def map_range(fd: int, offset: int, length: int) -> tuple[int, int, int] | None:
    """Map ``length`` bytes of the open file ``fd`` from ``offset`` read-only; returns (base, mapped
    length, address of ``offset``) for ``memcmp`` and ``unmap_range``, or None where that cannot be
    done (no libc mmap, a zero length, or mmap refused: the caller reads with ``preadv`` instead).

    Why map rather than read: comparing two page-cached files through ``preadv`` copies every byte
    into a buffer first; mapped, ``memcmp`` reads the page cache where it lies (the kernel maps
    whole folios per fault): 2-4x less time for the compare alone, 0.90x for the byte-equal
    tensors of bench row 8 as the whole engine runs them (start-up and scheduling stay). A window is
    unmapped after its compare, so RSS stays at a window per thread. The caller checks the file
    is long enough first: a page past the end of a file raises SIGBUS instead of an error."""
    if _mapping is None or length <= 0:
        return None
    import mmap

    base = offset - offset % mmap.ALLOCATIONGRANULARITY
    size = length + offset - base
    addr = _mapping[0](None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, base)
    if addr is None or addr == _MAP_FAILED:
        return None
    return addr, size, addr + offset - base


def unmap_range(mapped: tuple[int, int, int]) -> None:
    """Undo ``map_range``."""
    assert _mapping is not None
    _mapping[1](mapped[0], mapped[1])


def buffer_address(buffer: bytearray) -> int:
    """Address of a bytearray's first byte, for ``memcmp``; valid while it lives and is not resized."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def memcmp(a: int, b: int, length: int) -> int:
    """libc ``memcmp`` on two addresses (0: equal), the GIL released; a Python compare where libc
    has none. Hot loops call this with addresses looked up once (``buffer_address``)."""
    if _memcmp is not None:
        return _memcmp(a, b, length)
    return 0 if ctypes.string_at(a, length) == ctypes.string_at(b, length) else 1


def same_bytes(a: "np.ndarray", b: "np.ndarray") -> bool:
    """True when ``a`` and ``b`` hold the same bytes (their dtypes may differ; sizes in bytes must
    match for True). Non-contiguous arrays are compared through a contiguous copy."""
    import numpy as np

    if a.nbytes != b.nbytes:
        return False
    if a.nbytes == 0:
        return True
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if _memcmp is not None:
        return _memcmp(a.ctypes.data, b.ctypes.data, a.nbytes) == 0
    return bool(np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)))
