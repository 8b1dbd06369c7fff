"""Run a ``TimelinePlan``: stream every followed tensor through all iterations once, in bounded blocks.

A work unit is one block of rows of one tensor (at most ``BLOCK_ELEMS`` elements): it reads that
block from iteration 1, 2, ... in turn, keeping only the previous iteration's copy as stored, so
each stored byte is read exactly once and a unit holds two stored blocks (at most two float64 ones,
16 MB, for a block with NaN or Inf) however many iterations there are. Worker threads take units
in order (numpy, ``preadv`` and ``memcmp`` release the GIL), and mapped pages are released as
reading goes on, so memory does not grow with the checkpoint or the run. Block results are merged
in block order, so sums (and the fingerprints built from them) do not depend on thread timing.

An iteration whose fingerprints (per tensor: sum of squares, NaN and Inf counts) all equal an
earlier iteration's is compared with it byte for byte by the diff engine before it is flagged
``stale``: equal sums are a hint, not a proof.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ckptscope.core.units import plural
from ckptscope.formats.filecopy import read_exact_fd
from ckptscope.ops.blockmath import (
    PIECE,
    buffer_address,
    memcmp,
    same_bytes,
    single_threaded_blas,
    sum_squares,
    widen,
)
from ckptscope.ops.blockio import RELEASE_EVERY, ByteReader
from ckptscope.ops.blockio import split_box as split_rows
from ckptscope.ops.timeline.flags import (
    DEFAULT_FACTOR,
    Flag,
    exploding_flags,
    frozen_flags,
    lora_base_weights,
    nonfinite_flags,
    sort_flags,
    stale_flag,
)
from ckptscope.ops.timeline.plan import OptimizerTensor, TimelinePlan, TimelineTensor
from ckptscope.ops.timeline.series import MomentSeries, MomentSums, Series, Sums, moments_of, series_of

BLOCK_ELEMS = 1 << 20
"""Elements per block: 2 MB stored in bf16; two float64 copies (a block with NaN or Inf) are 16 MB.
Measured: 1M is faster than 256K (per-block overhead) and than 4M (the blocks leave the cache)."""

Progress = Callable[[int, int], None]
PROGRESS_EVERY = 0.05
"""Seconds between progress reports (and cancellation checks) from the calling thread."""


@dataclass
class TimelineOptions:
    frozen_below: float = 0.0
    """A step with relative change at most this is "no change" (0: exactly unchanged)."""
    explode_factor: float = DEFAULT_FACTOR
    workers: int | None = None
    block_elems: int = BLOCK_ELEMS


@dataclass
class TimelineResult:
    root: str
    kind: str
    iterations: list[int]
    paths: list[str]
    lr: list[float | None]
    tensors: list[Series]
    modules: list[Series]
    """Per module (``plan.module_of``): a layer's attention, MLP, experts, norms; embeddings; head."""
    layers: list[Series]
    """Per repeated layer (``model.layers.0``), all its tensors together."""
    model: Series
    moments: list[MomentSeries] = field(default_factory=list)
    """Adam statistics per parameter, then per module (``MomentSeries.module`` is None for modules)."""
    moment_modules: list[MomentSeries] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    optimizer_note: str | None = None
    sample: int | None = None
    bytes_read: int = 0
    seconds: float = 0.0

    @property
    def steps(self) -> list[tuple[int, int]]:
        return list(zip(self.iterations, self.iterations[1:]))

    def to_json(self) -> dict[str, Any]:
        labels = self.iterations
        return {
            "root": self.root, "kind": self.kind, "iterations": labels, "paths": self.paths,
            "lr": [_finite(v) for v in self.lr], "sample_rows": self.sample,
            "flags": [f.to_json() for f in self.flags],
            "model": self.model.to_json(labels),
            "layers": [s.to_json(labels) for s in self.layers],
            "modules": [s.to_json(labels) for s in self.modules],
            "tensors": [s.to_json(labels) for s in self.tensors],
            "optimizer": {"note": self.optimizer_note,
                          "modules": [m.to_json(labels) for m in self.moment_modules],
                          "tensors": [m.to_json(labels) for m in self.moments]},
            "notes": self.notes, "bytes_read": self.bytes_read,
        }

    def csv_rows(self) -> Iterator[tuple]:
        """Long format: ``level, name, iteration, metric, value``; per-step metrics sit at the later
        iteration of the step."""
        labels = self.iterations
        yield ("level", "name", "iteration", "metric", "value")
        for k, lr in enumerate(self.lr):
            if lr is not None:
                yield ("run", "lr", labels[k], "lr", lr)
        groups = (("model", [self.model]), ("layer", self.layers), ("module", self.modules), ("tensor", self.tensors))
        for level, items in groups:
            for s in items:
                for k, label in enumerate(labels):
                    yield (level, s.name, label, "norm", s.norm[k])
                    yield (level, s.name, label, "nan", s.nan[k])
                    yield (level, s.name, label, "inf", s.inf[k])
                    if k:
                        yield (level, s.name, label, "rel_change", s.change[k - 1])
                        yield (level, s.name, label, "abs_change", s.abs_change[k - 1])
                        yield (level, s.name, label, "max_abs_change", s.max_abs_change[k - 1])
        for level, items in (("optimizer_module", self.moment_modules), ("optimizer_tensor", self.moments)):
            for m in items:
                for k, label in enumerate(labels):
                    if m.exp_avg_sq_mean[k] is not None:
                        yield (level, m.name, label, "exp_avg_sq_mean", m.exp_avg_sq_mean[k])
                    if m.step_size_mean[k] is not None:
                        yield (level, m.name, label, "step_size_mean", m.step_size_mean[k])
        for f in self.flags:
            yield ("flag", f.subject, f.iteration, f.kind, f.reason)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _slices(box) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) for lo, hi in box)


