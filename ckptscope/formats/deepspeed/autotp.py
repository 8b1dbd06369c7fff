"""DeepSpeed AutoTP saves: every tensor-parallel rank's shards placed in the whole tensors (FORMATS.md §7).

AutoTP training (``"tensor_parallel": {"autotp_size": N}``, ZeRO 0/1/2) writes, per TP rank ``TT``,
``mp_rank_TT_model_states.pt`` and that rank's optimizer partitions ``zero_pp_rank_D_mp_rank_TT_optim_states.pt``.
Each rank's params are its local shards (``param_shapes`` are local shapes): column-parallel layers
(q/k/v, gate/up, an untied lm_head) split on dim 0, row-parallel ones (o, down) on dim 1, norms and an
untied embedding whole on every rank; HF's tensor-parallel plan splits a tied embedding by vocabulary.

Every model-states file carries ``universal_checkpoint_info["affine_map"]`` (version 1), which DeepSpeed's
own ``ds_to_universal`` rebuilds whole params from: per param (an anchored regex of its name) the
``logical_shape`` and, per TP rank, the ``pieces`` of the whole tensor the rank holds, each a ``shape``, a
``source`` (flat offset and strides in the whole tensor) and a ``dest`` (the same in the shard), and the
``locations`` (ranks) that hold it. This module reads it into ``Placement``s: where each rank's shard lies
in the whole tensor.

Only what AutoTP writes is accepted: per rank one piece that is the shard whole, a box of the whole tensor
(C strides on both sides). A piece that every rank holds (a replicated param) is read from the lowest rank;
the other ranks' copies are kept as replicas, which ``check`` compares. Anything else (sub-params of a
fused weight, strides that are no box) raises ``Unplaceable`` with the reason, and the save stays
unassembled (``check`` fails, exports refuse): never a guess.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from ckptscope.core.tensor import Chunk, TensorMeta

AFFINE_MAP_VERSION = 1


class Unplaceable(ValueError):
    """A param whose shards cannot be placed as boxes of the whole tensor (the message says why)."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where each TP rank's shard of one param lies in the whole tensor."""

    shape: tuple[int, ...]
    """The whole (logical) shape."""
    origins: dict[int, tuple[int, ...] | None]
    """TP rank -> offset of its shard in the whole tensor; None: the rank's copy is a replica of a lower
    rank's (or an empty shard), not placed."""
    shard_shapes: dict[int, tuple[int, ...]]


def affine_params(model_states: dict[str, Any]) -> dict[str, Any] | None:
    """The ``affine_map`` params of a model-states dict, or None when it has none (of a version read here)."""
    info = model_states.get("universal_checkpoint_info")
    affine = info.get("affine_map") if isinstance(info, dict) else None
    if not isinstance(affine, dict) or affine.get("version") != AFFINE_MAP_VERSION:
        return None
    params = affine.get("params")
    return params if isinstance(params, dict) and params else None


def _literal(pattern: str) -> str | None:
    """The one name an anchored, escaped pattern (``^model\\.norm\\.weight$``) matches, or None."""
    if not (pattern.startswith("^") and pattern.endswith("$")):
        return None
    literal = re.sub(r"\\(.)", r"\1", pattern[1:-1])
    return literal if re.fullmatch(pattern, literal) and re.escape(literal) == pattern[1:-1] else None


