"""``CheckpointReader``: the contract every format implements, and the shared byte reader.

A reader sniffs (``supports``), lists metadata without touching tensor bytes (``index``), and
reads any region of any tensor on demand (``read``) by memory-mapping only the files involved.
Chunk assembly lives here once, so a sharded format only has to describe its chunks.
"""

from __future__ import annotations

import mmap
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ckptscope.core.collector import collector_paused
from ckptscope.core.errors import CkptError, MissingTensor
from ckptscope.core.index import CheckpointIndex
from ckptscope.core.tensor import Chunk, Encoding, TensorMeta
from ckptscope.formats.blockscaled import BlockScaled, fold_block_scaled

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

Region = Sequence[slice]
"""A box inside a tensor: one ``slice(start, stop)`` per leading axis (step 1); missing axes are whole."""


def starts_with(path: Path, magic: bytes, at: int = 0) -> bool:
    """Whether ``path``'s bytes at ``at`` are ``magic`` (a format's sniff). Never raises: unreadable is no."""
    try:
        with open(path, "rb") as handle:
            handle.seek(at)
            return handle.read(len(magic)) == magic
    except OSError:
        return False


def normalize_region(shape: tuple[int, ...], region: Region | None) -> tuple[tuple[int, int], ...]:
    """Turn a region into explicit ``(start, stop)`` bounds for every axis, validating it."""
    region = tuple(region or ())
    if len(region) > len(shape):
        raise CkptError(f"region has {len(region)} axes but the tensor has {len(shape)}")
    bounds = []
    for axis, size in enumerate(shape):
        sl = region[axis] if axis < len(region) else slice(None)
        if not isinstance(sl, slice):
            raise CkptError("a region is a tuple of slices")
        start, stop, step = sl.indices(size)
        if step != 1:
            raise CkptError("region slices must have step 1")
        bounds.append((start, max(start, stop)))
    return tuple(bounds)




