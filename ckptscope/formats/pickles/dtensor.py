"""DTensor and ShardedTensor values of per-rank ``torch.save`` files, decoded from safe-unpickler stubs.

Both pickle as ``_rebuild_from_type_v2(_rebuild_wrapper_subclass, cls, (cls, dtype, global size,
stride, ...), state)`` (checked on torch 2.13); the safe unpickler never builds them, so their
arguments and state are read here instead:

* DTensor state ``{"_local_tensor": tensor, "_spec": DTensorSpec(mesh, placements, tensor_meta)}``.
  The local tensor's global offset follows from the placements, the mesh shape and the saving
  rank's mesh coordinate (``DeviceMesh._coordinate_on_dim``): ``Shard(d)`` splits dim ``d`` like
  ``torch.chunk`` (FORMATS.md §5.5), ``Replicate`` keeps it whole.
* ShardedTensor (FSDP1 without a device mesh) state ``(local_shards, ShardedTensorMetadata,
  ProcessGroupState, ChunkShardingSpec, init_rrefs)`` (FORMATS.md §6.1): each local shard carries
  its ``shard_offsets``; the metadata lists every rank's shard. ``ProcessGroupState`` is pickled as
  ``getattr(ShardedTensor, "ProcessGroupState")``, hence ``EXTRA_GLOBALS``.

Nothing here imports torch.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ckptscope.formats.pickles.safe import PickleStub, TensorRef, stub_class, type_name

# --- the unpickler's extra stand-in -----------------------------------------------------------------


def _stub_getattr(obj: Any, name: Any) -> Any:
    """``getattr(cls, "Nested")`` on a stub class gives the nested class's stub. ShardedTensor pickles
    its ``ProcessGroupState`` this way; anything else stays refused, so nothing real is looked up."""
    if isinstance(obj, type) and issubclass(obj, PickleStub) and isinstance(name, str) and name.isidentifier():
        return stub_class(obj.stub_module, f"{obj.stub_name}.{name}")
    raise pickle.UnpicklingError("getattr is only allowed on stub classes")


EXTRA_GLOBALS = {("builtins", "getattr"): _stub_getattr, ("__builtin__", "getattr"): _stub_getattr}


# --- decoding DTensor / ShardedTensor stubs ---------------------------------------------------------


def _fields(value: Any) -> dict[str, Any]:
    """The attributes a stub was built with (BUILD dict state, slot state, SETITEMs)."""
    out: dict[str, Any] = {}
    state = value.state if isinstance(value, PickleStub) else value
    if isinstance(state, (tuple, list)) and len(state) == 2 and all(p is None or isinstance(p, dict) for p in state):
        state = {**(state[0] or {}), **(state[1] or {})}  # (dict state, slot state)
    if isinstance(state, dict):
        out.update({str(k): v for k, v in state.items()})
    if isinstance(value, PickleStub):
        out.update({str(k): v for k, v in value.dict_items.items()})
    return out


def _stub_name(value: Any) -> str:
    if isinstance(value, type) and issubclass(value, PickleStub):
        return value.stub_name
    if isinstance(value, PickleStub):
        return type(value).stub_name
    return ""


def _ints(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    return None


def _wrapper_parts(leaf: Any) -> tuple[str, tuple[Any, ...], Any] | None:
    """``(class name, wrapper args, state)`` of a pickled tensor subclass, or None."""
    if not isinstance(leaf, PickleStub) or type(leaf).qualname() != "torch._tensor._rebuild_from_type_v2":
        return None
    if len(leaf.args) < 4 or _stub_name(leaf.args[0]) != "_rebuild_wrapper_subclass":
        return None
    cls, args, state = _stub_name(leaf.args[1]), leaf.args[2], leaf.args[3]
    return cls, tuple(args) if isinstance(args, (list, tuple)) else (), state


@dataclass(frozen=True, slots=True)
class Placement:
    kind: str
    """``shard``, ``replicate``, or what cannot be shown as chunks: ``partial``, ``strided``, ``unknown``."""
    dim: int | None = None
    label: str = ""


def _placement(value: Any) -> Placement:
    name = _stub_name(value)
    fields = _fields(value)
    dim = fields.get("dim")
    if name == "Shard" and isinstance(dim, int):
        return Placement("shard", dim, f"Shard({dim})")
    if name == "Replicate":
        return Placement("replicate", None, "Replicate()")
    if name == "_StridedShard":
        return Placement("strided", dim if isinstance(dim, int) else None,
                         f"_StridedShard(dim={dim}, split_factor={fields.get('split_factor')})")
    if name == "Partial":
        return Placement("partial", None, f"Partial({fields.get('reduce_op', 'sum')})")
    return Placement("unknown", None, name or type_name(value))


def _axis_size(shape: Any) -> int | None:
    if isinstance(shape, int) and not isinstance(shape, bool):
        return shape
    if isinstance(shape, (list, tuple)) and shape:
        sizes = [_axis_size(s) for s in shape]
        return None if any(s is None for s in sizes) else math.prod(s for s in sizes if s is not None)
    return None


@dataclass(frozen=True, slots=True)
class MeshInfo:
    shape: tuple[int, ...] | None
    names: tuple[str, ...]
    coordinate: tuple[int, ...] | None
    """The saving rank's coordinate (``DeviceMesh._coordinate_on_dim``), when pickled."""

    @property
    def label(self) -> str:
        if self.shape is None:
            return ", ".join(self.names) or "?"
        names = self.names if len(self.names) == len(self.shape) else tuple(f"dim{i}" for i in range(len(self.shape)))
        return ", ".join(f"{n}={s}" for n, s in zip(names, self.shape))


