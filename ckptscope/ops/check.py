"""``check``: is a checkpoint whole? Every tensor covered once by its chunks, every byte on disk.

A crashed or half-copied save is the usual reason to open a checkpoint, and it rarely fails
loudly: a rank file is missing, a ``.distcp`` is cut short, ``.metadata`` was never renamed into
place, an HF index names the wrong shard. This module finds such damage from metadata alone (no
tensor bytes are read), for any format, through what every reader provides:

* the index's logical tensors and their chunks: boxes that must tile the global shape exactly
  once (``chunk_coverage``: volumes plus a sweep for overlaps, so 20k tensors take milliseconds);
* the chunks' files and byte ranges, against the files' sizes on disk, and each chunk's byte
  length against its dtype and shape;
* the damage readers record while indexing (``CheckpointIndex.issues``: missing completeness
  markers, HF index vs shard headers, files that hold only objects);
* for a save root, its trainer's own completeness markers, then the iteration the trainer would
  resume from: Megatron (``iter_*`` / ``release``) and verl (``global_step_*``) by the
  ``latest_checkpointed_iteration.txt`` tracker; torchtitan (``step-*``, no tracker) the newest step
  with DCP's ``.metadata``; HF Trainer (``checkpoint-*``, no tracker) the highest checkpoint, whole
  when its ``trainer_state.json`` (written last) is there. No root is asked for another trainer's
  marker.

A new reader gets all of this without a change here, as long as it describes its chunks.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ckptscope.core.dtypes import DType
from ckptscope.core.errors import CkptError, UnknownFormat
from ckptscope.core.index import INFERRED_SHAPES, CheckpointIndex
from ckptscope.core.tensor import STORAGE_TRANSFORMS, Chunk, Encoding, TensorMeta
from ckptscope.core.units import plural
from ckptscope.formats import open_checkpoint
from ckptscope.formats.pickles.torch_file import ZIP_MAGIC
from ckptscope.ops.roots import (
    ACCELERATE_FSDP_MODEL,
    RELEASE,
    TRACKED_KINDS,
    TRACKER,
    TRAINER_STATE,
    VERL_ROLES,
    Iteration,
    IterationInfo,
    describe_checkpoint,
    describe_root,
    discover_iterations,
    find_iteration,
    pick_iteration,
    resolve_root,
    resume_target,
    root_kind,
    NEMO_WEIGHTS,
    nemo_weights,
    save_state_model,
    tracker_gap,
    verl_step_role,
)

Box = tuple[tuple[int, int], ...]
"""``(start, stop)`` per axis, global coordinates."""

MAX_PAIRS = 3
"""Overlapping chunk pairs spelled out per tensor (the count says how many there are)."""
_MAX_UNION_BOXES = 512
"""Above this many overlapping boxes the exact stored volume is not computed (only counted)."""
_BYTE_ENCODINGS = (Encoding.RAW, Encoding.STRIDED, Encoding.TORCH_ZIP_ITEM)
"""Chunks with a byte range in a file; ``LOADED`` chunks have none to check."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with the checkpoint."""

    kind: str
    """``missing-file``, ``truncated``, ``missing-marker``, ``tracker``, ``hole``, ``overlap``,
    ``bad-chunk``, ``byte-length``, ``index-mismatch``, ``unreadable-file``, ``incomplete``,
    ``replica-mismatch``, ``copy-mismatch``, ``bad-config``, ``args-mismatch``."""
    file: str | None
    """Relative to the path that was checked (``iter_0000010/__0_0.distcp`` for a save root)."""
    tensors: tuple[str, ...]
    detail: str

    @property
    def tensor(self) -> str | None:
        """Every tensor concerned, comma-separated (None when no tensor is)."""
        return ", ".join(self.tensors) if self.tensors else None

    def line(self, max_tensors: int = 3) -> str:
        """One human line: ``kind: file [tensors]: detail``."""
        where = self.file or "-"
        if self.tensors:
            shown = ", ".join(self.tensors[:max_tensors])
            more = len(self.tensors) - max_tensors
            where += f" [{shown}{f', +{more} more' if more > 0 else ''}]"
        return f"{self.kind}: {where}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "file": self.file, "tensor": self.tensor, "detail": self.detail}


