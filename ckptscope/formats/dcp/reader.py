"""PyTorch Distributed Checkpoint (DCP) directories: ``.metadata`` + ``__{rank}_{k}.distcp``.

FORMATS.md §5. This covers FSDP2/DTensor saves, torchtitan ``step-N/`` dirs, accelerate
``pytorch_model_fsdp_0/``, Megatron ``torch_dcp``/``fsdp_dtensor``; Megatron-Core ``torch_dist``
builds on it (``megatron/dist_reader.py``). No process group, GPU or torch import is needed:

* ``.metadata`` is parsed by the safe unpickler (``metadata.py``): global shape, dtype and
  every saved chunk with its file and byte range.
* With the default ``TORCH_SAVE`` serialisation each chunk's byte range is a complete embedded
  ``torch.save`` zip; reading a chunk parses that small zip and memory-maps its raw storage.
* With ``SerializationFormat.SAFETENSORS`` the tensor items of a file form one safetensors blob
  whose start the storage offset points at; its header (at index time, metadata only) turns every
  chunk into a plain raw byte range.
* Non-tensor leaves (``BytesStorageMetadata``) are torch.save'd objects; they are decoded with the
  safe unpickler into browsable objects, never executed.
* ``planner_data`` (flat key -> original nested path) gives the nested names.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from ckptscope.core.dtypes import dtype_by_safetensors
from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo, ObjectEntry
from ckptscope.core.tensor import STORAGE_TRANSFORMS, Chunk, Encoding, TensorMeta
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.dcp.metadata import DcpMetadata, DcpTensor, load_dcp_metadata
from ckptscope.formats.dcp.transforms import OVERHEAD, decode_item, transform_warnings
from ckptscope.formats.pickles.safe import PickleStub, TensorRef, safe_loads, to_plain, type_name
from ckptscope.formats.pickles.torch_file import ZIP_MAGIC, StoragePlacement, read_torch_zip, tensor_meta
from ckptscope.formats.rangeio import RangeIO
from ckptscope.formats.registry import register_reader

METADATA_FILE = ".metadata"
MAX_DECODED_OBJECT = 4 << 20
"""Bytes entries larger than this are listed but not decoded at index time."""
_MAX_ST_HEADER = 100_000_000
_OPTIMIZER_ROOTS = {"optimizer", "optimizers", "optim", "optim_state", "optimizer_state"}
_CHAINED = re.compile(r"chained_\d+")
DATA_SUFFIX = ".distcp"
MEGATRON_MARKER = "metadata.json"
_MEGATRON_COMMON = "common.pt"
_SHARDED_OBJECT_KEY = re.compile(r"/shard_[\d.]+_[\d.]+$")
"""Megatron ShardedObject keys (``rng_state/shard_0.0_1.2``): a DCP dir with them is a torch_dist save."""


def tensor_group(name: str) -> str:
    """``optimizer`` for optimizer state (``optimizer.*``, ``optim.*``, Megatron ``chained_N.optimizer.*``),
    ``model`` for everything else. Lets views and summaries keep the two apart."""
    parts = name.split(".")
    if parts and _CHAINED.fullmatch(parts[0]):
        parts = parts[1:]
    return "optimizer" if parts and parts[0] in _OPTIMIZER_ROOTS else "model"


def group_summary(tensors: dict[str, TensorMeta]) -> dict[str, dict[str, int]]:
    """Tensor count, parameters and bytes per group (``index.metadata["groups"]``)."""
    out: dict[str, dict[str, int]] = {}
    for meta in tensors.values():
        entry = out.setdefault(meta.attr("group") or "model", {"tensors": 0, "params": 0, "bytes": 0})
        entry["tensors"] += 1
        entry["params"] += meta.numel
        entry["bytes"] += meta.nbytes
    return out


def decode_object_bytes(data: bytes, path: Path) -> Any:
    """A DCP bytes item: a torch.save zip (the default planner; Megatron ShardedObjects, which
    are a list of the local objects) or, failing that, a bare pickle. Decoded safely."""
    if data[:4] == ZIP_MAGIC:
        value = read_torch_zip(path, file=io.BytesIO(data)).obj
    else:
        try:
            value = safe_loads(data)
        except Exception as exc:  # not a pickle at all: the bytes are the value
            raise CkptError(f"undecodable object bytes ({type(exc).__name__})", path) from None
    inner = _bytesio_payload(value)
    if inner is not None and inner[:4] == ZIP_MAGIC:
        return decode_object_bytes(inner, path)
    return value


def _bytesio_payload(value: Any) -> bytes | None:
    """The buffer of a pickled ``io.BytesIO``: the default planner torch.saves a BytesIO leaf
    instead of writing it verbatim as Megatron's planner does, so one more level is unwrapped."""
    if isinstance(value, PickleStub) and type(value).qualname() == "_io.BytesIO":
        state = value.state
        if isinstance(state, tuple) and state and isinstance(state[0], bytes):
            return state[0]
    return None


