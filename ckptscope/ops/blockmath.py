"""Two block primitives that diff and timeline spend most of their CPU in, made cheap.

* ``sum_squares``: the float64 sum of squares of a block. Weights of 16 bits or less (bf16, f16,
  fp8) are cast to float32 and squared there, which is exact (a square needs twice the mantissa
  bits: at most 2 x 11 <= 24), then summed with float64 accumulation. That avoids a float64 copy of
  the block, the dominant cost (a fresh 32 MB array faults in more pages than the arithmetic costs).
  Wider dtypes go through float64 in cache-sized pieces. The float32 square can overflow (bf16 spans
  float32's range) or lose bits to underflow (|x| < 2^-63): such sums are redone in float64.
* ``same_bytes``: are two contiguous arrays byte-for-byte equal, at ``memcmp`` speed with no
  temporary (``np.array_equal`` builds a boolean array as large as the block first).

Both release the GIL for the bulk of their work, so blocks on several threads use several cores.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

PIECE = 1 << 16
"""Elements per piece: a float32 piece is 256 KB, a float64 one 512 KB, both inside L2."""
TINY = 2.0 ** -100
"""Below this a float32-squared sum may have lost underflowed terms: redo it in float64."""

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


def sum_squares(values: "np.ndarray") -> float:
    """``sum(x * x)`` in float64 over every element of ``values`` (NaN / inf propagate)."""
    import numpy as np

    flat = values.reshape(-1)
    if flat.size == 0:
        return 0.0
    if _narrow_float(flat):
        total = _narrow_sum_squares(flat)
        if np.isnan(total) or (np.isfinite(total) and total >= TINY):
            return total
        if total == 0.0 and not np.any(flat.view(np.uint8 if flat.dtype.itemsize == 1 else np.uint16)
                                       & (0x7F if flat.dtype.itemsize == 1 else 0x7FFF)):
            return 0.0  # every element is +-0: nothing underflowed
    buf = _scratch("f8")
    total = 0.0
    for lo in range(0, flat.size, PIECE):
        piece = flat[lo:lo + PIECE]
        out = buf[:piece.size]
        np.copyto(out, piece, casting="unsafe")
        total += float(np.einsum("i,i->", out, out))
    return total


def _narrow_sum_squares(flat: "np.ndarray") -> float:
    import numpy as np

    buf = _scratch("f4")
    total = 0.0
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for lo in range(0, flat.size, PIECE):
            piece = flat[lo:lo + PIECE]
            out = buf[:piece.size]
            np.copyto(out, piece, casting="unsafe")
            np.multiply(out, out, out=out)
            total += float(np.add.reduce(out, dtype=np.float64))
    return total


def _load_memcmp():
    """libc's ``memcmp`` through ctypes (which releases the GIL around the call), or None."""
    try:
        if sys.platform == "win32":
            func = ctypes.cdll.msvcrt.memcmp
        else:
            func = ctypes.CDLL(ctypes.util.find_library("c") if sys.platform == "darwin" else None).memcmp
    except (OSError, AttributeError):
        return None
    func.restype = ctypes.c_int
    func.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    return func


_memcmp = _load_memcmp()


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
