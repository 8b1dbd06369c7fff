"""``ckptscope diff``: stream two checkpoints block by block and report how every tensor differs.

Plan first (plan.py: pairing by name or through the HF <-> Megatron mapping), then read.
Reading is bounded: work is cut into blocks of at most ``BLOCK_BYTES`` per side, a small window of
blocks is in flight on a thread pool (numpy releases the GIL, so CPU blocks use every core), and
mapped pages are released as we go, so peak memory does not grow with the checkpoint.

Two paths per pair:
* bytes: both sides store the tensor as the same raw chunks (same dtype and geometry), so equality
  is a byte comparison of file ranges read with ``preadv`` into reused buffers; nothing is decoded.
  Only when bytes differ is the pair decoded for metrics.
* values: anything else (different layouts, fused/stacked tensors, dtype changes) is read region
  by region through the readers and compared in float64 (metrics.py).
"""

from __future__ import annotations

import contextlib
import filecmp
import json
import math
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.core.tensor import Encoding, TensorMeta
from ckptscope.mappings.links import Box, Piece, Recipe, box_shape, source_slices
from ckptscope.ops.blockio import RELEASE_EVERY, ByteReader, split_box
from ckptscope.ops.blockmath import single_threaded_blas
from ckptscope.ops.diff.metrics import Accumulator, compare_block
from ckptscope.ops.diff.plan import DiffPair, DiffPlan, DiffSide
from ckptscope.ops.diff.quant import quant_error, quant_note, quantised_type
from ckptscope.ops.diff.sidefiles import SideFile

BLOCK_BYTES = 16 * 1024 * 1024
"""Upper bound of one block per side (raw bytes); float64 copies make the working set ~4x this."""
VALUE_BLOCK_ELEMS = 1 << 22
"""Elements per block on the value path: a float64 copy of a block is then 32 MB."""
SIGNIFICANT = 12
"""Float metrics are reported to this many significant digits: CPU and GPU sum in different
orders, and the last bits of a float64 sum are not a property of the checkpoints."""

STATUSES = ("equal", "close", "different", "dtype_mismatch", "shape_mismatch", "renamed", "only_a", "only_b")
"""``renamed``: a tensor only A has and one only B has, with the same dtype, shape and content (its
name in B is ``PairResult.renamed_to``): one rename, not a loss and an addition."""


@dataclass
class DiffOptions:
    atol: float = 0.0
    rtol: float = 0.0
    device: str = "auto"
    workers: int | None = None
    block_bytes: int = BLOCK_BYTES

    @property
    def tolerant(self) -> bool:
        return self.atol > 0 or self.rtol > 0


@dataclass
class PairResult:
    name: str
    a: str | None
    b: str | None
    status: str
    dtype_a: str | None = None
    dtype_b: str | None = None
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    max_diff_at: tuple[int, ...] | None = None
    renamed_to: str | None = None
    """For ``renamed``: the tensor's name in B (``name`` is its name in A)."""
    quant: dict[str, Any] | None = None
    """When one side is a block-quantised GGUF tensor: its quantisation error (``ops.diff.quant``)."""

    @property
    def differs(self) -> bool:
        return self.status not in ("equal", "close")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "a": self.a, "b": self.b, "status": self.status}
        for key in ("max_abs_diff", "mean_abs_diff", "rel_l2", "cosine", "num_diff"):
            value = self.metrics.get(key)
            out[key] = None if isinstance(value, float) and not math.isfinite(value) else value
        out.update({"dtype_a": self.dtype_a, "dtype_b": self.dtype_b,
                    "shape_a": list(self.shape_a) if self.shape_a is not None else None,
                    "shape_b": list(self.shape_b) if self.shape_b is not None else None,
                    "max_diff_at": list(self.max_diff_at) if self.max_diff_at is not None else None})
        if self.status == "renamed":
            out["renamed_to"] = self.renamed_to
        if self.quant is not None:
            out["quant_error"] = {k: _round(v) for k, v in self.quant.items()}
        return out


