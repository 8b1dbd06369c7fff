"""The one dtype table: torch name <-> safetensors code <-> numpy dtype <-> storage class.

Every reader and writer goes through this table so a dtype is spelled one way everywhere
(the torch name without the ``torch.`` prefix, e.g. ``"bfloat16"``). numpy has no native
bfloat16 or float8 types; those map to ``ml_dtypes`` names, resolved lazily so that listing
metadata never imports numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptscope.core.errors import CkptError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np


@dataclass(frozen=True, slots=True)
class DType:
    name: str
    """Canonical name: torch's dtype name without the ``torch.`` prefix (``"bfloat16"``)."""
    bits: int
    """Bits per element; sub-byte types (F4, F6) exist in safetensors."""
    safetensors: str | None
    """Code in a safetensors header (``"BF16"``), or None if safetensors cannot store it."""
    numpy_name: str | None
    """numpy dtype name; ``ml_dtypes.<x>`` for types numpy lacks; None when unreadable as values."""
    storage_class: str | None = None
    """Legacy typed-storage class used in torch pickles (``"BFloat16Storage"``)."""
    is_float: bool = False

    @property
    def itemsize(self) -> int:
        """Bytes per element (rounded up for sub-byte types, which are never sliced)."""
        return (self.bits + 7) // 8

    def nbytes(self, numel: int) -> int:
        return (numel * self.bits + 7) // 8

    def numpy(self) -> "np.dtype":
        """The numpy dtype to view raw little-endian bytes as (imports numpy / ml_dtypes)."""
        import numpy as np

        if self.numpy_name is None:
            raise CkptError(f"dtype {self.name} cannot be read as numbers (sub-byte packing)")
        if self.numpy_name.startswith("ml_dtypes."):
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, self.numpy_name.split(".", 1)[1]))
        return np.dtype(self.numpy_name)


_TABLE: tuple[DType, ...] = (
    DType("float64", 64, "F64", "float64", "DoubleStorage", True),
    DType("float32", 32, "F32", "float32", "FloatStorage", True),
    DType("float16", 16, "F16", "float16", "HalfStorage", True),
    DType("bfloat16", 16, "BF16", "ml_dtypes.bfloat16", "BFloat16Storage", True),
    DType("float8_e4m3fn", 8, "F8_E4M3", "ml_dtypes.float8_e4m3fn", None, True),
    DType("float8_e5m2", 8, "F8_E5M2", "ml_dtypes.float8_e5m2", None, True),
    DType("float8_e4m3fnuz", 8, "F8_E4M3FNUZ", "ml_dtypes.float8_e4m3fnuz", None, True),
    DType("float8_e5m2fnuz", 8, "F8_E5M2FNUZ", "ml_dtypes.float8_e5m2fnuz", None, True),
    DType("float8_e8m0fnu", 8, "F8_E8M0", "ml_dtypes.float8_e8m0fnu", None, True),
    DType("float4_e2m1fn_x2", 8, None, "uint8", None, True),
    DType("float4_e2m1fn", 4, "F4", None, None, True),
    DType("float6_e2m3fn", 6, "F6_E2M3", None, None, True),
    DType("float6_e3m2fn", 6, "F6_E3M2", None, None, True),
    DType("complex128", 128, None, "complex128", "ComplexDoubleStorage", True),
    DType("complex64", 64, "C64", "complex64", "ComplexFloatStorage", True),
    DType("complex32", 32, None, None, None, True),
    DType("int64", 64, "I64", "int64", "LongStorage"),
    DType("int32", 32, "I32", "int32", "IntStorage"),
    DType("int16", 16, "I16", "int16", "ShortStorage"),
    DType("int8", 8, "I8", "int8", "CharStorage"),
    DType("uint64", 64, "U64", "uint64", None),
    DType("uint32", 32, "U32", "uint32", None),
    DType("uint16", 16, "U16", "uint16", None),
    DType("uint8", 8, "U8", "uint8", "ByteStorage"),
    DType("bool", 8, "BOOL", "bool", "BoolStorage"),
)

_BY_NAME = {d.name: d for d in _TABLE}
_BY_SAFETENSORS = {d.safetensors: d for d in _TABLE if d.safetensors}
_BY_STORAGE = {d.storage_class: d for d in _TABLE if d.storage_class}
# Aliases torch accepts for the same dtype (``torch.float`` pickles as ``torch.float32``, but
# hand-written metadata sometimes uses the short names).
_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32",
            "short": "int16", "cfloat": "complex64", "cdouble": "complex128"}


def all_dtypes() -> tuple[DType, ...]:
    return _TABLE


def dtype_by_name(name: str) -> DType:
    """Look up by torch name, with or without the ``torch.`` prefix."""
    found = _BY_NAME.get(name)  # the canonical spelling: every TensorMeta, on every nbytes
    if found is not None:
        return found
    key = name.removeprefix("torch.")
    key = _ALIASES.get(key, key)
    try:
        return _BY_NAME[key]
    except KeyError:
        raise CkptError(f"unknown dtype {name!r}") from None


def dtype_by_safetensors(code: str) -> DType:
    try:
        return _BY_SAFETENSORS[code]
    except KeyError:
        raise CkptError(f"unknown safetensors dtype {code!r}") from None


def dtype_by_storage_class(class_name: str) -> DType:
    """Typed storage class (``FloatStorage``) -> element dtype. ``UntypedStorage`` is bytes."""
    if class_name in ("UntypedStorage", "TypedStorage"):
        return _BY_NAME["uint8"]
    try:
        return _BY_STORAGE[class_name]
    except KeyError:
        raise CkptError(f"unknown torch storage type {class_name!r}") from None