def entries_by_name(params: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The affine entry of each of ``names`` that has one: by the literal name of each pattern (what
    AutoTP writes), else by a regex match."""
    by_literal: dict[str, Any] = {}
    patterns: list[tuple[re.Pattern[str], Any]] = []
    for pattern, entry in params.items():
        literal = _literal(str(pattern))
        if literal is not None:
            by_literal[literal] = entry
        else:
            try:
                patterns.append((re.compile(str(pattern)), entry))
            except re.error:
                continue
    found = {}
    for name in names:
        entry = by_literal.get(name)
        if entry is None:
            entry = next((e for p, e in patterns if p.fullmatch(name)), None)
        if entry is not None:
            found[name] = entry
    return found


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for stride in _c_strides(shape):
        out.append(flat // stride)
        flat %= stride
    return tuple(out)


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise Unplaceable(f"not a list of integers: {value!r}")
    return tuple(value)


def placement(name: str, entry: Any) -> Placement:
    """``entry`` (one param of the affine map) as a ``Placement``. Raises ``Unplaceable``."""
    if not isinstance(entry, dict) or not isinstance(entry.get("ranks"), dict):
        raise Unplaceable(f"{name}: its affine map entry has no ranks")
    shape = _ints(entry.get("logical_shape"))
    strides = _c_strides(shape)
    origins: dict[int, tuple[int, ...] | None] = {}
    shard_shapes: dict[int, tuple[int, ...]] = {}
    placed: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    try:
        ranks = sorted((int(key), value) for key, value in entry["ranks"].items())
    except (TypeError, ValueError):
        raise Unplaceable(f"{name}: its affine map ranks {list(entry['ranks'])[:4]} are not rank numbers") from None
    for rank, rank_entry in ranks:
        if not isinstance(rank_entry, dict):
            raise Unplaceable(f"{name}: rank {rank} of its affine map entry is not a dict")
        shard = _ints(rank_entry.get("shard_shape"))
        pieces = rank_entry.get("pieces")
        if not isinstance(pieces, list) or len(pieces) != 1 or not isinstance(pieces[0], dict):
            raise Unplaceable(f"{name}: TP rank {rank} holds {len(pieces) if isinstance(pieces, list) else '?'} pieces "
                              "(sub-params of a fused weight); only one piece per rank is placed")
        piece = pieces[0]
        source, dest = piece.get("source"), piece.get("dest")
        if not (isinstance(source, list) and len(source) == 2 and isinstance(dest, list) and len(dest) == 2):
            raise Unplaceable(f"{name}: TP rank {rank}: a piece without source/dest")
        if _ints(piece.get("shape")) != shard or dest[0] != 0 or len(shard) != len(shape):
            raise Unplaceable(f"{name}: TP rank {rank}: its piece is not its whole shard")
        if math.prod(shard) and (_ints(source[1]) != strides or _ints(dest[1]) != _c_strides(shard)):
            raise Unplaceable(f"{name}: TP rank {rank}: strides {source[1]} / {dest[1]} are not a box")
        if not isinstance(source[0], int):
            raise Unplaceable(f"{name}: TP rank {rank}: source offset {source[0]!r}")
        shard_shapes[rank] = shard
        if not math.prod(shard):  # TP over fewer heads than ranks: this rank holds none (its offset is the end)
            origins[rank] = None
            continue
        origin = _unravel(source[0], shape)
        if any(o + s > n for o, s, n in zip(origin, shard, shape)):
            raise Unplaceable(f"{name}: TP rank {rank}: its shard {list(shard)} at {list(origin)} lies outside "
                              f"{list(shape)}")
        box = (origin, shard)
        origins[rank] = None if box in placed else origin
        placed.add(box)
    _check_cover(name, shape, origins, shard_shapes)
    return Placement(shape, origins, shard_shapes)


def _check_cover(name: str, shape: tuple[int, ...], origins: dict[int, tuple[int, ...] | None],
                 shard_shapes: dict[int, tuple[int, ...]]) -> None:
    """The placed shards must tile the whole tensor: their elements add up and no two overlap."""
    boxes = [(o, shard_shapes[r]) for r, o in origins.items() if o is not None]
    if sum(math.prod(s) for _, s in boxes) != math.prod(shape):
        raise Unplaceable(f"{name}: the shards hold {sum(math.prod(s) for _, s in boxes)} elements, the whole "
                          f"tensor {list(shape)} has {math.prod(shape)}")
    for i, (a, sa) in enumerate(boxes):
        for b, sb in boxes[i + 1:]:
            if all(max(x, y) < min(x + n, y + m) for x, n, y, m in zip(a, sa, b, sb)):
                raise Unplaceable(f"{name}: two TP ranks' shards overlap at {list(a)} and {list(b)}")


def moved(meta: TensorMeta, origin: tuple[int, ...]) -> tuple[Chunk, ...]:
    """``meta``'s chunks (a shard) at ``origin`` in the whole tensor."""
    return tuple(replace(c, offsets=tuple(o + d for o, d in zip(c.offsets, origin))) for c in meta.chunks)


def moved_holes(holes: list[tuple[tuple[int, ...], tuple[int, ...], str]],
                origin: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...], str]]:
    return [(tuple(o + d for o, d in zip(offsets, origin)), box, file) for offsets, box, file in holes]