@dataclass
class DiffReport:
    a: str
    b: str
    mapping: str
    device: str
    results: list[PairResult]
    padding: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ignored: dict[str, list[str]] = field(default_factory=dict)
    bytes_read: int = 0

    def summary(self) -> dict[str, int]:
        counts = dict.fromkeys(STATUSES, 0)
        for result in self.results:
            counts[result.status] += 1
        out = {
            "compared": sum(counts[s] for s in ("equal", "close", "different", "dtype_mismatch", "shape_mismatch")),
            "equal": counts["equal"],
            "close": counts["close"],
            "different": counts["different"] + counts["dtype_mismatch"] + counts["shape_mismatch"],
            "renamed": counts["renamed"],
            "only_a": counts["only_a"],
            "only_b": counts["only_b"],
            "dtype_mismatch": counts["dtype_mismatch"],
            "shape_mismatch": counts["shape_mismatch"],
        }
        quantised = [r for r in self.results if r.quant is not None and r.status in ("different", "close")]
        if quantised:  # of the differing tensors: explained by quantisation, or not
            out["quantization_error"] = sum(1 for r in quantised if r.quant["within"])
            out["beyond_quantization"] = len(quantised) - out["quantization_error"]
        return out

    @property
    def identical(self) -> bool:
        return not any(r.differs for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "identical": self.identical,
            "summary": self.summary(),
            "tensors": [r.to_json() for r in self.results],
            "mapping": self.mapping,
            "device": self.device,
            "padding": [{k: v for k, v in p.items() if k != "box"} for p in self.padding],
            "ignored": self.ignored,
            "notes": self.notes,
        }