def _mesh(value: Any) -> MeshInfo:
    """Mesh shape from ``_layout`` (torch >= 2.9: one ``_FlatLayout`` per mesh dim) or the pickled
    ``mesh`` rank tensor (older torch); names from ``_mesh_dim_names``."""
    fields = _fields(value)
    shape: tuple[int, ...] | None = None
    axes = _fields(fields.get("_layout")).get("axes")
    if isinstance(axes, (list, tuple)) and axes:
        sizes = [_axis_size(_fields(a).get("shape")) for a in axes]
        if all(s is not None for s in sizes):
            shape = tuple(s for s in sizes if s is not None)
    mesh_tensor = fields.get("mesh")
    if shape is None and isinstance(mesh_tensor, TensorRef):
        shape = mesh_tensor.shape
    raw_names = fields.get("_mesh_dim_names", fields.get("mesh_dim_names"))
    names = tuple(str(n) for n in raw_names) if isinstance(raw_names, (list, tuple)) else ()
    coordinate = _ints(fields.get("_coordinate_on_dim"))
    return MeshInfo(shape, names, coordinate)


def unravel(rank: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major coordinate of ``rank`` in a mesh laid out as ``arange(W).reshape(shape)``."""
    coord = []
    for size in reversed(shape):
        coord.append(rank % size)
        rank //= size
    return tuple(reversed(coord))


def local_box(global_shape: tuple[int, ...], placements: tuple[Placement, ...], mesh_shape: tuple[int, ...],
              coordinate: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Global offset and shape of one rank's local tensor: ``Shard(d)`` on mesh dim ``i`` cuts the
    current extent of dim ``d`` into ``mesh_shape[i]`` ``torch.chunk``-style pieces (ceil size, so
    the last pieces are shorter or empty) and keeps piece ``coordinate[i]``; mesh dims apply in order.
    None for placements that are not plain chunks (Partial, _StridedShard)."""
    offsets, shape = [0] * len(global_shape), list(global_shape)
    for mesh_dim, placement in enumerate(placements):
        if placement.kind == "replicate":
            continue
        if placement.kind != "shard" or placement.dim is None or not global_shape:
            return None
        dim = placement.dim % len(global_shape)
        pieces, index = mesh_shape[mesh_dim], coordinate[mesh_dim]
        full = -(-shape[dim] // pieces)
        start = min(index * full, shape[dim])
        stop = min(start + full, shape[dim])
        offsets[dim] += start
        shape[dim] = stop - start
    return tuple(offsets), tuple(shape)


@dataclass(slots=True)
class Piece:
    """One rank's stored part of a tensor."""

    ref: TensorRef
    offsets: tuple[int, ...]


@dataclass(slots=True)
class Decoded:
    """What one rank file says about one tensor."""

    kind: str
    """``DTensor``, ``ShardedTensor`` or ``Tensor`` (a plain tensor saved by every rank)."""
    shape: tuple[int, ...]
    dtype: str
    pieces: list[Piece] = field(default_factory=list)
    expected: list[tuple[tuple[int, ...], tuple[int, ...], int]] = field(default_factory=list)
    """Every rank's box ``(offsets, shape, rank)`` as the save laid them out, to name what a missing
    rank file held. Empty when unknown."""
    attrs: tuple[tuple[str, str], ...] = ()
    problem: str | None = None
    world: int | None = None
    """Ranks the save was laid out over, as the value itself records it (the DTensor's pickled mesh,
    the ShardedTensor's shard placements); None when it does not say. A set of rank files named
    without their world size (accelerate's) learns it here."""


def _global_dtype(args: tuple[Any, ...], fallback: str) -> str:
    dtype = args[1] if len(args) > 1 else None
    return getattr(dtype, "name", fallback) if dtype is not None else fallback


def decode_dtensor(args: tuple[Any, ...], state: Any, rank: int, world_size: int) -> Decoded:
    fields = _fields(state)
    local, spec = fields.get("_local_tensor"), _fields(fields.get("_spec"))
    meta_args = spec.get("tensor_meta").args if isinstance(spec.get("tensor_meta"), PickleStub) else ()
    shape = _ints(meta_args[0]) if meta_args else None
    if shape is None:
        shape = _ints(args[2]) if len(args) > 2 else None
    if not isinstance(local, TensorRef) or shape is None:
        return Decoded("DTensor", shape or (), "", problem="DTensor without a local tensor or a global shape")
    placements = tuple(_placement(p) for p in spec.get("placements") or ())
    mesh = _mesh(spec.get("mesh"))
    attrs = (("kind", "DTensor"), ("placements", "(" + ", ".join(p.label for p in placements) + ")"),
             ("mesh", mesh.label))
    decoded = Decoded("DTensor", shape, _global_dtype(args, local.dtype.name), attrs=attrs,
                      world=math.prod(mesh.shape) if mesh.shape is not None else None)
    mesh_shape = mesh.shape
    if mesh_shape is None and len(placements) == 1:
        mesh_shape = (world_size,)
    if mesh_shape is None or len(mesh_shape) != len(placements):
        decoded.problem = f"DTensor mesh shape unknown for placements {attrs[1][1]}"
        return decoded
    bad = [p.label for p in placements if p.kind not in ("shard", "replicate")]
    if bad:
        decoded.problem = f"placement {', '.join(bad)} cannot be shown as chunks"
        return decoded
    coordinate = mesh.coordinate if mesh.coordinate is not None and len(mesh.coordinate) == len(mesh_shape) \
        else unravel(rank, mesh_shape)
    box = local_box(shape, placements, mesh_shape, coordinate)
    if box is None or box[1] != local.shape:
        decoded.problem = (f"rank {rank}'s local tensor {list(local.shape)} does not match {attrs[1][1]} on mesh "
                           f"{mesh.label} at {list(coordinate)} (expected {list(box[1]) if box else '?'})")
        return decoded
    decoded.pieces.append(Piece(local, box[0]))
    if math.prod(mesh_shape) == world_size:
        for other in range(world_size):
            other_box = local_box(shape, placements, mesh_shape, unravel(other, mesh_shape))
            if other_box is not None:
                decoded.expected.append((other_box[0], other_box[1], other))
    return decoded


def decode_sharded_tensor(args: tuple[Any, ...], state: Any) -> Decoded:
    """FSDP1 without a mesh: ``(local_shards, ShardedTensorMetadata, pg_state, spec, init_rrefs)``."""
    parts = tuple(state) if isinstance(state, (list, tuple)) else ()
    local_shards = parts[0] if parts and isinstance(parts[0], list) else []
    metadata = _fields(parts[1]) if len(parts) > 1 else {}
    shape = _ints(metadata.get("size")) or (_ints(args[2]) if len(args) > 2 else None)
    spec = _fields(parts[3]) if len(parts) > 3 else {}
    dim = spec.get("dim")
    attrs = (("kind", "ShardedTensor"),)
    if isinstance(dim, int):
        attrs += (("placements", f"ChunkShardingSpec(dim={dim})"),)
    if shape is None:
        return Decoded("ShardedTensor", (), "", problem="ShardedTensor without a global size")
    decoded = Decoded("ShardedTensor", shape, _global_dtype(args, ""), attrs=attrs)
    for shard in local_shards:
        shard_fields = _fields(shard)
        tensor, shard_meta = shard_fields.get("tensor"), _fields(shard_fields.get("metadata"))
        offsets = _ints(shard_meta.get("shard_offsets"))
        if not isinstance(tensor, TensorRef) or offsets is None or len(offsets) != len(shape):
            decoded.problem = "a local shard without a tensor or offsets"
            return decoded
        decoded.pieces.append(Piece(tensor, offsets))
        decoded.dtype = decoded.dtype or tensor.dtype.name
    for entry in metadata.get("shards_metadata") or ():
        entry_fields = _fields(entry)
        offsets, sizes = _ints(entry_fields.get("shard_offsets")), _ints(entry_fields.get("shard_sizes"))
        owner = _fields(entry_fields.get("placement")).get("_rank")
        if offsets is not None and sizes is not None and isinstance(owner, int):
            decoded.expected.append((offsets, sizes, owner))
    if decoded.expected:
        decoded.world = max(owner for _, _, owner in decoded.expected) + 1
    return decoded


def holds_sharded(value: Any) -> bool:
    """Does a state dict hold a DTensor or ShardedTensor value anywhere? A cheap look at the pickled
    wrapper classes only, so a plain file pays next to nothing for the question."""
    if isinstance(value, dict):
        return any(holds_sharded(child) for child in value.values())
    if isinstance(value, TensorRef) or not isinstance(value, PickleStub):
        return False
    parts = _wrapper_parts(value)
    return parts is not None and parts[0] in ("DTensor", "ShardedTensor")


def decode_value(leaf: Any, rank: int, world_size: int) -> Decoded | None:
    """A rank file's value as distributed-tensor parts, or None when it is not a tensor at all."""
    if isinstance(leaf, TensorRef):
        if leaf.storage is None:
            return None
        return Decoded("Tensor", leaf.shape, leaf.dtype.name, [Piece(leaf, (0,) * len(leaf.shape))],
                       attrs=(("kind", "Tensor (saved by every rank)"),))
    parts = _wrapper_parts(leaf)
    if parts is None:
        return None
    cls, args, state = parts
    if cls == "DTensor":
        return decode_dtensor(args, state, rank, world_size)
    if cls == "ShardedTensor":
        return decode_sharded_tensor(args, state)
    return Decoded(cls, _ints(args[2]) or () if len(args) > 2 else (), "",
                   problem=f"tensor subclass {cls} is not supported")


def walk_state(value: Any, rank: int, world_size: int, prefix: str = "") -> Iterator[tuple[str, Any, Decoded | None]]:
    """``(dotted name, leaf, decoded)`` for a rank's state dict: tensors of any kind are leaves
    (``decoded`` set); dicts and lists are walked (``flatten`` would see a DTensor stub as opaque);
    anything else is an object leaf (``decoded`` None)."""
    decoded = decode_value(value, rank, world_size)
    if decoded is not None:
        yield prefix, value, decoded
        return
    if isinstance(value, dict) and value:
        for key, child in value.items():
            yield from walk_state(child, rank, world_size, f"{prefix}.{key}" if prefix else str(key))
        return
    yield prefix, value, None
