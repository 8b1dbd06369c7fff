"""``CheckpointIndex``: everything known about a checkpoint from its metadata alone."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

from ckptscope.core.dtypes import dtype_by_name
from ckptscope.core.tensor import TensorMeta


@dataclass(frozen=True, slots=True)
class FileInfo:
    path: str
    """Relative to the checkpoint root (the file name itself for single-file checkpoints)."""
    size: int
    role: str = "data"
    """What the file is for: ``data``, ``index``, ``config``, ``metadata``, ``tokenizer``, ..."""


@dataclass(frozen=True, slots=True)
class ObjectEntry:
    """A non-tensor item: args, iteration, rng state, optimizer scalars, config.

    ``value`` is already made safe: pickled objects arrive as stubs rendered into plain dicts
    (``{"__class__": "argparse.Namespace", ...}``) so they can be browsed without importing
    their classes.
    """

    name: str
    type: str
    value: Any = None


@dataclass(frozen=True, slots=True)
class Issue:
    """Damage a reader found while indexing (a missing or short file, a missing completeness marker,
    an index that disagrees with its shards), kept structured for ``ckptscope check``.

    Readers go on past such damage so that whatever is readable stays browsable; every issue also
    has a human line in ``CheckpointIndex.warnings``.
    """

    kind: str
    """Stable identifier: ``missing-file``, ``truncated``, ``missing-marker``, ``index-mismatch``, ..."""
    detail: str
    file: str | None = None
    """Relative to the checkpoint root, when one file is concerned."""
    tensors: tuple[str, ...] = ()
    """Stored tensor names concerned, when known."""


def bytes_by_dtype(metas: Iterable[TensorMeta]) -> dict[str, int]:
    """Bytes per dtype, largest first. One pass, elements summed per dtype before converting to
    bytes (this runs on every open; 20k ``nbytes`` property calls showed in profiles); sub-byte
    dtypes round up per tensor, as they are stored. A block-scaled tensor (FP8 + scales, MXFP4) counts
    its stored bytes, payload and scales, under its scheme (``fp8_block``), not the float32 it reads as."""
    metas = list(metas)
    elements: dict[str, int] = {}
    scaled: Counter[str] = Counter()
    prod = math.prod
    dtypes = set(map(_dtype_of, metas))
    if len(dtypes) == 1 and not any(map(_attrs_of, metas)):  # one dtype, nothing quantised: C-level passes
        dtype = dtypes.pop()
        if dtype_by_name(dtype).bits % 8 == 0:
            return {dtype: dtype_by_name(dtype).nbytes(count_elements(metas))}
    for t in metas:
        if t.attrs:
            scheme = t.attr("quant_scheme")
            if scheme is not None:
                scaled[scheme] += int(t.attr("stored_bytes") or 0)
                continue
        dtype = t.dtype
        elements[dtype] = elements.get(dtype, 0) + prod(t.shape)
    packed: Counter[str] = Counter()
    for name in elements:
        if dtype_by_name(name).bits % 8:
            packed[name] = sum(t.nbytes for t in metas if t.dtype == name)
    counts = Counter({d: packed[d] if d in packed else dtype_by_name(d).nbytes(n) for d, n in elements.items()})
    counts.update(scaled)
    return dict(counts.most_common())


INFERRED_SHAPES = "global_shapes"
"""Metadata key a reader sets when its global shapes are inferred from the pieces it found, not stored
(torch's HuggingFaceStorageWriter shards): ``check`` and ``inspect`` then compare them with config.json."""

TIED_BY_CONFIG = "tied_by_config"
"""Attr of a stored copy of a tied weight (``lm_head.weight`` beside ``model.embed_tokens.weight`` when the
config ties them: FSDP, DCP and Trainer saves keep both, on separate storage). transformers builds one
parameter of them, so it is counted once, like a ``shares_storage_with`` pair; the bytes are not shared."""


def storage_aliases(metas: Iterable[TensorMeta], stored: Iterable[str] | None = None, *,
                    ties: bool = True) -> dict[str, str]:
    """Stored name -> the earlier tensor whose bytes it shares (``shares_storage_with``: tied embeddings
    in a ``torch.save`` file) or that the config ties it to (``TIED_BY_CONFIG``), in the order given. The one rule by which parameters, bytes and an HF index's
    ``total_size`` count such a pair once, as ``sum(p.numel() for p in model.parameters())`` does.
    ``stored``: each meta's stored name, where the metas carry other names (a model view without its
    ``state_dict.`` wrapper); ``shares_storage_with`` always names stored tensors. ``ties=False`` leaves
    the config's ties out: for counting bytes, which such a copy has of its own."""
    metas = list(metas)
    if not any(map(_attrs_of, metas)):  # most checkpoints: one C-level pass
        return {}
    names = [m.name for m in metas] if stored is None else list(stored)
    seen: set[str] = set()
    aliases: dict[str, str] = {}
    for meta, name in zip(metas, names):
        sharers = (meta.attr("shares_storage_with") or (meta.attr(TIED_BY_CONFIG) if ties else None)
                   if meta.attrs else None)
        earlier = next((o for o in sharers.split(",") if o in seen), None) if sharers else None
        if earlier is None:
            seen.add(name)
        else:
            aliases[name] = earlier
    return aliases


def count_elements(metas: Iterable[TensorMeta]) -> int:
    """Elements of all ``metas`` together (``sum(t.numel for t in metas)``, without a property call per tensor)."""
    return sum(map(math.prod, map(_shape_of, metas)))


_shape_of = attrgetter("shape")
_dtype_of = attrgetter("dtype")
_attrs_of = attrgetter("attrs")


@dataclass(slots=True)
class CheckpointIndex:
    """The metadata view of one checkpoint. Built by a reader's ``index()``; never holds tensor data."""

    path: str
    format: str
    tensors: dict[str, TensorMeta] = field(default_factory=dict)
    objects: list[ObjectEntry] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    """Format metadata: safetensors ``__metadata__``, index metadata, iteration, ..."""
    files: list[FileInfo] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    issues: list[Issue] = field(default_factory=list)
    """Structured damage (see ``Issue``); each one also appears in ``warnings``."""
    views: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Logical per-layer names derived from stored tensors: ``view name -> (stored name, index on
    axis 0)``. Megatron torch_dist stores all layers of a homogeneous stack as one tensor with a
    leading layer axis (``decoder.layers.mlp.linear_fc2.weight`` ``[L, H, F]``); its views are
    ``decoder.layers.{i}.mlp.linear_fc2.weight`` ``[H, F]``. Views are never in ``tensors``: counts
    and bytes stay those of what is stored. ``CheckpointReader.meta``/``read`` accept view names."""

    @property
    def saved_config(self) -> dict[str, Any] | None:
        """The ``config.json`` saved with the weights, as the reader kept it (object ``config``), if any."""
        return next((o.value for o in self.objects if o.name == "config" and isinstance(o.value, dict)), None)

    def add_issue(self, kind: str, detail: str, *, file: str | None = None, tensors: tuple[str, ...] = (),
                  warning: str | None = None) -> None:
        """Record damage: an ``Issue`` for ``check`` and a warning line (``warning``, or one made
        from the file and detail) for ``inspect`` and the TUI."""
        self.issues.append(Issue(kind, detail, file, tuple(tensors)))
        line = warning if warning is not None else (f"{file}: {detail}" if file else detail)
        if line not in self.warnings:
            self.warnings.append(line)

    def __iter__(self) -> Iterator[TensorMeta]:
        return iter(self.tensors.values())

    def __len__(self) -> int:
        return len(self.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    @property
    def num_params(self) -> int:
        return count_elements(self.tensors.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_per_dtype().values())

    def bytes_per_dtype(self) -> dict[str, int]:
        """Bytes per dtype, largest first (see ``bytes_by_dtype``); bytes two tensors share count once."""
        aliases = storage_aliases(self.tensors.values(), ties=False)
        if not aliases:
            return bytes_by_dtype(self.tensors.values())
        return bytes_by_dtype(t for n, t in self.tensors.items() if n not in aliases)

    def view_meta(self, name: str) -> TensorMeta:
        """The ``TensorMeta`` of a per-layer view: the stored tensor without its leading axis.

        Its chunks are the stored chunks that hold layer ``i``, with the layer axis dropped; their
        file and byte fields still describe the stored chunk (exact when the stored chunk holds a
        single layer, as Megatron writes them). Reading goes through the stored tensor.
        """
        stored_name, layer = self.views[name]
        stored = self.tensors[stored_name]
        chunks = tuple(
            replace(c, offsets=c.offsets[1:], shape=c.shape[1:])
            for c in stored.chunks
            if c.offsets[0] <= layer < c.offsets[0] + c.shape[0]
        )
        attrs = tuple((k, v) for k, v in stored.attrs if k != "view_of")
        attrs += (("view_of", stored_name), ("layer", str(layer)))
        return TensorMeta(name=name, dtype=stored.dtype, shape=stored.shape[1:], chunks=chunks, attrs=attrs)

    def logical_tensors(self) -> dict[str, TensorMeta]:
        """Stored tensors with every stacked tensor replaced by its per-layer views (in order).

        This is the name space to compare or convert with (it matches per-layer checkpoints);
        ``tensors`` stays the name space of what is on disk.
        """
        by_stored: dict[str, list[str]] = {}
        for view, (stored_name, _) in self.views.items():
            by_stored.setdefault(stored_name, []).append(view)
        out: dict[str, TensorMeta] = {}
        for name, meta in self.tensors.items():
            if name in by_stored:
                for view in by_stored[name]:
                    out[view] = self.view_meta(view)
            else:
                out[name] = meta
        return out

    @property
    def iteration(self) -> int | None:
        value = self.metadata.get("iteration")
        return value if isinstance(value, int) else None


_TIED_PAIR = ("lm_head.weight", "model.embed_tokens.weight")


def mark_config_tie(index: CheckpointIndex, config: dict | None) -> None:
    """A config that ties the embeddings (an HF dir's, verl's ``huggingface/``), over weights that store
    ``lm_head.weight`` beside the embedding (FSDP's full state dict, a Trainer under FSDP, verl's FSDP rank
    files): transformers builds one parameter of the two, so the pair is marked (``TIED_BY_CONFIG``, on
    both: either may come first) and counted once. A probe's count was 6,736 where ``model.parameters()``
    gives 5,712. The bytes stay apart; convert refuses a copy that differs (``ops.convert.plan``)."""
    if not config or config.get("tie_word_embeddings") is not True:
        return
    head, embed = (index.tensors.get(name) for name in _TIED_PAIR)
    if head is None or embed is None or head.shape != embed.shape or head.attr("shares_storage_with"):
        return
    index.tensors[_TIED_PAIR[0]] = replace(head, attrs=head.attrs + ((TIED_BY_CONFIG, _TIED_PAIR[1]),))
    index.tensors[_TIED_PAIR[1]] = replace(embed, attrs=embed.attrs + ((TIED_BY_CONFIG, _TIED_PAIR[0]),))
