"""GGUF (llama.cpp / ggml) files, FORMATS.md §9.1: parsed by hand, values read on demand.

Layout: ``GGUF`` magic, u32 version (2 or 3), u64 tensor count, u64 KV count; the KV pairs
(typed values, arrays nestable); the tensor infos (name, dims innermost-first, ggml type, offset
relative to the data section); zero padding to ``general.alignment`` (default 32); the data.

Indexing reads the header only (one memory map, only its first pages touched) and imports neither
numpy nor torch. Shapes are given in numpy/PyTorch order (GGUF dims reversed). Plain types
(F32, F16, BF16, F64, I8..I64) are raw chunks; block-quantised types are ``gguf-quant`` chunks
whose dtype is float32, the dtype they dequantise to (``types.READABLE``: the legacy, K-, ternary,
IQ4 and MXFP4 quants by ckptscope's own code, exactly as gguf-py dequantises them; the lattice IQ
types through the optional gguf package). Every tensor shows its block layout; a type that cannot be
read (Q8_1, Q8_K, Q1_0) refuses with one line.

KV metadata becomes objects (``gguf.<key>``); long arrays (the tokenizer's 100k-entry vocab and
scores) are summarised: count, element type and the first few entries.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo, ObjectEntry
from ckptscope.core.tensor import Chunk, Encoding, TensorMeta
from ckptscope.formats.base import CheckpointReader, starts_with
from ckptscope.formats.gguf.types import BY_ID, READABLE, REMOVED_IDS, GGMLType, readable_note
from ckptscope.formats.registry import register_reader

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
"""``GGML_MAX_DIMS``."""
ARRAY_KEEP = 16
"""Arrays up to this long are kept whole; longer ones are summarised with their first entries."""
ARRAY_HEAD = 8
STRING_KEEP = 256
"""Longer strings (chat templates) are cut in the object view; ``str_len`` keeps the length."""

# value type id -> (name, struct code, size); 8 = string and 9 = array are handled apart
_SCALARS: dict[int, tuple[str, str, int]] = {
    0: ("u8", "B", 1), 1: ("i8", "b", 1), 2: ("u16", "H", 2), 3: ("i16", "h", 2), 4: ("u32", "I", 4),
    5: ("i32", "i", 4), 6: ("f32", "f", 4), 7: ("bool", "?", 1), 10: ("u64", "Q", 8), 11: ("i64", "q", 8),
    12: ("f64", "d", 8),
}
_STRING, _ARRAY = 8, 9
_TYPE_NAMES = {**{k: v[0] for k, v in _SCALARS.items()}, _STRING: "string", _ARRAY: "array"}


def sniff_gguf(path: Path) -> bool:
    """True for files starting with ``GGUF`` (any name), or named ``*.gguf`` (even if damaged, so
    that a cut or garbled file gets GGUF's error instead of "unknown format")."""
    if not path.is_file():
        return False
    return path.suffix == ".gguf" or starts_with(path, MAGIC)


class _Truncated(Exception):
    pass


class _Cursor:
    """Sequential little- or big-endian reads from a buffer; running past its end raises ``_Truncated``."""

    __slots__ = ("buf", "pos", "end", "order")

    def __init__(self, buf: Any, order: str) -> None:
        self.buf, self.pos, self.end, self.order = buf, 0, len(buf), order

    def take(self, code: str, size: int) -> Any:
        if self.pos + size > self.end:
            raise _Truncated
        (value,) = struct.unpack_from(self.order + code, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self) -> int:
        return self.take("I", 4)

    def u64(self) -> int:
        return self.take("Q", 8)

    def string(self) -> str:
        length = self.u64()
        if self.pos + length > self.end:
            raise _Truncated
        raw = bytes(self.buf[self.pos:self.pos + length])
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def skip(self, n: int) -> None:
        if self.pos + n > self.end:
            raise _Truncated
        self.pos += n

    def value(self, vtype: int, where: str) -> Any:
        """One value of type ``vtype``: scalars and strings as Python values, arrays summarised."""
        if vtype in _SCALARS:
            _, code, size = _SCALARS[vtype]
            return self.take(code, size)
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array(where)
        raise CkptError(f"bad GGUF metadata: {where} has unknown value type {vtype}")

    def array(self, where: str) -> Any:
        etype, count = self.u32(), self.u64()
        if etype not in _TYPE_NAMES:
            raise CkptError(f"bad GGUF metadata: {where} is an array of unknown value type {etype}")
        if count <= ARRAY_KEEP:
            return [self.value(etype, where) for _ in range(count)]
        head = [self.value(etype, where) for _ in range(ARRAY_HEAD)]
        if etype in _SCALARS:  # fixed size: jump over the rest
            self.skip((count - ARRAY_HEAD) * _SCALARS[etype][2])
        elif etype == _STRING:
            for _ in range(count - ARRAY_HEAD):
                self.skip(self.u64())
        else:  # nested arrays: walk them (rare: no known key holds a long array of arrays)
            for _ in range(count - ARRAY_HEAD):
                self.array(where)
        return {"__class__": "gguf.array", "type": _TYPE_NAMES[etype], "count": count, "head": head}


def _shown(value: Any) -> Any:
    """Long strings cut for display (a chat template can be 10 KB)."""
    if isinstance(value, str) and len(value) > STRING_KEEP:
        return value[:STRING_KEEP] + f"… ({len(value)} characters)"
    if isinstance(value, list):
        return [_shown(v) for v in value]
    return value


class GGUFHeader:
    """Everything before the tensor data, parsed and validated."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.kv: dict[str, Any] = {}
        self.kv_types: dict[str, str] = {}
        self.tensors: list[tuple[str, tuple[int, ...], GGMLType, int]] = []
        """(name, ggml dims innermost-first, type, offset relative to the data section)."""
        try:
            with open(path, "rb") as handle:
                self.file_size = os.fstat(handle.fileno()).st_size
                if self.file_size < 24:
                    head = handle.read(4)
                    if head != MAGIC:
                        raise CkptError(f"not a GGUF file: it does not start with 'GGUF' ({head!r})", path)
                    raise CkptError(f"truncated GGUF file: {self.file_size} bytes, too short for a header", path)
                with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                    self._parse(buf)
        except OSError as exc:
            raise CkptError(f"cannot read: {exc.strerror or exc}", path) from None

    def _parse(self, buf: Any) -> None:
        path = self.path
        if buf[:4] != MAGIC:
            raise CkptError(f"not a GGUF file: it does not start with 'GGUF' ({bytes(buf[:4])!r})", path)
        (version,) = struct.unpack_from("<I", buf, 4)
        order = "<"
        if version & 0xFFFF == 0 and version:  # written on a big-endian machine (gguf-py's test)
            order = ">"
            (version,) = struct.unpack_from(">I", buf, 4)
        self.big_endian = order == ">"
        self.version = version
        if version == 1:
            raise CkptError("GGUF version 1 (2023, 32-bit counts) is obsolete and not supported; "
                            "convert it with a current llama.cpp", path)
        if version not in (2, 3):
            raise CkptError(f"unsupported GGUF version {version} (ckptscope reads versions 2 and 3)", path)
        cur = _Cursor(buf, order)
        cur.pos = 8
        try:
            n_tensors, n_kv = cur.u64(), cur.u64()
            if n_tensors > self.file_size or n_kv > self.file_size:
                raise CkptError(f"bad GGUF header: {n_tensors} tensors and {n_kv} metadata pairs "
                                f"cannot fit in {self.file_size} bytes", path)
            for _ in range(n_kv):
                key = cur.string()
                vtype = cur.u32()
                try:
                    self.kv[key] = cur.value(vtype, f"key {key!r}")
                except CkptError as exc:
                    raise CkptError(exc.problem, path) from None
                self.kv_types[key] = _TYPE_NAMES.get(vtype, str(vtype))
            for _ in range(n_tensors):
                self.tensors.append(self._tensor_info(cur))
            self.info_end = cur.pos
        except _Truncated:
            raise CkptError(f"truncated GGUF file: the header runs past the end of the file "
                            f"({self.file_size} bytes)", path) from None
        alignment = self.kv.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment % 8:
            raise CkptError(f"bad GGUF header: general.alignment is {alignment!r}, not a positive multiple of 8",
                            path)
        self.alignment = alignment
        self.data_start = -(-self.info_end // alignment) * alignment

    def _tensor_info(self, cur: _Cursor) -> tuple[str, tuple[int, ...], GGMLType, int]:
        path = self.path
        name = cur.string()
        n_dims = cur.u32()
        if n_dims > MAX_DIMS:
            raise CkptError(f"bad GGUF tensor info: {name!r} has {n_dims} dimensions (ggml allows {MAX_DIMS})", path)
        dims = tuple(cur.u64() for _ in range(n_dims))
        type_id = cur.u32()
        offset = cur.u64()
        ggml_type = BY_ID.get(type_id)
        if ggml_type is None:
            known = f" (removed ggml type {REMOVED_IDS[type_id]})" if type_id in REMOVED_IDS else ""
            raise CkptError(f"bad GGUF tensor info: {name!r} has unknown ggml type id {type_id}{known}", path)
        if dims and dims[0] % ggml_type.block_size:
            raise CkptError(f"bad GGUF tensor info: {name!r} rows of {dims[0]} elements are not whole "
                            f"{ggml_type.name} blocks of {ggml_type.block_size}", path)
        return name, dims, ggml_type, offset


def _architecture_summary(kv: dict[str, Any]) -> dict[str, Any]:
    """``general.*`` scalars and the architecture's hyperparameters, for ``index.metadata``."""
    arch = kv.get("general.architecture")
    out: dict[str, Any] = {}
    for key, value in kv.items():
        if isinstance(value, (dict, list)):
            continue
        if key.startswith("general.") or (isinstance(arch, str) and key.startswith(arch + ".")):
            out[key] = _shown(value)
    return out


@register_reader
class GGUFReader(CheckpointReader):
    """One ``.gguf`` file (llama.cpp / ggml)."""

    format_name = "gguf"
    priority = 10

    @classmethod
    def supports(cls, path: Path) -> bool:
        return sniff_gguf(path)

    def _build_index(self) -> CheckpointIndex:
        header = GGUFHeader(self.path)
        rel = self.path.name
        data_size = header.file_size - header.data_start
        tensors: dict[str, TensorMeta] = {}
        per_type: dict[str, dict[str, Any]] = {}
        spans: list[tuple[int, int, str]] = []
        for name, dims, gtype, offset in header.tensors:
            if name in tensors:
                raise CkptError(f"bad GGUF tensor info: {name!r} appears twice", self.path)
            shape = tuple(reversed(dims))
            numel = 1
            for d in dims:
                numel *= d
            nbytes = gtype.nbytes(numel)
            if offset % header.alignment:
                raise CkptError(f"bad GGUF tensor info: {name!r} starts at data offset {offset}, not a multiple "
                                f"of the alignment {header.alignment}", self.path)
            if offset + nbytes > data_size:
                raise CkptError(
                    f"truncated GGUF file: tensor {name!r} ({gtype.name}) ends at byte "
                    f"{header.data_start + offset + nbytes}, the file has {header.file_size}", self.path)
            encoding = Encoding.GGUF_QUANT if gtype.quantized else Encoding.RAW
            chunk = Chunk((0,) * len(shape), shape, rel, header.data_start + offset, nbytes, encoding,
                          big_endian=header.big_endian and not gtype.quantized)
            attrs = (("ggml_type", gtype.name), ("ggml_block", gtype.describe()),
                     ("gguf_dims", f"{list(dims)} (ggml order, innermost first)"),
                     ("gguf_offset", str(offset)))
            if gtype.quantized:
                attrs += (("stored_bytes", str(nbytes)),
                          ("values", readable_note(gtype.name)))
            tensors[name] = TensorMeta(name, gtype.dtype, shape, (chunk,), attrs)
            entry = per_type.setdefault(gtype.name, {"tensors": 0, "bytes": 0, "block": gtype.describe()})
            entry["tensors"] += 1
            entry["bytes"] += nbytes
            spans.append((offset, offset + nbytes, name))
        index = CheckpointIndex(path=str(self.path), format=self.format_name, tensors=tensors)
        index.files.append(FileInfo(rel, header.file_size, "data"))
        arch = header.kv.get("general.architecture")
        index.metadata["gguf"] = {
            "version": header.version, "alignment": header.alignment, "data_offset": header.data_start,
            "big_endian": header.big_endian, "tensor_types": per_type,
            "ggml_types": {name: gtype.name for name, _, gtype, _ in header.tensors},
            "kv": _architecture_summary(header.kv),
        }
        if isinstance(arch, str):
            index.metadata["model_type"] = arch
        for key, value in header.kv.items():
            kind = header.kv_types[key]
            if isinstance(value, dict):  # a summarised long array
                kind = f"array of {value['count']} {value['type']}"
            elif isinstance(value, list):
                kind = f"array of {len(value)}"
            index.objects.append(ObjectEntry(key, f"gguf {kind}", _shown(value)))
        if any(t.quantized for _, _, t, _ in header.tensors):
            if "general.quantization_version" not in header.kv:
                index.warnings.append(f"{rel}: quantised tensors but no general.quantization_version key")
            unreadable = sorted({t.name for _, _, t, _ in header.tensors if t.quantized and t.name not in READABLE})
            if unreadable:
                index.warnings.append(f"{rel}: values of {', '.join(unreadable)} tensors are not readable "
                                      "(llama.cpp's intermediate types; ckptscope lists them only)")
        if "general.architecture" not in header.kv:
            index.warnings.append(f"{rel}: no general.architecture key (required by the GGUF spec)")
        spans.sort()
        for (b0, e0, n0), (b1, _e1, n1) in zip(spans, spans[1:]):
            if b1 < e0:
                raise CkptError(f"bad GGUF tensor info: tensors {n0!r} and {n1!r} overlap", self.path)
        return index

    def _read_chunk(self, meta: TensorMeta, chunk: Chunk, local: tuple[tuple[int, int], ...]) -> "np.ndarray":
        if chunk.encoding is not Encoding.GGUF_QUANT:
            return super()._read_chunk(meta, chunk, local)
        import numpy as np

        type_name = meta.attr("ggml_type") or "?"
        if type_name not in READABLE:
            raise CkptError(f"{meta.name}: ggml type {type_name} is listed but not readable: ckptscope does not "
                            f"dequantise {type_name} ({meta.attr('ggml_block')})", self.path)
        buf = self._buffer(chunk.file)
        if chunk.byte_offset + chunk.byte_length > len(buf):
            raise CkptError(f"{meta.name}: bytes {chunk.byte_offset}-{chunk.byte_offset + chunk.byte_length} lie "
                            f"beyond the end of the file ({len(buf)} bytes); the file is truncated", self.path)
        from ckptscope.formats.gguf.dequant import dequantize_rows

        out_shape = tuple(hi - lo for lo, hi in local)
        if chunk.numel == 0 or not chunk.shape:
            return np.zeros(out_shape, dtype=np.float32)
        row_bytes = chunk.byte_length // (chunk.numel // chunk.shape[-1])
        raw = np.frombuffer(buf, dtype=np.uint8, count=chunk.byte_length, offset=chunk.byte_offset)
        rows = raw.reshape(*chunk.shape[:-1], row_bytes)[tuple(slice(lo, hi) for lo, hi in local[:-1])]
        lo, hi = local[-1]
        try:
            values = dequantize_rows(rows, type_name)
        except CkptError as exc:  # a delegated type without the gguf package
            raise CkptError(f"{meta.name}: {exc.problem}", self.path) from None
        if (lo, hi) != (0, chunk.shape[-1]):
            values = np.ascontiguousarray(values[..., lo:hi])
        return values
