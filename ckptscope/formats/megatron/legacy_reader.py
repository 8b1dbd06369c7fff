"""Megatron-LM legacy ``--ckpt-format torch`` iteration dirs, shown as one logical model.

FORMATS.md §3, MAPPING.md §4-§6. An ``iter_0000500/`` (or ``release/``) dir holds one
``torch.save`` file per model-parallel rank, ``mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt``, each
with that rank's *local* piece of the model. Opening the dir reads every rank's ``data.pkl``
with the safe unpickler (no torch) and builds the global model:

* layer ``decoder.layers.{j}`` of pipeline stage (p, v) becomes layer ``j + offset(p, v)``
  (``model`` or, with virtual pipeline, ``model0``, ``model1``, ...); offsets come from ``args``
  and are checked against the layers each stage actually holds;
* TP shards become chunks of one global tensor, each pointing at its rank file's bytes:
  column-parallel on dim 0, row-parallel on dim 1 (each rank's shard is contiguous in its own
  file, so a dim-1 shard is a plain chunk at a column offset), SwiGLU fc1 as ``[gate; up]``
  (two chunks per rank), replicated tensors from TP rank 0 (shapes checked on every rank);
* experts from every EP rank get global ids; dense tensors, duplicated in every EP file, come
  from EP rank 0;
* ``_extra_state`` entries, ``args``, ``iteration``, ``checkpoint_version``, ``opt_param_scheduler``
  and each rank's ``rng_state`` are objects; each rank's optimizer state and ``distrib_optim.pt``
  flat buffers are tensors named ``optimizer.<rank dir>.…`` / ``distrib_optim.<rank dir>.…`` in
  group ``optimizer`` (their mapping to parameters is not in the files).

``--trust-pickle`` is not needed here: the safe unpickler describes these files completely.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ckptscope.core.dtypes import DType
from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo, ObjectEntry
from ckptscope.core.tensor import Chunk, TensorMeta
from ckptscope.core.units import plural
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.dcp.reader import group_summary
from ckptscope.formats.megatron.legacy_layout import (
    DIST_OPTIM_FILE,
    MODEL_FILE,
    RANK_DIR,
    Parallelism,
    Split,
    counts_from_offsets,
    globalize,
    is_expert,
    is_extra_state,
    is_legacy_grouped,
    layer_offsets,
    local_experts,
    local_layer,
    offsets_from_counts,
    parse_rank_dir,
    tp_split,
)
from ckptscope.formats.pickles.safe import PickleStub, TensorRef, to_plain, type_name
from ckptscope.formats.pickles.torch_file import TorchZip, flatten, read_torch_zip, tensor_meta
from ckptscope.formats.registry import register_reader

_MODEL_KEY = re.compile(r"model(\d*)")
_ITER_DIR = re.compile(r"iter_(\d+)")
_PER_RANK_OBJECTS = ("rng_state",)
_TIED = "output_layer.weight"


def rank_dirs(path: Path) -> list[str]:
    """Names of the ``mp_rank_*`` subdirectories of ``path`` (sorted). Never raises."""
    try:
        with os.scandir(path) as entries:
            return sorted(e.name for e in entries if RANK_DIR.fullmatch(e.name) and e.is_dir())
    except OSError:
        return []


def _zip_finished(path: Path) -> bool:
    """A zip ends with its central directory, written last: a crashed ``torch.save`` lacks it."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            handle.seek(max(0, size - 65_600))
            return b"PK\x05\x06" in handle.read()
    except OSError:
        return False


def is_complete_save(path: Path) -> bool:
    """Every rank dir holds a finished ``model_optim_rng.pt`` and the (tp, pp, ep) name grid is full.

    Cheap (file names, sizes and each zip's last bytes; no pickle is read), for save-root listings.
    """
    names = rank_dirs(path)
    if not names:
        return False
    grids = set()
    for name in names:
        if not _zip_finished(path / name / MODEL_FILE):
            return False
        match = RANK_DIR.fullmatch(name)
        assert match is not None
        grids.add(tuple(int(g) for g in match.groups() if g is not None))
    widths = {len(g) for g in grids}
    if len(widths) != 1:
        return False
    axes = [sorted({g[i] for g in grids}) for i in range(widths.pop())]
    expected = 1
    for values in axes:
        if values != list(range(len(values))):
            return False
        expected *= len(values)
    return expected == len(grids)


