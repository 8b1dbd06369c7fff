"""A logical tensor is a global shape plus the chunks that store it.

A plain safetensors tensor is one chunk covering everything. A tensor sharded over ranks
(Megatron TP/PP, FSDP, DCP) is several chunks, each at its global offset in its own file. Chunks
say exactly which bytes hold them, so any region can be read without touching the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from ckptscope.core.dtypes import DType, dtype_by_name


STORAGE_TRANSFORMS = "storage_transforms"
"""Attr of a tensor whose DCP items went through storage transforms (``FileSystemWriter(_extensions=...)``):
set by the DCP reader, asked by ``check`` (which then need not import the reader)."""


class Encoding(str, Enum):
    """How a chunk's bytes are laid out in its file."""

    RAW = "raw"
    """C-order, contiguous, little-endian elements starting at ``byte_offset``."""
    STRIDED = "strided"
    """A view into a storage: element strides given by ``Chunk.strides``; ``byte_offset`` is the
    first element of the view (storage start + storage_offset * itemsize)."""
    TORCH_ZIP_ITEM = "torch-zip-item"
    """The byte range is itself a ``torch.save`` zip holding one tensor (DCP ``.distcp`` items)."""
    LOADED = "loaded"
    """Only reachable through a trusted ``torch.load`` (``--trust-pickle``); no byte range."""
    GGUF_QUANT = "gguf-quant"
    """ggml block-quantised data (GGUF ``Q8_0``, ``Q4_K`` ...): ``byte_length`` bytes of fixed-size
    blocks, rows in C order over ``shape``, each row a whole number of blocks. The tensor's dtype is
    what reading gives (float32, dequantised by the GGUF reader); its ``ggml_type`` attr names the type."""
    BLOCK_SCALED = "block-scaled"
    """A low-precision payload plus a tensor of per-block scales, shown as one logical tensor (DeepSeek-V3's
    ``float8_e4m3fn`` ``X.weight`` + ``X.weight_scale_inv``, GPT-OSS's MXFP4 ``X_blocks`` + ``X_scales``).
    The chunk names the payload's bytes; the tensor's dtype is what reading gives (float32, dequantised
    exactly); its ``quant_*`` attrs name the scheme, the block and the stored tensors (``formats.blockscaled``)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One stored piece of a logical tensor."""

    offsets: tuple[int, ...]
    """Global offset of this chunk's first element along each axis."""
    shape: tuple[int, ...]
    """Local shape of the chunk."""
    file: str
    """Path of the file holding the bytes, relative to the checkpoint root."""
    byte_offset: int = 0
    """Absolute offset in ``file`` of the chunk's first element (or of the zip item)."""
    byte_length: int = 0
    """Number of bytes spanned in ``file`` (for strided chunks: up to the last element used)."""
    encoding: Encoding = Encoding.RAW
    strides: tuple[int, ...] | None = None
    """Element strides for ``Encoding.STRIDED``; None means C-contiguous."""
    big_endian: bool = False
    """Set for torch files written on big-endian machines; readers swap bytes."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def byte_range(self) -> tuple[int, int]:
        return (self.byte_offset, self.byte_offset + self.byte_length)


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """A logical tensor: name, dtype and global shape, stored as one or more chunks."""

    name: str
    dtype: str
    """Canonical dtype name (see ``core.dtypes``), e.g. ``"bfloat16"``."""
    shape: tuple[int, ...]
    """Global (logical) shape."""
    chunks: tuple[Chunk, ...] = field(default=())
    attrs: tuple[tuple[str, str], ...] = field(default=())
    """Small format-specific facts shown to users (e.g. ``("shares_storage_with", "a.b")``)."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def dtype_info(self) -> DType:
        return dtype_by_name(self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the logical tensor (not counting replicas or padding on disk); for a block-scaled
        tensor the bytes stored, payload and scales, not the float32 it reads as."""
        if self.attrs and self.attr("quant_scheme") is not None:
            return int(self.attr("stored_bytes") or 0)
        return self.dtype_info.nbytes(self.numel)

    @property
    def files(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for chunk in self.chunks:
            seen.setdefault(chunk.file, None)
        return tuple(seen)

    def attr(self, key: str) -> str | None:
        for k, v in self.attrs:
            if k == key:
                return v
        return None

    @property
    def quantization(self) -> dict[str, object] | None:
        """For a block-scaled tensor (``Encoding.BLOCK_SCALED``): scheme, block, the stored payload
        and scale tensors and their bytes, as ``inspect --json`` shows them; None otherwise."""
        scheme = self.attr("quant_scheme")
        if scheme is None:
            return None
        return {"scheme": scheme, "block": [int(b) for b in (self.attr("quant_block") or "").split("x") if b],
                "payload": self.attr("quant_payload"), "payload_dtype": self.attr("quant_payload_dtype"),
                "scale": self.attr("quant_scale"), "scale_dtype": self.attr("quant_scale_dtype"),
                "stored_bytes": int(self.attr("stored_bytes") or 0)}



def _raw_tensor_maker():
    """``raw_tensor`` with every setter in its closure (cheaper than globals or default arguments)."""
    new = object.__new__
    zeros = tuple((0,) * n for n in range(9))  # shared all-zero offsets: every one-chunk tensor starts at 0
    raw = Encoding.RAW
    c_offsets, c_shape, c_file = Chunk.offsets.__set__, Chunk.shape.__set__, Chunk.file.__set__
    c_begin, c_length, c_encoding = Chunk.byte_offset.__set__, Chunk.byte_length.__set__, Chunk.encoding.__set__
    c_strides, c_big = Chunk.strides.__set__, Chunk.big_endian.__set__
    m_name, m_dtype, m_shape = TensorMeta.name.__set__, TensorMeta.dtype.__set__, TensorMeta.shape.__set__
    m_chunks, m_attrs = TensorMeta.chunks.__set__, TensorMeta.attrs.__set__

    def raw_tensor(name: str, dtype: str, shape: tuple[int, ...], file: str, byte_offset: int,
                   byte_length: int) -> TensorMeta:
        """``TensorMeta(name, dtype, shape, (Chunk((0,) * len(shape), shape, file, byte_offset,
        byte_length),))``, built without the frozen dataclasses' ``__init__``: the same objects (equal,
        hashable, immutable) in a fraction of the time. Readers of headers that list tensors by the
        hundred thousand (safetensors, issue 15) call it once per tensor; elsewhere use the constructors."""
        chunk = new(Chunk)
        rank = len(shape)
        c_offsets(chunk, zeros[rank] if rank < 9 else (0,) * rank)
        c_shape(chunk, shape)
        c_file(chunk, file)
        c_begin(chunk, byte_offset)
        c_length(chunk, byte_length)
        c_encoding(chunk, raw)
        c_strides(chunk, None)
        c_big(chunk, False)
        meta = new(TensorMeta)
        m_name(meta, name)
        m_dtype(meta, dtype)
        m_shape(meta, shape)
        m_chunks(meta, (chunk,))
        m_attrs(meta, ())
        return meta

    return raw_tensor


raw_tensor = _raw_tensor_maker()
