"""The compiled safetensors header scan (``_scan.c``), when the install could build it.

A 100,000-tensor header spent most of ``inspect``'s time in ``json.loads`` and the per-entry loop
(issue 15); the scan reads the common header (plain strings and integers, the three keys per entry)
straight into the same ``TensorMeta`` objects, and returns None for anything else, which the Python
parser then reads (and, where it is bad, reports). ``CKPTSCOPE_PURE_PYTHON=1`` turns it off: the
tests compare both paths, and the bench times one against the other.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ckptscope.core.dtypes import all_dtypes
from ckptscope.core.tensor import Chunk, Encoding, TensorMeta

PURE_ENV = "CKPTSCOPE_PURE_PYTHON"

Scan = Callable[[bytes, int, str], "tuple[dict[str, TensorMeta], dict[str, str] | None, bool, int, int] | None"]


def load_scan() -> Scan | None:
    """``scan(raw_header, data_start, file) -> (tensors, metadata or None, in_order, covered, last_end)``
    or None (then parse in Python); None when the module was not built or ``CKPTSCOPE_PURE_PYTHON`` is set."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        from ckptscope.formats.safetensors import _scan  # type: ignore[attr-defined]
    except ImportError:
        return None
    module: Any = _scan
    module.configure(Chunk, TensorMeta, Encoding.RAW,
                     {d.safetensors: (d.name, d.bits) for d in all_dtypes() if d.safetensors})
    return module.scan