def _args_dict(value: Any) -> dict[str, Any]:
    """The raw fields of the pickled ``argparse.Namespace`` (a stub) as a dict."""
    if isinstance(value, dict):
        return value
    if isinstance(value, PickleStub):
        state = value.state
        if isinstance(state, tuple) and len(state) == 2:
            state = {**(state[0] or {}), **(state[1] or {})}
        out = dict(state) if isinstance(state, dict) else {}
        out.update(value.dict_items)
        return {str(k): v for k, v in out.items()}
    return {}


def _readable_keys(value: Any, depth: int = 0) -> Any:
    """Dict keys that are dtypes or tuples of them (``distrib_optim.pt``) as ``bfloat16/float32``."""
    if depth > 32 or not isinstance(value, dict):
        return value
    out = {}
    for key, child in value.items():
        if isinstance(key, tuple) and key and all(isinstance(k, DType) for k in key):
            key = "/".join(k.name for k in key)
        elif isinstance(key, DType):
            key = key.name
        out[key] = _readable_keys(child, depth + 1)
    return out


_SHARED_ARGS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "kv_channels", "padded_vocab_size", "num_experts", "tensor_model_parallel_size",
                "pipeline_model_parallel_size", "expert_model_parallel_size", "virtual_pipeline_model_parallel_size")
"""Args every rank of one save records alike (``rank``, ``local_rank`` ... differ by design)."""


@dataclass(slots=True)
class _Rank:
    """One rank file: its folder, ranks and parsed pickle."""

    dir: str
    tp: int
    pp: int
    ep: int
    parsed: TorchZip

    @property
    def rel(self) -> str:
        return f"{self.dir}/{MODEL_FILE}"


@dataclass(slots=True)
class _Logical:
    """A global tensor being assembled: its TP pieces, by TP rank."""

    local_name: str
    split: Split
    expert: bool
    pieces: dict[int, tuple[_Rank, str, TensorRef]] = field(default_factory=dict)
    """tp rank -> (rank file, stored name, tensor ref)."""