@dataclass(slots=True)
class CheckReport:
    path: str
    """What the user asked to check."""
    format: str | None
    """The checked checkpoint's format (None when nothing could be opened under a save root)."""
    problems: list[Problem] = field(default_factory=list)
    tensors: int = 0
    files: int = 0
    chunks: int = 0
    target: str | None = None
    """For a save root: the iteration directory checked, relative to ``path``."""
    iteration: int | str | None = None
    """For a save root: the iteration checked (a number, ``release`` or ``final``)."""
    layout: str | None = None
    """What was recognised: ``Megatron-LM save root (torch_dist, tracker: iteration 5)``,
    ``HF Trainer checkpoint (step 4)``, ``PyTorch DCP dir``, ... (None when nothing could be opened)."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        counted = ", ".join(f"{n} {what}{'s' if n != 1 else ''}" for n, what in
                            ((self.tensors, "tensor"), (self.chunks, "chunk"), (self.files, "file")))
        if self.ok:
            return f"ok: {counted} checked"
        found = f"{len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}"
        if not (self.tensors or self.chunks or self.files):  # nothing could be read ("1 problem in 0 tensors, ...")
            return f"{found}: nothing in it could be read"
        return f"{found} in {counted}"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "layout": self.layout, "format": self.format, "ok": self.ok,
                "iteration": self.iteration, "target": self.target,
                "problems": [p.to_json() for p in self.problems],
                "checked": {"tensors": self.tensors, "files": self.files, "chunks": self.chunks}}


# --- coverage: chunks must tile the global shape exactly once -----------------------------------


@dataclass(frozen=True, slots=True)
class Coverage:
    """How the chunks of one tensor cover its global shape."""

    numel: int
    stored: int
    """Elements in the chunks that fit the tensor (replicas and overlaps counted again)."""
    covered: int | None
    """Distinct elements covered; None when too many boxes overlap to count them exactly."""
    overlaps: tuple[tuple[int, int, int], ...]
    """``(chunk i, chunk j, shared elements)`` for the first ``MAX_PAIRS`` overlapping pairs."""
    overlap_pairs: int
    bad: tuple[tuple[int, str], ...]
    """``(chunk index, why)`` for chunks whose rank or bounds do not fit the tensor."""

    @property
    def holes(self) -> int | None:
        return None if self.covered is None else self.numel - self.covered

    @property
    def exact(self) -> bool:
        return not self.bad and not self.overlap_pairs and self.covered == self.numel


def _box(chunk: Chunk) -> Box:
    return tuple((o, o + s) for o, s in zip(chunk.offsets, chunk.shape))


def _volume(box: Box) -> int:
    return math.prod(hi - lo for lo, hi in box)


def _shared(a: Box, b: Box) -> int:
    total = 1
    for (alo, ahi), (blo, bhi) in zip(a, b):
        extent = min(ahi, bhi) - max(alo, blo)
        if extent <= 0:
            return 0
        total *= extent
    return total


def _sweep_axis(boxes: Sequence[Box]) -> int:
    """The axis with the most distinct chunk starts: sweeping along it keeps the active set small
    (row shards sweep on axis 0, column shards on axis 1)."""
    ndim = len(boxes[0])
    return max(range(ndim), key=lambda axis: len({b[axis][0] for b in boxes}))


def find_overlaps(boxes: Sequence[Box], limit: int = MAX_PAIRS) -> tuple[list[tuple[int, int, int]], int]:
    """Overlapping pairs of non-empty boxes: the first ``limit`` as ``(i, j, shared)``, and the count.

    A sweep along one axis: boxes sorted by start, each compared only with the boxes still open
    there. Disjoint shards (the normal case) cost ``O(k log k)``.
    """
    if not boxes:
        return [], 0
    if not boxes[0]:  # 0-d: every chunk is the single element
        pairs = [(i, j, 1) for i in range(len(boxes)) for j in range(i + 1, len(boxes))]
        return pairs[:limit], len(pairs)
    axis = _sweep_axis(boxes)
    order = sorted(range(len(boxes)), key=lambda i: boxes[i][axis])
    active: list[int] = []
    found: list[tuple[int, int, int]] = []
    count = 0
    for i in order:
        start = boxes[i][axis][0]
        active = [j for j in active if boxes[j][axis][1] > start]
        for j in active:
            shared = _shared(boxes[i], boxes[j])
            if shared:
                count += 1
                if len(found) < limit:
                    found.append((min(i, j), max(i, j), shared))
        active.append(i)
    return found, count


def union_volume(boxes: Sequence[Box]) -> int:
    """Elements covered by at least one box: slabs between the box edges along the first axis,
    each the union of the boxes spanning it one dimension down. Only needed when boxes overlap."""
    if not boxes:
        return 0
    if not boxes[0]:
        return 1
    edges = sorted({b[0][0] for b in boxes} | {b[0][1] for b in boxes})
    total = 0
    for lo, hi in itertools.pairwise(edges):
        inner = [b[1:] for b in boxes if b[0][0] <= lo and b[0][1] >= hi]
        if inner:
            total += (hi - lo) * union_volume(inner)
    return total


def _one_axis_split(chunks: Sequence[Chunk], shape: tuple[int, ...]) -> int | None:
    """The axis along which every chunk is cut while spanning all other axes whole (row or
    column shards, stacked layers), or None. Such chunks are disjoint iff their intervals on
    that axis are, which is a sort instead of a sweep (tuple compares run at C speed)."""
    zeros = (0,) * len(shape)
    for axis in range(len(shape)):
        head, tail = slice(0, axis), slice(axis + 1, None)
        if all(c.offsets[head] == zeros[head] and c.offsets[tail] == zeros[tail]
               and c.shape[head] == shape[head] and c.shape[tail] == shape[tail] for c in chunks):
            return axis
    return None


def _disjoint_along(chunks: Sequence[Chunk], axis: int) -> bool:
    spans = sorted((c.offsets[axis], c.offsets[axis] + c.shape[axis]) for c in chunks)
    return all(start >= prev_end for (_, prev_end), (start, _) in itertools.pairwise(spans))


def chunk_coverage(shape: tuple[int, ...], chunks: Sequence[Chunk]) -> Coverage:
    """Check that ``chunks`` tile ``shape`` exactly once, without visiting elements.

    No overlap and every chunk in bounds means the chunks' volumes add up to the elements they
    cover, so holes are ``numel - sum``; overlaps are found by a sort (chunks cut along one axis)
    or a sweep, and only when there are some is the covered volume computed exactly.
    """
    numel = math.prod(shape)
    if len(chunks) == 1 and chunks[0].shape == shape and not any(chunks[0].offsets):
        return Coverage(numel, numel, numel, (), 0, ())  # the common case: one chunk holds it all
    ndim = len(shape)
    bad: list[tuple[int, str]] = []
    good: list[Chunk] = []
    index: list[int] = []
    stored = 0
    for k, chunk in enumerate(chunks):
        offsets, sizes = chunk.offsets, chunk.shape
        if len(offsets) != ndim or len(sizes) != ndim:
            bad.append((k, f"has {len(offsets)} offsets and {len(sizes)} sizes for a {ndim}-d tensor"))
            continue
        volume = 1
        for o, s, n in zip(offsets, sizes, shape):
            if o < 0 or s < 0 or o + s > n:
                volume = -1
                break
            volume *= s
        if volume < 0:
            bad.append((k, f"{_fmt_box(_box(chunk))} lies outside the tensor's shape {list(shape)}"))
        elif volume:
            good.append(chunk)
            index.append(k)
            stored += volume
    axis = _one_axis_split(good, shape) if len(good) > 1 else None
    if len(good) <= 1 or (axis is not None and _disjoint_along(good, axis)):
        return Coverage(numel, stored, stored, (), 0, tuple(bad))
    boxes = [_box(c) for c in good]
    pairs, count = find_overlaps(boxes)
    if not count:
        covered: int | None = stored
    elif len(boxes) <= _MAX_UNION_BOXES:
        covered = union_volume(boxes)
    else:
        covered = None
    overlaps = tuple((index[i], index[j], shared) for i, j, shared in pairs)
    return Coverage(numel, stored, covered, overlaps, count, tuple(bad))


def _fmt_box(box: Box) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in box) + "]"


def coverage_problems(meta: TensorMeta) -> list[Problem]:
    """``hole``, ``overlap`` and ``bad-chunk`` problems of one tensor (none when it is tiled exactly)."""
    cov = chunk_coverage(meta.shape, meta.chunks)
    if cov.exact:
        return []
    out: list[Problem] = []
    for k, why in cov.bad:
        out.append(Problem("bad-chunk", meta.chunks[k].file or None, (meta.name,), f"chunk #{k} {why}"))
    if cov.overlap_pairs:
        spelled = "; ".join(
            f"#{i} {_fmt_box(_box(meta.chunks[i]))} ({meta.chunks[i].file}) and #{j} {_fmt_box(_box(meta.chunks[j]))} "
            f"({meta.chunks[j].file}) share {shared} elements" for i, j, shared in cov.overlaps)
        more = cov.overlap_pairs - len(cov.overlaps)
        out.append(Problem("overlap", None, (meta.name,),
                           f"{cov.overlap_pairs} overlapping chunk pair{'s' if cov.overlap_pairs != 1 else ''}: "
                           f"{spelled}{f'; +{more} more' if more > 0 else ''}"))
    holes = cov.holes
    if holes:
        out.append(Problem("hole", None, (meta.name,),
                           f"its {len(meta.chunks)} chunk{'s cover' if len(meta.chunks) != 1 else ' covers'} "
                           f"{cov.covered} of {cov.numel} elements of {meta.dtype}{list(meta.shape)}; "
                           f"{holes} are stored nowhere"))
    elif holes is None:
        out.append(Problem("hole", None, (meta.name,),
                           f"{len(meta.chunks)} chunks overlap too much to count the covered elements"))
    return out


# --- bytes: chunk lengths against dtype and shape, files against their sizes --------------------


def expected_bytes(meta: TensorMeta, chunk: Chunk, info: DType | None = None) -> tuple[int, bool] | None:
    """Bytes a chunk's range must span, and whether that is a minimum (an embedded zip adds its
    own headers) rather than an exact length. None when there is nothing to compare."""
    if info is None:
        try:
            info = meta.dtype_info
        except CkptError:
            return None
    encoding = chunk.encoding
    if encoding is Encoding.RAW or (encoding is Encoding.STRIDED and chunk.strides is None):
        return info.nbytes(chunk.numel), False
    if encoding is Encoding.STRIDED:
        if chunk.numel == 0:
            return 0, False
        span = 1 + sum((s - 1) * abs(st) for s, st in zip(chunk.shape, chunk.strides or ()))
        return span * info.itemsize, False
    if encoding is Encoding.TORCH_ZIP_ITEM:
        if meta.attrs and meta.attr(STORAGE_TRANSFORMS):
            return None  # compressed (DCP storage transforms): any length may hold it
        return info.nbytes(chunk.numel), True
    return None


def byte_length_problems(meta: TensorMeta) -> list[Problem]:
    """A chunk whose byte range cannot hold its dtype and shape (a header or index lies)."""
    try:
        info = meta.dtype_info
    except CkptError:
        return []
    bad = []
    for k, chunk in enumerate(meta.chunks):
        want = expected_bytes(meta, chunk, info)
        if want is None:
            continue
        need, at_least = want
        if chunk.byte_length < need or (not at_least and chunk.byte_length != need):
            bad.append((k, chunk, need, at_least))
    if not bad:
        return []
    k, chunk, need, at_least = bad[0]
    more = f" (and {plural(len(bad) - 1, 'more chunk')})" if len(bad) > 1 else ""
    return [Problem("byte-length", chunk.file or None, (meta.name,),
                    f"chunk #{k} {_fmt_box(_box(chunk))} is {meta.dtype}{list(chunk.shape)}, which needs "
                    f"{'at least ' if at_least else ''}{need} bytes; its byte range holds {chunk.byte_length}{more}")]


def file_problems(tensors: Iterable[TensorMeta], root: Path) -> tuple[list[Problem], set[str], int]:
    """Missing and truncated files, naming the tensors whose chunks they hold.

    Returns the problems, every file referenced by a chunk, and the number of chunks.
    """
    ends: dict[str, int] = {}
    holders: dict[str, dict[str, int]] = {}
    """file -> tensor -> end of its last chunk there."""
    chunks = 0
    items: dict[str, dict[int, str]] = {}
    """file -> start of a torch.save zip item (DCP ``.distcp``) -> a tensor stored there."""
    for meta in tensors:
        for chunk in meta.chunks:
            chunks += 1
            if chunk.encoding not in _BYTE_ENCODINGS or not chunk.file:
                continue
            end = chunk.byte_offset + chunk.byte_length
            ends[chunk.file] = max(ends.get(chunk.file, 0), end)
            per = holders.setdefault(chunk.file, {})
            per[meta.name] = max(per.get(meta.name, 0), end)
            if chunk.encoding is Encoding.TORCH_ZIP_ITEM and not (meta.attrs and meta.attr(STORAGE_TRANSFORMS)):
                items.setdefault(chunk.file, {}).setdefault(chunk.byte_offset, meta.name)  # (compressed ones start otherwise)
    problems = []
    for rel in sorted(ends):
        try:
            size = os.stat(root / rel).st_size if (root / rel).is_file() else None
        except OSError:
            size = None
        names = holders[rel]
        if size is None:
            problems.append(Problem("missing-file", rel, tuple(names),
                                    f"not found; it should hold chunks of {plural(len(names), 'tensor')} "
                                    f"(at least {plural(ends[rel], 'byte')})"))
        elif size < ends[rel]:
            cut = tuple(name for name, end in names.items() if end > size)
            problems.append(Problem("truncated", rel, cut,
                                    f"the file has {plural(size, 'byte')}, its chunks need {ends[rel]:,} "
                                    f"({plural(ends[rel] - size, 'byte')} missing; {plural(len(cut), 'tensor')} cut)"))
        elif rel in items:
            problems.extend(_item_problems(root / rel, rel, items[rel]))
    return problems, set(ends), chunks


def _item_problems(path: Path, rel: str, starts: dict[int, str]) -> list[Problem]:
    """DCP items whose first bytes are not a zip entry's: ``.metadata`` places them where the writer did
    not (a probe shifted a storage offset; check said ok and only convert failed). Reads 4 bytes per item."""
    missed: list[tuple[int, str]] = []
    try:
        with open(path, "rb") as handle:
            for start, name in sorted(starts.items()):
                if os.pread(handle.fileno(), 4, start) != ZIP_MAGIC:
                    missed.append((start, name))
    except OSError as exc:
        return [Problem("unreadable-file", rel, (), f"{type(exc).__name__}: {exc}")]
    if not missed:
        return []
    start, name = missed[0]
    return [Problem("bad-offset", rel, tuple(n for _, n in missed),
                    f"{plural(len(missed), 'item')} of this file do not start where .metadata says (the first, "
                    f"{name}, at byte {start:,}, holds no torch.save zip entry)")]


_STATE_ROLES = frozenset({"optimizer", "scheduler", "scaler", "sampler", "rng", "args"})


def side_file_problems(index: CheckpointIndex, root: Path) -> list[Problem]:
    """Training-state files (a Trainer's ``optimizer.pt``, accelerate's ``optimizer.bin`` ...) in torch's zip
    format whose central directory does not parse: cut short mid-write, so ``torch.load`` (and a resume) fails.
    A probe truncated ``optimizer.pt`` and check said ok. Reads each file's end only (``zipfile``)."""
    import zipfile

    problems = []
    for info in index.files:
        if info.role not in _STATE_ROLES:
            continue
        path = root / info.path
        try:
            with open(path, "rb") as handle:
                head = handle.read(4)
            if not head:  # a probe emptied optimizer.pt and scheduler.pt: check said ok, torch.load raises EOFError
                problems.append(Problem("unreadable-file", info.path, (), f"{info.role} state file is empty: "
                                        f"torch.load, and a resume from it, would fail"))
                continue
            if head != ZIP_MAGIC:
                if head[:1] != b"\x80":  # every pickle torch or accelerate writes opens with the PROTO opcode
                    problems.append(Problem("unreadable-file", info.path, (), f"{info.role} state file is neither "
                                            f"torch's zip format nor a pickle: torch.load, and a resume, would fail"))
                continue  # a plain pickle (legacy torch.save, random_states_N.pkl): nothing cheap to check
            with zipfile.ZipFile(path) as archive:
                archive.infolist()
        except OSError as exc:
            problems.append(Problem("unreadable-file", info.path, (), f"{type(exc).__name__}: {exc}"))
        except (zipfile.BadZipFile, EOFError, ValueError) as exc:
            problems.append(Problem("unreadable-file", info.path, (),
                                    f"{info.role} state in torch's zip format that does not parse ({exc}): cut short "
                                    f"mid-write? torch.load, and a resume from it, would fail"))
    return problems