class CheckpointReader(ABC):
    """One checkpoint format. Subclasses describe chunks; this class reads them."""

    format_name: ClassVar[str]
    """Short stable identifier shown to users and in ``--json`` (``"safetensors"``)."""
    priority: ClassVar[int]
    """Detection order (FORMATS.md §0): lower runs first, the first ``supports`` wins."""

    def __init__(self, path: Path, *, trust_pickle: bool = False) -> None:
        self.path = Path(path)
        self.trust_pickle = trust_pickle
        self._index: CheckpointIndex | None = None
        self._maps: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._holes: dict[str, list[tuple[tuple[int, ...], tuple[int, ...], str]]] = {}
        """Per tensor, the (offsets, shape, file) boxes a missing rank file held (multi-file formats
        fill it while indexing): the rest stays readable, a read that touches one is an error."""
        self._dequantize = True
        self._block_scaled: dict[str, BlockScaled] = {}
        """Logical tensors made of a quantised payload and its scales (``formats.blockscaled``)."""
        self._replicas: dict[str, list[Chunk]] = {}
        """Per tensor, other stored copies that must hold the same values as the chunk shown (a Megatron
        per-rank TP save keeps each replicated tensor in every rank's file; the index shows rank 0's)."""

    # --- what a format implements ----------------------------------------------------------

    @classmethod
    @abstractmethod
    def supports(cls, path: Path) -> bool:
        """Cheap sniff: suffix, marker file or magic bytes. Never raises."""

    @abstractmethod
    def _build_index(self) -> CheckpointIndex:
        """Read metadata only. Must not read tensor bytes."""

    @classmethod
    def missing_markers(cls, path: Path) -> tuple[str, ...]:
        """Files a finished save of this format always has but ``path`` lacks (``.metadata``,
        ``metadata.json``): a cheap completeness test. Never raises; the default knows none."""
        return ()

    # --- the public API --------------------------------------------------------------------

    def index(self) -> CheckpointIndex:
        with self._lock:
            if self._index is None:
                with collector_paused():
                    index = self._build_index()
                    if self._dequantize:
                        self._block_scaled = fold_block_scaled(index)
                    self._index = index
            return self._index

    def show_stored_quantization(self) -> None:
        """List block-scaled tensors as stored (FP8 payload and ``weight_scale_inv``, MXFP4 ``_blocks``
        and ``_scales`` as separate entries, read as their raw values) instead of one dequantised
        logical tensor: ``diff --raw`` compares them bit for bit. Call before ``index()``."""
        if self._index is not None:
            raise RuntimeError("show_stored_quantization() must be called before index()")
        self._dequantize = False

    def meta(self, name: str) -> TensorMeta:
        """A stored tensor's metadata, or a per-layer view's (``CheckpointIndex.views``)."""
        index = self.index()
        meta = index.tensors.get(name)
        if meta is not None:
            return meta
        if name in index.views:
            return index.view_meta(name)
        raise MissingTensor(f"no tensor named {name!r}", self.path)

    def read(self, name: str, region: Region | None = None) -> "np.ndarray":
        """Read one tensor, or the box ``region`` of it, as a numpy array (bf16/fp8 via ml_dtypes).

        Only the bytes of the chunks that overlap the region are touched; a block-scaled tensor reads
        (and dequantises) only the blocks and scales the region meets.
        """
        index = self.index()
        if name not in index.tensors and name in index.views:
            return self._read_view(name, region)
        meta = self.meta(name)
        bounds = normalize_region(meta.shape, region)
        scaled = self._block_scaled.get(name)
        if scaled is not None:
            return scaled.read(self._read_stored, bounds)
        return self._read_stored(meta, bounds)

    def read_mapped(self, name: str, region: Region | None = None) -> "np.ndarray":
        """``read``, but without the copy where the region is one contiguous run of raw bytes
        (``byte_span``): a read-only array over the mapped file. For streaming consumers that are
        done with the array before they read on (diff, timeline): copying every block into fresh
        memory cost them more than their arithmetic. The view keeps the map open while it lives."""
        import numpy as np

        span = self.byte_span(name, region)
        if span is None:
            return self.read(name, region)
        path, offset, length = span
        meta = self.meta(name)
        shape = tuple(hi - lo for lo, hi in normalize_region(meta.shape, region))
        dtype = meta.dtype_info.numpy()
        mapped = self._map_file(str(path), path)
        if length == 0 or offset + length > len(mapped):
            return self.read(name, region)  # empty, or truncated: read() says so in one line
        return np.frombuffer(mapped, dtype=dtype, count=length // dtype.itemsize, offset=offset).reshape(shape)

    def _read_stored(self, meta: TensorMeta, bounds: tuple[tuple[int, int], ...]) -> "np.ndarray":
        """The box ``bounds`` of a tensor as stored: its chunks assembled (a block-scaled tensor reads
        its payload and scales through here, under their stored metadata)."""
        import numpy as np

        name = meta.name
        for offsets, shape, file in self._holes.get(name, ()):
            if all(max(lo, o) < min(hi, o + n) for (lo, hi), o, n in zip(bounds, offsets, shape)):
                raise CkptError(f"{name}: the elements at {list(offsets)} (shape {list(shape)}) are in {file}, "
                                "which is missing", self.path)
        dtype = meta.dtype_info.numpy()
        out_shape = tuple(stop - start for start, stop in bounds)
        if len(meta.chunks) == 1 and meta.chunks[0].shape == meta.shape:
            return self._read_chunk(meta, meta.chunks[0], bounds)
        out = np.zeros(out_shape, dtype=dtype)
        if out.size == 0:
            return out
        for chunk in meta.chunks:
            local, target = [], []
            for (start, stop), off, size in zip(bounds, chunk.offsets, chunk.shape):
                lo, hi = max(start, off), min(stop, off + size)
                if lo >= hi:
                    break
                local.append((lo - off, hi - off))
                target.append(slice(lo - start, hi - start))
            else:
                out[tuple(target)] = self._read_chunk(meta, chunk, tuple(local))
        return out

    def byte_span(self, name: str, region: Region | None = None) -> tuple[Path, int, int] | None:
        """``(file, offset, length)`` holding exactly the C-order bytes of ``region`` of a tensor,
        or None when they are not stored as one contiguous run (several chunks, strided or
        big-endian storage, sub-byte dtypes, a box that cuts rows). Writers copy such runs
        file-to-file in the kernel instead of through memory; everything else goes via ``read``."""
        index = self.index()
        if name not in index.tensors and name in index.views:
            stored_name, layer = index.views[name]
            stored = self.meta(stored_name)
            bounds = normalize_region(stored.shape[1:], region)
            return self.byte_span(stored_name, (slice(layer, layer + 1),) + tuple(slice(lo, hi) for lo, hi in bounds))
        meta = self.meta(name)
        bounds = normalize_region(meta.shape, region)
        dtype = meta.dtype_info
        if dtype.bits % 8:
            return None
        inside = [c for c in meta.chunks if all(off <= lo and hi <= off + size
                                                 for (lo, hi), off, size in zip(bounds, c.offsets, c.shape))]
        if len(inside) != 1:
            return None
        chunk = self._raw_chunk(meta, inside[0])
        if chunk.encoding is not Encoding.RAW or chunk.big_endian:
            return None
        local = [(lo - off, hi - off) for (lo, hi), off in zip(bounds, chunk.offsets)]
        # Contiguous in C order: single indices, then one axis cut anywhere, then whole axes.
        axis = 0
        while axis < len(local) and local[axis][1] - local[axis][0] == 1:
            axis += 1
        if any(local[a] != (0, chunk.shape[a]) for a in range(axis + 1, len(local))):
            return None
        start = 0
        for a, (lo, _) in enumerate(local):
            start = start * chunk.shape[a] + lo
        numel = 1
        for lo, hi in local:
            numel *= hi - lo
        offset, length = chunk.byte_offset + start * dtype.itemsize, numel * dtype.itemsize
        if offset + length > chunk.byte_offset + chunk.byte_length:
            return None
        return self._file_path(chunk.file), offset, length

    def byte_runs(self, name: str, region: Region | None = None) -> list[tuple[Path, int, int]] | None:
        """``byte_span``, generalised to a tensor stored as row blocks in several files (FSDP or
        ZeRO shards of one parameter, one per rank file): the C-order bytes of ``region`` as one
        run per block it meets, or None when some block is not one contiguous run. This is what
        lets ``merge`` copy shards file to file instead of assembling them in memory."""
        span = self.byte_span(name, region)
        if span is not None:
            return [span]
        meta = self.index().tensors.get(name)
        if meta is None or len(meta.chunks) < 2 or not meta.shape:
            return None
        if any(c.offsets[1:] != (0,) * (len(meta.shape) - 1) or c.shape[1:] != meta.shape[1:] for c in meta.chunks):
            return None  # not split along rows only
        bounds = normalize_region(meta.shape, region)
        (start, stop), rest = bounds[0], bounds[1:]
        if any(b != (0, n) for b, n in zip(rest, meta.shape[1:])):
            return None  # a box that cuts rows is not one run per block
        whole_rows = tuple(slice(0, n) for n in meta.shape[1:])
        runs, row = [], start
        for chunk in sorted(meta.chunks, key=lambda c: c.offsets[0]):
            lo, hi = max(row, chunk.offsets[0]), min(stop, chunk.offsets[0] + chunk.shape[0])
            if lo >= hi:
                continue
            if lo != row:
                return None  # a gap between row blocks
            span = self.byte_span(name, (slice(lo, hi),) + whole_rows)
            if span is None:
                return None
            runs.append(span)
            row = hi
        return runs if row == stop else None

    def _raw_chunk(self, meta: TensorMeta, chunk: Chunk) -> Chunk:
        """The chunk as the raw bytes it holds; formats whose chunks wrap their bytes in a
        container (DCP's per-item ``torch.save`` zips) resolve it here."""
        return chunk

    def _read_view(self, name: str, region: Region | None) -> "np.ndarray":
        """A per-layer view is the box ``[layer, region...]`` of its stored tensor, layer axis dropped."""
        stored_name, layer = self.index().views[name]
        stored = self.meta(stored_name)
        bounds = normalize_region(stored.shape[1:], region)
        box = (slice(layer, layer + 1),) + tuple(slice(lo, hi) for lo, hi in bounds)
        return self.read(stored_name, box)[0]

    def differing_replicas(self, max_bytes: int | None = None) -> list[tuple[str, Chunk]]:
        """The stored copies (``_replicas``) whose values differ bit for bit from the copy the index shows:
        a TP rank whose replicated norm drifted from rank 0's runs another model than the one an export
        writes (a probe: diff and check said identical). Reads every copy whole: norms and biases are
        small, but experts kept whole on every TP rank (expert TP 1) are read once per rank; ``max_bytes``
        skips tensors larger than that."""
        if not self._replicas:  # every format but Megatron's per-rank TP files: nothing to read, nor numpy to import
            return []
        import numpy as np

        index = self.index()
        differing: list[tuple[str, Chunk]] = []
        for name, copies in self._replicas.items():
            meta = index.tensors.get(name)
            if meta is None or len(meta.chunks) != 1 or (max_bytes is not None and meta.nbytes > max_bytes):
                continue
            if meta.chunks[0].encoding not in (Encoding.RAW, Encoding.STRIDED):
                continue  # block-scaled (FP8 payload + scales): read as stored only under check (show_stored_quantization)
            whole = tuple((0, size) for size in meta.chunks[0].shape)
            shown = self._read_chunk(meta, meta.chunks[0], whole)
            for chunk in copies:
                if chunk.shape != meta.chunks[0].shape:
                    continue
                other = self._read_chunk(meta, chunk, whole)
                if not np.array_equal(np.ascontiguousarray(shown).view(np.uint8),
                                      np.ascontiguousarray(other).view(np.uint8)):
                    differing.append((name, chunk))
        return differing

    def disagreeing_copies(self) -> list[tuple[str, str, str]]:
        """``(tensor, file, what disagrees)`` for each stored pair of copies a format keeps that must agree and
        do not (DeepSpeed: an fp32 master and the module's own copy of it): a rank file taken from another rank
        or another save, which no metadata tells apart. A few small reads; formats without such pairs say none."""
        return []

    def close(self) -> None:
        with self._lock:
            for mapped in self._maps.values():
                if isinstance(mapped, mmap.mmap):
                    try:
                        mapped.close()
                    except BufferError:  # a caller still holds a view; the GC closes it later
                        pass
            self._maps.clear()

    def release_pages(self) -> None:
        """Drop the pages this process has touched in its memory maps (they stay in the page
        cache). Streaming ops call it between tensors so RSS tracks the working set, not the
        checkpoint size: mapped file pages count towards RSS until released."""
        with self._lock:
            maps = list(self._maps.values())
        for mapped in maps:
            if isinstance(mapped, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
                try:
                    mapped.madvise(mmap.MADV_DONTNEED)
                except (OSError, ValueError):  # closed meanwhile, or not supported: only a hint
                    pass

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- byte access shared by all formats ---------------------------------------------------

    def _file_path(self, rel: str) -> Path:
        base = self.__dict__.get("_files_base")
        if base is None:  # asked once: streaming ops resolve a file per block
            base = self._files_base = self.path if self.path.is_dir() else self.path.parent
        return base / rel

    def _buffer(self, rel: str) -> Any:
        """A read-only memory map of one file, opened once and shared."""
        return self._map_file(rel, self._file_path(rel))

    def _map_file(self, key: str, path: Path) -> Any:
        with self._lock:
            mapped = self._maps.get(key)
            if mapped is None:
                try:
                    with open(path, "rb") as handle:
                        size = os.fstat(handle.fileno()).st_size
                        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
                except OSError as exc:
                    raise CkptError(f"cannot read: {exc.strerror or exc}", path) from None
                self._maps[key] = mapped
            return mapped

    def _read_chunk(self, meta: TensorMeta, chunk: Chunk, local: tuple[tuple[int, int], ...]) -> "np.ndarray":
        """Read the box ``local`` (chunk-relative bounds) of one chunk into a fresh array."""
        if chunk.encoding not in (Encoding.RAW, Encoding.STRIDED):
            raise CkptError(f"{meta.name}: {chunk.encoding.value} chunks are not readable by {self.format_name}")
        return self._read_box(meta, chunk, local, self._buffer(chunk.file))

    def _read_box(self, meta: TensorMeta, chunk: Chunk, local: tuple[tuple[int, int], ...], buf: Any) -> "np.ndarray":
        """``_read_chunk`` of a raw or strided chunk whose bytes are ``buf`` (its file's map, or bytes a
        reader decoded into memory), into a fresh array."""
        import numpy as np

        dtype = meta.dtype_info.numpy()
        if chunk.big_endian:
            dtype = dtype.newbyteorder(">")
        strides = None
        if chunk.encoding is Encoding.STRIDED and chunk.strides is not None:
            strides = tuple(s * dtype.itemsize for s in chunk.strides)
        if chunk.byte_offset + chunk.byte_length > len(buf):
            raise CkptError(
                f"{meta.name}: bytes {chunk.byte_offset}-{chunk.byte_offset + chunk.byte_length} "
                f"lie beyond the end of the file ({len(buf)} bytes); the file is truncated",
                self._file_path(chunk.file),
            )
        if chunk.numel == 0 or len(buf) == 0:
            return np.zeros(tuple(hi - lo for lo, hi in local), dtype=dtype.newbyteorder("="))
        view = np.ndarray(chunk.shape, dtype=dtype, buffer=buf, offset=chunk.byte_offset, strides=strides)
        part = view[tuple(slice(lo, hi) for lo, hi in local)]
        result = np.array(part, dtype=dtype.newbyteorder("="), copy=True)
        return result