@dataclass(slots=True)
class DcpContents:
    """What ``DcpReader.fill_index`` found, for readers built on it (Megatron torch_dist)."""

    metadata: DcpMetadata
    objects: dict[str, Any]
    """Decoded value of every bytes entry, by displayed name (raw, before ``to_plain``)."""
    serialization: str


def data_files(path: Path, *, first: bool = False) -> list[str]:
    """Names of the ``.distcp`` files directly in ``path``, sorted (just one, unsorted, with ``first``)."""
    found = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.name.endswith(DATA_SUFFIX):
                    found.append(entry.name)
                    if first:
                        break
    except OSError:
        return []
    return sorted(found)


class _Files:
    """Plain file handles used while indexing (the reader's mmaps are off limits under its lock)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._handles: dict[str, IO[bytes] | None] = {}
        self.sizes: dict[str, int | None] = {}

    def size(self, rel: str) -> int | None:
        if rel not in self.sizes:
            try:
                self.sizes[rel] = (self.root / rel).stat().st_size
            except OSError:
                self.sizes[rel] = None
        return self.sizes[rel]

    def read(self, rel: str, offset: int, length: int) -> bytes | None:
        if rel not in self._handles:
            try:
                self._handles[rel] = open(self.root / rel, "rb")
            except OSError:
                self._handles[rel] = None
        handle = self._handles[rel]
        if handle is None:
            return None
        handle.seek(offset)
        return handle.read(length)

    def close(self) -> None:
        for handle in self._handles.values():
            if handle is not None:
                handle.close()


@register_reader
class DcpReader(CheckpointReader):
    """A plain DCP directory (``.metadata`` without Megatron's ``metadata.json``)."""

    format_name = "dcp"
    priority = 90

    def __init__(self, path: Path, *, trust_pickle: bool = False) -> None:
        super().__init__(path, trust_pickle=trust_pickle)
        self._items: dict[tuple[str, int], Chunk] = {}
        self._last_decoded: tuple[tuple[str, int], Chunk, bytes] | None = None
        """(file, offset) of the last item ``_decoded_item`` inflated, its inner chunk and its bytes."""

    @classmethod
    def supports(cls, path: Path) -> bool:
        """A dir with ``.metadata``, or with ``.distcp`` files only: a save that never wrote its
        ``.metadata`` is still recognised, so ``inspect`` and ``check`` can say what is missing."""
        try:
            return path.is_dir() and ((path / METADATA_FILE).is_file() or bool(data_files(path, first=True)))
        except OSError:
            return False

    @classmethod
    def missing_markers(cls, path: Path) -> tuple[str, ...]:
        """``.metadata`` is renamed into place after every rank wrote its data (FORMATS.md §5.1);
        Megatron's ``metadata.json`` comes last of all (§4.1), so a dir holding ``common.pt`` needs it too."""
        missing = [] if (path / METADATA_FILE).is_file() else [METADATA_FILE]
        if (path / _MEGATRON_COMMON).is_file() and not (path / MEGATRON_MARKER).is_file():
            missing.append(MEGATRON_MARKER)
        return tuple(missing)

    def _build_index(self) -> CheckpointIndex:
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        if not (self.path / METADATA_FILE).is_file():
            self.index_without_metadata(index)
            return index
        contents = self.fill_index(index)
        # common.pt or Megatron ShardedObject keys: a torch_dist save whose last file is missing.
        # ``mcore_data`` alone is weaker evidence (other tools reuse Megatron's planner): a warning.
        looks_megatron = (self.path / _MEGATRON_COMMON).is_file() \
            or any(_SHARDED_OBJECT_KEY.search(key) for key in contents.metadata.bytes_entries)
        if "mcore_data" in contents.metadata.extra and not looks_megatron and not (self.path / MEGATRON_MARKER).is_file():
            index.warnings.append(f"{MEGATRON_MARKER} not found but .metadata carries Megatron's mcore_data: "
                                  "if this is a Megatron-Core save, it did not finish")
        if looks_megatron and not (self.path / MEGATRON_MARKER).is_file():
            index.add_issue("missing-marker", "not found: this looks like a Megatron-Core torch_dist save, whose "
                            "metadata.json is written last; the save did not finish (or the file was lost)",
                            file=MEGATRON_MARKER)
        return index

    def index_without_metadata(self, index: CheckpointIndex) -> None:
        """A dir of ``.distcp`` files without ``.metadata``: list the files, record the damage.
        Nothing says which tensors the files hold, so the index has none."""
        found = data_files(self.path)
        for rel in found:
            try:
                index.files.append(FileInfo(rel, (self.path / rel).stat().st_size, "data"))
            except OSError:
                continue
        index.add_issue("missing-marker", f"not found: DCP writes it after all data, so the save did not finish (or "
                        f"the file was lost); the {len(found)} {DATA_SUFFIX} files cannot be indexed without it",
                        file=METADATA_FILE)

    # --- indexing ----------------------------------------------------------------------------

    def fill_index(self, index: CheckpointIndex) -> DcpContents:
        """Add the tensors, objects, files and warnings of this DCP directory to ``index``."""
        meta_path = self.path / METADATA_FILE
        meta = load_dcp_metadata(meta_path)
        index.files.append(FileInfo(METADATA_FILE, meta_path.stat().st_size, "metadata"))
        files = _Files(self.path)
        try:
            names = self._display_names(meta)
            self._check_files(index, meta, files, names)
            serialization = self._sniff_serialization(meta, files)
            for key, tensor in meta.tensors.items():
                index.tensors[names[key]] = self._tensor_meta(index, names[key], tensor, serialization, files)
            objects = self._objects(index, meta, names, files)
        finally:
            files.close()
        index.metadata["dcp"] = {
            "version": meta.version,
            "serialization": serialization,
            "planner_data": meta.planner_data is not None,
            "chunks": sum(len(t.chunks) for t in meta.tensors.values()),
            **meta.storage_meta,
        }
        if serialization == "safetensors":
            index.metadata["dcp"]["note"] = (
                "written with SerializationFormat.SAFETENSORS: each .distcp holds a safetensors blob; "
                "torch's plain FileSystemReader cannot load it")
        index.metadata["groups"] = group_summary(index.tensors)
        return DcpContents(meta, objects, serialization)

    def _check_files(self, index: CheckpointIndex, meta: DcpMetadata, files: _Files, names: dict[str, str]) -> None:
        """Missing or short data files are issues (and warnings): everything else stays browsable."""
        needed: dict[str, int] = {}
        entries: dict[str, list[tuple[str, int]]] = {}
        """file -> (display name, end byte) of every item stored in it."""
        items = [(key, c.storage) for key, t in meta.tensors.items() for c in t.chunks if c.storage is not None]
        items += [(key, s) for key, s in meta.bytes_entries.items() if s is not None]
        for key, info in items:
            end = info.offset + info.length
            needed[info.file] = max(needed.get(info.file, 0), end)
            entries.setdefault(info.file, []).append((names[key], end))
        on_disk = data_files(self.path)
        for rel in sorted(set(needed) | set(on_disk)):
            size = files.size(rel)
            held = entries.get(rel, [])
            if size is None:
                index.add_issue("missing-file", "referenced by .metadata but missing; its chunks cannot be read",
                                file=rel, tensors=tuple(dict.fromkeys(n for n, _ in held)))
                continue
            index.files.append(FileInfo(rel, size, "data"))
            if rel in needed and size < needed[rel]:
                detail = f".metadata places data up to byte {needed[rel]}, the file has {size}"
                index.add_issue("truncated", detail, file=rel, warning=f"{rel}: truncated: {detail}",
                                tensors=tuple(dict.fromkeys(n for n, end in held if end > size)))
        chains = {", ".join(info.transforms) for _, info in items if info.transforms}
        if chains:
            index.warnings.extend(transform_warnings(chains))

    def _sniff_serialization(self, meta: DcpMetadata, files: _Files) -> str:
        """``torch_save`` (every item is an embedded zip) or ``safetensors`` (FORMATS.md §5.4)."""
        for tensor in meta.tensors.values():
            for chunk in tensor.chunks:
                info = chunk.storage
                if info is None or not info.length:
                    continue
                head = files.read(info.file, info.offset, 9)
                if not head:
                    continue
                if head[:4] == ZIP_MAGIC:
                    return "torch_save"
                if len(head) == 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] < _MAX_ST_HEADER:
                    return "safetensors"
                return "unknown"
        return "torch_save"

    @staticmethod
    def _display_names(meta: DcpMetadata) -> dict[str, str]:
        """Dotted names from ``planner_data``'s nested paths, when present and unambiguous."""
        keys = list(meta.tensors) + list(meta.bytes_entries)
        planner = meta.planner_data or {}
        names = {key: ".".join(planner[key]) if planner.get(key) else key for key in keys}
        if len(set(names.values())) != len(names):
            return {key: key for key in keys}
        return names

    def _tensor_meta(self, index: CheckpointIndex, name: str, tensor: DcpTensor, serialization: str,
                     files: _Files) -> TensorMeta:
        chunks = []
        for chunk in tensor.chunks:
            info = chunk.storage
            if info is None:
                index.warnings.append(f"{name}: a chunk at {list(chunk.offsets)} has no storage entry")
                continue
            base = Chunk(offsets=chunk.offsets, shape=chunk.sizes, file=info.file, byte_offset=info.offset,
                         byte_length=info.length, encoding=Encoding.TORCH_ZIP_ITEM)
            if serialization == "safetensors":
                base = self._safetensors_chunk(index, name, tensor, base, files)
            chunks.append(base)
        attrs: tuple[tuple[str, str], ...] = (("group", tensor_group(name)),)
        if name != tensor.key:
            attrs += (("dcp_key", tensor.key),)
        transforms = sorted({t for c in tensor.chunks if c.storage is not None for t in c.storage.transforms})
        if transforms:  # (torch's _extensions, e.g. ZStandard: the item's bytes are compressed)
            attrs += ((STORAGE_TRANSFORMS, ", ".join(transforms)),)
        return TensorMeta(name=name, dtype=tensor.dtype, shape=tensor.shape, chunks=tuple(chunks), attrs=attrs)

    def _safetensors_chunk(self, index: CheckpointIndex, name: str, tensor: DcpTensor, chunk: Chunk,
                           files: _Files) -> Chunk:
        """Locate a chunk in the safetensors blob that starts at its storage offset."""
        where = self.path / chunk.file
        head = files.read(chunk.file, chunk.byte_offset, 8)
        if head is None or len(head) < 8:
            return chunk  # missing/short file: already a warning; reading will say so
        (length,) = struct.unpack("<Q", head)
        raw = files.read(chunk.file, chunk.byte_offset + 8, length) if length < _MAX_ST_HEADER else None
        try:
            header = json.loads((raw or b"").decode("utf-8").rstrip(" \x00"))
            entry = header[tensor.key]
            begin, end = (int(x) for x in entry["data_offsets"])
            dtype = dtype_by_safetensors(str(entry["dtype"]))
            shape = tuple(int(s) for s in entry["shape"])
        except (ValueError, KeyError, TypeError, CkptError):
            raise CkptError(f"bad safetensors-serialised DCP item for {tensor.key!r} at byte "
                            f"{chunk.byte_offset}", where) from None
        if dtype.name != tensor.dtype or shape != chunk.shape or end - begin != dtype.nbytes(math.prod(shape)):
            raise CkptError(f"safetensors-serialised DCP item {tensor.key!r} does not match .metadata "
                            f"({dtype.name}{list(shape)} vs {tensor.dtype}{list(chunk.shape)})", where)
        return replace(chunk, byte_offset=chunk.byte_offset + 8 + length + begin, byte_length=end - begin,
                       encoding=Encoding.RAW)

    def _objects(self, index: CheckpointIndex, meta: DcpMetadata, names: dict[str, str],
                 files: _Files) -> dict[str, Any]:
        decoded: dict[str, Any] = {}
        for key, info in meta.bytes_entries.items():
            name = names[key]
            if info is None:
                index.objects.append(ObjectEntry(name, "bytes", "<no storage entry>"))
                continue
            if info.length > MAX_DECODED_OBJECT:
                index.objects.append(ObjectEntry(name, "bytes", f"<{info.length} bytes, not decoded>"))
                continue
            data = files.read(info.file, info.offset, info.length)
            if data is None or len(data) < info.length:
                index.objects.append(ObjectEntry(name, "bytes", f"<missing: {info.file} is missing or truncated>"))
                continue
            try:
                if info.transforms:  # compressed like the tensors (torch's ZStandard extension)
                    data = decode_item(data, ", ".join(info.transforms), MAX_DECODED_OBJECT, name,
                                       self.path / info.file)
                value = decode_object_bytes(data, self.path / info.file)
            except CkptError as exc:
                index.objects.append(ObjectEntry(name, "bytes", f"<{info.length} bytes: {exc.problem}>"))
                continue
            decoded[name] = value
            index.objects.append(ObjectEntry(name, type_name(value), to_plain(value)))
        return decoded

    # --- reading -----------------------------------------------------------------------------

    def _read_chunk(self, meta: TensorMeta, chunk: Chunk, local: tuple[tuple[int, int], ...]) -> Any:
        transforms = meta.attr(STORAGE_TRANSFORMS) if meta.attrs else None
        if transforms:  # ("corrupt torch zip file" was said before: it read like damage)
            inner, data = self._decoded_item(meta, chunk, transforms)
            return self._read_box(meta, inner, local, data)
        return super()._read_chunk(meta, self._raw_chunk(meta, chunk), local)

    def _raw_chunk(self, meta: TensorMeta, chunk: Chunk) -> Chunk:
        """The chunk's bytes in its file (inside its item's container); a compressed item's stay a
        container chunk, whose bytes no file range holds (``byte_span`` then says None)."""
        if meta.attrs and meta.attr(STORAGE_TRANSFORMS):
            return chunk
        return self._zip_item_chunk(meta, chunk) if chunk.encoding is Encoding.TORCH_ZIP_ITEM else chunk

    def _decoded_item(self, meta: TensorMeta, chunk: Chunk, transforms: str) -> tuple[Chunk, bytes]:
        """An item written through storage transforms (``dcp.transforms``: zstd), decoded into memory: the
        raw or strided chunk inside its ``torch.save`` container, and the container's bytes. The last one
        decoded is kept, so a tensor read block by block (diff, convert) is inflated once."""
        key = (chunk.file, chunk.byte_offset)
        with self._lock:
            if self._last_decoded is not None and self._last_decoded[0] == key:
                return self._last_decoded[1], self._last_decoded[2]
        path, buf, where = self._item_bytes(meta, chunk)
        data = decode_item(bytes(buf[chunk.byte_offset:chunk.byte_offset + chunk.byte_length]), transforms,
                           meta.dtype_info.nbytes(chunk.numel) + OVERHEAD, where, path)
        inner = self._container_chunk(meta, chunk, io.BytesIO(data), 0, where, path)
        with self._lock:
            self._last_decoded = (key, inner, data)
        return inner, data

    def _item_bytes(self, meta: TensorMeta, chunk: Chunk) -> tuple[Path, Any, str]:
        """The item's file, that file's map (the item's bytes are checked to lie inside it) and how errors
        name the item."""
        path = self._file_path(chunk.file)
        buf = self._buffer(chunk.file)
        end = chunk.byte_offset + chunk.byte_length
        where = f"{meta.name}: chunk at {list(chunk.offsets)} (bytes {chunk.byte_offset}-{end})"
        if end > len(buf):
            raise CkptError(f"{where} lies beyond the end of the file ({len(buf)} bytes); the file is truncated",
                            path)
        return path, buf, where

    def _zip_item_chunk(self, meta: TensorMeta, chunk: Chunk) -> Chunk:
        """The raw/strided chunk inside an embedded torch.save zip (parsed once, then cached)."""
        key = (chunk.file, chunk.byte_offset)
        cached = self._items.get(key)
        if cached is not None:
            return replace(cached, offsets=chunk.offsets)
        path, buf, where = self._item_bytes(meta, chunk)
        view = RangeIO(buf, chunk.byte_offset, chunk.byte_length)
        try:
            resolved = self._container_chunk(meta, chunk, view, chunk.byte_offset, where, path)
        finally:
            view.close()
        self._items[key] = resolved
        return resolved

    def _container_chunk(self, meta: TensorMeta, chunk: Chunk, container: IO[bytes], start: int, where: str,
                         path: Path) -> Chunk:
        """The raw/strided chunk a ``torch.save`` container (one DCP item, read through ``container``, which
        begins at byte ``start`` of the chunk's file or of decoded bytes) holds, checked against ``.metadata``."""
        try:
            parsed = read_torch_zip(path, file=container)
        except CkptError as exc:
            raise CkptError(f"{where}: {exc.problem}", path) from None
        ref = parsed.obj
        if not isinstance(ref, TensorRef) or ref.storage is None:
            raise CkptError(f"{where}: the item does not hold a tensor", path)
        if ref.shape != chunk.shape or ref.dtype.name != meta.dtype:
            raise CkptError(f"{where}: the item holds {ref.dtype.name}{list(ref.shape)}, .metadata says "
                            f"{meta.dtype}{list(chunk.shape)}", path)
        placement = parsed.storages.get(ref.storage.key)
        if placement is not None:
            placement = StoragePlacement(start + placement.offset, placement.length)
        inner = tensor_meta(meta.name, ref, chunk.file, placement, big_endian=parsed.big_endian, path=path)
        return replace(inner.chunks[0], offsets=chunk.offsets)