# --- putting it together -----------------------------------------------------------------------


def metadata_problems(tensors: Iterable[TensorMeta]) -> list[Problem]:
    """What the metadata alone shows wrong with ``tensors`` (no file opened): holes, overlaps, chunks out
    of bounds, byte ranges that cannot hold their chunk. ``check`` reports them; convert, merge, verify and
    rename refuse a model that has any, since the reader zero-fills what no chunk holds (a probe: a
    torch_dist with a lost chunk and a verl save with a rank file copied over another exported zeros)."""
    problems: list[Problem] = []
    for meta in tensors:
        problems.extend(coverage_problems(meta))
        problems.extend(byte_length_problems(meta))
    return problems




def inferred_shape_problems(index: CheckpointIndex) -> list[Problem]:
    """A shard dir of torch's ``HuggingFaceStorageWriter`` records no global shape: the reader takes the
    largest ``offset + size`` of the pieces it finds, so without the last rank's file every tensor is
    whole, only smaller (a probe: ``check`` said ok). The ``config.json`` saved beside the pieces is
    then the one witness: tensors that do not fit it are a problem. An architecture ckptscope has no
    shape rules for is not judged."""
    if INFERRED_SHAPES not in index.metadata:
        return []
    config = index.saved_config
    if config is None:
        return []
    from ckptscope.mappings.config import hf_shape_problems

    try:
        found = hf_shape_problems(config, {name: meta.shape for name, meta in index.tensors.items()}, shapes_only=True)
    except (CkptError, KeyError, TypeError, ValueError):  # no rules for this config: nothing to judge by
        return []
    if not found:
        return []
    return [Problem("incomplete", "config.json", (), f"the tensors do not fit it ({'; '.join(found[:3])}"
                    f"{f'; {len(found) - 3} more' if len(found) > 3 else ''}): the writer stores no global "
                    "shape, so a rank's shard file that is missing shows only here")]


