"""Reading what ``torch.save`` wrote without torch: zip layout, storages, and the object tree.

Used by the torch-file reader, the HF ``pytorch_model*.bin`` reader and (later) every format that
embeds torch pickles. FORMATS.md §2.1-§2.4: the zip's entries sit under one prefix folder (never
hard-code it), ``data.pkl`` holds the object with tensors as persistent ids, ``data/<key>`` holds
the raw bytes of each storage, stored uncompressed.
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, ObjectEntry
from ckptscope.core.tensor import Chunk, Encoding, TensorMeta
from ckptscope.formats.pickles.safe import PickleStub, TensorRef, safe_loads, to_plain, type_name

ZIP_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True, slots=True)
class StoragePlacement:
    """Where a storage's bytes start in the file, and how many bytes are there."""

    offset: int
    length: int


@dataclass(slots=True)
class TorchZip:
    """The parsed skeleton of a torch zip file: its object tree and where each storage lives."""

    obj: Any
    storages: dict[str, StoragePlacement]
    big_endian: bool
    prefix: str


def is_torch_zip(path: Path) -> bool:
    """Zip file containing ``<prefix>/data.pkl`` (FORMATS.md §0 row 3)."""
    try:
        with open(path, "rb") as handle:
            if handle.read(4) != ZIP_MAGIC:
                return False
        with zipfile.ZipFile(path) as archive:
            return any(n.endswith("data.pkl") and n.count("/") == 1 for n in archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def read_torch_zip(path: Path, file: IO[bytes] | None = None, *,
                   extra_globals: dict[tuple[str, str], Any] | None = None) -> TorchZip:
    """Parse a torch zip's ``data.pkl`` with the safe unpickler and locate every storage record.

    ``extra_globals`` are passed to the unpickler (a format's own data-only stand-ins)."""
    try:
        archive = zipfile.ZipFile(file if file is not None else path)
    except zipfile.BadZipFile as exc:
        raise CkptError(f"corrupt torch zip file: {exc}", path) from None
    except OSError as exc:
        raise CkptError(f"cannot read: {exc.strerror or exc}", path) from None
    with archive:
        names = archive.namelist()
        pkl = next((n for n in names if n.endswith("/data.pkl") and n.count("/") == 1), None)
        if pkl is None:
            raise CkptError("zip file without data.pkl: not written by torch.save", path)
        prefix = pkl[: -len("data.pkl")]
        if f"{prefix}constants.pkl" in names or any(n.startswith(f"{prefix}code/") for n in names):
            raise CkptError("TorchScript archive (torch.jit.save), not a state dict; ckptscope reads state dicts", path)
        try:
            order = archive.read(f"{prefix}byteorder").strip() if f"{prefix}byteorder" in names else b"little"
            data = archive.read(pkl)
        except (OSError, zipfile.BadZipFile, EOFError) as exc:  # a member the directory points past or before
            raise CkptError(f"corrupt torch zip file: {exc}", path) from None
        if order not in (b"little", b"big"):  # torch.load refuses any other
            raise CkptError(f"corrupt torch zip file: byteorder {order[:20]!r} is neither little nor big", path)
        big_endian = order == b"big"
        try:
            obj = safe_loads(data, extra_globals)
        except CkptError:
            raise
        except Exception as exc:  # any malformed pickle: report it, never execute it
            if b"_flat_param" in data and b"ShardedTensor" in data:
                raise CkptError("a torch FSDP1 LOCAL_STATE_DICT save (each rank's flattened parameters as "
                                "ShardedTensors of _flat_param, no named weights), which ckptscope does not read; "
                                "save with StateDictType.SHARDED_STATE_DICT or FULL_STATE_DICT", path) from None
            raise CkptError(f"cannot decode data.pkl: {type(exc).__name__}: {exc}", path) from None
        storages: dict[str, StoragePlacement] = {}
        raw = file if file is not None else None
        handle = raw or open(path, "rb")
        try:
            for info in archive.infolist():
                if not info.filename.startswith(f"{prefix}data/"):
                    continue
                if info.compress_type != zipfile.ZIP_STORED:
                    raise CkptError(f"storage {info.filename} is compressed; cannot map it lazily", path)
                handle.seek(info.header_offset)
                local = handle.read(30)
                if len(local) < 30 or local[:4] != ZIP_MAGIC:
                    raise CkptError(f"corrupt zip local header for {info.filename}", path)
                name_len, extra_len = struct.unpack("<HH", local[26:30])
                key = info.filename[len(f"{prefix}data/"):]
                storages[key] = StoragePlacement(info.header_offset + 30 + name_len + extra_len, info.file_size)
        finally:
            if raw is None:
                handle.close()
    return TorchZip(obj=obj, storages=storages, big_endian=big_endian, prefix=prefix.rstrip("/"))


# --- flattening the object tree -----------------------------------------------------------------


def _contains_tensor(value: Any, depth: int = 0) -> bool:
    if depth > 64:
        return False
    if isinstance(value, TensorRef):
        return True
    if isinstance(value, dict):
        return any(_contains_tensor(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_contains_tensor(v, depth + 1) for v in value)
    if isinstance(value, PickleStub):
        return _contains_tensor(_stub_children(value), depth + 1)
    return False


def _stub_children(stub: PickleStub) -> dict[str, Any]:
    children: dict[str, Any] = {}
    state = stub.state
    if isinstance(state, tuple) and len(state) == 2 and (state[0] is None or isinstance(state[0], dict)):
        state = {**(state[0] or {}), **(state[1] or {})}
    if isinstance(state, dict):
        children.update({str(k): v for k, v in state.items()})
    children.update({str(k): v for k, v in stub.dict_items.items()})
    children.update({str(i): v for i, v in enumerate(stub.items)})
    return children


def flatten_paths(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Yield ``(key path, leaf)``: leaves are TensorRefs, or whole subtrees holding no tensor."""
    if isinstance(value, TensorRef):
        yield path, value
        return
    children: dict[str, Any] | None = None
    if _contains_tensor(value):
        if isinstance(value, dict):
            children = {str(k): v for k, v in value.items()}
        elif isinstance(value, (list, tuple)):
            children = {str(i): v for i, v in enumerate(value)}
        elif isinstance(value, PickleStub):
            children = _stub_children(value)
    if children is None:
        yield path, value
        return
    for key, child in children.items():
        yield from flatten_paths(child, (*path, key))


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield ``(dotted name, leaf)``: leaves are TensorRefs, or whole subtrees holding no tensor.

    Nested dicts keep their full path (``model.decoder.layers.0...``), so a state dict stored
    under ``model``/``state_dict``/``module`` is shown where it actually is.
    """
    for path, leaf in flatten_paths(value, (prefix,) if prefix else ()):
        yield ".".join(path), leaf


def tensor_meta(name: str, ref: TensorRef, file: str, placement: StoragePlacement | None, *,
                big_endian: bool = False, path: Path | None = None) -> TensorMeta:
    """Describe a pickled tensor as one chunk pointing into its storage's bytes."""
    itemsize = ref.dtype.itemsize
    if ref.storage is None or placement is None:
        raise CkptError(f"tensor {name!r} refers to a storage that is not in the file", path)
    start = placement.offset + ref.storage_offset * itemsize
    span = ref.span_elements * itemsize
    needed = ref.storage_offset * itemsize + span
    if needed > placement.length:
        raise CkptError(
            f"tensor {name!r} needs {needed} bytes of storage {ref.storage.key} but only "
            f"{placement.length} are stored (truncated file?)", path,
        )
    contiguous = ref.is_contiguous
    chunk = Chunk(
        offsets=(0,) * len(ref.shape),
        shape=ref.shape,
        file=file,
        byte_offset=start,
        byte_length=span,
        encoding=Encoding.RAW if contiguous else Encoding.STRIDED,
        strides=None if contiguous else ref.stride,
        big_endian=big_endian,
    )
    attrs: tuple[tuple[str, str], ...] = (("storage", ref.storage.key),)
    if ref.kind != "Tensor":
        attrs += (("kind", ref.kind),)
    return TensorMeta(name=name, dtype=ref.dtype.name, shape=ref.shape, chunks=(chunk,), attrs=attrs)


def piece_chunk(name: str, ref: TensorRef, offsets: tuple[int, ...], file: str, parsed: "TorchZip",
                path: Path | None = None) -> Chunk:
    """One rank's local piece of a sharded tensor (a DTensor's local tensor, a ShardedTensor's local
    shard) as a chunk at its global ``offsets`` in the rank file ``file``."""
    placement = parsed.storages.get(ref.storage.key) if ref.storage else None
    meta = tensor_meta(name, ref, file, placement, big_endian=parsed.big_endian, path=path)
    return replace(meta.chunks[0], offsets=offsets)


def mark_shared_storages(tensors: dict[str, TensorMeta]) -> dict[str, TensorMeta]:
    """Annotate tensors whose bytes overlap on one storage (tied weights): ``shares_storage_with``.

    Views of one storage that do not overlap are separate data and stay unmarked: DeepSpeed's
    ``save_16bit_model`` / ``zero_to_fp32`` ``.bin`` files and Megatron's DDP param buffers keep every
    parameter as a slice of one flat storage, and marking those as shared counted 1,184 of a model's
    19,936 parameters (each tensor after the first taken for a tied alias)."""
    by_storage: dict[tuple[str, str], list[TensorMeta]] = {}
    for meta in tensors.values():
        key = meta.attr("storage")
        if key is not None:
            by_storage.setdefault((meta.chunks[0].file, key), []).append(meta)
    out = dict(tensors)
    for metas in by_storage.values():
        if len(metas) < 2:
            continue
        overlapping: dict[str, list[str]] = {}
        active: list[tuple[int, str]] = []  # (end, name) of spans not yet passed
        for start, end, name in sorted((m.chunks[0].byte_offset, m.chunks[0].byte_offset + m.chunks[0].byte_length,
                                        m.name) for m in metas):
            active = [(e, n) for e, n in active if e > start]
            for _, other in active:
                overlapping.setdefault(name, []).append(other)
                overlapping.setdefault(other, []).append(name)
            if end > start:
                active.append((end, name))
        order = {m.name: k for k, m in enumerate(metas)}  # listed in the file's order
        for meta in metas:
            others = overlapping.get(meta.name)
            if others:
                listed = ",".join(sorted(others, key=order.__getitem__))
                out[meta.name] = TensorMeta(meta.name, meta.dtype, meta.shape, meta.chunks,
                                            meta.attrs + (("shares_storage_with", listed),))
    return out


def build_torch_index(index: CheckpointIndex, obj: Any, file: str,
                      placements: dict[str, StoragePlacement], *, big_endian: bool, path: Path) -> None:
    """Fill ``index`` with the tensors and objects of one unpickled torch file."""
    tensors: dict[str, TensorMeta] = {}
    for name, leaf in flatten(obj):
        if isinstance(leaf, TensorRef):
            if leaf.storage is None:
                index.objects.append(ObjectEntry(name, leaf.kind, to_plain(leaf)))
                continue
            placement = placements.get(leaf.storage.key)
            tensors[name] = tensor_meta(name, leaf, file, placement, big_endian=big_endian, path=path)
        else:
            index.objects.append(ObjectEntry(name or "<root>", type_name(leaf), to_plain(leaf)))
    index.tensors.update(mark_shared_storages(tensors))
    if isinstance(obj, dict):
        for key in ("iteration", "checkpoint_version", "epoch", "global_step"):
            value = obj.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                index.metadata.setdefault(key, value)