def _shifted(box, offset: int | None) -> tuple[slice, ...]:
    """A flat box of a parameter as the slice of the flat optimizer buffer that holds it."""
    (lo, hi), = box
    return (slice(offset + lo, offset + hi),)


def _boxes(shape: tuple[int, ...], rows, block_elems: int) -> list:
    if not shape:
        return [()]
    full = tuple((0, n) for n in shape)
    runs = [((lo, hi),) + full[1:] for lo, hi in rows] if rows else [full]
    return [b for run in runs for b in split_rows(run, block_elems)]


class _Reading:
    """Byte accounting, page release and open files shared by the worker threads."""

    def __init__(self, plan: TimelinePlan) -> None:
        self.plan = plan
        self.lock = threading.Lock()
        self.bytes_read = 0
        self.since_release = 0
        self.files = ByteReader()
        self.runs: dict[int, list[_Run | None]] = {}

    def count(self, nbytes: int) -> None:
        with self.lock:
            self.bytes_read += nbytes
            self.since_release += nbytes
            release = self.since_release >= RELEASE_EVERY
            if release:
                self.since_release = 0
        if release:
            for reader in self.plan.all_readers():
                reader.release_pages()

    def runs_of(self, t: int) -> list[_Run | None]:
        """Per iteration, where tensor ``t`` lies as one run of bytes (None: read it otherwise).
        Looked up once per tensor: ``byte_span`` per block and iteration cost more than the read."""
        with self.lock:
            runs = self.runs.get(t)
        if runs is None:
            tensor = self.plan.tensors[t]
            runs = [_run_of(reader, name, tensor.shape, self.files)
                    for reader, name in zip(self.plan.readers, tensor.stored)]
            with self.lock:
                self.runs[t] = runs
        return runs

    def close(self) -> None:
        self.files.close()


@dataclass(frozen=True)
class _Run:
    """A tensor stored as one C-order run of bytes: ``fd`` from ``offset``, ``row_bytes`` per
    first-axis row (the whole tensor for a scalar), decoded as ``dtype``."""

    fd: int
    path: str
    offset: int
    row_bytes: int
    dtype: Any