def config_problems(index: CheckpointIndex) -> list[Problem]:
    """A model config saved with the weights that no model can have: a ``config.json`` whose values
    transformers cannot build from (a size that is no whole number, ``architectures`` that are no
    strings), or sizes in it or in the Megatron args beyond any model (10**15 layers, a top-k over
    more experts than there are). A probe: check said ok while convert and diff refused them. The
    same type and bound rules the exports refuse by; the values themselves are the model's."""
    from ckptscope.mappings.config import check_hf_config_types, check_model_sizes
    from ckptscope.mappings.resolve import config_from_index

    config = index.saved_config
    config_file = next((f.path for f in index.files if f.role == "config" and Path(f.path).name == "config.json"),
                       None)
    if config is not None:
        try:
            check_hf_config_types(config, where="config.json")
        except CkptError as exc:
            return [Problem("bad-config", config_file, (), exc.problem.removeprefix("config.json: ")
                            + ": transformers cannot build the model from it")]
    try:
        model = config_from_index(index)
    except (CkptError, TypeError, ValueError, KeyError):  # an architecture or spelling the mappings do not read
        return []  # nothing to judge by (what it does to an export, convert says)
    try:
        check_model_sizes(model)
    except CkptError as exc:
        said = "config.json's" if config is not None else "the Megatron args'"
        detail = exc.problem.replace("the model config's", said, 1)
        return [Problem("bad-config", config_file if config is not None else None, (), f"{detail}: no model has that")]
    return []


