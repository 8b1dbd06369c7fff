"""Writing safetensors files: the header of a new file (convert), and a file rewritten with new
tensor names, the data bytes copied verbatim (rename).

Renaming never decodes a tensor. When nothing is dropped, the data buffer is copied as one range
and only the header differs; dropping tensors copies the kept byte ranges back to back (adjacent
ranges are merged into one copy).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ckptscope.core.dtypes import dtype_by_name
from ckptscope.core.errors import CkptError
from ckptscope.formats.filefill import OutputFile
from ckptscope.formats.safetensors.reader import SafetensorsHeader


def new_file_header(tensors: Sequence[tuple[str, str, tuple[int, ...], int]],
                    metadata: Mapping[str, str] | None = None) -> bytes:
    """Header bytes (length prefix included) of a new file holding ``(name, dtype, shape, nbytes)``
    back to back in this order; the data buffer that follows starts 8-byte aligned."""
    header: dict[str, object] = {"__metadata__": dict(metadata if metadata is not None else {"format": "pt"})}
    offset = 0
    for name, dtype, shape, nbytes in tensors:
        code = dtype_by_name(dtype).safetensors
        if code is None:
            raise CkptError(f"{name}: dtype {dtype} cannot be stored in safetensors")
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def renamed_header(header: SafetensorsHeader, new_names: Mapping[str, str]) -> tuple[bytes, list[tuple[int, int]]]:
    """Header bytes (length prefix included) for the kept tensors, and the source byte ranges to copy.

    ``new_names`` maps each kept old name to its new name; tensors absent from it are dropped.
    """
    kept = sorted((meta.chunks[0].byte_offset, old) for old, meta in header.tensors.items() if old in new_names)
    entries: dict[str, object] = {}
    ranges: list[tuple[int, int]] = []
    cursor = 0
    for start, old in kept:
        meta = header.tensors[old]
        length = meta.chunks[0].byte_length
        entries[new_names[old]] = {
            "dtype": dtype_by_name(meta.dtype).safetensors,
            "shape": list(meta.shape),
            "data_offsets": [cursor, cursor + length],
        }
        cursor += length
        if ranges and ranges[-1][0] + ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], ranges[-1][1] + length)
        elif length:
            ranges.append((start, length))
    if header.metadata:
        entries["__metadata__"] = dict(header.metadata)
    raw = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # keep the data buffer 8-byte aligned, as the reference writer does
    return struct.pack("<Q", len(raw)) + raw, ranges


def write_renamed(src: Path, header: SafetensorsHeader, new_names: Mapping[str, str], dst: Path,
                  on_bytes: Callable[[int], None] | None = None) -> int:
    """Write ``dst``; returns the number of data bytes copied. Its size is known from the header,
    so it is an ``OutputFile``: blocks reserved first, then filled by positional writes."""
    prefix, ranges = renamed_header(header, new_names)
    copied = 0
    with OutputFile(dst, len(prefix) + sum(length for _, length in ranges)) as out:
        out.write(0, prefix)
        position = len(prefix)
        for start, length in ranges:
            out.copy(src, start, position, length)
            position += length
            copied += length
            if on_bytes:
                on_bytes(length)
    return copied