def _run_of(reader, name: str, shape: tuple[int, ...], files: ByteReader) -> _Run | None:
    span = reader.byte_span(name)
    if span is None:
        return None
    path, offset, length = span
    rows = shape[0] if shape else 1
    if not rows:
        return None
    return _Run(files.fd(str(path)), str(path), offset, length // rows, reader.meta(name).dtype_info.numpy())


_LOCAL = threading.local()


def _thread_bytes(length: int) -> tuple[list[memoryview], list[int]]:
    """Two byte buffers per thread (this iteration's block, the previous one's), as memoryviews and
    their addresses for ``memcmp``, grown as blocks need."""
    bufs = getattr(_LOCAL, "bytes", None)
    if bufs is None or len(bufs[0][0]) < length:
        size = max(length, 1, len(bufs[0][0]) if bufs else 0)
        arrays = [bytearray(size), bytearray(size)]
        bufs = _LOCAL.bytes = ([memoryview(a) for a in arrays], [buffer_address(a) for a in arrays])
    return bufs


def _read_stored(reader, files: ByteReader, name: str, box, slot: int):
    """The block as stored, for a tensor that is not one run of bytes per iteration (a sharded
    save's chunks): where the block itself is (``byte_span``) it is read into this thread's buffer
    ``slot`` through the run's open ``files``; otherwise a view of the mapped file, or a copy
    (``read_mapped``)."""
    import numpy as np

    region = _slices(box)
    span = reader.byte_span(name, region)
    if span is None:
        return reader.read_mapped(name, region)
    path, offset, length = span
    views, _ = _thread_bytes(length)
    view = views[slot][:length]
    files.read_into(str(path), offset, view)
    dtype = reader.meta(name).dtype_info.numpy()
    shape = tuple(hi - lo for lo, hi in box)
    return np.frombuffer(view, dtype=dtype).reshape(shape)


def _buffers(size: int):
    """Two float64 work buffers (this iteration, the previous one) and a float32 one per thread,
    reused from block to block: a fresh 8 MB array per operation costs more in page faults than the
    arithmetic on it. Only blocks with NaN or Inf use them."""
    import numpy as np

    bufs = getattr(_LOCAL, "bufs", None)
    if bufs is None or bufs[0].size < size:
        bufs = _LOCAL.bufs = [np.empty(size, np.float64) for _ in range(2)] + [np.empty(size, np.float32)]
    return bufs


def _sumsq(values) -> float:
    """Sum of squares in float64 (BLAS ``ddot``, on one thread: ``single_threaded_blas``)."""
    import numpy as np

    return float(np.dot(values, values))


def _load(raw, out, narrow) -> None:
    """``raw`` into the float64 buffer ``out``; 8- and 16-bit floats via float32 (exact, and
    ml_dtypes' bfloat16 -> float32 cast is several times faster than its cast to float64)."""
    import numpy as np

    if raw.dtype.itemsize <= 2:
        np.copyto(narrow.reshape(raw.shape), raw, casting="unsafe")
        np.copyto(out, narrow)
    else:
        np.copyto(out.reshape(raw.shape), raw, casting="unsafe")


def _step_sums(cur, prev) -> tuple[float, float, float]:
    """``sum(cur^2)``, ``sum((cur - prev)^2)`` and ``max |cur - prev|`` in float64 over two flat
    arrays (``prev`` finite), one ``PIECE`` at a time through per-thread float64 buffers that stay
    in the core's cache. ``sum(cur^2)`` is summed exactly as ``sum_squares`` sums it (the same
    pieces, widened by the same ``widen``, in the same order), so the same bytes give the same norm on
    either path (fingerprints compare them); where it is not finite the other two are not used."""
    import numpy as np

    a, b = _piece_buffers()
    sq, dsq, dmax = 0.0, 0.0, 0.0
    for lo in range(0, cur.size, PIECE):
        x = widen(cur[lo:lo + PIECE], a)
        sq += float(np.dot(x, x))
        y = widen(prev[lo:lo + PIECE], b)
        np.subtract(x, y, out=x)
        dsq += float(np.dot(x, x))
        np.abs(x, out=x)
        dmax = max(dmax, float(x.max()))
    return sq, dsq, dmax


def _piece_buffers():
    import numpy as np

    bufs = getattr(_LOCAL, "pieces", None)
    if bufs is None:
        bufs = _LOCAL.pieces = (np.empty(PIECE, np.float64), np.empty(PIECE, np.float64))
    return bufs


def _tensor_block(plan: TimelinePlan, reading: _Reading, t: int, box) -> Sums:
    """One block of rows through every iteration: per iteration the sum of squares and NaN / Inf
    counts, per step the squared difference, the earlier side's squares and max |difference| (over
    elements finite on both sides).

    The block is read as stored, into one of two per-thread buffers (this iteration's, the previous
    one's), and never decoded whole when it is finite: a block whose bytes equal the previous
    iteration's (frozen weights) costs one read and one ``memcmp``, a norm comes from
    ``sum_squares`` and a step from ``_step_sums``, both in cache-sized pieces. Only a block with
    NaN or Inf is decoded into the block-sized float64 buffers, to mask it."""
    import numpy as np

    tensor = plan.tensors[t]
    runs = reading.runs_of(t)
    n = len(plan.readers)
    sums = Sums(n)
    shape = tuple(hi - lo for lo, hi in box)
    size = 1
    for d in shape:
        size *= d
    first_row = box[0][0] if box else 0
    cur, prev, narrow = (b[:size] for b in _buffers(size))
    prev_raw = None
    prev_addr = 0
    slot = 1
    prev_loaded = False
    prev_mask = None
    nbytes = 0
    for i, reader in enumerate(plan.readers):
        slot = 1 - slot  # the previous iteration's block stays in the other buffer
        run = runs[i]
        if run is not None:
            length = shape[0] * run.row_bytes if shape else run.row_bytes  # boxes keep whole rows
            views, addresses = _thread_bytes(length)
            view = views[slot][:length]
            read_exact_fd(run.fd, run.path, run.offset + first_row * run.row_bytes, view)
            addr = addresses[slot]
            nbytes += length
            if (prev_addr and prev_raw.dtype == run.dtype and prev_raw.nbytes == length
                    and memcmp(addr, prev_addr, length) == 0):
                frozen = True
            else:
                frozen = False
                raw = np.frombuffer(view, dtype=run.dtype).reshape(shape)
        else:
            raw = _read_stored(reader, reading.files, tensor.stored[i], box, slot)
            addr = 0
            nbytes += raw.nbytes
            frozen = prev_raw is not None and raw.dtype == prev_raw.dtype and same_bytes(raw, prev_raw)
        k = i - 1
        if frozen:
            slot = 1 - slot  # nothing new to keep: the next read may reuse this buffer
            # Unchanged since the previous iteration (a frozen block): its sums are the previous
            # ones and the step is exactly zero, without decoding it again.
            sums.sq[i], sums.nan[i], sums.inf[i] = sums.sq[k], sums.nan[k], sums.inf[k]
            sums.psq[k], sums.dsq[k], sums.dmax[k] = sums.sq[k], 0.0, 0.0
            continue
        if i and prev_mask is None:
            # The common case, both sides finite: the norm and the step in one pass of cache-sized
            # pieces straight from the stored bytes, with no block-sized float64 copies.
            sq, dsq, dmax = _step_sums(raw.reshape(-1), prev_raw.reshape(-1))
            if math.isfinite(sq):
                sums.sq[i], sums.psq[k], sums.dsq[k], sums.dmax[k] = sq, sums.sq[k], dsq, dmax
                prev_raw, prev_loaded, prev_mask, prev_addr = raw, False, None, addr
                continue
        else:
            sq = sum_squares(raw)
        loaded, mask = False, None
        if math.isfinite(sq):
            sums.sq[i] = sq
        else:
            _load(raw, cur, narrow)
            loaded = True
            mask = np.isfinite(cur)
            nans = int(np.count_nonzero(np.isnan(cur)))
            sums.nan[i], sums.inf[i] = nans, int(cur.size - np.count_nonzero(mask)) - nans
            sums.sq[i] = _sumsq(cur[mask])
        if i:  # NaN or Inf on one side: the step over elements finite on both
            if not prev_loaded:
                _load(prev_raw, prev, narrow)
            if not loaded:
                _load(raw, cur, narrow)
                loaded = True
            both = (mask if mask is not None else True) & (prev_mask if prev_mask is not None else True)
            earlier = prev[both]
            d = cur[both] - earlier
            sums.psq[k] = _sumsq(earlier)
            sums.dsq[k] = _sumsq(d)
            sums.dmax[k] = max(float(d.max()), -float(d.min())) if d.size else 0.0
        if loaded:
            cur, prev = prev, cur
        prev_raw, prev_loaded, prev_mask, prev_addr = raw, loaded, mask, addr
    reading.count(nbytes)
    sums.numel = size
    return sums


def _moment_block(plan: TimelinePlan, reading: _Reading, tensor: OptimizerTensor, box) -> MomentSums:
    import numpy as np

    sums = MomentSums(len(plan.readers))
    for i in range(len(plan.readers)):
        name = tensor.stored[i]
        if name is None:
            continue
        region = _slices(box) if tensor.offsets is None else _shifted(box, tensor.offsets[i])
        raw = plan.optimizer_reader(i).read(name, region)
        reading.count(raw.nbytes)
        v = np.asarray(raw).astype(np.float64).ravel()
        v = v[np.isfinite(v) & (v >= 0)]
        sums.present[i] = True
        sums.v[i] = float(v.sum())
        sums.count[i] = int(v.size)
    return sums


def _run_units(plan: TimelinePlan, options: TimelineOptions, reading: _Reading,
               progress: Progress | None, cancelled: Callable[[], bool]) -> tuple[list[Sums], list[MomentSums]]:
    """Every block of every tensor (then every optimizer moment), on ``workers`` threads; a tensor's
    block results are merged in block order as soon as all of them are in."""
    jobs: list[tuple[str, int, int, Any]] = []
    blocks_of: dict[tuple[str, int], int] = {}
    for t, tensor in enumerate(plan.tensors):
        boxes = _boxes(tensor.shape, tensor.rows, options.block_elems)
        blocks_of["w", t] = len(boxes)
        jobs += [("w", t, b, box) for b, box in enumerate(boxes)]
    for t, moment in enumerate(plan.optimizer):
        boxes = _boxes(moment.shape, moment.rows, options.block_elems)
        blocks_of["v", t] = len(boxes)
        jobs += [("v", t, b, box) for b, box in enumerate(boxes)]
    parts: dict[tuple[str, int], dict[int, Any]] = {key: {} for key in blocks_of}
    n = len(plan.readers)
    weights: list[Sums] = [Sums(n) for _ in plan.tensors]
    moments: list[MomentSums] = [MomentSums(n) for _ in plan.optimizer]

    def finish(key: tuple[str, int]) -> None:
        ordered = [parts[key][b] for b in range(blocks_of[key])]
        target = weights[key[1]] if key[0] == "w" else moments[key[1]]
        for part in ordered:
            target.add(part)
        del parts[key]

    def work(job):
        what, t, _b, box = job
        if what == "w":
            return _tensor_block(plan, reading, t, box)
        return _moment_block(plan, reading, plan.optimizer[t], box)

    workers = options.workers or max(2, min(4, os.cpu_count() or 1))
    taken = itertools.count()  # the next job's index; next() on it is atomic under the GIL
    lock = threading.Lock()
    stop = threading.Event()
    failures: list[BaseException] = []
    done = 0

    def worker() -> None:
        nonlocal done
        while not stop.is_set():
            j = next(taken)
            if j >= len(jobs):
                return
            what, t, b, _box = job = jobs[j]
            try:
                part = work(job)
            except BaseException as exc:  # handed to the calling thread, which raises it
                failures.append(exc)
                stop.set()
                return
            with lock:
                parts[what, t][b] = part
                if len(parts[what, t]) == blocks_of[what, t]:
                    finish((what, t))
                done += 1

    # Workers take jobs themselves: a future per block and a wake-up of this thread per block
    # cost the workers the GIL often enough to show in the run time. This thread only reports
    # progress and watches for cancellation, a few times a second.
    threads = [threading.Thread(target=worker, name=f"ckptscope-timeline-{w}", daemon=True) for w in range(workers)]
    if cancelled():
        stop.set()
    for thread in threads:
        thread.start()
    try:
        reported = -1
        while alive := [thread for thread in threads if thread.is_alive()]:
            alive[0].join(PROGRESS_EVERY)
            if cancelled():
                stop.set()
            if progress and done != reported:
                reported = done
                progress(done, len(jobs))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    if failures:
        raise failures[0]
    return weights, moments


def _group(tensors: list[TimelineTensor], weights: list[Sums], key: Callable[[TimelineTensor], str | None],
           n: int) -> list[Series]:
    sums: dict[str, Sums] = {}
    layer_of: dict[str, str | None] = {}
    for tensor, w in zip(tensors, weights):
        name = key(tensor)
        if name is None:
            continue
        sums.setdefault(name, Sums(n)).add(w)
        layer_of.setdefault(name, tensor.layer)
    return [series_of(name, None, layer_of[name], s) for name, s in sums.items()]


def _stale(plan: TimelinePlan, tensors: list[Series]) -> dict[int, int]:
    """Iteration index -> the latest earlier index whose model weights are byte-identical."""
    from ckptscope.ops.diff.engine import DiffOptions, diff_checkpoints
    from ckptscope.ops.diff.plan import plan_diff

    n = len(plan.iterations)
    prints = [tuple(s.fingerprint[i] for s in tensors) for i in range(n)]
    names = {t.name for t in plan.tensors}
    out = {}
    for i in range(1, n):
        for s in range(i - 1, -1, -1):
            if prints[s] != prints[i]:
                continue
            diff = plan_diff(plan.iterations[s].path, plan.iterations[i].path, mapping="none",
                             include=plan.include, exclude=plan.exclude, compare_unknown=False)
            try:
                report = diff_checkpoints(diff, DiffOptions(device="cpu"))
            finally:
                diff.a.reader.close()
                diff.b.reader.close()
            if all(r.status == "equal" for r in report.results if r.name in names):
                out[i] = s
                break
    return out


def run_timeline(plan: TimelinePlan, progress: Progress | None = None, options: TimelineOptions | None = None,
                 cancelled: Callable[[], bool] = lambda: False) -> TimelineResult:
    """Read everything the plan names and return the series and flags. ``progress(done, total)``
    is called after each block (from the calling thread)."""
    options = options or TimelineOptions()
    started = time.perf_counter()
    reading = _Reading(plan)
    n = len(plan.iterations)
    try:
        with single_threaded_blas():
            weights, moment_sums = _run_units(plan, options, reading, progress, cancelled)
    finally:
        reading.close()
        for reader in plan.all_readers():
            reader.release_pages()
    tensors = [series_of(t.name, t.module, t.layer, w) for t, w in zip(plan.tensors, weights)]
    modules = _group(plan.tensors, weights, lambda t: t.module, n)
    layers = _group(plan.tensors, weights, lambda t: t.layer, n)
    whole = Sums(n)
    for w in weights:
        whole.add(w)
    model = series_of("model", None, None, whole)
    labels = plan.labels
    moments = [moments_of(o.param, o.module, o.layer, m, plan.lr, plan.eps)
               for o, m in zip(plan.optimizer, moment_sums)]
    by_module: dict[str, MomentSums] = {}
    layer_of: dict[str, str | None] = {}
    for o, m in zip(plan.optimizer, moment_sums):
        by_module.setdefault(o.module, MomentSums(n)).add(m)
        layer_of.setdefault(o.module, o.layer)
    moment_modules = [moments_of(name, None, layer_of[name], m, plan.lr, plan.eps) for name, m in by_module.items()]

    stale = {} if cancelled() else _stale(plan, tensors)
    stale_steps = {i - 1 for i in stale}
    flags = [stale_flag(labels, i, s) for i, s in stale.items()]
    flags += nonfinite_flags(tensors, labels)
    flags += exploding_flags(tensors, labels, options.explode_factor, stale_steps)
    flags += frozen_flags(tensors, labels, options.frozen_below, {i - 1 for i, s in stale.items() if s == i - 1})
    notes = list(plan.notes)
    base = len(lora_base_weights([t.name for t in tensors]))
    if base:
        notes.append(f"LoRA run: the {plural(base, 'base weight')} {'stay' if base > 1 else 'stays'} put by design "
                     f"and {'are' if base > 1 else 'is'} not flagged as frozen; only the lora_A/lora_B tensors (and "
                     f"PEFT's modules_to_save copies) can be")
    if cancelled():
        notes.append("cancelled: the numbers are incomplete")
    return TimelineResult(plan.root, plan.kind, labels, [i.path for i in plan.iterations], list(plan.lr), tensors,
                          modules, layers, model, moments, moment_modules, sort_flags(flags), notes,
                          plan.optimizer_note, plan.sample, reading.bytes_read, time.perf_counter() - started)
