"""A single ``.safetensors`` file: an 8-byte length, a JSON header, then raw tensor bytes.

The header is parsed and validated by hand (FORMATS.md §1.1-§1.4) so listing a file costs one
small read and no safetensors/torch import; values are memory-mapped on demand. The common header
(plain names and integers) is read by a compiled scan where the install built one (``_scan.c``);
anything else, and every bad header, by the Python parser here.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from operator import index
from pathlib import Path
from typing import Any

from ckptscope.core.dtypes import dtype_by_safetensors
from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo
from ckptscope.core.tensor import TensorMeta, raw_tensor
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.safetensors.compiled import load_scan
from ckptscope.formats.registry import register_reader

MAX_HEADER_SIZE = 100_000_000
"""The reference implementation's cap (safetensors ``tensor.rs``); also our sniffing sanity check."""

_compiled_scan = load_scan()
"""The compiled scan of the common header (``compiled.py``), or None: then every header is parsed here."""


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    tensors: dict[str, TensorMeta]
    metadata: dict[str, str]
    data_start: int
    file_size: int
    warnings: tuple[str, ...] = ()
    truncated: tuple[str, ...] = ()
    """Tensors whose bytes run past the end of the file (only with ``allow_truncated``)."""
    unloadable: str | None = None
    """Why the safetensors library (and so transformers) refuses this file although its tensors read fine:
    data bytes that belong to no tensor (a gap or trailing bytes: "incomplete metadata, file not fully
    covered"). ``note_header`` makes it a ``check`` problem."""


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
    data_start = 8 + length
    data_size = file_size - data_start
    scanned = _compiled_scan(raw, data_start, rel_name) if _compiled_scan is not None else None
    if scanned is not None:  # the common header, read by the compiled scan (_scan.c)
        tensors, metadata, in_order, covered, previous_end = scanned
        metadata = metadata or {}
    else:
        try:
            header = json.loads(raw.decode("utf-8").rstrip(" \x00"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # (ValueError: bad JSON, a 5,000-digit int)
            raise CkptError(f"bad safetensors header JSON: {str(exc)[:200]}", path) from None
        if not isinstance(header, dict):
            raise CkptError("bad safetensors header: the JSON is not an object", path)
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict):
            raise CkptError("bad safetensors header: __metadata__ is not an object", path)
        tensors, in_order, covered, previous_end = _parse_entries(path, header, data_start, rel_name)
    truncated, warnings = _check_extent(path, tensors, in_order, covered, previous_end, data_start, data_size,
                                        allow_truncated)
    unloadable = warnings[0] if warnings and not truncated and UNCOVERED in warnings[0] else None
    return SafetensorsHeader(tensors, {str(k): str(v) for k, v in metadata.items()}, data_start, file_size,
                             tuple(warnings), tuple(truncated), unloadable)


UNCOVERED = "belong to no tensor"


def note_header(index: CheckpointIndex, header: SafetensorsHeader, rel_name: str) -> None:
    """A parsed header's warnings into ``index``; a file the safetensors library would refuse is also an
    ``unloadable-file`` issue for ``check`` (it said ok: transformers then failed on the file). Exports
    are not refused for it: every tensor is read from its own byte range, and the file written is whole."""
    if header.unloadable is not None:
        index.add_issue("unloadable-file", header.unloadable.split(": ", 1)[-1] + ": the safetensors library "
                        "(and so transformers) refuses the file (\"file not fully covered\")", file=rel_name,
                        warning=header.unloadable)
    index.warnings.extend(w for w in header.warnings if w != header.unloadable)


def _parse_entries(path: Path, header: dict[str, Any], data_start: int,
                   rel_name: str) -> tuple[dict[str, TensorMeta], bool, int, int]:
    """Every header entry, validated: the metas by name, whether they lie in header order, the bytes
    they cover and the end of the last one (``_check_extent`` takes it from there).

    This loop runs once per tensor and is most of the time a huge header costs (issue 15), so it
    keeps the well-formed case to a few C-level steps (dtype facts cached per code, ``raw_tensor``)
    and hands anything unusual to ``_parse_entry``, which either accepts it the same way or raises
    the error that names the problem. Writers place tensors in header order, so the layout is checked
    on the fly (each tensor starts at or after the previous end); only a header in another order is
    sorted."""
    # Sizes and offsets must be JSON integers, as the safetensors library requires: ``int`` would have
    # taken 256.7 as 256 and "256" as 256, a file the library refuses read as another (``operator.index``
    # takes ints only, at the same cost).
    tensors: dict[str, TensorMeta] = {}
    by_code: dict[str, Any] = {}
    known: dict[str, tuple[str, int]] = {}  # dtype code -> (canonical name, bits)
    prod = math.prod
    previous_end = 0
    in_order = True
    covered = 0
    for name, entry in header.items():
        try:
            dtype, bits = known[entry["dtype"]]
            shape = tuple(map(index, entry["shape"]))
            begin, end = map(index, entry["data_offsets"])
            if (end - begin != (prod(shape) * bits + 7) // 8 or begin < 0 or end < begin
                    or (shape and min(shape) < 0)):
                raise ValueError
            meta = raw_tensor(name, dtype, shape, rel_name, data_start + begin, end - begin)
        except (KeyError, TypeError, ValueError, OverflowError):
            begin, end, meta = _parse_entry(path, name, entry, data_start, rel_name, by_code)
            known.setdefault(entry["dtype"], (meta.dtype, by_code[entry["dtype"]].bits))
        if begin < previous_end:
            in_order = False
        previous_end = end
        covered += end - begin
        tensors[name] = meta
    return tensors, in_order, covered, previous_end


def _check_extent(path: Path, tensors: dict[str, TensorMeta], in_order: bool, covered: int, previous_end: int,
                  data_start: int, data_size: int, allow_truncated: bool) -> tuple[list[str], list[str]]:
    """The names past the end of the data (only with ``allow_truncated``; otherwise that is an error)
    and the layout warnings (``_check_layout``) of a parsed header."""
    spans = None if in_order else _spans(tensors, data_start)
    if spans is not None:
        _check_layout(path, spans)
    last = previous_end if spans is None else max((e for _, e, _ in spans), default=0)
    truncated: list[str] = []
    if last > data_size:
        file_size = data_start + data_size
        truncated = [n for n, m in tensors.items() if m.chunks[0].byte_offset + m.chunks[0].byte_length > file_size]
        if not allow_truncated:
            name = truncated[0]
            chunk = tensors[name].chunks[0]
            raise CkptError(f"truncated safetensors file: tensor {name!r} ends at byte "
                            f"{chunk.byte_offset + chunk.byte_length}, file has {file_size}", path)
        # the layout warning would count the missing bytes as negative free space
        return truncated, [f"{path.name}: truncated: the header places data up to byte {data_start + last}, "
                           f"the file has {file_size}"]
    if covered != data_size:
        return truncated, [f"{path.name}: {data_size - covered} bytes of the data buffer {UNCOVERED}"]
    return truncated, []


def _spans(tensors: dict[str, TensorMeta], data_start: int) -> list[tuple[int, int, str]]:
    """(begin, end, name) of every tensor, relative to the data buffer."""
    return [(c.byte_offset - data_start, c.byte_offset - data_start + c.byte_length, n)
            for n, m in tensors.items() for c in m.chunks]


def _parse_entry(path: Path, name: str, entry: Any, data_start: int, rel_name: str,
                 by_code: dict[str, Any]) -> tuple[int, int, TensorMeta]:
    """One header entry, validated, the slow and thorough way: the first entry of each dtype, and
    any entry the fast loop in ``_parse_entries`` did not accept (which this reports precisely)."""
    if not isinstance(entry, dict):
        raise CkptError(f"bad safetensors header: entry {name!r} is not an object", path)
    try:
        code = entry["dtype"]
        dtype = by_code.get(code) if isinstance(code, str) else None
        if dtype is None:
            dtype = by_code[code] = dtype_by_safetensors(str(code))
        shape = tuple(map(index, entry["shape"]))
        begin, end = map(index, entry["data_offsets"])
    except CkptError as exc:
        raise CkptError(f"bad safetensors header: tensor {name!r}: {exc.problem}", path) from None
    except (KeyError, TypeError, ValueError, OverflowError):
        raise CkptError(f"bad safetensors header: tensor {name!r} lacks dtype/shape/data_offsets (or they are not "
                        f"integers)", path) from None
    if (shape and min(shape) < 0) or begin < 0 or end < begin:
        raise CkptError(f"bad safetensors header: tensor {name!r} has negative sizes or offsets", path)
    expected = dtype.nbytes(math.prod(shape))
    if end - begin != expected:
        raise CkptError(
            f"bad safetensors header: tensor {name!r} spans {end - begin} bytes but "
            f"{dtype.name}{list(shape)} needs {expected}",
            path,
        )
    return begin, end, raw_tensor(name, dtype.name, shape, rel_name, data_start + begin, end - begin)


def _check_layout(path: Path, spans: list[tuple[int, int, str]]) -> None:
    """Overlapping tensors are an error (holes or trailing bytes only a warning: other writers pad)."""
    spans.sort()
    for (_b0, e0, n0), (b1, _e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise CkptError(f"bad safetensors header: tensors {n0!r} and {n1!r} overlap", path)


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
        note_header(index, header, self.path.name)
        return index