def check_index(index: CheckpointIndex, root: Path) -> tuple[list[Problem], int, int]:
    """Every check on one index whose chunk files are relative to ``root``.

    Returns the problems (file paths relative to ``root``), the files examined, and the chunks.
    """
    problems, files, chunks = file_problems(index.tensors.values(), root)
    problems.extend(metadata_problems(index.tensors.values()))
    problems.extend(inferred_shape_problems(index))
    problems.extend(config_problems(index))
    seen = {(p.kind, p.file) for p in problems if p.file is not None}
    for issue in index.issues:  # the reader's own findings, unless already reported more precisely
        if issue.file is not None and (issue.kind, issue.file) in seen:
            continue
        problems.append(Problem(issue.kind, issue.file, issue.tensors, issue.detail))
    files |= {f.path for f in index.files}
    files |= {i.file for i in index.issues if i.file is not None}
    return problems, len(files), chunks


def _tracked_target(path: Path, found: list[IterationInfo], explicit: bool = False
                    ) -> tuple[IterationInfo | None, list[Problem]]:
    """Megatron and verl: the iteration the tracker names (the newest one when it names none that is
    here), and the tracker's problems (``explicit``: the user picks the iteration)."""
    problems: list[Problem] = []
    newest = found[0] if found else None
    try:
        text: str | None = (path / TRACKER).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        text = None
    if text is None:
        where = f"; checking the newest iteration ({newest.label}) instead" if newest and not explicit else ""
        problems.append(Problem("missing-marker", TRACKER, (),
                                "not found; trainers write it once a save is complete, and resume looks for "
                                f"it{where}"))
        return newest, problems
    if text == RELEASE:
        release = find_iteration(found, RELEASE)
        if release is not None:
            return release, problems
        problems.append(Problem("tracker", TRACKER, (), "names the 'release' checkpoint, but there is no "
                                "release/ directory"))
        return newest, problems
    if not text.isdigit():
        problems.append(Problem("tracker", TRACKER, (), f"holds {text[:40]!r}, not an iteration number"))
        return newest, problems
    wanted = int(text)
    named = find_iteration(found, wanted)
    if named is not None:
        return named, problems
    others = ", ".join(i.label for i in found[:5]) or "none"
    problems.append(Problem("tracker", TRACKER, (), f"names iteration {wanted}, which is not here "
                            f"(iterations found: {others})"))
    return newest, problems


