"""The ggml tensor types a GGUF file can hold: id, name, block layout, and how ckptscope shows them.

Block sizes and byte sizes follow ``ggml.h`` / ``ggml-common.h`` (gguf-py ``GGML_QUANT_SIZES``;
``tests/test_gguf.py`` checks this table against it). Plain types (one element per "block") are read
as themselves; block-quantised types are shown as float32, the dtype their values dequantise to.
No numpy here: the metadata path imports only the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass

QK_K = 256
"""Elements per K-quant super-block."""


@dataclass(frozen=True, slots=True)
class GGMLType:
    id: int
    name: str
    block_size: int
    """Elements per block (1 for plain types)."""
    type_size: int
    """Bytes per block."""
    dtype: str
    """ckptscope dtype of the values: the element type, or float32 for quantised types."""
    layout: str
    """What one block holds, for users (the ``ggml_block`` attr)."""

    @property
    def quantized(self) -> bool:
        return self.block_size > 1

    @property
    def bits_per_element(self) -> float:
        return 8 * self.type_size / self.block_size

    def nbytes(self, numel: int) -> int:
        return numel // self.block_size * self.type_size

    def describe(self) -> str:
        """``256-element super-blocks of 144 bytes (4.5 bits/element): f16 d, ...``."""
        if not self.quantized:
            return f"plain {self.dtype}, {self.type_size} byte{'s' if self.type_size != 1 else ''} per element"
        kind = "super-blocks" if self.block_size >= QK_K else "blocks"
        return (f"{self.block_size}-element {kind} of {self.type_size} bytes "
                f"({self.bits_per_element:g} bits/element): {self.layout}")


def _t(id_: int, name: str, block: int, size: int, dtype: str = "float32", layout: str = "") -> GGMLType:
    return GGMLType(id_, name, block, size, dtype, layout)


_TABLE: tuple[GGMLType, ...] = (
    _t(0, "F32", 1, 4, "float32"),
    _t(1, "F16", 1, 2, "float16"),
    _t(2, "Q4_0", 32, 18, layout="f16 d, 16 B of 4-bit quants; x = d*(q-8)"),
    _t(3, "Q4_1", 32, 20, layout="f16 d, f16 m, 16 B of 4-bit quants; x = d*q + m"),
    _t(6, "Q5_0", 32, 22, layout="f16 d, 4 B high bits, 16 B low nibbles; x = d*(q-16)"),
    _t(7, "Q5_1", 32, 24, layout="f16 d, f16 m, 4 B high bits, 16 B low nibbles; x = d*q + m"),
    _t(8, "Q8_0", 32, 34, layout="f16 d, 32 int8 quants; x = d*q"),
    _t(9, "Q8_1", 32, 40, layout="scale d, s = d*sum(q), 32 int8 quants (intermediate type)"),
    _t(10, "Q2_K", QK_K, 84, layout="16 B of 4-bit scales/mins for 16 sub-blocks of 16, 64 B of 2-bit quants, "
                                    "f16 d, f16 dmin"),
    _t(11, "Q3_K", QK_K, 110, layout="32 B high-bit mask, 64 B of 2-bit low quants, 12 B of 6-bit scales "
                                     "(16 sub-blocks of 16), f16 d"),
    _t(12, "Q4_K", QK_K, 144, layout="f16 d, f16 dmin, 12 B of 6-bit scales and mins (8 sub-blocks of 32), "
                                     "128 B of 4-bit quants; x = d*sc*q - dmin*m"),
    _t(13, "Q5_K", QK_K, 176, layout="f16 d, f16 dmin, 12 B of 6-bit scales and mins (8 sub-blocks of 32), "
                                     "32 B high bits, 128 B low nibbles; x = d*sc*q - dmin*m"),
    _t(14, "Q6_K", QK_K, 210, layout="128 B low 4 bits, 64 B high 2 bits, 16 int8 scales (16 sub-blocks of 16), "
                                     "f16 d; x = d*sc*(q-32)"),
    _t(15, "Q8_K", QK_K, 292, layout="f32 d, 256 int8 quants, 16 int16 sums of 16 (intermediate type)"),
    _t(16, "IQ2_XXS", QK_K, 66, layout="f16 d, 64 B of grid indices, signs and scales"),
    _t(17, "IQ2_XS", QK_K, 74, layout="f16 d, 64 B of 9-bit grid indices + signs, 8 B scales"),
    _t(18, "IQ3_XXS", QK_K, 98, layout="f16 d, 64 B grid indices, 32 B signs and scales"),
    _t(19, "IQ1_S", QK_K, 50, layout="f16 d, 32 B grid indices, 16 B high bits and scales"),
    _t(20, "IQ4_NL", 32, 18, layout="f16 d, 16 B of 4-bit indices into a non-linear table"),
    _t(21, "IQ3_S", QK_K, 110, layout="f16 d, 64 B grid indices, 8 B high bits, 32 B signs, 4 B scales"),
    _t(22, "IQ2_S", QK_K, 82, layout="f16 d, 64 B grid indices and signs, 8 B high bits, 8 B scales"),
    _t(23, "IQ4_XS", QK_K, 136, layout="f16 d, u16 high scale bits, 4 B low scale bits, 128 B of 4-bit indices"),
    _t(24, "I8", 1, 1, "int8"),
    _t(25, "I16", 1, 2, "int16"),
    _t(26, "I32", 1, 4, "int32"),
    _t(27, "I64", 1, 8, "int64"),
    _t(28, "F64", 1, 8, "float64"),
    _t(29, "IQ1_M", QK_K, 56, layout="32 B grid indices, 16 B high bits, 8 B scales (with the f16 scale)"),
    _t(30, "BF16", 1, 2, "bfloat16"),
    _t(34, "TQ1_0", QK_K, 54, layout="48 B of base-3 packed ternary digits, 4 B more, f16 d"),
    _t(35, "TQ2_0", QK_K, 66, layout="64 B of 2-bit ternary quants, f16 d"),
    _t(39, "MXFP4", 32, 17, layout="e8m0 shared exponent, 16 B of fp4 e2m1 values"),
    _t(40, "NVFP4", 64, 36, layout="4 fp8 e4m3 scales (sub-blocks of 16), 32 B of fp4 e2m1 values"),
    _t(41, "Q1_0", 128, 18, layout="f16 d, 16 B of 1-bit quants"),
)

BY_ID: dict[int, GGMLType] = {t.id: t for t in _TABLE}
BY_NAME: dict[str, GGMLType] = {t.name: t for t in _TABLE}
REMOVED_IDS = {4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
               36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8"}
"""Ids ggml once used and removed (repacked or abandoned types); a file holding one is rejected."""

PLAIN = ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64")
DEQUANTISED = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "TQ1_0", "TQ2_0",
               "IQ4_NL", "IQ4_XS", "MXFP4")
"""Quantised types ckptscope dequantises itself (``dequant.BLOCK_DEQUANT``), exactly as gguf-py does."""
DELEGATED = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "NVFP4")
"""Quantised types whose values come from the optional ``gguf`` package (code book grids ckptscope
does not carry); without it they are listed and refuse to be read."""
READABLE = PLAIN + DEQUANTISED + DELEGATED
"""Types whose values ckptscope reads. The rest (Q8_1, Q8_K: llama.cpp's intermediate types, Q1_0)
are listed with their block layout only."""


def readable_note(name: str) -> str:
    """How a quantised type's values are read, for the ``values`` attr."""
    if name in DEQUANTISED:
        return "dequantised to float32 on read"
    if name in DELEGATED:
        return "dequantised to float32 on read by the optional gguf package (gguf.quants)"
    return f"not readable: ckptscope does not dequantise {name}"


def all_types() -> tuple[GGMLType, ...]:
    return _TABLE
