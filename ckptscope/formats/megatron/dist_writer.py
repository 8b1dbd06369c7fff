"""Streaming writers for Megatron-Core checkpoints, with no process group and no GPU.

* ``write_torch_dist``: a ``--ckpt-format torch_dist`` iteration dir (FORMATS.md §4) equal to what
  megatron-core 0.16.1 ``dist_checkpointing.save`` writes for a GPTModel saved on one rank: data
  files ``__0_{k}.distcp``, ``.metadata`` (torch DCP ``Metadata``, ``planner_data`` None, Megatron's
  ``all_local_plans``), ``common.pt`` (args, iteration, checkpoint_version) and ``metadata.json``,
  written last because its presence marks a complete save. Per-layer tensors are stacked under the
  key without the layer index (global ``[L, ...]``, one chunk per layer at ``(i, 0, ...)``, §4.5),
  SwiGLU ``linear_fc1`` goes in as its two halves (gate at row 0, up at row F, §4.7), local-spec
  norms under the TE names (§4.5), and each linear's ``_extra_state`` as a ShardedObject
  ``<key>/shard_{i}_{L}`` (§4.4), which megatron-core's load asks for. MoE layers (SequentialMLP,
  EP=1 on one rank): ``mlp.router.weight`` ``[L, E, H]``, every expert of a layer under
  ``mlp.experts.experts.linear_fc1.weight`` / ``linear_fc2.weight`` with the expert axis after the
  layer axis (``[L, E, ...]``, chunk at ``(i, e, ...)``, fc1 again in two halves), their extra states
  ``…/shard_{i}.{e}_{L}.{E}``, ``mlp.shared_experts.*`` stacked like a dense MLP, and the norm under
  the local spec's keys-map name ``mlp.linear_fc1.layer_norm_weight`` (``pre_mlp_layernorm.weight``
  with the TE spec).
* ``write_torch_legacy`` (legacy_writer.py): a ``--ckpt-format torch`` dir of per-rank
  ``mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt`` files (§3).

Megatron's own writers need an initialised process group and the whole model in memory; a
converter has neither. Here each ``OutTensor.produce`` is called exactly once, when its bytes are
due, and the array is dropped before the next one, so the peak is about one tensor whatever the
model size. For torch_dist every chunk is one ``torch.save`` container appended to a data file,
which is how torch's ``FileSystemWriter`` stores an item (§5.4); that writer itself is not used
because it keeps every tensor it wrote alive until its file is closed.

The torch_dist writer does not import torch at all (``import torch`` alone takes longer than
converting a small model): containers come from ``torch_save.zip_container``, ``.metadata`` from
``dcp.metadata_write``, ``common.pt`` from ``pickles.repickle.repickle``; tests load the results with
torch and megatron-core. A tensor offered as file byte runs (``OutTensor.runs``) is copied straight
into the data file's pages (``formats.filefill``), its CRC taken from each piece as it lands. The legacy
per-rank writer still uses torch.

Same input, same bytes: nothing written depends on the clock, a random draw or thread timing. The
ids the formats stamp are derived from the content: each container's ``.data/serialization_id``
as torch computes it (``torch_save.serialization_id``), and ``.metadata``'s ``storage_meta.save_id``
from the items and their CRC-32s (``dcp.metadata_write.content_save_id``; torch draws a uuid4).
``storage_meta.checkpoint_id`` records the final location, as torch's writer does, so it alone
follows the output path. Items go to data files by a greedy byte balance in tensor order, which
depends on sizes only.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import struct
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptscope.core.dtypes import DType, dtype_by_name
from ckptscope.core.errors import CkptError
from ckptscope.formats.dcp.metadata_write import BytesItem, ChunkItem, content_save_id, metadata_bytes
from ckptscope.formats.filefill import OutputFile
from ckptscope.formats.megatron.legacy_writer import legacy_rank_dir, write_torch_legacy
from ckptscope.formats.megatron.model_layout import (
    DIST_EXPERTS,
    EXPERTS,
    GLU,
    LAYERS,
    LINEARS,
    LOCAL_TO_TE,
    MLA_LINEARS,
    MOE_NORM,
    MTP_LAYER,
    REPLICATED,
    Entry,
    ModelTensors,
    OutTensor,
    Progress,
    analyse,
    check_spec,
    pipeline_layer_ranges,
    produce_array,
)
from ckptscope.formats.pickles.repickle import repickle
from ckptscope.formats.pickles.safe import StorageRef, TensorRef
from ckptscope.formats.torch_save.zip_container import Copied, crc32, tensor_pickle, write_torch_save

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = ["DistLayout", "OutTensor", "Progress", "finish_torch_dist", "legacy_rank_dir", "pipeline_layer_ranges",
           "plan_torch_dist", "write_dist_files", "write_torch_dist", "write_torch_legacy"]

HETERO_LINEARS = MLA_LINEARS
"""Replicated linears that still carry an ``_extra_state`` (MLA's duplicated down projections)."""
COMMON_FILE = "common.pt"
MARKER_FILE = "metadata.json"
CHECKPOINT_VERSION = 3.0
MARKER = {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
          "common_backend": "torch", "common_backend_version": 1}
"""megatron-core <= 0.18 ``CheckpointingConfig`` (FORMATS.md §4.1, checked on disk with 0.16.1)."""


@dataclass
class _Chunk:
    key: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    global_shape: tuple[int, ...]
    rows: tuple[int, int] | None
    """Rows (axis 0) of the produced array this chunk holds; None: all of it."""


def _dist_key(entry: Entry, model: ModelTensors, spec: str) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """The torch_dist key of one tensor and the axes prepended to it: (key, offsets, global sizes).
    Layers that differ (``model.hetero``) are keyed one by one, without the layer axis."""
    if entry.layer is None and not entry.owner:
        return entry.sub, (), ()
    prefix, axis, size = (entry.owner, (), ()) if model.hetero else (LAYERS, (entry.layer,), (model.num_layers,))
    if entry.expert is not None:
        return prefix + DIST_EXPERTS + entry.expert_sub, axis + (entry.expert,), size + (model.num_experts,)
    sub = entry.sub
    moe = model.is_moe_layer(entry.layer) if entry.layer is not None else entry.owner.endswith(MTP_LAYER)
    if moe and spec == "local" and not model.mla and sub.startswith(MOE_NORM):
        # the local spec's keys map still applies (an MTP layer's decoder layer too: a MoE norm is only
        # spelled pre_mlp_layernorm there when that layer is MoE, as GLM-4.5's is)
        sub = LOCAL_TO_TE[MOE_NORM] + sub[len(MOE_NORM):]
    return prefix + sub, axis, size


def _chunks(entry: Entry, model: ModelTensors, spec: str = "local") -> list[_Chunk]:
    """Where one tensor goes in a TP=1 torch_dist save (FORMATS.md §4.5, §4.7)."""
    shape = entry.out.shape
    key, prefix, prefix_shape = _dist_key(entry, model, spec)
    halves: list[tuple[int, int] | None] = [None]
    if entry.layout == GLU:  # apply_swiglu_sharded_factory: W at fragment 0 of 2, V at fragment 1
        halves = [(0, shape[0] // 2), (shape[0] // 2, shape[0])]
    chunks = []
    for rows in halves:
        start, stop = rows if rows else (0, shape[0] if shape else 0)
        local = (stop - start,) + shape[1:] if shape else ()
        offsets = (start,) + (0,) * (len(shape) - 1) if shape else ()
        chunks.append(_Chunk(key, prefix + offsets, (1,) * len(prefix) + local, prefix_shape + shape, rows))
    return chunks


def _extra_state_objects(model: ModelTensors) -> list[str]:
    """ShardedObject keys of the layers' linears' ``_extra_state``, in the order megatron-core's
    sharded state dict lists them: per layer the attention linears, then the dense ``linear_fc1`` /
    ``linear_fc2``, or each routed expert's (``shard_{i}.{e}_{L}.{E}``) and the shared experts'.
    Layers that differ (``model.hetero``): per-layer keys, ``shard_0_1`` per linear, ``shard_{e}_{E}``
    per expert; MLA's duplicated down projections and an MTP layer's ``eh_proj`` have one too."""
    layers, experts = model.num_layers, model.num_experts
    if not model.hetero:
        subs = set(model.layer_subs)
        return [LAYERS + key.format(i=i) for i in range(layers) for key in _extra_keys(subs, experts, layers)]
    by_owner: dict[str, set[str]] = {}
    for entry in model.entries:
        if entry.owner and entry.expert is None:
            by_owner.setdefault(entry.owner, set()).add(entry.sub)
        elif entry.expert is not None:
            by_owner.setdefault(entry.owner, set()).add(f"{EXPERTS}{entry.expert}.{entry.expert_sub}")
    out = []
    for owner, subs in by_owner.items():
        out += [owner + key for key in _extra_keys(subs, experts, None)]
        out += [f"{owner}{module}._extra_state/shard_0_1" for module in HETERO_LINEARS + ("eh_proj",)
                if module not in LINEARS and f"{module}.weight" in subs]
    return out


def _extra_keys(subs: set[str], experts: int, layers: int | None) -> list[str]:
    """One layer's ``_extra_state`` ShardedObject keys: ``{i}`` is its place on the ``layers``-long layer
    axis, or (``layers`` None) there is no layer axis and a non-expert object is ``shard_0_1``."""
    axis, size = ("{i}.", f"{layers}.") if layers is not None else ("", "")
    whole = f"shard_{{i}}_{layers}" if layers is not None else "shard_0_1"
    modules: list[tuple[str, str]] = [(m, f"{m}._extra_state/{whole}") for m in LINEARS]
    for e in range(experts):
        for linear in ("linear_fc1", "linear_fc2"):
            modules.append((f"{EXPERTS}{e}.{linear}",
                            f"{DIST_EXPERTS}{linear}._extra_state/shard_{axis}{e}_{size}{experts}"))
    for m in ("mlp.shared_experts.linear_fc1", "mlp.shared_experts.linear_fc2"):
        modules.append((m, f"{m}._extra_state/{whole}"))
    return [key for module, key in modules if f"{module}.weight" in subs]


class _DataFile:
    """One ``.distcp`` file being appended to: each item a self-contained ``torch.save`` container
    (written by ``torch_save.zip_container``, no torch), or raw bytes. Its size is planned
    (``DistLayout.file_sizes``), so it is an ``OutputFile``: copied data lands straight in the
    file's pages with its CRC-32 taken on the way, one pass over the source."""

    def __init__(self, path: Path, planned: int) -> None:
        self.name = path.name
        self.file = OutputFile(path, planned)
        self.size = 0
        """Bytes appended so far (where the next one goes)."""

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.file.write(self.size, view)
        self.size += view.nbytes
        return view.nbytes

    def append(self, payload: bytes) -> tuple[int, int]:
        """Append raw bytes (a ShardedObject's item); returns (offset, length)."""
        start = self.size
        self.write(payload)
        return start, self.size - start

    def append_tensor(self, array: np.ndarray, dtype: DType) -> tuple[int, int, int]:
        """Append one C-contiguous array as ``torch.save`` would store the tensor; returns
        (offset, length, CRC-32 of the data). The container's offsets count from the item's
        start, as with the ``NoCloseWriter`` stream torch's ``FileSystemWriter`` hands ``torch.save``."""
        start = self.size
        data = array.reshape(-1).view("uint8")
        crc = crc32(data)
        write_torch_save(self.write, tensor_pickle(dtype, array.shape), [("0", data, crc)])
        return start, self.size - start, crc

    def append_runs(self, runs: list[tuple[Path, int, int]], shape: tuple[int, ...], dtype: DType) -> tuple[int, int, int]:
        """Append a tensor whose bytes are ``runs`` of source files, copied into the file with the
        CRC-32 taken from each piece as it lands: the container needs it only in the data
        descriptor that follows the data."""
        start = self.size
        size = sum(length for _, _, length in runs)
        crc = [0]

        def copy() -> None:
            value, position = 0, self.size
            for path, offset, length in runs:
                value = self.file.copy(path, offset, position, length, value)
                position += length
            crc[0] = (value or 0) & 0xFFFFFFFF
            self.size += size

        data = Copied(size, copy, lambda: crc[0], runs_head(runs))
        write_torch_save(self.write, tensor_pickle(dtype, shape), [("0", data, None)])
        return start, self.size - start, crc[0]

    def check_full(self) -> None:
        if self.size != self.file.size:
            raise CkptError(f"internal error: {self.name}: planned {self.file.size:,} bytes, wrote {self.size:,}")

    def close(self) -> None:
        self.file.close()


class _Metadata:
    """The items of ``.metadata`` in write order, pickled at the end by ``dcp.metadata_write``
    (torch's DCP ``Metadata`` with Megatron's ``all_local_plans``, written without torch)."""

    def __init__(self) -> None:
        self.items: list[ChunkItem | BytesItem] = []
        self.contents = hashlib.blake2b(digest_size=32)
        """Digest of what the items hold (payloads, chunk CRC-32s), for the content-derived save id."""

    def add_bytes(self, key: str, file: str, offset: int, length: int, payload: bytes) -> None:
        self.items.append(BytesItem(key, file, offset, length))
        self.contents.update(hashlib.blake2b(payload, digest_size=32).digest())

    def add_chunk(self, chunk: _Chunk, dtype_name: str, file: str, offset: int, length: int, crc: int) -> None:
        self.items.append(ChunkItem(chunk.key, chunk.offsets, chunk.sizes, chunk.global_shape, dtype_name,
                                    file, offset, length))
        self.contents.update(struct.pack("<I", crc))

    def dump(self, path: Path, checkpoint_id: str) -> None:
        save_id = content_save_id(self.items, self.contents.digest())
        data = metadata_bytes(self.items, checkpoint_id=checkpoint_id, save_id=save_id)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def runs_head(runs: list[tuple[Path, int, int]], size: int = 8) -> bytes:
    """The first ``size`` bytes of the concatenated runs (fewer when they hold fewer)."""
    head = b""
    for path, offset, length in runs:
        if len(head) >= size:
            break
        with open(path, "rb") as handle:
            handle.seek(offset)
            head += handle.read(min(length, size - len(head)))
    return head


def slice_runs(runs: list[tuple[Path, int, int]], start: int, stop: int) -> list[tuple[Path, int, int]]:
    """Bytes ``[start, stop)`` of the concatenation of ``runs``, as runs."""
    out, position = [], 0
    for path, offset, length in runs:
        lo, hi = max(start, position), min(stop, position + length)
        if lo < hi:
            out.append((path, offset + lo - position, hi - lo))
        position += length
    return out


@dataclass(frozen=True)
class DistItem:
    """One item of a torch_dist save, placed before anything is written: a ShardedObject's bytes
    (``entry`` None) or one chunk of ``model.entries[entry]``, at ``offset`` in data file ``file``."""

    file: int
    offset: int
    length: int
    key: str
    entry: int | None = None
    chunk: _Chunk | None = None


@dataclass
class DistLayout:
    """Where every item of a torch_dist save goes, decided from names, shapes and dtypes alone.

    It depends on ``num_files`` and never on how many processes write: one process writes every
    data file, or N ranks each write whole files of it (``ops.parallel``), and the bytes are the
    same because every offset is fixed here. Items go to the file with the fewest bytes so far
    (the lowest index on a tie), as torch's writer balances them."""

    model: ModelTensors
    items: list[DistItem]
    file_names: list[str]
    file_sizes: list[int]
    payload: bytes
    """The ShardedObjects' bytes (every ``_extra_state`` item holds the same)."""

    def entries_in(self, files: set[int]) -> list[int]:
        """Indices of the entries with a chunk in ``files``, in write order."""
        seen: dict[int, None] = {}
        for item in self.items:
            if item.entry is not None and item.file in files:
                seen[item.entry] = None
        return list(seen)


_CONTAINER_LENGTHS: dict[tuple[str, tuple[int, ...]], int] = {}


def container_length(dtype: DType, shape: tuple[int, ...]) -> int:
    """Bytes of the ``torch.save`` container of one tensor of ``shape``: written to a counter with
    the data left out (the length does not depend on the values)."""
    key = (dtype.name, tuple(shape))
    if key not in _CONTAINER_LENGTHS:
        numel = 1
        for n in shape:
            numel *= n
        data = Copied(dtype.nbytes(numel), lambda: None, lambda: 0)
        _CONTAINER_LENGTHS[key] = write_torch_save(lambda chunk: None, tensor_pickle(dtype, tuple(shape)),
                                                   [("0", data, None)])
    return _CONTAINER_LENGTHS[key]


def plan_torch_dist(tensors: list[OutTensor], *, args: dict, spec: str = "local", num_files: int = 2) -> DistLayout:
    """The ``DistLayout`` of a torch_dist save of ``tensors`` (see ``write_torch_dist``)."""
    check_spec(spec)
    if num_files < 1:
        raise CkptError("num_files must be at least 1")
    model = analyse(tensors, args)
    payload = _saved_extra_state(spec)
    sizes = [0] * num_files
    items: list[DistItem] = []
    # ShardedObjects: each layer linear's _extra_state; the bytes are a torch.save of the list of the
    # rank's local objects (_mcore_to_torch_sharded_object, FORMATS.md §4.4). As torch's writer:
    # bytes items first, round robin over the files.
    for j, key in enumerate(_extra_state_objects(model)):
        k = j % num_files
        items.append(DistItem(k, sizes[k], len(payload), key))
        sizes[k] += len(payload)
    for e, entry in enumerate(model.entries):
        for chunk in _chunks(entry, model, spec):
            k = min(range(num_files), key=lambda f: sizes[f])  # torch's greedy balancing of bytes over files
            length = container_length(entry.dtype, chunk.sizes)
            items.append(DistItem(k, sizes[k], length, chunk.key, e, chunk))
            sizes[k] += length
    return DistLayout(model, items, [f"__0_{k}.distcp" for k in range(num_files)], sizes, payload)


def write_dist_files(iter_dir: Path, layout: DistLayout, files: set[int] | None = None,
                     progress: Progress | None = None,
                     on_failure: Callable[[str], None] | None = None) -> dict[int, int]:
    """Write the data files ``files`` of ``layout`` (all by default) into ``iter_dir``; returns the
    CRC-32 of every tensor item written (item index -> CRC), which ``.metadata``'s save id needs.
    Each tensor is produced once, when its first chunk here is due; ``progress(nbytes)`` follows it.

    When every tensor is copied file to file (``runs``), the data files are written side by side,
    one thread each (a tensor whose items lie in two files is copied by both): the copies then
    use every core, where ``cp`` uses one. Tensors that must be produced in memory keep the
    one-at-a-time order (and with it the memory bound). ``on_failure(name)`` hears which tensor's write failed."""
    wanted = set(range(len(layout.file_names))) if files is None else set(files)
    iter_dir.mkdir(parents=True, exist_ok=True)
    handles: dict[int, _DataFile] = {}
    crcs: dict[int, int] = {}
    by_entry: dict[int, list[int]] = {}
    for i, item in enumerate(layout.items):
        if item.file in wanted and item.entry is not None:
            by_entry.setdefault(item.entry, []).append(i)
    try:
        for k in sorted(wanted):
            handles[k] = _DataFile(iter_dir / layout.file_names[k], layout.file_sizes[k])
        lanes = _file_lanes(layout, by_entry) or [[(e, indices, True) for e, indices in by_entry.items()]]
        for item in layout.items:
            if item.file in wanted and item.entry is None:
                _expect(handles[item.file], item, handles[item.file].append(layout.payload))
        lock = threading.Lock()

        def write_lane(work: list[tuple[int, list[int], bool]]) -> None:
            for e, indices, counts in work:  # the entries' write order
                entry = layout.model.entries[e]
                try:
                    got = _write_entry(entry, [(i, layout.items[i]) for i in indices], handles)
                except BaseException:
                    if on_failure:
                        on_failure(entry.out.name)
                    raise
                with lock:
                    crcs.update(got)
                    if progress and counts:
                        progress(entry.nbytes)

        if len(lanes) == 1:
            write_lane(lanes[0])
        else:
            with ThreadPoolExecutor(len(lanes), thread_name_prefix="ckptscope-write") as pool:
                for future in [pool.submit(write_lane, lane) for lane in lanes]:
                    future.result()
        for data_file in handles.values():
            data_file.check_full()
    finally:
        for data_file in handles.values():
            data_file.close()
    return crcs


def _file_lanes(layout: DistLayout, by_entry: dict[int, list[int]]) -> list[list[tuple[int, list[int], bool]]] | None:
    """Per data file, in write order, ``(entry, its items in that file, reports progress)``, when
    every entry is a copy of source bytes (its items are slices of source byte runs, so files can be
    written concurrently and no array is held); None otherwise. An entry split over files (fc1's
    two halves) reports its progress once, from the file of its first item."""
    lanes: dict[int, list[tuple[int, list[int], bool]]] = {}
    for e, indices in by_entry.items():
        runs = layout.model.entries[e].out.runs
        if runs is None or runs() is None:
            return None
        per_file: dict[int, list[int]] = {}
        for i in indices:
            per_file.setdefault(layout.items[i].file, []).append(i)
        for n, (file, mine) in enumerate(per_file.items()):
            lanes.setdefault(file, []).append((e, mine, n == 0))
    return list(lanes.values())


def _write_entry(entry: Entry, items: list[tuple[int, DistItem]], handles: dict[int, _DataFile]) -> dict[int, int]:
    """Produce one tensor and append its chunks ``items`` (locals die on return: the array never
    outlives its turn); returns item index -> CRC-32. numpy is imported only for a tensor that is
    produced in memory: a convert made of file-to-file copies never pays its import."""
    crcs = {}
    runs = entry.out.runs() if entry.out.runs is not None else None
    array = None if runs is not None else produce_array(entry)
    for i, item in items:
        chunk, target = item.chunk, handles[item.file]
        if runs is not None:
            shape = entry.out.shape
            row_bytes = entry.nbytes // shape[0] if shape and shape[0] else 0
            part = runs if chunk.rows is None else slice_runs(runs, chunk.rows[0] * row_bytes,
                                                              chunk.rows[1] * row_bytes)
            offset, length, crc = target.append_runs(part, chunk.sizes, entry.dtype)
        else:
            import numpy as np

            piece = array if chunk.rows is None else array[chunk.rows[0]:chunk.rows[1]]
            offset, length, crc = target.append_tensor(np.ascontiguousarray(piece).reshape(chunk.sizes), entry.dtype)
        _expect(target, item, (offset, length))
        crcs[i] = crc
    return crcs


def _expect(target: _DataFile, item: DistItem, placed: tuple[int, int]) -> None:
    """The layout fixed every offset in advance: an item that lands elsewhere is a bug, never output."""
    if placed != (item.offset, item.length):
        raise RuntimeError(f"{target.name}: {item.key} written at {placed}, planned at {(item.offset, item.length)}")


def finish_torch_dist(iter_dir: Path, layout: DistLayout, crcs: dict[int, int], *, args: dict, iteration: int,
                      checkpoint_id: str | None = None) -> None:
    """``.metadata``, ``common.pt`` and ``metadata.json`` (last: its presence marks a complete save),
    once every data file of ``layout`` is written; ``crcs`` from ``write_dist_files`` (all of them)."""
    meta = _Metadata()
    names = layout.file_names
    for i, item in enumerate(layout.items):
        if item.chunk is None:
            meta.add_bytes(item.key, names[item.file], item.offset, item.length, layout.payload)
        else:
            dtype = layout.model.entries[item.entry].dtype.name
            meta.add_chunk(item.chunk, dtype, names[item.file], item.offset, item.length, crcs[i])
    meta.dump(iter_dir / ".metadata", str(checkpoint_id or iter_dir))
    common, _ = repickle({"args": argparse.Namespace(**args), "checkpoint_version": CHECKPOINT_VERSION,
                          "iteration": iteration})
    with open(iter_dir / COMMON_FILE, "wb") as handle:
        write_torch_save(handle.write, common, [])
    (iter_dir / MARKER_FILE).write_text(json.dumps(MARKER))


def write_torch_dist(iter_dir: Path, tensors: list[OutTensor], *, args: dict, iteration: int, spec: str = "local",
                     progress: Progress | None = None, num_files: int = 2, checkpoint_id: str | None = None) -> None:
    """Write a Megatron-Core torch_dist iteration dir into ``iter_dir`` (see the module docstring).

    ``args``: Megatron argument values, stored as an ``argparse.Namespace`` in ``common.pt``;
    ``swiglu`` decides the fc1 layout and ``untie_embeddings_and_output_weights`` whether
    ``output_layer.weight`` belongs (tied: no ``output_layer`` key at all, as Megatron saves it).
    ``spec`` ("local" or "te") only changes the ``_extra_state`` objects' values (None, or TE's
    empty uint8 tensor). ``num_files``: data files (megatron-core 0.16 writes 2 per rank; any
    count loads, the layout depends on it alone). ``checkpoint_id``: the location recorded in
    ``.metadata`` (default ``iter_dir``; a caller that renames the dir into place may pass the
    final path). Tensors are produced and written in list order, one at a time; ``progress(nbytes)``
    follows each. ``plan_torch_dist`` + ``write_dist_files`` + ``finish_torch_dist`` are the same
    steps for writers that split the data files between processes.
    """
    layout = plan_torch_dist(tensors, args=args, spec=spec, num_files=num_files)
    iter_dir = Path(iter_dir)
    crcs = write_dist_files(iter_dir, layout, progress=progress)
    finish_torch_dist(iter_dir, layout, crcs, args=args, iteration=iteration, checkpoint_id=checkpoint_id)


def _saved_extra_state(spec: str) -> bytes:
    """``torch.save([get_extra_state()])`` of a linear without FP8, written without torch: ``[None]``
    (local spec) or ``[empty uint8 tensor]`` (TE, see ``extra_state_value``)."""
    buffer = io.BytesIO()
    if spec == "local":
        write_torch_save(buffer.write, repickle([None])[0], [])
        return buffer.getvalue()
    uint8 = dtype_by_name("uint8")
    empty = TensorRef(StorageRef("0", uint8, "cpu", 0, "torch.ByteStorage"), 0, (0,), (1,), uint8)
    write_torch_save(buffer.write, repickle([empty])[0], [("0", b"", None)])
    return buffer.getvalue()