def _untracked_target(found: list[IterationInfo]) -> tuple[IterationInfo | None, list[Problem]]:
    """torchtitan and HF Trainer keep no tracker: what the trainer resumes from, by its own rule, and
    a missing completeness marker there."""
    target = resume_target(found)
    problems: list[Problem] = []
    if target is None:
        problems.append(Problem("incomplete", None, (), "a save root without any checkpoint"))
    elif not target.complete and target.kind == "hf-trainer":
        name = Path(target.path).name
        good = next((i for i in found if i.complete and i.number is not None), None)
        fallback = (f"; the newest complete one is {Path(good.path).name}" if good
                    else "; no checkpoint here is complete")
        problems.append(Problem("missing-marker", f"{name}/{TRAINER_STATE}", (),
                                f"not found; transformers' Trainer writes it last, so the save of {name} did not "
                                f"finish, and resume_from_checkpoint=True (get_last_checkpoint: the highest "
                                f"number) would pick it{fallback}"))
    return target, problems


def _resolve_root(path: Path, iteration: Iteration | None = None
                  ) -> tuple[Path | None, list[Problem], Iteration | None, str | None]:
    """For a save root: the iteration to check (``iteration``, else the one the trainer resumes from:
    the tracker's, torchtitan's newest complete step, HF Trainer's highest checkpoint), the root's
    problems by its trainer's own markers, and the root's layout. ``(path, [], None, None)`` for
    anything else."""
    found = discover_iterations(path)
    if found is None:
        if iteration is not None:
            resolve_root(path, iteration)  # raises: not a save directory
        return path, [], None, None
    layout = describe_root(path, found)
    tracked = root_kind(found) in TRACKED_KINDS
    if iteration is not None:
        target: IterationInfo | None = pick_iteration(path, found, iteration)  # raises, listing what is there
        problems = _tracked_target(path, found, explicit=True)[1] if tracked else []
    elif tracked:
        target, problems = _tracked_target(path, found)
    else:
        target, problems = _untracked_target(found)
        if target is not None and root_kind(found) == "deepspeed":
            gap = tracker_gap(path, found, target)
            if gap is not None:  # DeepSpeed resumes from the tag in 'latest' only
                problems.append(Problem("tracker", "latest", (), gap))
    if target is None:
        return None, problems, None, layout
    return Path(target.path), problems, target.iteration, layout


