"""Names for the Adam state of Megatron's distributed optimizer, which keeps it in flat buffers.

megatron-core's ``DistributedOptimizer`` lays every grad buffer out as one flat vector per
(param dtype, grad dtype) and bucket (``_ParamAndGradBuffer``, ``param_and_grad_buffer.py``): the
parameters one after another, each start padded to a multiple of 64 elements, each bucket's end
padded to a DP multiple. It saves them without names:

* torch_dist with ``distrib_optim_sharding_type = dp_reshardable`` (the default since core 0.14):
  one 1-D tensor per bucket, ``optimizer.distributed.dp_group_idx_<g>.gbuf_idx_<i>.dtype_(<param
  dtype>, <grad dtype>).bucket_idx_<b>.{param,exp_avg,exp_avg_sq}``, the bucket's end padding cut off;
* ``--ckpt-format torch``: ``distrib_optim.pt`` (``get_parameter_state_dp_zero``):
  ``{"buckets_coalesced": True, <gbuf>: {(param dtype, grad dtype): {"param", "exp_avg",
  "exp_avg_sq", "numel_unpadded"}}}``, every bucket cut at its unpadded end and the buckets
  concatenated (FORMATS.md §3.3, §4.8).

Which parameter sits where depends on the order megatron-core's DDP collected the parameters
(reversed ``named_parameters()``, by dtype, expert or not), the bucket size and tied embeddings:
not in the save. It *is* recoverable from the save itself: the buffers hold the fp32 master weights
(``param``) next to the moments, and after every step the model's weights are those masters cast to
the model dtype. So the buffer is walked from its start: at each parameter start (the next multiple
of 64 after the previous parameter, or, in a coalesced ``distrib_optim.pt``, right after it where a
new bucket begins) the model tensor whose weights equal the master there, every element (cast to
the model dtype, compared bit for bit), is the parameter, and the walk goes on after it. A position
no model tensor fits stops the naming of that save with the reason; model tensors with identical
weights that fit the same position are not told apart and get no statistics (named in the notes).
That check reads the weights and the masters once more per save.

Saved by more than one model-parallel rank (``dp_group_idx`` > 0, several ``mp_rank_*`` dirs), a
buffer holds TP/PP-local shards that are not whole model tensors: refused with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.formats.base import CheckpointReader

ALIGN = 64
"""``_pad_start_of_param_if_needed``: a parameter starts at a multiple of 64 elements of its bucket."""
PARAM_DTYPES = ("float32", "bfloat16", "float16")
"""Model dtypes whose weights are their fp32 masters rounded (to nearest even), compared bit for bit."""
_DIST = re.compile(r"^(?P<base>(?:.*\.)?optimizer\.distributed\.dp_group_idx_(?P<group>\d+)\.gbuf_idx_\d+\."
                   r"dtype_\((?:torch\.)?(?P<dtype>\w+), (?:torch\.)?\w+\)\.bucket_idx_\d+)\.exp_avg_sq$")
_LEGACY = re.compile(r"^(?P<base>distrib_optim\.(?P<group>[^.]+)\.\d+\.(?P<dtype>\w+)/\w+)\.exp_avg_sq$")


@dataclass(frozen=True)
class FlatBuffer:
    """One flat run of Adam state: its ``exp_avg_sq`` and the fp32 masters beside it."""

    moment: str
    master: str
    length: int
    dtype: str
    """The parameters' dtype (``float32``, ``bfloat16``)."""
    coalesced: bool
    """Buckets concatenated at their unpadded ends (``distrib_optim.pt``)."""


@dataclass
class FlatNames:
    """Where each parameter's ``exp_avg_sq`` is in one save's flat buffers."""

    place: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    """Model tensor name -> (buffer ``exp_avg_sq`` name, first element, element count)."""
    ambiguous: list[str] = field(default_factory=list)


def flat_buffers(reader: CheckpointReader) -> tuple[list[FlatBuffer], str | None]:
    """The distributed optimizer's flat buffers in a save, or a reason they cannot be named."""
    index = reader.index()
    found, groups = [], set()
    coalesced = {o.name.rsplit(".", 1)[0]: o.value for o in index.objects if o.name.endswith(".buckets_coalesced")}
    for name, meta in index.tensors.items():
        m = _DIST.match(name) or _LEGACY.match(name)
        if m is None or len(meta.shape) != 1:
            continue
        legacy = name.startswith("distrib_optim.")
        groups.add(m.group("group"))
        master = f"{m.group('base')}.param"
        if master not in index.tensors:
            return [], f"{name} has no fp32 master ({master}) beside it to tell its parameters by"
        if legacy and coalesced.get(f"distrib_optim.{m.group('group')}") is not True:
            return [], "distrib_optim.pt keeps its buckets uncoalesced (before megatron-core 0.7): not read"
        if m.group("dtype") not in PARAM_DTYPES:
            return [], f"{name}: parameters of dtype {m.group('dtype')} are not compared with their masters"
        found.append(FlatBuffer(name, master, int(meta.shape[0]), m.group("dtype"), legacy))
    if len(groups) > 1:
        return [], (f"saved by {len(groups)} model-parallel ranks: their flat buffers hold TP/PP shards, "
                    "not whole parameters")
    return found, None


