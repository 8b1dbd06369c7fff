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
the model dtype, compared bit for bit), is the parameter, and the walk goes on after it (fewer than 64
elements left after the last parameter are its padding). A position no model tensor fits stops the
naming of that buffer with the reason (the save's other buffers keep theirs); model tensors with
identical weights that fit the same position are not told apart and get no statistics (named in the
notes). Fits of different lengths at one position (norms all 1.0 at the start of training, 64 and
16 wide) are tried longest first, the next when the rest of the buffer then fits nothing, and their
tensors are not told apart either. With ``--ckpt-format torch`` a pipeline stage's buffers are matched
against that stage's tensors only (a tied output layer on the last stage equals the first stage's
embedding). That check reads the weights and the masters once more per save.

Saved by more than one model-parallel rank (TP and/or PP > 1), the save holds one set of buffers per
model-parallel rank: torch_dist names it ``dp_group_idx_<g>`` (megatron-core 0.16.1's
``get_megatron_optimizer`` passes ``data_parallel_group_idx = model_parallel_rank``, the rank in the
tp-pp group), ``--ckpt-format torch`` keeps one ``mp_rank_<tp>[_<pp>]/distrib_optim.pt`` per rank.
Each rank's buffer holds that rank's local parameters: PP ranks hold different layers, and with
TP = T (``args.tensor_model_parallel_size``) a parameter is whole on every TP rank (norms) or one
of T parts: first axis (column-parallel ``linear_qkv``, ``linear_fc1``, vocab-parallel embedding and
output), second axis (row-parallel ``linear_proj``, ``linear_fc2``), or, for a gated MLP's fc1 whose
global tensor is ``[gate_all; up_all]``, the rank's ``[gate_r; up_r]``. Which one is not taken
from names: every such local shard of every model tensor is a candidate at each parameter start,
compared bit for bit like a whole tensor, and no assumption on which rank holds which part is made.
Where a whole tensor and its own first part both fit, the whole one is taken (the part is its
prefix); a shorter fit of another tensor is a choice of lengths, as above. Afterwards each tensor must
be either whole in one or more ranks or all its T parts, of one kind, once each; anything else
leaves that tensor without statistics (named in the notes). Its ``exp_avg_sq`` is then read as the
global tensor, shards put back in place (``StitchedMoments``), so means and ``--sample`` rows are of
the global parameter; a replicated tensor is read from one replica (the lowest model-parallel rank),
because its N elements are one parameter of N elements, not T of them (megatron-core gives every TP
rank the same gradient for a replicated parameter, so the replicas' moments are the same; counting
all T would weigh the norms T times in a module's mean). The naming reads each model tensor once per
TP rank whose buffers hold a part of it.
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
_RANK_DIR = re.compile(r"^mp_rank_\d+_(?P<pp>\d+)(?:_\d+)?/")
"""A ``--ckpt-format torch`` rank dir with its pipeline stage (``mp_rank_TT_PPP[_EEE]/``)."""
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
    group: str = "0"
    """The model-parallel rank that saved it (``dp_group_idx_<g>``, ``mp_rank_<tp>[_<pp>]``)."""


@dataclass
class FlatNames:
    """Where each parameter's ``exp_avg_sq`` is in one save's flat buffers."""

    place: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    """Model tensor name -> (name of its ``exp_avg_sq`` to read, first element, element count): a
    buffer's ``exp_avg_sq`` in the save's reader, or, with ``reader`` set, a name of ``reader``."""
    ambiguous: list[str] = field(default_factory=list)
    reader: StitchedMoments | None = None
    """Saved by several model-parallel ranks: where the parameters' global ``exp_avg_sq`` is read."""
    unassembled: dict[str, str] = field(default_factory=dict)
    """Model tensor name -> why its shards do not make up the tensor (no statistics for it)."""
    skipped: list[str] = field(default_factory=list)
    """Why each buffer that could not be named was left out (its tensors get no statistics)."""

    def unassembled_note(self) -> str | None:
        """One line for the tensors whose shards do not make them up, or None."""
        if not self.unassembled:
            return None
        items = sorted(self.unassembled.items())
        return (f"for {len(items)} tensor{'s' if len(items) > 1 else ''} whose model-parallel shards do not make "
                f"{'them' if len(items) > 1 else 'it'} up: " + "; ".join(f"{n}: {why}" for n, why in items))


def _group_key(group: str) -> tuple:
    """``dp_group_idx`` number, or ``mp_rank_<tp>[_<pp>]`` as (pp, tp): the model-parallel rank order."""
    if group.isdigit():
        return (int(group),)
    numbers = [int(x) for x in re.findall(r"\d+", group)]
    return tuple(reversed(numbers)) if numbers else (group,)


def _tp_size(reader: CheckpointReader) -> int | None:
    """``args.tensor_model_parallel_size`` as the save recorded it (Megatron-LM saves ``args``)."""
    for obj in reader.index().objects:
        if obj.name == "args" and isinstance(obj.value, dict):
            value = obj.value.get("tensor_model_parallel_size")
            return int(value) if isinstance(value, int) and value > 0 else None
    return None


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
        found.append(FlatBuffer(name, master, int(meta.shape[0]), m.group("dtype"), legacy, m.group("group")))
    if len(groups) > 1 and _tp_size(reader) is None:
        return [], (f"saved by {len(groups)} model-parallel ranks, and the save's args do not say the "
                    "tensor-parallel size their shards are cut by")
    found.sort(key=lambda b: _group_key(b.group))  # stable: each rank's buffers keep their order
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


WHOLE, ROWS, COLS, GLU = "whole", "rows", "cols", "glu"
_KIND_WORDS = {WHOLE: "the whole tensor", ROWS: "first-axis parts", COLS: "second-axis parts",
               GLU: "[gate; up] parts"}


@dataclass(frozen=True)
class Shard:
    """Which part of a model tensor a rank holds: the whole tensor, or part ``part`` of ``parts`` along
    the first axis (``rows``), the second (``cols``), or a gated fc1's ``[gate_part; up_part]`` (``glu``).

    In the global tensor's C order every kind is a run of equal segments of ``segment`` elements;
    segment k belongs to part ``k % parts`` and sits at ``(k // parts) * segment`` in that part's flat
    local tensor (rows: one segment per part; cols: one per part and row; glu: two per part)."""

    kind: str
    part: int
    parts: int
    segment: int

    def local(self, bits, shape: tuple[int, ...]):
        """This rank's local tensor, flat, cut out of the global tensor's flat ``bits``."""
        if self.kind == WHOLE:
            return bits
        if self.kind == ROWS:
            return bits.reshape(self.parts, -1)[self.part]
        if self.kind == GLU:
            return bits.reshape(2, self.parts, -1)[:, self.part].ravel()
        return bits.reshape(shape[0], self.parts, -1)[:, self.part].ravel()


def _shards(shape: tuple[int, ...], numel: int, tp: int) -> list[Shard]:
    """Every local shard a TP rank can hold of a tensor of ``shape`` (see the module docstring)."""
    out = [Shard(WHOLE, 0, 1, numel)]
    if tp == 1 or not shape or numel == 0:
        return out
    if shape[0] % tp == 0:
        out += [Shard(ROWS, r, tp, numel // tp) for r in range(tp)]
    if shape[0] % (2 * tp) == 0:
        out += [Shard(GLU, r, tp, numel // (2 * tp)) for r in range(tp)]
    if len(shape) > 1 and shape[1] % tp == 0:
        out += [Shard(COLS, r, tp, numel // shape[0] // tp) for r in range(tp)]
    return out


@dataclass(frozen=True)
class _Fit:
    name: str
    shard: Shard
    numel: int


class _Walker:
    def __init__(self, reader: CheckpointReader, model: dict[str, tuple[str, Any]], tp: int = 1) -> None:
        self.reader = reader
        self.model = model
        """Model tensor name -> (stored name, meta)."""
        self.tp = tp
        self.first: dict[tuple[str, int], list[_Fit]] = {}
        self._bits_cache: dict[str, Any] = {}
        self.ambiguous: set[str] = set()
        """Tensors that fit a position together with another candidate of the same length."""
        self.found: dict[str, list[tuple[Shard, str, str, int]]] = {}
        """Model tensor -> every (shard, buffer group, buffer ``exp_avg_sq``, first element) it fits."""
        self._held: dict[int, set[str] | None] = {}

    def _first_bits(self, dtype: str) -> None:
        """Each candidate's first element, read by itself: the cheap test before a whole compare."""
        if any(k[0] == dtype for k in self.first):
            return
        for name, (stored, meta) in self.model.items():
            if meta.dtype != dtype or meta.numel == 0:
                continue
            shape = tuple(meta.shape)
            for shard in _shards(shape, meta.numel, self.tp):
                at = shard.part * shard.segment  # local element 0 is global segment ``part``
                corner = tuple(slice(i, i + 1) for i in _unravel(at, shape))
                value = self.reader.read(stored, corner) if shape else self.reader.read(stored)
                numel = meta.numel // shard.parts
                self.first.setdefault((dtype, int(_bits(value)[0])), []).append(_Fit(name, shard, numel))

    def _weights(self, name: str):
        if name not in self._bits_cache:
            stored, _meta = self.model[name]
            self._bits_cache = {name: _bits(self.reader.read(stored))}  # one tensor at a time
        return self._bits_cache[name]

    def _held_by(self, buffer: FlatBuffer) -> set[str] | None:
        """The model tensors of the pipeline stage that saved ``buffer``, where the save says
        (``--ckpt-format torch``: the tensors of the ``mp_rank_TT_PPP`` dirs of its stage); None: any tensor may
        be there. Without it the last stage's tied output layer, equal to the first stage's embedding,
        fitted the embedding's place too, and neither got statistics (a probe with megatron-core's own
        saves). By stage, not by rank dir: a replicated tensor is read from one TP rank's file only."""
        numbers = re.findall(r"\d+", buffer.group)
        if not buffer.coalesced or len(numbers) < 2:
            return None
        stage = int(numbers[1])
        if stage not in self._held:
            held = set()
            for name, (_stored, meta) in self.model.items():
                for chunk in meta.chunks:
                    found = _RANK_DIR.match(str(chunk.file))
                    if found and int(found.group("pp")) == stage:
                        held.add(name)
                        break
            self._held[stage] = held or None
        return self._held[stage]

    def fits(self, buffer: FlatBuffer, at: int) -> list[_Fit]:
        """Candidate shards whose weights equal the masters from element ``at`` on."""
        target = _dtype(buffer.dtype)
        head = self.reader.read(buffer.master, (slice(at, at + 1),)).astype(target)
        held = self._held_by(buffer)
        out = []
        for fit in self.first.get((buffer.dtype, int(_bits(head)[0])), []):
            if held is not None and fit.name not in held:
                continue
            n = fit.numel
            if at + n > buffer.length:
                continue
            master = self.reader.read(buffer.master, (slice(at, at + n),)).astype(target)
            weights = fit.shard.local(self._weights(fit.name), tuple(self.model[fit.name][1].shape))
            if weights.size == n and (_bits(master) == weights).all():
                out.append(fit)
        return out

    MAX_CHOICES = 64
    """Positions where fits of different lengths are tried in turn, per buffer: past it the buffer is given up."""

    def walk(self, buffer: FlatBuffer) -> None:
        """Name the parameters of ``buffer`` in place (``found``, ``ambiguous``), or raise ``CkptError`` and
        record nothing of it.

        At a position several fits may agree: tensors of equal weights and length (not told apart: each is
        marked ambiguous), a whole tensor and its own first TP part (the whole one is taken), or tensors of
        different lengths whose weights agree as far as the shorter goes (norms all 1.0 at the start of
        training, a 64-wide layer norm beside a 16-wide q/k norm). The last kind is decided by the rest of
        the buffer: the longest is tried first, and when the walk then reaches a position nothing fits it
        comes back and tries the next length; the tensors of such a position are marked ambiguous whatever
        walk completes. Before, such a position stopped the naming of the whole save, every other buffer's
        statistics included (a probe with megatron-core's own saves at warmup)."""
        self._first_bits(buffer.dtype)
        placed: list[tuple[_Fit, int]] = []
        ambiguous: set[str] = set()
        choices: list[tuple[int, int, int, list[list[_Fit]], set[str]]] = []
        """Backtracking points: (pos, bucket, len(placed), the other lengths' fits, ambiguous then)."""
        tried = 0
        pos = bucket = 0
        while pos < buffer.length:
            aligned = bucket + -(-(pos - bucket) // ALIGN) * ALIGN
            starts = [aligned] + ([pos] if buffer.coalesced and pos != aligned else [])
            hit = None
            for at in starts:
                if at < buffer.length and (fits := self.fits(buffer, at)):
                    hit = at, fits
                    break
            if hit is None and aligned >= buffer.length:
                break  # the last parameter's start padding: no parameter can start before the end
            if hit is None:
                if choices and tried < self.MAX_CHOICES:
                    tried += 1
                    at, bucket, count, rest, ambiguous = choices.pop()
                    del placed[count:]
                    fits = rest.pop(0)
                    if rest:
                        choices.append((at, bucket, count, rest, set(ambiguous)))
                    pos = self._place(fits, at, placed, ambiguous)
                    continue
                raise CkptError(f"no model tensor's weights equal the fp32 masters at element {pos} of "
                                f"{buffer.master}")
            at, fits = hit
            if at != aligned:
                bucket = at  # a coalesced bucket starts right where the previous one ended
            by_length = self._by_length(fits)
            if len(by_length) > 1:
                ambiguous.update(f.name for group in by_length for f in group)
                choices.append((at, bucket, len(placed), by_length[1:], set(ambiguous)))
            pos = self._place(by_length[0], at, placed, ambiguous)
        for fit, at in placed:
            self.found.setdefault(fit.name, []).append((fit.shard, buffer.group, buffer.moment, at))
        self.ambiguous |= ambiguous

    @staticmethod
    def _by_length(fits: list[_Fit]) -> list[list[_Fit]]:
        """The fits at one position grouped by length, longest first; a shorter fit that is a part of a
        tensor fitting whole there is dropped (a part is its whole's prefix)."""
        lengths: dict[int, list[_Fit]] = {}
        for fit in fits:
            lengths.setdefault(fit.numel, []).append(fit)
        groups = [lengths[n] for n in sorted(lengths, reverse=True)]
        whole = {f.name for f in groups[0]}
        groups = [groups[0]] + [g for g in ([f for f in group if f.name not in whole] for group in groups[1:]) if g]
        return groups

    @staticmethod
    def _place(fits: list[_Fit], at: int, placed: list[tuple[_Fit, int]], ambiguous: set[str]) -> int:
        """Record ``fits`` (one length) at ``at``; returns where the next parameter may start."""
        placed.extend((fit, at) for fit in fits)
        if len(fits) > 1:
            ambiguous.update(f.name for f in fits)
        return at + fits[0].numel

def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        out.append(i)
    return tuple(reversed(out))


class StitchedMoments:
    """The ``exp_avg_sq`` of parameters saved as TP shards in several ranks' flat buffers, read as
    each global tensor (flat, C order): the engine reads it like a save's flat buffer. It reads
    through the save's own reader, which the timeline closes; ``close`` here closes nothing."""

    def __init__(self, reader: CheckpointReader) -> None:
        self.reader = reader
        self.pieces: dict[str, tuple[Shard, list[tuple[str, int]], int]] = {}
        """Stitched name -> (shard kind, per part: (buffer ``exp_avg_sq``, first element), global numel)."""

    def add(self, param: str, numel: int, shard: Shard, parts: list[tuple[str, int]]) -> str:
        name = f"{param} (exp_avg_sq of {len(parts)} model-parallel ranks)" if len(parts) > 1 else \
            f"{param} (exp_avg_sq)"
        self.pieces[name] = (shard, parts, numel)
        return name

    def read(self, name: str, region=None):
        """Elements ``region`` (one flat slice; None: all) of the stitched tensor ``name``."""
        import numpy as np

        shard, parts, numel = self.pieces[name]
        lo, hi = (0, numel) if region is None else (region[0].start, region[0].stop)
        s, n = shard.segment, shard.parts
        wanted: dict[int, list[tuple[int, int, int]]] = {}  # part -> (local start, out start, length)
        for k in range(lo // s, -(-hi // s)):
            a, b = max(lo, k * s), min(hi, (k + 1) * s)
            wanted.setdefault(k % n, []).append(((k // n) * s + a - k * s, a - lo, b - a))
        out = None
        for part, runs in wanted.items():
            moment, start = parts[part]
            first = runs[0][0]
            values = self.reader.read(moment, (slice(start + first, start + runs[-1][0] + runs[-1][2]),))
            if out is None:
                out = np.empty(hi - lo, values.dtype)
            for local, at, length in runs:
                out[at:at + length] = values[local - first:local - first + length]
        return out if out is not None else np.empty(0, np.float32)

    def release_pages(self) -> None:
        pass

    def close(self) -> None:
        pass


def _assemble(found: list[tuple[Shard, str, str, int]], tp: int) -> tuple[Shard, list[tuple[str, int]]] | str:
    """One tensor's shards as (kind, per part (buffer, first element)), or why they do not make it up."""
    kinds = {shard.kind for shard, *_ in found}
    if kinds == {WHOLE}:
        shard, _group, moment, at = found[0]  # buffers come in model-parallel rank order
        return shard, [(moment, at)]
    if len(kinds) > 1:
        return f"found both as {' and as '.join(_KIND_WORDS[k] for k in sorted(kinds))} in different ranks"
    parts: dict[int, list[tuple[str, int]]] = {}
    for shard, _group, moment, at in found:
        parts.setdefault(shard.part, []).append((moment, at))
    if sorted(parts) != list(range(tp)) or any(len(v) > 1 for v in parts.values()):
        held = ", ".join(f"part {p}" + (f" {len(v)} times" if len(v) > 1 else "") for p, v in sorted(parts.items()))
        return f"found as {_KIND_WORDS[found[0][0].kind]} of {tp}, not each part once ({held})"
    return found[0][0], [parts[p][0] for p in range(tp)]


def name_flat_state(reader: CheckpointReader, model: dict[str, tuple[str, Any]],
                    buffers: list[FlatBuffer]) -> tuple[FlatNames | None, str]:
    """Place every parameter of ``buffers`` (see the module docstring). ``model``: every model tensor
    of the save, name -> (stored name, meta). None and the reason when a position fits no tensor."""
    names = FlatNames()
    several = len({b.group for b in buffers}) > 1
    tp = (_tp_size(reader) or 1) if several else 1
    walker = _Walker(reader, {n: v for n, v in model.items() if v[1].dtype_info.is_float}, tp)
    failed: list[str] = []
    for buffer in buffers:  # a buffer that cannot be named leaves the others' statistics standing
        try:
            walker.walk(buffer)
        except CkptError as exc:
            failed.append(str(exc.args[0]))
    if len(failed) == len(buffers):
        return None, failed[0]
    names.skipped = failed
    names.ambiguous = sorted(walker.ambiguous)
    if several:
        names.reader = StitchedMoments(reader)
    for name, found in walker.found.items():
        if name in walker.ambiguous:
            continue
        numel = model[name][1].numel
        if not several:
            _shard, _group, moment, at = found[-1]
            names.place[name] = (moment, at, numel)
            continue
        assembled = _assemble(found, tp)
        if isinstance(assembled, str):
            names.unassembled[name] = assembled
            continue
        names.place[name] = (names.reader.add(name, numel, *assembled), 0, numel)
    return names, ""