def _check_save_state(given: Path) -> CheckReport:
    """An accelerate ``save_state`` dir with an FSDP sharded model: the model dir and every
    ``optimizer_<N>/`` DCP dir beside it."""
    parts = [given / ACCELERATE_FSDP_MODEL] + sorted(p for p in given.glob("optimizer_*") if p.is_dir())
    return _check_parts(given, parts, f"accelerate save_state dir (FSDP sharded model in {ACCELERATE_FSDP_MODEL}/)",
                        ACCELERATE_FSDP_MODEL)


def _check_parts(given: Path, parts: list[Path], layout: str, target: str) -> CheckReport:
    """A dir whose checkpoints are its subdirs: each checked whole, problems under their dir's name."""
    report = CheckReport(path=str(given), format=None, target=target, layout=layout)
    for part in parts:
        try:
            sub = check_checkpoint(part)
        except UnknownFormat as exc:
            report.problems.append(Problem("incomplete", part.name, (), f"not readable as a checkpoint: {exc.problem}"))
            continue
        report.format = report.format or sub.format
        report.tensors += sub.tensors
        report.files += sub.files
        report.chunks += sub.chunks
        report.problems += [replace(p, file=f"{part.name}/{p.file}" if p.file else part.name) for p in sub.problems]
    return report


def _merge_part(report: CheckReport, sub: CheckReport, rel: str) -> CheckReport:
    """``sub`` (a check of ``rel`` under the root) as the root's report: its problems under ``rel/``."""
    report.target = rel
    report.format = sub.format
    report.tensors, report.files, report.chunks = sub.tensors, sub.files, sub.chunks
    report.problems += [replace(p, file=f"{rel}/{p.file}" if p.file else rel) for p in sub.problems]
    return report