def _round(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value != 0.0:
        return float(f"{value:.{SIGNIFICANT}g}")
    return value


# --- work units ------------------------------------------------------------------------------------


def _raw_chunks_match(ma: TensorMeta, mb: TensorMeta) -> bool:
    """Both tensors are stored as the same plain chunks: compare bytes, decode nothing."""
    if ma.dtype != mb.dtype or ma.shape != mb.shape or len(ma.chunks) != len(mb.chunks):
        return False
    for ca, cb in zip(ma.chunks, mb.chunks):
        if (ca.offsets, ca.shape) != (cb.offsets, cb.shape):
            return False
        for c in (ca, cb):
            if c.encoding is not Encoding.RAW or c.strides is not None or c.big_endian:
                return False
            if c.byte_length != c.numel * ma.dtype_info.bits // 8:
                return False
    return True


def _stored_meta(side: DiffSide, recipe: Recipe) -> TensorMeta | None:
    """The stored tensor behind an identity recipe (None for views and transformed tensors)."""
    if not recipe.is_identity:
        return None
    return side.reader.index().tensors.get(recipe.pieces[0].source)


def _overlaps(a: Recipe, b: Recipe) -> Iterator[tuple[Box, Piece, Piece]]:
    """Canonical boxes where one piece of A meets one piece of B."""
    for pa in a.pieces:
        for pb in b.pieces:
            box = []
            for (sa, ea), (sb, eb) in zip(pa.dst_box, pb.dst_box):
                lo, hi = max(sa, sb), min(ea, eb)
                if lo >= hi:
                    break
                box.append((lo, hi))
            else:
                yield tuple(box), pa, pb


def read_piece(side: DiffSide, piece: Piece, box: Box, *, mapped: bool = False):
    """Canonical ``box`` of a recipe piece, as a numpy array of the box's shape. ``mapped``: a
    read-only view of the file where the bytes allow it (``CheckpointReader.read_mapped``)."""
    read = side.reader.read_mapped if mapped else side.reader.read
    array = read(piece.source, source_slices(piece, box))
    return array.reshape(box_shape(box))


# --- the engine ------------------------------------------------------------------------------------


AUTO_CUDA_BYTES = 32 << 30
"""``--device auto`` takes up the GPU once the pairs that need decoding hold this many bytes (both
sides); below it the diff stays on the CPU. Measured on an H200 machine (bench/gpu_diff.py): torch's
import and CUDA's start cost ~3.5 s; with them, ``--device cuda`` made a diff of 3 changed tensors
5.7x slower than the CPU (3.9 s against 0.7 s), and a diff where every value of 2 x 2.5 GB differs
1.09x slower (the crossover is near 5 GB decoded); an auto that switched at 4 GiB came out 1.24x
slower there, as the start competed with the CPU's decoding. Past the crossover the GPU's ~0.25 s
per GB decoded beats the CPU's ~0.9: 32 GiB leaves a wide margin."""


def _has_nvidia_device() -> bool:
    """An NVIDIA device node or driver, looked for without importing torch (2 s on a CPU box)."""
    return os.path.exists("/dev/nvidia0") or os.path.exists("/proc/driver/nvidia/version")


def _pick_device(device: str) -> str:
    """``cpu`` or ``cuda`` to start with: ``auto`` starts on the CPU (``DiffEngine`` may take up
    the GPU later, see ``AUTO_CUDA_BYTES``); ``cuda`` is checked now, as the user asked for it."""
    if device not in ("auto", "cpu", "cuda"):
        raise CkptError(f"--device must be auto, cpu or cuda, not {device!r}")
    if device in ("auto", "cpu"):
        return "cpu"
    try:
        import torch
    except ImportError:
        raise CkptError("--device cuda needs torch with CUDA") from None
    if not torch.cuda.is_available():
        raise CkptError("--device cuda: no CUDA device is available")
    return "cuda"


class DiffEngine:
    """Runs a ``DiffPlan``: ``run(on_result)`` streams one ``PairResult`` per pair as it completes."""

    def __init__(self, plan: DiffPlan, options: DiffOptions | None = None) -> None:
        self.plan = plan
        self.options = options or DiffOptions()
        self.device = _pick_device(self.options.device)
        self.workers = self.options.workers or max(2, min(4, os.cpu_count() or 1))
        self._bytes = ByteReader()
        self._blas, self._blas_taken = contextlib.ExitStack(), False
        """Holds ``single_threaded_blas`` from the first pair decoded to the end of ``compare``: an
        all-equal diff never imports numpy, so the limit is taken only once values are needed."""
        self._read_lock = threading.Lock()
        self._read_since_release = 0
        self.bytes_read = 0
        self._cuda = None
        self._cuda_candidate = self.options.device == "auto" and _has_nvidia_device()
        """auto on a machine with a GPU: ``_take_up_cuda`` runs once enough values need decoding."""
        self._taking_up: threading.Thread | None = None
        if self.device == "cuda":
            from ckptscope.ops.diff.cuda import CudaComparer

            self._cuda = CudaComparer(self.options.block_bytes)

    def _take_up_cuda(self) -> None:
        """``auto``'s switch to the GPU, on a thread of its own while the CPU goes on decoding: blocks
        started after it completes run on the GPU (same formulas; a pair's CPU and GPU sums merge),
        and the report then says ``cuda``. A torch without CUDA leaves the diff on the CPU."""
        try:
            import torch

            if not torch.cuda.is_available():
                return
            from ckptscope.ops.diff.cuda import CudaComparer

            comparer = CudaComparer(self.options.block_bytes)
        except Exception:  # noqa: BLE001 - auto means "the GPU if it works": any failure leaves the CPU
            return
        self._cuda = comparer

    # -- per block --------------------------------------------------------------------------

    def _count(self, nbytes: int) -> None:
        with self._read_lock:
            self.bytes_read += nbytes
            self._read_since_release += nbytes
            release = self._read_since_release >= RELEASE_EVERY
            if release:
                self._read_since_release = 0
        if release:
            self.plan.a.reader.release_pages()
            self.plan.b.reader.release_pages()

    def _bytes_task(self, path_a: str, off_a: int, path_b: str, off_b: int, length: int) -> bool:
        try:
            return self._bytes.same_range(path_a, off_a, path_b, off_b, length)
        finally:
            self._count(2 * length)

    def _values_task(self, box: Box, pa: Piece, pb: Piece) -> Accumulator:
        cuda = self._cuda  # read once: auto may take up the GPU while this block runs
        mapped = cuda is None  # the GPU path hands arrays to torch, which wants them writable
        a = read_piece(self.plan.a, pa, box, mapped=mapped)
        b = read_piece(self.plan.b, pb, box, mapped=mapped)
        self._count(a.nbytes + b.nbytes)
        origin = tuple(lo for lo, _ in box)
        if cuda is not None:
            self.device = "cuda"  # auto's report names the GPU once a block ran there
            return cuda.compare(a, b, origin, atol=self.options.atol, rtol=self.options.rtol)
        return compare_block(a, b, origin, atol=self.options.atol, rtol=self.options.rtol)

    # -- per pair ---------------------------------------------------------------------------

    def _byte_units(self, pair: DiffPair) -> list[tuple] | None:
        ma, mb = _stored_meta(self.plan.a, pair.a), _stored_meta(self.plan.b, pair.b)
        if ma is None or mb is None or not _raw_chunks_match(ma, mb):
            return None
        units = []
        step = self.options.block_bytes
        for ca, cb in zip(ma.chunks, mb.chunks):
            path_a = str(self.plan.a.reader._file_path(ca.file))
            path_b = str(self.plan.b.reader._file_path(cb.file))
            for pos in range(0, ca.byte_length, step):
                n = min(step, ca.byte_length - pos)
                units.append((self._bytes_task, path_a, ca.byte_offset + pos, path_b, cb.byte_offset + pos, n))
        return units

    def _value_units(self, pair: DiffPair) -> list[tuple]:
        if not self._blas_taken:
            self._blas.enter_context(single_threaded_blas())
            self._blas_taken = True
        itemsize = max(_itemsize(pair.a.dtype), _itemsize(pair.b.dtype))
        max_elems = max(1, min(VALUE_BLOCK_ELEMS, self.options.block_bytes // itemsize))
        units = []
        for box, pa, pb in _overlaps(pair.a, pair.b):
            for block in split_box(box, max_elems):
                units.append((self._values_task, block, pa, pb))
        return units

    def _finish(self, pair: DiffPair, acc: Accumulator | None, bytes_equal: bool) -> PairResult:
        a, b = pair.a, pair.b
        result = PairResult(pair.name, self.plan.a.describe(pair.name), self.plan.b.describe(pair.name),
                            pair.static_status or "equal",
                            a.dtype if a else None, b.dtype if b else None,
                            a.shape if a else None, b.shape if b else None)
        if pair.static_status is not None:
            result.metrics = dict.fromkeys(("max_abs_diff", "mean_abs_diff", "rel_l2", "cosine", "num_diff"))
            return result
        if bytes_equal:
            acc = Accumulator(numel=a.numel)
        assert acc is not None
        if acc.numel != a.numel:
            raise CkptError(f"{pair.name}: compared {acc.numel} of {a.numel} elements; the mapping does not cover it")
        result.metrics = {k: _round(v) for k, v in acc.metrics().items()}
        result.max_diff_at = acc.max_at if acc.num_diff else None
        if a.dtype != b.dtype:
            result.status = "dtype_mismatch"
        elif acc.num_diff == 0:
            result.status = "equal"
        elif self.options.tolerant and acc.violations == 0:
            result.status = "close"
        else:
            result.status = "different"
        for label, side, recipe in (("A", self.plan.a, a), ("B", self.plan.b, b)):
            ggml_type = quantised_type(side, recipe)
            if ggml_type is not None:
                result.quant = quant_error(acc, label, ggml_type)
                break
        return result

    def run(self, on_result: Callable[[PairResult], None] | None = None,
            cancelled: Callable[[], bool] = lambda: False,
            on_progress: Callable[[int, int], None] | None = None) -> DiffReport:
        """Compare every pair; ``on_result`` sees each result as its pair completes (any order).

        The report lists results in plan order. ``on_progress(done_pairs, total_pairs)`` is called
        after each pair.
        """
        results = self.compare(on_result, cancelled, on_progress)
        report = self.report(results, self.bytes_read, cancelled=cancelled())
        for side_file in self.plan.side_files:
            if cancelled():
                break
            self._compare_side_file(side_file, report, on_result, cancelled)
        return report

    def _compare_side_file(self, side_file: SideFile, report: DiffReport,
                           on_result: Callable[[PairResult], None] | None, cancelled: Callable[[], bool]) -> None:
        """One training-state file of ``diff --training-state`` (``sidefiles``): its tensors by stored
        name under ``<file>/``, or the file as one entry when one side lacks it or it is compared as
        bytes. Results go to the end of ``report``."""
        label = side_file.name
        found: list[PairResult] = []
        if side_file.plan is not None:
            sub = DiffEngine(side_file.plan, self.options).run(cancelled=cancelled)
            for result in sub.results:
                result.name = f"{label}/{result.name}"
                if result.renamed_to is not None:
                    result.renamed_to = f"{label}/{result.renamed_to}"
            found = sub.results + _object_results(label, side_file.plan)
            report.notes += [f"{label}: {note}" for note in sub.notes]
            report.bytes_read += sub.bytes_read
        elif side_file.a is None or side_file.b is None:
            found = [PairResult(label, str(side_file.a) if side_file.a else None,
                                str(side_file.b) if side_file.b else None, "only_b" if side_file.a is None else "only_a")]
        else:
            same = _same_file_bytes(side_file.a, side_file.b)
            report.bytes_read += _tree_size(side_file.a) + _tree_size(side_file.b)
            found = [PairResult(label, str(side_file.a), str(side_file.b), "equal" if same else "different")]
            report.notes.append(f"{label}: compared byte for byte ({'equal' if same else 'the bytes differ'}), "
                                f"not tensor by tensor: {side_file.unreadable}")
        for result in found:
            if result.status in ("only_a", "only_b", "different") and not result.metrics:
                result.metrics = dict.fromkeys(("max_abs_diff", "mean_abs_diff", "rel_l2", "cosine", "num_diff"))
            report.results.append(result)
            if on_result:
                on_result(result)

    def compare(self, on_result: Callable[[PairResult], None] | None = None,
                cancelled: Callable[[], bool] = lambda: False,
                on_progress: Callable[[int, int], None] | None = None,
                only: set[int] | None = None) -> dict[int, PairResult]:
        """The per-pair half of ``run``: plan index -> result, for the pairs ``only`` names (all by
        default). Processes that share a diff (``ops.parallel``) each compare their pairs and one
        of them makes the ``report`` of all results."""
        pairs = self.plan.pairs
        results: dict[int, PairResult] = {}
        done = 0

        def emit(i: int, result: PairResult) -> None:
            nonlocal done
            results[i] = result
            done += 1
            if on_result:
                on_result(result)
            if on_progress:
                on_progress(done, len(pairs))

        state: dict[int, dict] = {}
        window = 2 * self.workers
        inflight: dict[Future, tuple[int, str]] = {}
        pending_retry: list[int] = []
        value_bytes = 0

        def needs_values(pair: DiffPair) -> None:
            """Count a pair bound for decoding; past ``AUTO_CUDA_BYTES``, auto takes up the GPU."""
            nonlocal value_bytes
            value_bytes += sum(r.numel * _itemsize(r.dtype) for r in (pair.a, pair.b) if r is not None)
            if self._cuda_candidate and value_bytes >= AUTO_CUDA_BYTES:
                # on a thread of its own: a pool worker would stop decoding for the seconds it takes
                self._cuda_candidate = False
                self._taking_up = threading.Thread(target=self._take_up_cuda, name="ckptscope-diff-cuda")
                self._taking_up.start()

        def bytes_done(i: int) -> None:
            if state[i]["equal"]:
                emit(i, self._finish(pairs[i], None, True))
            else:  # bytes differ: decode for metrics
                state[i] = {"mode": "values", "left": 0, "acc": Accumulator()}
                pending_retry.append(i)
                needs_values(pairs[i])

        def units_for(i: int) -> Iterator[tuple]:
            pair = pairs[i]
            byte_units = self._byte_units(pair)
            if byte_units is not None:
                state[i] = {"mode": "bytes", "left": len(byte_units), "equal": True}
                return iter(byte_units)
            units = self._value_units(pair)
            state[i] = {"mode": "values", "left": len(units), "acc": Accumulator()}
            needs_values(pair)
            return iter(units)

        def queue() -> Iterator[tuple[int, tuple]]:
            for i, pair in enumerate(pairs):
                if cancelled():
                    return
                if only is not None and i not in only:
                    continue
                if pair.static_status is not None:
                    emit(i, self._finish(pair, None, False))
                    continue
                units = list(units_for(i))
                if not units:
                    emit(i, self._finish(pair, Accumulator(), False))
                    continue
                st = state[i]
                for k, unit in enumerate(units):
                    if st["mode"] == "bytes" and not st["equal"]:
                        # A block already differs: the value path reads the whole pair again, so
                        # the rest of its byte comparison would be read for nothing.
                        st["left"] -= len(units) - k
                        if st["left"] == 0:
                            bytes_done(i)
                        break
                    yield i, unit

        try:
            with ThreadPoolExecutor(self.workers, thread_name_prefix="ckptscope-diff") as pool:
                source = queue()
                exhausted = False
                while True:
                    while not exhausted and len(inflight) < window:
                        try:
                            i, unit = next(source)
                        except StopIteration:
                            exhausted = True
                            break
                        fn, *args = unit
                        inflight[pool.submit(fn, *args)] = (i, state[i]["mode"])
                    if pending_retry and len(inflight) < window:
                        i = pending_retry.pop(0)
                        for unit in self._value_units(pairs[i]):
                            fn, *args = unit
                            inflight[pool.submit(fn, *args)] = (i, "values")
                            state[i]["left"] += 1
                    if not inflight:
                        if exhausted and not pending_retry:
                            break
                        continue
                    finished, _ = wait(inflight, return_when=FIRST_COMPLETED)
                    for future in finished:
                        i, mode = inflight.pop(future)
                        value = future.result()
                        st = state[i]
                        st["left"] -= 1
                        if mode == "bytes":
                            st["equal"] = st["equal"] and bool(value)
                            if st["left"] == 0:
                                bytes_done(i)
                        else:
                            st["acc"].merge(value)
                            if st["left"] == 0:
                                emit(i, self._finish(pairs[i], st["acc"], False))
                    if cancelled():
                        for future in inflight:
                            future.cancel()
                        break
        finally:
            if self._taking_up is not None:  # never left importing torch while the interpreter exits
                self._taking_up.join()
                self._taking_up = None
            self._blas.close()
            self._blas_taken = False
            self._bytes.close()
            self.plan.a.reader.release_pages()
            self.plan.b.reader.release_pages()
        return results

    def report(self, results: dict[int, PairResult], bytes_read: int, *, cancelled: bool = False) -> DiffReport:
        """The report of ``compare``'s results (renamed pairs joined, padding checked, notes)."""
        ordered = [results[i] for i in sorted(results)]
        if not cancelled:
            ordered = self._pair_renamed(ordered)
        report = DiffReport(self.plan.a.path, self.plan.b.path, self.plan.mapping, self.device, ordered,
                            notes=list(self.plan.notes),
                            ignored={"a": list(self.plan.a.ignored), "b": list(self.plan.b.ignored)},
                            bytes_read=bytes_read)
        report.padding = self._padding_report()
        note = quant_note(ordered)
        if note is not None:
            report.notes.append(note)
        if self.plan.compare_config and not cancelled:
            report.results += _config_results(self.plan, report.notes)
        return report

    def _pair_renamed(self, results: list[PairResult]) -> list[PairResult]:
        """Turn an only_a and an only_b result of equal dtype, shape and content into one ``renamed``
        result. Only tensors whose dtype and shape match some tensor of the other side are read
        (whole, once, for a BLAKE2 digest), so a diff without renames reads nothing more."""
        only_b: dict[tuple, list[PairResult]] = {}
        for r in results:
            if r.status == "only_b":
                only_b.setdefault((r.dtype_b, r.shape_b), []).append(r)
        if not only_b:
            return results
        digests: dict[tuple[str, str], bytes] = {}

        def digest(label: str, name: str) -> bytes:
            if (label, name) not in digests:
                side = self.plan.a if label == "a" else self.plan.b
                digests[label, name] = _content_digest(side, side.recipes[name])
            return digests[label, name]

        renamed_b: set[str] = set()
        out = []
        for r in results:
            if r.status == "only_b" and r.name in renamed_b:
                continue
            candidates = only_b.get((r.dtype_a, r.shape_a), []) if r.status == "only_a" else []
            match = next((b for b in candidates if b.name not in renamed_b
                          and digest("b", b.name) == digest("a", r.name)), None)
            if match is None:
                out.append(r)
                continue
            renamed_b.add(match.name)
            out.append(PairResult(r.name, r.a, match.b, "renamed", r.dtype_a, match.dtype_b, r.shape_a, match.shape_b,
                                  metrics=dict(r.metrics), renamed_to=match.name))
        return [r for r in out if not (r.status == "only_b" and r.name in renamed_b)]

    def _padding_report(self) -> list[dict]:
        """Vocab pad rows: reported (count, all zero or not), never compared."""
        if not self.plan.padding:
            return []  # and numpy is not imported: an all-equal diff never needs it
        import numpy as np

        out = []
        for item in self.plan.padding:
            side = self.plan.a if item["side"] == "a" else self.plan.b
            rows = item["rows"][1] - item["rows"][0]
            zero = True
            for block in split_box(item["box"], self.options.block_bytes // 8):
                values = side.reader.read(item["source"], tuple(slice(lo, hi) for lo, hi in block))
                if np.count_nonzero(values.view(_uint_view(values.dtype.itemsize))):
                    zero = False
                    break
            out.append({**item, "count": rows, "all_zero": zero})
        return out


def _content_digest(side: DiffSide, recipe: Recipe) -> bytes:
    """BLAKE2 of the tensor's bytes in C order: a whole stored tensor in bounded blocks, a fused or
    permuted one assembled once (at most the largest tensor in memory)."""
    import hashlib

    import numpy as np

    hasher = hashlib.blake2b(digest_size=32)
    pieces = recipe.pieces
    if len(pieces) == 1 and pieces[0].dst_box == tuple((0, n) for n in recipe.shape):
        for box in split_box(pieces[0].dst_box, BLOCK_BYTES // max(1, _itemsize(recipe.dtype))):
            hasher.update(np.ascontiguousarray(read_piece(side, pieces[0], box)).tobytes())
        return hasher.digest()
    whole = None  # several pieces (a fused or permuted tensor): assembled once, in the recipe's order
    for piece in pieces:
        values = read_piece(side, piece, piece.dst_box)
        if whole is None:
            whole = np.empty(recipe.shape, dtype=values.dtype)
        whole[tuple(slice(lo, hi) for lo, hi in piece.dst_box)] = values
    hasher.update(whole.tobytes())
    return hasher.digest()


def _uint_view(size: int):
    import numpy as np

    return {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(size, np.uint8)


def _itemsize(dtype: str) -> int:
    from ckptscope.core.dtypes import dtype_by_name

    return max(1, dtype_by_name(dtype).bits // 8)


def _object_results(label: str, plan: DiffPlan) -> list[PairResult]:
    """The non-tensor entries of a training-state file pair (a scheduler's ``last_epoch``, the
    python / numpy rng states), as the safe unpickler rendered them: one result per entry that
    differs or that one side lacks (equal ones are not listed)."""
    def rendered(side: DiffSide) -> dict[str, str]:
        return {o.name: json.dumps(o.value, sort_keys=True, default=repr) for o in side.reader.index().objects}

    objects_a, objects_b = rendered(plan.a), rendered(plan.b)
    out = []
    for name in list(objects_a) + [n for n in objects_b if n not in objects_a]:
        in_a, in_b = objects_a.get(name), objects_b.get(name)
        if in_a == in_b:
            continue
        status = "only_b" if in_a is None else "only_a" if in_b is None else "different"
        out.append(PairResult(f"{label}/{name}", name if in_a is not None else None,
                              name if in_b is not None else None, status))
    return out


CONFIG_FACT = "config.json: "
"""The name prefix of a result that is a fact the two config.json files disagree on (its ``a`` / ``b``
are the two values as JSON), not a tensor pair."""
ARGS_FACT = "Megatron args: "
"""The same for a fact two Megatron saves' args disagree on, or that one side's config.json and the other's
Megatron args state otherwise (named by the Megatron arg)."""
FACT_PREFIXES = (CONFIG_FACT, ARGS_FACT)


def is_fact(name: str) -> bool:
    """Whether a result is a config fact (``CONFIG_FACT``, ``ARGS_FACT``), not a tensor pair."""
    return name.startswith(FACT_PREFIXES)


def _config_results(plan: DiffPlan, notes: list[str]) -> list[PairResult]:
    """One ``different`` result per fact the two sides' configs state otherwise: equal tensors under another
    activation, RoPE base or window are another model, and such a diff said identical. Two config.json
    files are compared fact by fact (``ops.config_check.fact_differences``); two Megatron saves by their
    args (``mappings.config.args_differences``); a config.json and a Megatron save by the rules convert
    refuses a mismatched ``--hf-config`` with (``mappings.config.config_conflicts``)."""
    indexes = [side.reader.index() for side in (plan.a, plan.b)]
    configs = [index.saved_config for index in indexes]
    if configs[0] is None or configs[1] is None:
        return _args_results(indexes, configs, notes)
    from ckptscope.mappings.config import check_hf_config_types
    from ckptscope.ops.config_check import fact_differences

    for label, config in zip("AB", configs):
        try:
            check_hf_config_types(config)
        except CkptError as exc:
            notes.append(f"the config.json files were not compared: {label}'s {exc.problem}")
            return []
    try:
        found = fact_differences(*configs)
    except (TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:  # a value no rule type-checks
        notes.append(f"the config.json files were not compared: {type(exc).__name__}: {exc}")
        return []
    return [PairResult(f"{CONFIG_FACT}{fact}", json.dumps(a, default=repr), json.dumps(b, default=repr), "different")
            for fact, a, b in found]


def _args_results(indexes: list, configs: list, notes: list[str]) -> list[PairResult]:
    """``_config_results`` where a side has no config.json: its Megatron args (or Megatron-Bridge's
    ``run_config.yaml``, verl's ``transformer_config.json``) against the other side's args or config.json."""
    from ckptscope.mappings.config import args_differences, check_hf_config_types, config_conflicts
    from ckptscope.mappings.resolve import megatron_config_from_index

    try:
        args = [megatron_config_from_index(index) if config is None else None
                for index, config in zip(indexes, configs)]
    except (CkptError, TypeError, ValueError, AttributeError) as exc:  # args of types no reading expects
        notes.append(f"the Megatron args were not compared: {exc}")
        return []
    found: list[tuple[str, object, object]] = []
    try:
        if args[0] is not None and args[1] is not None:
            found = args_differences(args[0], args[1])
        elif (args[0] is None) != (args[1] is None):
            hf_side = 0 if args[0] is None else 1
            config = configs[hf_side]
            if config is None:
                return []
            check_hf_config_types(config)
            for c in config_conflicts(args[1 - hf_side], config):
                pair = (c.hf, c.args) if hf_side == 0 else (c.args, c.hf)
                found.append((c.fact, *pair))
    except (CkptError, TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:
        notes.append(f"the Megatron args were not compared: {getattr(exc, 'problem', None) or exc}")
        return []
    return [PairResult(f"{ARGS_FACT}{fact}", json.dumps(a, default=repr), json.dumps(b, default=repr), "different")
            for fact, a, b in found]


def _files_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def _tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in _files_of(path))


def _same_file_bytes(a: Path, b: Path) -> bool:
    """Whether two files (or two directories, file by file under the same relative names) hold
    the same bytes."""
    files_a, files_b = _files_of(a), _files_of(b)
    if a.is_dir() != b.is_dir() or [p.relative_to(a) for p in files_a] != [p.relative_to(b) for p in files_b]:
        return False
    return all(filecmp.cmp(x, y, shallow=False) for x, y in zip(files_a, files_b))


def diff_checkpoints(plan: DiffPlan, options: DiffOptions | None = None,
                     on_result: Callable[[PairResult], None] | None = None,
                     cancelled: Callable[[], bool] = lambda: False,
                     on_progress: Callable[[int, int], None] | None = None) -> DiffReport:
    """Run ``plan`` and return the report (see ``DiffEngine.run``)."""
    return DiffEngine(plan, options).run(on_result, cancelled, on_progress)