@register_reader
class MegatronLegacyReader(CheckpointReader):
    """A Megatron-LM ``--ckpt-format torch`` iteration dir (``iter_0000500/`` with ``mp_rank_*/``)."""

    format_name = "megatron_legacy"
    priority = 100

    @classmethod
    def supports(cls, path: Path) -> bool:
        try:
            return path.is_dir() and bool(rank_dirs(path))
        except OSError:
            return False

    # --- indexing ----------------------------------------------------------------------------

    def _build_index(self) -> CheckpointIndex:
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        names = rank_dirs(self.path)
        present = [n for n in names if (self.path / n / MODEL_FILE).is_file()]
        for name in sorted(set(names) - set(present)):
            index.add_issue("missing-file", "missing (incomplete save?); that rank's tensors are absent",
                            file=f"{name}/{MODEL_FILE}",
                            warning=f"{name}/{MODEL_FILE} is missing (incomplete save?); that rank's tensors are absent")
        if not present:
            raise CkptError(f"no {MODEL_FILE} in any mp_rank_* folder (incomplete save?)", self.path)
        first = self._first_readable(present)
        top = first.obj if isinstance(first.obj, dict) else {}
        args = _args_dict(top.get("args"))
        sizes = self._sizes(index, args, present)
        tp_seen = max(int(n[len("mp_rank_"):][:2]) for n in names) + 1  # the TP number is never ambiguous
        if tp_seen > sizes.tp:
            index.warnings.append(f"args say TP={sizes.tp} but there are mp_rank folders up to TP rank "
                                  f"{tp_seen - 1}; using TP={tp_seen}")
            sizes = replace(sizes, tp=tp_seen)
        ranks = self._read_ranks(index, present, sizes, first)
        self._check_grid(index, ranks, sizes)
        self._check_rank_args(index, ranks, top)
        parts = self._model_parts(ranks)
        vpp = max(len(p) for p in parts.values()) if parts else 1
        if vpp > 1 and sizes.vpp != vpp:
            sizes = replace(sizes, vpp=vpp)
        offsets = self._layer_offsets(index, args, sizes, ranks, parts)
        self._add_model(index, ranks, parts, sizes, offsets, args)
        self._add_rank_state(index, ranks)
        self._add_common(index, top, ranks)
        index.metadata["megatron_legacy"] = {
            "tensor_model_parallel_size": sizes.tp, "pipeline_model_parallel_size": sizes.pp,
            "expert_model_parallel_size": sizes.ep, "virtual_pipeline_model_parallel_size": sizes.vpp,
            "num_layers": sizes.num_layers, "ranks": [r.dir for r in ranks],
            "layer_offsets": {f"pp{p}" + (f".vpp{v}" if sizes.vpp else ""): o
                              for (p, v), o in sorted(offsets.items(), key=lambda kv: (kv[0][1], kv[0][0]))},
        }
        index.metadata["groups"] = group_summary(index.tensors)
        return index

    def _first_readable(self, present: list[str]) -> TorchZip:
        """The first rank file that parses (it supplies args); the error of the first one if none does."""
        error: CkptError | None = None
        for name in present:
            try:
                parsed = read_torch_zip(self.path / name / MODEL_FILE)
            except CkptError as exc:
                error = error or exc
                continue
            if name != present[0]:
                present.insert(0, present.pop(present.index(name)))
            return parsed
        assert error is not None
        raise error

    def _sizes(self, index: CheckpointIndex, args: dict[str, Any], present: list[str]) -> Parallelism:
        """Parallel sizes from ``args``; without args, from the folder names (PP assumed for one suffix)."""
        if args:
            return Parallelism.from_args(args)
        index.warnings.append("no args in the rank files: parallel sizes guessed from the folder names "
                              "(a single suffix is read as the pipeline rank)")
        groups = [[int(g) for g in RANK_DIR.fullmatch(n).groups() if g is not None] for n in present]  # type: ignore[union-attr]
        width = max(len(g) for g in groups)
        tp = max(g[0] for g in groups) + 1
        pp = max(g[1] for g in groups if len(g) > 1) + 1 if width > 1 else 1
        ep = max(g[2] for g in groups if len(g) > 2) + 1 if width > 2 else 1
        return Parallelism(tp=tp, pp=max(pp, 2) if width > 1 else 1, ep=max(ep, 2) if width > 2 else 1)

    def _read_ranks(self, index: CheckpointIndex, present: list[str], sizes: Parallelism,
                    first: TorchZip) -> list[_Rank]:
        ranks = []
        for name in present:
            where = parse_rank_dir(name, sizes.pp, sizes.ep)
            if where is None:
                index.warnings.append(f"{name}: does not fit TP={sizes.tp} PP={sizes.pp} EP={sizes.ep} "
                                      "from args; skipped")
                continue
            path = self.path / name / MODEL_FILE
            index.files.append(FileInfo(f"{name}/{MODEL_FILE}", path.stat().st_size, "data"))
            try:
                parsed = first if name == present[0] else read_torch_zip(path)
            except CkptError as exc:  # one damaged rank: the others stay browsable
                index.add_issue("unreadable-file", f"{exc.problem}; that rank's tensors are absent",
                                file=f"{name}/{MODEL_FILE}")
                continue
            ranks.append(_Rank(name, *where, parsed=parsed))
        if not ranks:
            raise CkptError("no mp_rank_* folder matches the parallel sizes in args", self.path)
        ranks.sort(key=lambda r: (r.pp, r.ep, r.tp))
        return ranks

    @staticmethod
    def _check_rank_args(index: CheckpointIndex, ranks: list[_Rank], top: dict[str, Any]) -> None:
        """Every rank file of one save records the same iteration and the same model and parallel sizes
        in its args; one that says otherwise is a file of another run or save copied in (a probe: rank 1's
        args said TP 4, and inspect, check and convert read rank 0's without a word). ``args-mismatch``,
        which ``check`` reports and exports refuse."""
        ours = _args_dict(top.get("args"))
        for rank in ranks:
            obj = rank.parsed.obj if isinstance(rank.parsed.obj, dict) else {}
            if obj is top:
                continue
            theirs = _args_dict(obj.get("args"))
            said = [(key, ours.get(key), theirs.get(key)) for key in _SHARED_ARGS
                    if key in ours and key in theirs and ours.get(key) != theirs.get(key)]
            if "iteration" in top and "iteration" in obj and top["iteration"] != obj["iteration"]:
                said.insert(0, ("iteration", top["iteration"], obj["iteration"]))
            if said:
                key, first, other = said[0]
                more = f" (and {len(said) - 1} more)" if len(said) > 1 else ""
                index.add_issue("args-mismatch", f"its {key} is {other!r} where the first rank file's is {first!r}"
                                f"{more}: a rank file of another run or save?", file=rank.rel)

    @staticmethod
    def _check_grid(index: CheckpointIndex, ranks: list[_Rank], sizes: Parallelism) -> None:
        have = {(r.tp, r.pp, r.ep) for r in ranks}
        # counted, never listed: the sizes are whatever args say (a probe: a TP size of 10**15)
        inside = sum(1 for t, p, e in have if t < sizes.tp and p < sizes.pp and e < sizes.ep)
        count = sizes.tp * sizes.pp * sizes.ep - inside
        if count:
            grid = ((t, p, e) for t in range(sizes.tp) for p in range(sizes.pp) for e in range(sizes.ep))  # lazy
            first = itertools.islice((rank for rank in grid if rank not in have), 8)
            shown = ", ".join(f"tp{t}/pp{p}/ep{e}" for t, p, e in first)
            index.add_issue("missing-file", f"{count} rank file(s) missing ({shown}): their shards read as zeros")
        extra = sorted(f"{r.dir}" for r in ranks if r.tp >= sizes.tp or r.pp >= sizes.pp or r.ep >= sizes.ep)
        if extra:
            index.warnings.append(f"rank folders beyond the sizes in args: {', '.join(extra)}")

    @staticmethod
    def _model_parts(ranks: list[_Rank]) -> dict[str, list[tuple[int, str, Any]]]:
        """Per rank dir: ``(virtual stage, key, state dict)`` for ``model`` / ``model0``, ``model1``, ..."""
        out: dict[str, list[tuple[int, str, Any]]] = {}
        for rank in ranks:
            obj = rank.parsed.obj if isinstance(rank.parsed.obj, dict) else {}
            found = []
            for key, value in obj.items():
                match = _MODEL_KEY.fullmatch(str(key))
                if match:
                    found.append((int(match.group(1) or 0), str(key), value))
            out[rank.dir] = sorted(found, key=lambda item: item[0])
        return out

    def _layer_offsets(self, index: CheckpointIndex, args: dict[str, Any], sizes: Parallelism,
                       ranks: list[_Rank], parts: dict[str, list[tuple[int, str, Any]]]) -> dict[tuple[int, int], int]:
        """Offsets from args when they agree with the layers present, else counted from the files."""
        if sizes.pp == 1 and not sizes.vpp:
            return {(0, 0): 0}
        counts: dict[tuple[int, int], int] = {}
        for rank in ranks:
            for v, _, state in parts[rank.dir]:
                held = {local_layer(name) for name, _ in flatten(state)} - {None}
                counts[(rank.pp, v)] = max(counts.get((rank.pp, v), 0), max(held, default=-1) + 1)  # type: ignore[type-var]
        chunks = 1 + max((v for held in parts.values() for v, _, _ in held), default=0)
        if (sizes.vpp or 1) != chunks:  # (a probe: a VPP size of 10**15 listed that many stages)
            index.warnings.append(f"args say {sizes.vpp or 1} virtual pipeline stages, the rank files hold "
                                  f"{plural(chunks, 'model chunk')}: global layer indices are counted from the files")
            return offsets_from_counts(counts)
        from_args = layer_offsets(args, sizes.pp, sizes.vpp) if args else None
        if from_args is not None and sizes.num_layers is not None:
            implied = counts_from_offsets(from_args, sizes.num_layers)
            if all(implied.get(stage) == n for stage, n in counts.items()):
                return from_args
            index.warnings.append("layer counts per pipeline stage disagree with args; global layer indices "
                                  "are counted from the files instead")
        elif sizes.pp > 1 or (sizes.vpp or 1) > 1:
            index.warnings.append("pipeline layer offsets not derivable from args; counted from the files")
        return offsets_from_counts(counts)

    # --- the model ---------------------------------------------------------------------------

    def _add_model(self, index: CheckpointIndex, ranks: list[_Rank], parts: dict[str, list[tuple[int, str, Any]]],
                   sizes: Parallelism, offsets: dict[tuple[int, int], int], args: dict[str, Any]) -> None:
        expert_local = self._experts_per_rank(sizes, ranks, parts)
        logical: dict[str, _Logical] = {}
        seen_objects: set[str] = set()
        layers: dict[int, set[tuple[int, int]]] = {}
        order = sorted(((v, r.pp, r.ep, r.tp, r, key, state) for r in ranks for v, key, state in parts[r.dir]),
                       key=lambda item: item[:4])
        for v, pp, ep, tp, rank, key, state in order:
            offset = offsets.get((pp, v), 0)
            for local, leaf in flatten(state):
                name = globalize(local, offset, ep * expert_local)
                if is_extra_state(local) or not isinstance(leaf, TensorRef) or leaf.storage is None:
                    if name not in seen_objects:
                        seen_objects.add(name)
                        index.objects.append(ObjectEntry(name, type_name(leaf), to_plain(leaf)))
                    continue
                layer = local_layer(name)
                if layer is not None:
                    layers.setdefault(layer, set()).add((pp, v))
                if is_legacy_grouped(local) and (sizes.ep > 1 or sizes.tp > 1) and name not in logical:
                    index.warnings.append(f"{name}: legacy GroupedMLP weights (all local experts fused) are "
                                          "shown from TP rank 0 / EP rank 0 only")
                expert = is_expert(local)
                entry = logical.get(name)
                if entry is None:
                    entry = logical[name] = _Logical(local, self._split(local, expert, sizes), expert)
                held = entry.pieces.get(tp)
                if held is None:
                    if ep == 0 or expert or not any(r.ep == 0 and r.pp == pp for r in ranks):
                        entry.pieces[tp] = (rank, f"{key}.{local}", leaf)
                    continue
                if held[0].ep != ep:  # a dense tensor's copy in another EP rank's file
                    if held[2].shape != leaf.shape or held[2].dtype != leaf.dtype:
                        index.warnings.append(f"{name}: differs between {held[0].dir} and {rank.dir} "
                                              f"({list(held[2].shape)} vs {list(leaf.shape)})")
                    continue
                index.warnings.append(f"{name}: stored by two pipeline stages ({held[0].dir} {held[1]!r} and "
                                      f"{rank.dir} {key}.{local!r}); layer offsets are inconsistent, kept the first")
        tied = sizes.pp > 1 and args.get("untie_embeddings_and_output_weights") is False
        for name, entry in logical.items():
            meta = self._assemble(index, name, entry, sizes)
            if tied and name == _TIED:
                meta = replace(meta, attrs=meta.attrs + (("tied_copy_of", "embedding.word_embeddings.weight"),))
            index.tensors[name] = meta
        self._check_layers(index, layers, sizes)

    @staticmethod
    def _experts_per_rank(sizes: Parallelism, ranks: list[_Rank], parts: dict[str, list[tuple[int, str, Any]]]) -> int:
        if sizes.num_experts and sizes.ep and sizes.num_experts % sizes.ep == 0:
            return sizes.num_experts // sizes.ep
        highest = -1
        for rank in ranks:
            for _, _, state in parts[rank.dir]:
                for name, _ in flatten(state):
                    found = local_experts(name)
                    if found is not None:
                        highest = max(highest, found)
        return highest + 1

    @staticmethod
    def _split(local: str, expert: bool, sizes: Parallelism) -> Split:
        if sizes.tp == 1:
            return Split.REPLICATED
        if expert and sizes.etp == 1:
            return Split.REPLICATED  # experts not split over TP: every TP file has the whole expert
        return tp_split(local, swiglu=sizes.swiglu, local_impl=sizes.local_impl)

    def _assemble(self, index: CheckpointIndex, name: str, entry: _Logical, sizes: Parallelism) -> TensorMeta:
        """The global tensor: one chunk per TP piece (two for SwiGLU fc1), at its global offset."""
        ranks = sorted(entry.pieces)
        base_rank, stored, base = entry.pieces[ranks[0]]
        shapes = {entry.pieces[t][2].shape for t in ranks}
        dtypes = {entry.pieces[t][2].dtype.name for t in ranks}
        split = entry.split
        tp = sizes.etp if entry.expert and sizes.etp else sizes.tp
        if len(dtypes) > 1:
            index.warnings.append(f"{name}: dtype differs across TP ranks ({', '.join(sorted(dtypes))}); "
                                  "showing TP rank 0")
            split = Split.REPLICATED
        elif len(shapes) > 1:
            index.warnings.append(f"{name}: shape differs across TP ranks ({sorted(shapes)}); showing TP rank 0")
            split = Split.REPLICATED
        dim = 1 if split is Split.ROW else 0
        if split is not Split.REPLICATED and (len(base.shape) <= dim or (split is Split.GLU and base.shape[0] % 2)):
            index.warnings.append(f"{name}: shape {list(base.shape)} does not fit a {split.value} split; "
                                  "showing TP rank 0")
            split = Split.REPLICATED
        if split is not Split.REPLICATED and tp != sizes.tp:
            index.warnings.append(f"{name}: expert tensor parallel size {tp} differs from TP {sizes.tp}; "
                                  "shards are placed by TP rank")
        attrs: tuple[tuple[str, str], ...] = (("group", "model"), ("stored_as", stored))
        if split is Split.REPLICATED:
            chunk = self._chunk(name, base_rank, base)
            if entry.split is Split.REPLICATED and len(ranks) > 1:  # every TP rank's copy (check compares them)
                self._replicas[name] = [self._chunk(name, entry.pieces[t][0], entry.pieces[t][2])
                                        for t in ranks[1:] if entry.pieces[t][2].storage is not None]
            return TensorMeta(name, base.dtype.name, base.shape, (chunk,), attrs)
        shape = list(base.shape)
        chunks: list[Chunk] = []
        if split is Split.GLU:
            half = shape[0] // 2
            full = half * sizes.tp
            for t in ranks:
                rank, _, ref = entry.pieces[t]
                whole = self._chunk(name, rank, ref)
                chunks.append(_rows(whole, ref, 0, half, (t * half,)))
                chunks.append(_rows(whole, ref, half, 2 * half, (full + t * half,)))
            shape[0] = 2 * full
            attrs += (("tp_split", "dim 0, [gate; up]: rank t holds [gate_t; up_t]"),)
        else:
            size = shape[dim]
            for t in ranks:
                rank, _, ref = entry.pieces[t]
                offsets = [0] * len(shape)
                offsets[dim] = t * size
                chunks.append(replace(self._chunk(name, rank, ref), offsets=tuple(offsets)))
            shape[dim] = size * sizes.tp
            attrs += (("tp_split", f"dim {dim} ({split.value}-parallel)"),)
        return TensorMeta(name, base.dtype.name, tuple(shape), tuple(chunks), attrs)

    def _chunk(self, name: str, rank: _Rank, ref: TensorRef) -> Chunk:
        placement = rank.parsed.storages.get(ref.storage.key) if ref.storage else None
        meta = tensor_meta(name, ref, rank.rel, placement, big_endian=rank.parsed.big_endian,
                           path=self.path / rank.rel)
        return meta.chunks[0]

    @staticmethod
    def _check_layers(index: CheckpointIndex, layers: dict[int, set[tuple[int, int]]], sizes: Parallelism) -> None:
        """Every global layer exactly once: 0..L-1, each from one pipeline stage."""
        shared = sorted(layer for layer, stages in layers.items() if len(stages) > 1)
        if shared:
            index.warnings.append(f"global layers {shared[:10]} come from more than one pipeline stage")
        count = sizes.num_layers
        if count is None or not layers:
            return
        # never range(count) as a set: the args' num_layers is whatever the file says (a probe: 10**15)
        extra = sorted(layer for layer in layers if not 0 <= layer < count)
        if extra or len(layers) != count:
            missing = list(itertools.islice((layer for layer in range(count) if layer not in layers), 10))
            index.warnings.append(f"layers do not cover 0..{count - 1}: missing {missing}, beyond {extra[:10]}")

    # --- everything else ---------------------------------------------------------------------

    def _add_rank_state(self, index: CheckpointIndex, ranks: list[_Rank]) -> None:
        """Per-rank optimizer state, rng state and ``distrib_optim.pt``, named by rank dir."""
        for rank in ranks:
            obj = rank.parsed.obj if isinstance(rank.parsed.obj, dict) else {}
            for key in _PER_RANK_OBJECTS:
                if key in obj:
                    index.objects.append(ObjectEntry(f"{key}.{rank.dir}", type_name(obj[key]), to_plain(obj[key])))
            for key, value in obj.items():
                key = str(key)
                if _MODEL_KEY.fullmatch(key) or key in _PER_RANK_OBJECTS:
                    continue
                if key == "optimizer" or _has_tensor(value):
                    self._add_tree(index, f"{key}.{rank.dir}", value, rank.parsed, rank.rel, "optimizer"
                                   if key.startswith("optim") else "other")
            dist_path = self.path / rank.dir / DIST_OPTIM_FILE
            if dist_path.is_file():
                rel = f"{rank.dir}/{DIST_OPTIM_FILE}"
                index.files.append(FileInfo(rel, dist_path.stat().st_size, "optimizer"))
                parsed = read_torch_zip(dist_path)
                self._add_tree(index, f"distrib_optim.{rank.dir}", _readable_keys(parsed.obj), parsed, rel,
                               "optimizer", layout="distributed-optimizer flat buffer (DP-zero gathered; "
                               "param mapping not in the file)")

    def _add_tree(self, index: CheckpointIndex, prefix: str, value: Any, parsed: TorchZip, rel: str, group: str,
                  layout: str | None = None) -> None:
        for name, leaf in flatten(value, prefix):
            if isinstance(leaf, TensorRef) and leaf.storage is not None:
                meta = tensor_meta(name, leaf, rel, parsed.storages.get(leaf.storage.key),
                                   big_endian=parsed.big_endian, path=self.path / rel)
                extra: tuple[tuple[str, str], ...] = (("group", group),)
                if layout:
                    extra += (("layout", layout),)
                index.tensors[name] = replace(meta, attrs=meta.attrs + extra)
            else:
                index.objects.append(ObjectEntry(name, type_name(leaf), to_plain(leaf)))

    def _add_common(self, index: CheckpointIndex, top: dict[Any, Any], ranks: list[_Rank]) -> None:
        """args, iteration, checkpoint_version, scheduler ...: the same in every rank file; from the first."""
        common = [(str(k), v) for k, v in top.items()
                  if not _MODEL_KEY.fullmatch(str(k)) and str(k) not in _PER_RANK_OBJECTS
                  and str(k) != "optimizer" and not _has_tensor(v)]
        index.objects[:0] = [ObjectEntry(k, type_name(v), to_plain(v)) for k, v in common]
        for key in ("iteration", "checkpoint_version", "num_floating_point_operations_so_far"):
            value = top.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                index.metadata[key] = value
        if "iteration" not in index.metadata:
            match = _ITER_DIR.fullmatch(self.path.name)
            if match:
                index.metadata["iteration"] = int(match.group(1))
        # Megatron-LM's fix_query_key_value_ordering permutes only the pre-mcore ``query_key_value`` /
        # ``key_value`` rows of checkpoints older than 2.0 (a missing version reads as 0); mcore names never
        version = index.metadata.get("checkpoint_version", 0)
        if isinstance(version, (int, float)) and version < 2.0 and any(
                n.endswith((".query_key_value.weight", ".query_key_value.bias", ".key_value.weight",
                            ".key_value.bias")) for n in index.tensors):
            said = f"checkpoint_version {version}" if "checkpoint_version" in index.metadata else \
                "no checkpoint_version (read as 0)"
            index.warnings.append(f"{said}: query_key_value rows use the pre-2.0 ordering (Megatron permutes them "
                                  "on load); shown as stored")


def _has_tensor(value: Any) -> bool:
    return any(isinstance(leaf, TensorRef) for _, leaf in flatten(value))


def _rows(chunk: Chunk, ref: TensorRef, start: int, stop: int, offset0: tuple[int]) -> Chunk:
    """Rows ``start:stop`` (axis 0) of a chunk as a chunk of their own, at global row ``offset0``."""
    itemsize = ref.dtype.itemsize
    shape = (stop - start, *chunk.shape[1:])
    strides = chunk.strides or ref.stride
    span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    return replace(chunk, offsets=offset0 + (0,) * (len(shape) - 1), shape=shape,
                   byte_offset=chunk.byte_offset + start * strides[0] * itemsize, byte_length=span * itemsize)