def _dtype(name: str):
    import numpy as np

    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _bits(values):
    """The values as unsigned integers of their width: equal bits, NaN payloads included."""
    import numpy as np

    return np.ascontiguousarray(values).view(f"u{values.dtype.itemsize}").ravel()


def master_is_weights(reader: CheckpointReader, master: str, weights: str, dtype: str) -> bool:
    """Whether the saved fp32 master ``master`` cast to ``dtype`` is bit for bit the model tensor
    ``weights`` (both names as ``reader`` reads them)."""
    if dtype not in PARAM_DTYPES:
        return True  # nothing to compare by
    target = _bits(reader.read(weights))
    return target.size == 0 or (_bits(reader.read(master).astype(_dtype(dtype))) == target).all()


class _Walker:
    def __init__(self, reader: CheckpointReader, model: dict[str, tuple[str, Any]]) -> None:
        self.reader = reader
        self.model = model
        """Model tensor name -> (stored name, meta)."""
        self.first: dict[tuple[str, int], list[str]] = {}
        self._bits_cache: dict[str, Any] = {}

    def _first_bits(self, dtype: str) -> None:
        if any(k[0] == dtype for k in self.first):
            return
        for name, (stored, meta) in self.model.items():
            if meta.dtype != dtype or meta.numel == 0:
                continue
            corner = tuple(slice(0, 1) for _ in meta.shape)
            value = self.reader.read(stored, corner) if meta.shape else self.reader.read(stored)
            self.first.setdefault((dtype, int(_bits(value)[0])), []).append(name)

    def _weights(self, name: str):
        if name not in self._bits_cache:
            stored, _meta = self.model[name]
            self._bits_cache = {name: _bits(self.reader.read(stored))}  # one tensor at a time
        return self._bits_cache[name]

    def fits(self, buffer: FlatBuffer, at: int) -> list[str]:
        """Model tensors whose weights equal the masters from element ``at`` on."""
        target = _dtype(buffer.dtype)
        head = self.reader.read(buffer.master, (slice(at, at + 1),)).astype(target)
        out = []
        for name in self.first.get((buffer.dtype, int(_bits(head)[0])), []):
            n = self.model[name][1].numel
            if at + n > buffer.length:
                continue
            master = self.reader.read(buffer.master, (slice(at, at + n),)).astype(target)
            weights = self._weights(name)
            if weights.size == n and (_bits(master) == weights).all():
                out.append(name)
        return out

    def walk(self, buffer: FlatBuffer, names: FlatNames) -> None:
        self._first_bits(buffer.dtype)
        pos = bucket = 0
        while pos < buffer.length:
            aligned = bucket + -(-(pos - bucket) // ALIGN) * ALIGN
            starts = [aligned] + ([pos] if buffer.coalesced and pos != aligned else [])
            hit = None
            for at in starts:
                if at < buffer.length and (fits := self.fits(buffer, at)):
                    hit = at, fits
                    break
            if hit is None:
                raise CkptError(f"no model tensor's weights equal the fp32 masters at element {pos} of "
                                f"{buffer.master}")
            at, fits = hit
            if at != aligned:
                bucket = at  # a coalesced bucket starts right where the previous one ended
            numel = self.model[fits[0]][1].numel
            if len(fits) > 1:
                names.ambiguous += fits
            else:
                names.place[fits[0]] = (buffer.moment, at, numel)
            pos = at + numel


def name_flat_state(reader: CheckpointReader, model: dict[str, tuple[str, Any]],
                    buffers: list[FlatBuffer]) -> tuple[FlatNames | None, str]:
    """Place every parameter of ``buffers`` (see the module docstring). ``model``: every model tensor
    of the save, name -> (stored name, meta). None and the reason when a position fits no tensor."""
    names = FlatNames()
    walker = _Walker(reader, {n: v for n, v in model.items() if v[1].dtype_info.is_float})
    try:
        for buffer in buffers:
            walker.walk(buffer, names)
    except CkptError as exc:
        return None, str(exc.args[0])
    for name in set(names.ambiguous):
        names.place.pop(name, None)
    names.ambiguous = sorted(set(names.ambiguous))
    return names, ""