def check_checkpoint(path: str | Path, iteration: Iteration | None = None) -> CheckReport:
    """Check ``path`` (a checkpoint, or a save root: its trainer's markers and the iteration it would
    resume from, or ``iteration``).

    Raises ``CkptError`` when the checkpoint cannot be read at all, or ``iteration`` is not there
    (exit code 2 in the CLI).
    """
    given = Path(path)
    if iteration is None and discover_iterations(given) is None:
        if save_state_model(given) is not None:
            return _check_save_state(given)
        if verl_step_role(given) is not None:  # a verl global_step_N dir: each role saved in it
            roles = [given / role for role in VERL_ROLES if (given / role).is_dir()]
            return _check_parts(given, roles, f"verl step dir ({', '.join(r.name for r in roles)})", roles[0].name)
        if nemo_weights(given) is not None:  # a NeMo 2.0 checkpoint: its weights/ is the checkpoint
            return _check_parts(given, [Path(nemo_weights(given))], "NeMo 2.0 checkpoint (weights/ + context/)",
                                NEMO_WEIGHTS)
    target, problems, label, layout = _resolve_root(given, iteration)
    report = CheckReport(path=str(path), format=None, problems=problems, iteration=label, layout=layout)
    if target is None:
        if not problems:
            problems.append(Problem("incomplete", None, (), "a save root without any iteration"))
        return report
    prefix = ""
    if label is not None:
        report.target = target.relative_to(given).as_posix()
        prefix = "" if report.target == "." else report.target + "/"
        if target.name == ACCELERATE_FSDP_MODEL and save_state_model(target.parent) is not None:
            # the iteration is a save_state dir (accelerate, or the Trainer under FSDP): every part of it, not
            # only the model (a probe truncated the newest save's optimizer_0/ and the root's check said ok)
            return _merge_part(report, _check_save_state(target.parent), target.parent.relative_to(given).as_posix())
        step_roles = [target.parent / r for r in VERL_ROLES if (target.parent / r).is_dir()]
        if target.name in VERL_ROLES and len(step_roles) > 1:
            # every role of the verl step (actor and critic): the critic was never checked (a probe)
            step = _check_parts(target.parent, step_roles, "", target.name)
            return _merge_part(report, step, target.parent.relative_to(given).as_posix())
    try:
        reader = open_checkpoint(target)
    except UnknownFormat as exc:
        if label is None:
            raise
        if not any(p.kind == "missing-marker" and p.file is not None and p.file.startswith(prefix) for p in problems):
            problems.append(Problem("incomplete", report.target, (), f"no checkpoint here: {exc.problem}"))
        return report
    try:
        with reader:
            reader.show_stored_quantization()  # storage is checked as stored: FP8 payloads and scales apart
            index = reader.index()
            try:
                differing = reader.differing_replicas()
            except CkptError:
                differing = []  # a copy that cannot be read: its file's problem is reported below
            disagreeing = reader.disagreeing_copies()
    except CkptError as exc:
        # The format is recognised but one file of a checkpoint dir does not parse (a rank file cut
        # short mid-write): damage to report, like a short .distcp. A single file that does not
        # parse is a path that cannot be read at all (exit 2), as before.
        if target.is_file() or exc.path is None or Path(exc.path).resolve() == target.resolve():
            raise
        report.format = reader.format_name
        if report.layout is None:
            report.layout = describe_checkpoint(target, CheckpointIndex(path=str(target), format=reader.format_name))
        try:
            file: str | None = prefix + Path(exc.path).resolve().relative_to(target.resolve()).as_posix()
        except ValueError:  # a file outside the dir (a symlinked shard): named by the message itself
            file = None
        problems.append(Problem("unreadable-file", file, (), exc.problem))
        return report
    report.format = index.format
    if report.layout is None:
        report.layout = describe_checkpoint(target, index)
    root = target if target.is_dir() else target.parent
    found, report.files, report.chunks = check_index(index, root)
    found += side_file_problems(index, root)
    for name, chunk in differing:
        found.append(Problem("replica-mismatch", chunk.file, (name,),
                             f"this copy of a tensor every TP rank keeps differs from the one in "
                             f"{index.tensors[name].chunks[0].file}: the ranks ran different weights, and "
                             f"exports and diff take the first copy"))
    for name, file, detail in disagreeing:
        found.append(Problem("copy-mismatch", file, (name,), detail))
    report.tensors = len(index.tensors)
    seen = {(p.kind, p.file) for p in problems}
    for problem in found:
        file = f"{prefix}{problem.file}" if problem.file is not None else None
        if (problem.kind, file) in seen:
            continue
        problems.append(Problem(problem.kind, file, problem.tensors, problem.detail))
    return report
