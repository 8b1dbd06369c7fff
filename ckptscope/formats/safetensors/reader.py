"""A single ``.safetensors`` file: an 8-byte length, a JSON header, then raw tensor bytes.

The header is parsed and validated by hand (FORMATS.md §1.1-§1.4) so listing a file costs one
small read and no safetensors/torch import; values are memory-mapped on demand.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptscope.core.dtypes import dtype_by_safetensors
from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo
from ckptscope.core.tensor import Chunk, Encoding, TensorMeta
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.registry import register_reader

MAX_HEADER_SIZE = 100_000_000
"""The reference implementation's cap (safetensors ``tensor.rs``); also our sniffing sanity check."""


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    tensors: dict[str, TensorMeta]
    metadata: dict[str, str]
    data_start: int
    file_size: int
    warnings: tuple[str, ...] = ()
    truncated: tuple[str, ...] = ()
    """Tensors whose bytes run past the end of the file (only with ``allow_truncated``)."""


def sniff_safetensors(path: Path) -> bool:
    """True for ``*.safetensors`` files, or files whose first bytes look like a safetensors header."""
    if not path.is_file():
        return False
    if path.suffix == ".safetensors":
        return True
    try:
        with open(path, "rb") as handle:
            head = handle.read(9)
    except OSError:
        return False
    if len(head) < 9:
        return False
    (length,) = struct.unpack("<Q", head[:8])
    return length < MAX_HEADER_SIZE and head[8:9] == b"{"


def parse_safetensors_header(path: Path, rel_name: str, *, allow_truncated: bool = False) -> SafetensorsHeader:
    """Read and validate the header of one file. Raises ``CkptError`` naming the file and problem.

    With ``allow_truncated`` a file cut short after its header is still described: the tensors
    past its end are listed in ``truncated`` (a shard of a sharded checkpoint, whose other shards
    stay readable) instead of failing the whole checkpoint.
    """
    try:
        with open(path, "rb") as handle:
            file_size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise CkptError(f"not a safetensors file: only {file_size} bytes, too short for a header", path)
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_SIZE:
                raise CkptError(f"not a safetensors file: header length {length} is implausible", path)
            if 8 + length > file_size:
                raise CkptError(
                    f"truncated safetensors file: header needs {8 + length} bytes, file has {file_size}", path
                )
            raw = handle.read(length)
    except OSError as exc:
        raise CkptError(f"cannot read: {exc.strerror or exc}", path) from None
    try:
        header = json.loads(raw.decode("utf-8").rstrip(" \x00"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CkptError(f"bad safetensors header JSON: {exc}", path) from None
    if not isinstance(header, dict):
        raise CkptError("bad safetensors header: the JSON is not an object", path)

    data_start = 8 + length
    data_size = file_size - data_start
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise CkptError("bad safetensors header: __metadata__ is not an object", path)
    tensors: dict[str, TensorMeta] = {}
    spans: list[tuple[int, int, str]] = []
    truncated: list[str] = []
    by_code: dict[str, Any] = {}
    for name, entry in header.items():
        begin, end, meta = _parse_entry(path, name, entry, data_start, rel_name, by_code)
        if end > data_size and allow_truncated:
            truncated.append(name)
        elif end > data_size:
            raise CkptError(
                f"truncated safetensors file: tensor {name!r} ends at byte {data_start + end}, "
                f"file has {file_size}",
                path,
            )
        spans.append((begin, end, name))
        tensors[name] = meta
    warnings = _check_layout(path, spans, data_size)
    if truncated:  # the layout warning would count the missing bytes as negative free space
        end = data_start + max(e for _, e, _ in spans)
        warnings = [f"{path.name}: truncated: the header places data up to byte {end}, the file has {file_size}"]
    return SafetensorsHeader(tensors, {str(k): str(v) for k, v in metadata.items()}, data_start, file_size,
                             tuple(warnings), tuple(truncated))


def _parse_entry(path: Path, name: str, entry: Any, data_start: int, rel_name: str,
                 by_code: dict[str, Any]) -> tuple[int, int, TensorMeta]:
    """One header entry, validated. Runs once per tensor and dominates opening huge headers,
    so dtypes are looked up once per code (``by_code``) and construction is positional."""
    if not isinstance(entry, dict):
        raise CkptError(f"bad safetensors header: entry {name!r} is not an object", path)
    try:
        code = entry["dtype"]
        dtype = by_code.get(code) if isinstance(code, str) else None
        if dtype is None:
            dtype = by_code[code] = dtype_by_safetensors(str(code))
        shape = tuple(map(int, entry["shape"]))
        begin, end = map(int, entry["data_offsets"])
    except CkptError as exc:
        raise CkptError(f"bad safetensors header: tensor {name!r}: {exc.problem}", path) from None
    except (KeyError, TypeError, ValueError):
        raise CkptError(f"bad safetensors header: tensor {name!r} lacks dtype/shape/data_offsets", path) from None
    if (shape and min(shape) < 0) or begin < 0 or end < begin:
        raise CkptError(f"bad safetensors header: tensor {name!r} has negative sizes or offsets", path)
    expected = dtype.nbytes(math.prod(shape))
    if end - begin != expected:
        raise CkptError(
            f"bad safetensors header: tensor {name!r} spans {end - begin} bytes but "
            f"{dtype.name}{list(shape)} needs {expected}",
            path,
        )
    chunk = Chunk((0,) * len(shape), shape, rel_name, data_start + begin, end - begin, Encoding.RAW)
    return begin, end, TensorMeta(name, dtype.name, shape, (chunk,))


def _check_layout(path: Path, spans: list[tuple[int, int, str]], data_size: int) -> list[str]:
    """Overlapping tensors are an error; holes or trailing bytes only a warning (other writers pad)."""
    spans.sort()
    covered = 0
    for (b0, e0, n0), (b1, _e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise CkptError(f"bad safetensors header: tensors {n0!r} and {n1!r} overlap", path)
    for begin, end, _ in spans:
        covered += end - begin
    if covered != data_size:
        return [f"{path.name}: {data_size - covered} bytes of the data buffer belong to no tensor"]
    return []


@register_reader
class SafetensorsFileReader(CheckpointReader):
    """One ``.safetensors`` file."""

    format_name = "safetensors"
    priority = 20

    @classmethod
    def supports(cls, path: Path) -> bool:
        return sniff_safetensors(path)

    def _build_index(self) -> CheckpointIndex:
        header = parse_safetensors_header(self.path, self.path.name)
        index = CheckpointIndex(path=str(self.path), format=self.format_name, tensors=header.tensors)
        if header.metadata:
            index.metadata["__metadata__"] = header.metadata
        index.files.append(FileInfo(self.path.name, header.file_size, "data"))
        index.warnings.extend(header.warnings)
        return index
