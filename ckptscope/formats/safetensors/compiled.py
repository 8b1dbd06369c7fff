"""The compiled safetensors header scan (``_scan.c``), when the install could build it.

A 100,000-tensor header spent most of ``inspect``'s time in ``json.loads`` and the per-entry loop
(issue 15); the scan reads the common header (plain strings and integers, the three keys per entry)
straight into the same ``TensorMeta`` objects, and returns None for anything else, which the Python
parser then reads (and, where it is bad, reports). ``core.native`` has the switch that turns it off.
"""

from __future__ import annotations

from collections.abc import Callable

from ckptscope.core.dtypes import all_dtypes
from ckptscope.core.native import PURE_ENV, compiled_module
from ckptscope.core.tensor import Chunk, Encoding, TensorMeta

__all__ = ["PURE_ENV", "Scan", "load_scan"]

Scan = Callable[[bytes, int, str], "tuple[dict[str, TensorMeta], dict[str, str] | None, bool, int, int] | None"]


def load_scan() -> Scan | None:
    """``scan(raw_header, data_start, file) -> (tensors, metadata or None, in_order, covered, last_end)``
    or None (then parse in Python); None when the module was not built or ``CKPTSCOPE_PURE_PYTHON`` is set."""
    module = compiled_module("ckptscope.formats.safetensors._scan")
    if module is None:
        return None
    module.configure(Chunk, TensorMeta, Encoding.RAW,
                     {d.safetensors: (d.name, d.bits) for d in all_dtypes() if d.safetensors})
    return module.scan
