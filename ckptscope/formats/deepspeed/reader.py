"""DeepSpeed ZeRO checkpoints (FORMATS.md §7), shown as the one fp32 model ``zero_to_fp32`` rebuilds.

A save dir holds ``latest`` (the tag) and ``<tag>/`` (``global_stepN/``) with
``mp_rank_00_model_states.pt`` (ZeRO 1/2) or ``zero_pp_rank_{dp}_mp_rank_00_model_states.pt``
(ZeRO-3, one per data-parallel rank), and ``[bf16_]zero_pp_rank_{dp}_mp_rank_00_optim_states.pt``.
Either the tag dir or the save dir (through ``latest``) opens.

The fp32 master weights live only as flat per-rank partitions in the optim files; the model-states
file says which params they hold (``param_shapes``, one ordered ``name -> shape`` per param group).
How DeepSpeed's ``zero_to_fp32`` cuts them up, which this reader follows:

* **ZeRO 1/2**: per param group, the ranks' ``single_partition_of_fp32_groups[g]`` concatenated in
  rank order are one flat vector; params follow each other in ``param_shapes[g]`` order (plus, since
  DeepSpeed 0.18, ``param_alignment_paddings[g][i]`` elements after param ``i``); the tail is
  alignment padding (both ends rounded up to ``2 * world_size`` must agree). A param may straddle a
  rank boundary. Saved partitions are the padded ones minus ``group_paddings`` (non-zero on the
  last rank only), so every rank but the last holds the same ``P`` elements.
* **ZeRO-3**: every param is partitioned on its own: ``p = ceil(numel / W)`` elements per rank,
  the last rank padded. Params follow each other in every rank's ``fp32_flat_groups``
  (concatenated over groups); param ``i`` at running offset ``o`` has its elements
  ``[r*p, min((r+1)*p, numel))`` at ``[o, o + ...)`` of rank ``r``'s flat groups.

So every param is a handful of *flat element ranges* of its C-order shape, each a contiguous run
of one rank file's storage. A flat range is cut into at most ``2 * ndim - 1`` boxes that are each
contiguous in C order (a partial row, whole rows, a partial row, recursively), so every piece is an
ordinary RAW ``Chunk`` at a byte offset in the rank file: no chunk-model change, lazy reads, and
``byte_span`` works for a region inside one piece. Nothing is loaded at index time beyond the
pickles (safe stub unpickler; torch is never imported).

Names: the fp32 params under their module names (the model); the Adam moments reassembled the
same way under ``optimizer.state.<key>.<param>`` (training state); the rest of the optimizer state
(``step``, loss scaler, param groups, slice mappings) under ``optimizer.``. Buffers come from the
model-states ``module`` (floating ones read as float32, as ``zero_to_fp32`` does); frozen params
from ``frozen_param_fragments`` (stored dtype; ZeRO-3: rank fragments concatenated and trimmed).
``shared_params`` aliases point at their target's chunks. The module's own bf16/fp16 param copies
(ZeRO 1/2) are listed under ``lp_params.`` and tagged as optimizer state: they are derived from
the fp32 masters after every step and would otherwise shadow the model. Without any optim file the
module's weights *are* the model and are listed under their names (ZeRO-3's placeholders are empty:
a warning says the weights are in the missing optim files).

A missing rank file is an issue (``check``) and a warning; reading the elements it held is an error
naming it.

A ``PipelineModule`` save has one model/optim pair per stage (``mp_rank_{stage:02d}``, module None) and one
``layer_NN[-model_00]-model_states.pt`` per layer: each stage is read as above and merged under the module's
names (layer ids are global), then the layer files add the module weights (``lp_params.`` beside masters,
the model without). AutoTP saves (``mp_rank_01`` ... without layer files, with an affine map) read each TP
rank as above and place its shards in the whole tensors (``formats.deepspeed.autotp``). Other tensor-parallel
saves (layer files of TP rank > 0, no affine map, a placement that is no box) are not assembled: rank 00
only, each other file an ``unassembled-file`` issue. MoE saves (``formats.deepspeed.moe``): at ZeRO-0 every
expert file joins the module; under ZeRO-1/2 the expert param groups' masters come from their own
expert-data-parallel partitions, and the expert files are their ``lp_params.`` copies. The MoE files of a
pipeline save are not assembled.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ckptscope.core.dtypes import dtype_by_name
from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo, ObjectEntry
from ckptscope.core.tensor import Chunk, Encoding, TensorMeta
from ckptscope.formats.base import CheckpointReader, Region
from ckptscope.formats.deepspeed import moe
from ckptscope.formats.deepspeed.autotp import (
    Placement,
    Unplaceable,
    affine_params,
    entries_by_name,
    moved,
    moved_holes,
    placement,
)
from ckptscope.formats.hf.side_files import load_json
from ckptscope.formats.pickles.safe import PickleStub, TensorRef, to_plain, type_name
from ckptscope.formats.pickles.torch_file import (
    StoragePlacement,
    TorchZip,
    flatten,
    read_torch_zip,
    tensor_meta,
)
from ckptscope.formats.registry import register_reader
from ckptscope.formats.torch_save.legacy_reader import TorchLegacyReader, read_legacy

LATEST = "latest"
LATEST_UNIVERSAL = "latest_universal"
"""What ``ds_to_universal`` writes beside the ``<tag>_universal/`` dir it makes."""
UNIVERSAL_DIR = "zero"
UNIVERSAL_STATES = ("fp32", "exp_avg", "exp_avg_sq")
"""Per-param files of a universal checkpoint: the fp32 master (the model) and the Adam moments."""
MODEL_STATES = re.compile(r"^(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$")
OPTIM_STATES = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
LAYER_FILE = re.compile(r"^layer_(\d+)(?:-model_(\d+))?-model_states\.pt$")
"""``PipelineModule.save_state_dict``: one file per layer, ``layer_{idx:02d}[-model_{tp:02d}]-model_states.pt``
(the ``-model_NN`` part when the topology has a model axis, as Megatron-DeepSpeed's has)."""
_STEP = re.compile(r"global_step(\d+)$")
SHARED = "shares_storage_with"
LP_PREFIX = "lp_params."
MOMENT_PREFIX = "optimizer.state."
_FLAT_KEYS = {1: "single_partition_of_fp32_groups", 2: "single_partition_of_fp32_groups", 3: "fp32_flat_groups"}


# --- flat element ranges as C-contiguous boxes ------------------------------------------------------


Box = tuple[tuple[int, ...], tuple[int, ...], int]
"""``(offsets, box shape, flat index of the box's first element)``."""


def flat_range_boxes(shape: tuple[int, ...], start: int, stop: int) -> list[Box]:
    """Cut the C-order elements ``[start, stop)`` of a tensor of ``shape`` into boxes, each contiguous
    in C order: ``[(offsets, box shape, flat index of the box's first element)]`` in flat order.

    At most ``2 * ndim - 1`` boxes: the partial leading row, the whole rows, the partial last row,
    each partial row cut the same way one axis down.
    """
    if start >= stop:
        return []
    if not shape:
        return [((), (), 0)]
    if len(shape) == 1:
        return [((start,), (stop - start,), start)]
    inner = math.prod(shape[1:])
    first, last = start // inner, (stop - 1) // inner

    def row(index: int, lo: int, hi: int) -> list[Box]:
        return [((index, *off), (1, *shp), index * inner + flat)
                for off, shp, flat in flat_range_boxes(shape[1:], lo, hi)]

    if first == last:
        return row(first, start - first * inner, stop - first * inner)
    out = []
    if start % inner:
        out += row(first, start % inner, inner)
        first += 1
    tail = []
    if stop % inner:
        tail = row(last, 0, stop % inner)
        last -= 1
    if first <= last:
        out.append(((first,) + (0,) * (len(shape) - 1), (last - first + 1, *shape[1:]), first * inner))
    return out + tail


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of a flat vector stored contiguously in one file (``file`` None: its file is missing)."""

    length: int | None
    """Elements; None for a missing last rank whose length is unknown (it runs to the end)."""
    file: str | None
    byte_offset: int = 0
    missing: str = ""
    """The missing file's name, for errors."""


def _split(segments: list[Segment], start: int, stop: int) -> list[tuple[int, int, Segment, int]]:
    """The parts of flat range ``[start, stop)`` of the concatenation of ``segments``:
    ``(start, stop, segment, offset of start inside the segment)``."""
    out = []
    base = 0
    for seg in segments:
        end = math.inf if seg.length is None else base + seg.length
        lo, hi = max(start, base), min(stop, end)
        if lo < hi:
            out.append((lo, int(hi), seg, lo - base))
        if end >= stop:
            break
        base = int(end)
    return out


@dataclass(slots=True)
class _Piece:
    """Elements ``[start, stop)`` of a param, at ``offset`` elements into ``segment``."""

    start: int
    stop: int
    segment: Segment
    offset: int


@dataclass(slots=True)
class _Built:
    tensors: dict[str, TensorMeta] = field(default_factory=dict)
    holes: dict[str, list[tuple[tuple[int, ...], tuple[int, ...], str]]] = field(default_factory=dict)


# --- directory layout ---------------------------------------------------------------------------


@dataclass(slots=True)
class DsLayout:
    """The rank files of one tag dir."""

    mp: int = 0
    """The model-parallel rank (a pipeline stage, or a tensor-parallel rank) ``model`` and ``optim`` are of."""
    model: dict[int | None, str] = field(default_factory=dict)
    """DP rank (None for ``mp_rank_XX_model_states.pt``) -> file name, model-parallel rank ``mp`` only."""
    optim: dict[int, str] = field(default_factory=dict)
    bf16: bool = False
    other_mp: list[str] = field(default_factory=list)
    mp_ranks: set[int] = field(default_factory=set)
    """Every model-parallel rank with a model- or optim-states file."""
    layers: dict[int, str] = field(default_factory=dict)
    """PipelineModule layer files of tensor-parallel rank 0 (or of a topology without one): layer -> file."""
    unassembled: list[str] = field(default_factory=list)
    """Layer files of tensor-parallel ranks other than 0 (and, in ``DeepSpeedReader``, the MoE files of
    a save it does not assemble): their tensors are not shown."""
    experts: dict[tuple[int, int], str] = field(default_factory=dict)
    """MoE expert files of model-parallel rank ``mp``: (MoE layer, global expert id) -> file name (``moe``)."""
    expert_optim: dict[int, str] = field(default_factory=dict)
    """``expp_rank_{R}_mp_rank_{mp}_optim_states.pt``: expert-parallel rank -> file name."""
    universal: list[str] = field(default_factory=list)
    """``zero/<param>/`` dirs of a universal checkpoint (``ds_to_universal``), each with ``fp32.pt``."""


def ds_layout(tag_dir: Path, mp: int = 0) -> DsLayout | None:
    """The DeepSpeed files of ``tag_dir`` (rank files of model-parallel rank ``mp``), or None when it has
    none. Never raises."""
    try:
        names = sorted(p.name for p in tag_dir.iterdir() if p.is_file())
    except OSError:
        return None
    layout = DsLayout(mp=mp)
    found = False
    for name in names:
        m = MODEL_STATES.match(name)
        o = OPTIM_STATES.match(name)
        layer = LAYER_FILE.match(name)
        expert = moe.expert_file(name)
        expp = moe.expert_optim_rank(name)
        if expert is not None or expp is not None:
            if (expert.mp if expert is not None else expp[1]) != mp:
                layout.other_mp.append(name)
            elif expert is not None:
                layout.experts[(expert.layer, expert.expert)] = name
            else:
                layout.expert_optim[expp[0]] = name
        elif layer:
            if layer.group(2) is not None and int(layer.group(2)) != 0:
                layout.unassembled.append(name)
            else:
                layout.layers[int(layer.group(1))] = name
        elif m:
            found = True
            layout.mp_ranks.add(int(m.group(2)))
            if int(m.group(2)) != mp:
                layout.other_mp.append(name)
            else:
                layout.model[int(m.group(1)) if m.group(1) is not None else None] = name
        elif o:
            found = True
            layout.mp_ranks.add(int(o.group(3)))
            if int(o.group(3)) != mp:
                layout.other_mp.append(name)
            else:
                layout.optim[int(o.group(2))] = name
                layout.bf16 = layout.bf16 or bool(o.group(1))
    if found:
        layout.universal = _universal_params(tag_dir / UNIVERSAL_DIR)
    return layout if found else None


def _universal_params(zero_dir: Path) -> list[str]:
    """The param dirs of a universal checkpoint's ``zero/`` (those holding ``fp32.pt``), sorted; [] for none."""
    try:
        return sorted(p.name for p in zero_dir.iterdir() if (p / "fp32.pt").is_file())
    except OSError:
        return []


def _parallel_degrees(tag_dir: Path, stage: int, read: Callable[[Path], TorchZip]) -> tuple[int | None, int | None]:
    """(pipeline stages, tensor-parallel size) a pipeline save records in its first stage's model states:
    ``checkpoint_parallel_dimensions`` (DeepSpeed 0.17+), else ``mp_world_size`` for the stages."""
    layout = ds_layout(tag_dir, stage)
    name = next(iter(layout.model.values()), None) if layout else None
    if name is None:
        return None, None
    obj = read(tag_dir / name).obj
    obj = obj if isinstance(obj, dict) else {}
    dims = to_plain(obj.get("checkpoint_parallel_dimensions"))
    dims = dims if isinstance(dims, dict) else {}
    pp, tp = _as_int(dims.get("pp_degree")), _as_int(dims.get("tp_degree"))
    return (pp if pp is not None else _as_int(obj.get("mp_world_size"))), tp


def pipeline_stages(layout: DsLayout) -> list[int] | None:
    """The model-parallel ranks of a ``PipelineModule`` save when they are its stages, or None.

    DeepSpeed's pipeline engine names each stage's model- and optim-states files by its model-parallel
    rank (``mp_rank_{stage:02d}``) and writes every layer's weights to a layer file of its own. With
    tensor parallelism as well (Megatron-DeepSpeed's topology), layer files carry ``-model_NN`` and the
    ranks mix stages and TP ranks: not assembled."""
    if not layout.layers or any(LAYER_FILE.match(name) for name in layout.unassembled):
        return None
    return sorted(layout.mp_ranks) or None


def master_probes(index: CheckpointIndex) -> list[tuple[str, tuple[tuple[int, int], ...], str]]:
    """``(tensor, region, file)``: per file holding fp32 masters that have a module copy (``lp_params.``), the
    master's smallest chunk there (``DeepSpeedReader.disagreeing_copies`` compares it with the copy). A piece
    of a tensor split over TP ranks first: a replicated norm holds the same values on every rank, so it
    cannot tell one rank's file from another's."""
    best: dict[str, tuple[tuple[bool, int], str, Chunk]] = {}
    for name, meta in index.tensors.items():
        lp = index.tensors.get(LP_PREFIX + name)
        if lp is None or meta.attr("zero") is None or lp.shape != meta.shape:
            continue
        for chunk in meta.chunks:
            rank = (meta.attr("tp") is None, chunk.byte_length)
            if chunk.byte_length and (chunk.file not in best or rank < best[chunk.file][0]):
                best[chunk.file] = (rank, name, chunk)
    return [(name, tuple((o, o + n) for o, n in zip(chunk.offsets, chunk.shape)), file)
            for file, (_, name, chunk) in sorted(best.items())]


def latest_file(root: Path) -> str:
    """``latest``, or ``latest_universal`` for a save root holding only universal checkpoints."""
    return LATEST if (root / LATEST).exists() or not (root / LATEST_UNIVERSAL).exists() else LATEST_UNIVERSAL


def read_latest(root: Path) -> str | None:
    """The tag named by ``root/latest`` (``latest_universal``) when it is a dir beside it, else None.
    Never raises."""
    try:
        tag = (root / latest_file(root)).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not tag or "/" in tag or tag in (".", ".."):
        return None
    try:
        return tag if (root / tag).is_dir() else None
    except OSError:
        return None


def _as_int(value: Any) -> int | None:
    """``ZeroStageEnum.gradients`` (a stub built as ``ZeroStageEnum(2)``), or a plain int."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, PickleStub) and value.args and isinstance(value.args[0], int):
        return value.args[0]
    return None


def _shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    if isinstance(value, PickleStub) and value.args and isinstance(value.args[0], (tuple, list)):
        return _shape(value.args[0])
    return None


def _ordered(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    if isinstance(value, PickleStub):  # an OrderedDict subclass pickled as a stub
        return {str(k): v for k, v in value.dict_items.items()}
    return {}


def _slice_names(osd: dict) -> list[list[str]] | None:
    """Per param group, the names of the params this rank's partition holds (``param_slice_mappings``)."""
    mappings = osd.get("param_slice_mappings")
    if not isinstance(mappings, list):
        return None
    return [list(_ordered(m)) for m in mappings]


def _group_names(osd: dict) -> list[object] | None:
    """Per param group, its ``name`` in the base optimizer's ``param_groups`` (DeepSpeed's MoE groups have one)."""
    base = osd.get("base_optimizer_state")
    groups = base.get("param_groups") if isinstance(base, dict) else None
    if not isinstance(groups, list):
        return None
    return [g.get("name") if isinstance(g, dict) else None for g in groups]


# --- the reader -------------------------------------------------------------------------------------


def _add_trainer_config(index: CheckpointIndex, save_dir: Path, prefix: str) -> None:
    """The HF ``config.json`` the transformers Trainer writes beside ``global_stepN/`` (its
    ``checkpoint-N/``), as an object: under ZeRO-3 the Trainer saves no HF weights, so that config is
    all that says what the reassembled model is (convert and merge need it). Listed as a file when the
    save dir itself was opened; a config.json that is not a model config is left alone."""
    path = save_dir / "config.json"
    if not path.is_file():
        return
    try:
        config = load_json(path)
    except CkptError as exc:
        index.warnings.append(f"{path.name} beside the DeepSpeed save: {exc.problem}; not used")
        return
    if not isinstance(config, dict) or "model_type" not in config:
        return
    index.objects.append(ObjectEntry("config", "json", config))
    if prefix:
        index.files.append(FileInfo("config.json", path.stat().st_size, "config"))


def read_rank_file(path: Path) -> TorchZip:
    """A rank file as ``torch.save`` wrote it: a zip, or the legacy stream that DeepSpeed's
    ``checkpoint_serialization: false`` asks for (``_use_new_zipfile_serialization=False``; a probe's save of
    that kind was "corrupt torch zip file" in every rank file). Both give the object and its storages' places."""
    if TorchLegacyReader.supports(path):
        obj, placements, big_endian = read_legacy(path)
        return TorchZip(obj, placements, big_endian, "")
    return read_torch_zip(path)


@register_reader
class DeepSpeedReader(CheckpointReader):
    """A DeepSpeed ZeRO tag dir (``global_stepN/``), or its save dir through ``latest``."""

    format_name = "deepspeed"
    priority = 110

    def __init__(self, path: Path, *, trust_pickle: bool = False) -> None:
        super().__init__(path, trust_pickle=trust_pickle)
        self._upcast: dict[str, str] = {}
        """Buffers read as float32 from another stored float dtype: name -> stored dtype."""
        self._layer_zips: dict[int, TorchZip] = {}
        self._layer_shapes: dict[str, tuple[int, ...]] = {}
        """A pipeline save's layer files, parsed once, and their tensors' shapes under ``<layer>.<param>``."""
        self._parsed: dict[Path, TorchZip] = {}
        """Rank files parsed so far: a pipeline save reads a stage's files for its shapes and again for its index."""
        self._master_probes: list[tuple[str, tuple[tuple[int, int], ...], str]] = []
        self._pipeline_params: set[str] = set()
        """Every stage's params by ``param_slice_mappings`` (BF16_Optimizer pipelines): a layer's own params."""

    def _rank_file(self, path: Path) -> TorchZip:
        """``read_rank_file``, each file parsed once per reader."""
        parsed = self._parsed.get(path)
        if parsed is None:
            parsed = self._parsed[path] = read_rank_file(path)
        return parsed

    @classmethod
    def supports(cls, path: Path) -> bool:
        try:
            if not path.is_dir():
                return False
            if ds_layout(path) is not None:
                return True
            tag = read_latest(path)
            return tag is not None and ds_layout(path / tag) is not None
        except OSError:
            return False

    # --- index ----------------------------------------------------------------------------------

    def _build_index(self) -> CheckpointIndex:
        index = self._build_deepspeed_index()
        self._master_probes = master_probes(index)
        return index

    def disagreeing_copies(self) -> list[tuple[str, str, str]]:
        """Per optimizer file, its smallest fp32 master piece against the same elements of the module's own
        copy (``lp_params.``), which DeepSpeed writes from the masters after every step: equal bit for bit
        (fp32), or the master rounded to the copy's dtype (bf16/fp16). A file of another TP or DP rank, or of
        another save, holds other values (a probe: swapped TP rank files read as a model with its halves
        swapped, and check said ok)."""
        import numpy as np

        self.index()
        found = []
        for name, region, file in self._master_probes:
            box = tuple(slice(lo, hi) for lo, hi in region)
            try:
                master, copy = self.read(name, box), self.read(LP_PREFIX + name, box)
            except CkptError:
                continue  # a piece that cannot be read: its file's problem is reported on its own
            if master.dtype != copy.dtype:
                master = master.astype(copy.dtype)
            if not np.array_equal(np.ascontiguousarray(master).view(np.uint8), np.ascontiguousarray(copy).view(np.uint8)):
                where = ", ".join(f"{lo}:{hi}" for lo, hi in region)
                found.append((name, file, f"the fp32 master of {name}[{where}] here differs from the module's own copy "
                                          f"of it (lp_params.{name}), which DeepSpeed writes from the masters: this "
                                          "optimizer file belongs to another rank or another save"))
        return found

    def _build_deepspeed_index(self) -> CheckpointIndex:
        prefix = ""
        tag_dir = self.path
        layout = ds_layout(self.path)
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        if layout is None:
            tag = read_latest(self.path)
            if tag is None:
                raise CkptError("no DeepSpeed *_model_states.pt / *_optim_states.pt files and no usable 'latest'",
                                self.path)
            tag_dir, prefix = self.path / tag, f"{tag}/"
            layout = ds_layout(tag_dir)
            if layout is None:
                raise CkptError(f"'latest' names {tag}/, which holds no DeepSpeed rank files", self.path)
            latest = latest_file(self.path)
            index.files.append(FileInfo(latest, (self.path / latest).stat().st_size, "metadata"))
        self._prefix = prefix
        _add_trainer_config(index, tag_dir.parent, prefix)
        info: dict[str, Any] = {"tag": tag_dir.name}
        index.metadata["deepspeed"] = info
        step = _STEP.search(tag_dir.name)
        if step:
            index.metadata["iteration"] = int(step.group(1))
        stages = pipeline_stages(layout)
        if (layout.experts or layout.expert_optim) and stages:  # an MoE pipeline save: its expert files not placed
            layout.unassembled += sorted(layout.experts.values()) + sorted(layout.expert_optim.values())
            layout.experts, layout.expert_optim = {}, {}
        why_not = ""
        declared = 1 if stages or layout.layers or layout.unassembled else self._declared_tp(tag_dir, layout)
        if declared > 1 or (not stages and not layout.layers and not layout.unassembled and layout.other_mp):
            holes, replicas = dict(self._holes), dict(self._replicas)
            try:
                if self._index_autotp(index, tag_dir, prefix, layout, info, declared):
                    return index
                why_not = "no universal_checkpoint_info affine map says where each rank's shards lie"
            except Unplaceable as exc:
                why_not = str(exc)
                self._holes, self._replicas = holes, replicas
        # Tensor-parallel ranks (Megatron-DeepSpeed TP, AutoTP without a placement), their layer files and MoE
        # expert files hold tensors shown nowhere: damage to what ckptscope shows, so check fails and exports
        # refuse rather than write a model without them.
        other_mp = [] if stages else layout.other_mp
        layer_files = [] if stages else list(layout.layers.values())
        apart = other_mp + layer_files + layout.unassembled
        summary = (f"{len(apart)} DeepSpeed files are not assembled (tensor-parallel ranks, MoE expert files): "
                   f"the model shown lacks their tensors" + (f" ({why_not})" if why_not else ""))
        for rank in range(declared):
            if rank not in layout.mp_ranks:
                index.add_issue("missing-file", f"missing (tensor-parallel rank {rank} of {declared}, mp_world_size); "
                                "its shards cannot be read", file=f"{prefix}mp_rank_{rank:02d}_model_states.pt")
        for name in other_mp:
            index.add_issue("unassembled-file", "a model-parallel rank other than 00 of a tensor-parallel save: "
                            "ckptscope does not assemble this DeepSpeed tensor-parallel save"
                            + (f" ({why_not})" if why_not else "") + "; its tensors are not shown",
                            file=prefix + name, warning=summary)
        for name in sorted(layer_files + layout.unassembled):
            if "exp" in name:
                problem = ("an MoE file of a save with ZeRO partitions or pipeline stages: ckptscope assembles "
                           "DeepSpeed MoE saves at ZeRO stage 0 only; its tensors are not shown")
            else:
                problem = ("a PipelineModule layer file of a tensor-parallel save: ckptscope does not assemble "
                           "DeepSpeed tensor-parallel saves; its tensors are not shown")
            index.add_issue("unassembled-file", problem, file=prefix + name, warning=summary)
        if stages:
            self._index_pipeline(index, tag_dir, prefix, layout, stages, info)
        else:
            self._index_rank(index, tag_dir, prefix, layout, info)
        return index

    def _index_autotp(self, index: CheckpointIndex, tag_dir: Path, prefix: str, layout: DsLayout,
                      info: dict[str, Any], declared: int) -> bool:
        """An AutoTP save (``formats.deepspeed.autotp``): each TP rank read as a save of its own, then every
        param, its Adam moments and its low-precision copy placed in the whole tensor. False when rank 00's
        model states have no affine map (Megatron-DeepSpeed TP); ``Unplaceable`` when a param cannot be
        placed. ``index`` is only filled when it returns True. ``declared``: rank 00's ``mp_world_size``."""
        main_model = layout.model.get(None)
        if main_model is None:
            return False
        model_obj = self._rank_file(tag_dir / main_model).obj
        params = affine_params(model_obj) if isinstance(model_obj, dict) else None
        if params is None:
            return False
        tp = max(declared, max(layout.mp_ranks) + 1)
        if "mp_world_size" in model_obj and declared < tp:
            raise Unplaceable(f"mp_world_size {declared} but files of TP rank {max(layout.mp_ranks)}")
        subs: dict[int, CheckpointIndex] = {}
        holes: dict[int, dict[str, list[tuple[tuple[int, ...], tuple[int, ...], str]]]] = {}
        rank_info: dict[str, Any] = {}
        has_optim: dict[int, bool] = {}
        for rank in sorted(layout.mp_ranks):
            rank_layout = ds_layout(tag_dir, rank)
            if rank_layout is None or not rank_layout.model:
                continue
            has_optim[rank] = bool(rank_layout.optim)
            sub = CheckpointIndex(path=index.path, format=index.format)
            outer, self._holes = self._holes, {}
            try:
                self._index_rank(sub, tag_dir, prefix, rank_layout, rank_info if not subs else {})
            finally:
                holes[rank], self._holes = self._holes, outer
            subs[rank] = sub
        if 0 not in subs:
            return False
        first = subs[0]
        # A TP rank without its optimizer files reads as its module copy (a bf16 one beside fp32 masters): its
        # shards of the masters, moments and copies are holes instead, and the files a missing-file problem.
        optim_name = ("bf16_" if layout.bf16 else "") + "zero_pp_rank_0_mp_rank_{:02d}_optim_states.pt"
        if not has_optim[0] and any(has_optim.values()):
            raise Unplaceable("TP rank 0's optimizer files are missing while other ranks have theirs")
        lacking = {rank: prefix + optim_name.format(rank) for rank in subs if has_optim[0] and not has_optim[rank]}
        trained = {n for g in model_obj.get("param_shapes") or [] for n in _ordered(g)} | \
            set(_ordered(model_obj.get("frozen_param_shapes")))
        bases = {name: self._param_of(name) for name in first.tensors}
        entries = entries_by_name(params, sorted({b for b in bases.values() if b is not None}))
        places = {name: placement(name, entry) for name, entry in entries.items()}
        aliases = {n for n, m in first.tensors.items() if m.attr(SHARED)}
        lost = sorted(n for n in trained if n not in places and n not in aliases)
        if lost:
            raise Unplaceable(f"{len(lost)} params have no place in the affine map ({', '.join(lost[:3])})")
        tensors: dict[str, TensorMeta] = {}
        for name, meta in first.tensors.items():
            base = bases[name]
            where = places.get(base) if base is not None else None
            tensors[name] = meta if where is None else self._placed(name, meta, where, subs, holes, tp, prefix,
                                                                    lacking)
        for name, meta in first.tensors.items():  # tied aliases: their target, whole
            target = meta.attr(SHARED)
            if target and target in tensors:
                tensors[name] = replace(tensors[target], name=name, attrs=tensors[target].attrs + ((SHARED, target),))
                if target in self._holes:
                    self._holes[name] = self._holes[target]
        # placed: from here on nothing raises, and ``index`` is filled
        index.tensors.update(tensors)
        for rank in range(tp):
            if rank not in subs:
                index.add_issue("missing-file", f"missing (AutoTP rank {rank} of {tp}, mp_world_size); its shards "
                                "of the split params cannot be read", file=f"{prefix}mp_rank_{rank:02d}_model_states.pt")
        for rank, file in lacking.items():
            index.add_issue("missing-file", f"missing (TP rank {rank}'s optimizer partitions; the other ranks have "
                            "theirs): its shards of the fp32 masters and Adam moments cannot be read", file=file)
        positional = [n for n, m in first.tensors.items() if n.startswith("optimizer.") and bases[n] not in places]
        if tp > 1 and not has_optim[0] and positional:
            others = "TP rank 1" if tp == 2 else f"TP ranks 1-{tp - 1}"
            index.warnings.append(f"the optimizer state of {others} is not shown: without ZeRO partitions "
                                  "each rank keeps its own in its model states, by position; the optimizer.* shown is "
                                  "rank 0's, in its local shard shapes")
        for sub in subs.values():
            index.files.extend(f for f in sub.files if f not in index.files)
            index.issues.extend(sub.issues)
            index.warnings.extend(w for w in sub.warnings if w not in index.warnings)
        index.objects.extend(first.objects)
        for key, value in first.metadata.items():
            index.metadata.setdefault(key, value)
        info.update(rank_info)
        info["autotp"] = {"tp_size": tp, "ranks": sorted(subs), "placed_params": len(places)}
        return True

    def _declared_tp(self, tag_dir: Path, layout: DsLayout) -> int:
        """The tensor-parallel size rank 00's model states record (``mp_world_size``): 1 when they say
        none, so that a save whose other ranks' files are all gone is not read as a whole model."""
        main_model = layout.model.get(None)
        if main_model is None:
            return 1
        try:
            obj = self._rank_file(tag_dir / main_model).obj
        except CkptError:
            return 1  # reported when the index reads it
        return max(1, _as_int(obj.get("mp_world_size")) or 1) if isinstance(obj, dict) else 1

    @staticmethod
    def _param_of(name: str) -> str | None:
        """The param a tensor of a rank's index belongs to: itself, its Adam moment's or its bf16 copy's."""
        if name.startswith(MOMENT_PREFIX):
            return name[len(MOMENT_PREFIX):].partition(".")[2] or None
        if name.startswith(LP_PREFIX):
            return name[len(LP_PREFIX):]
        return name

    def _placed(self, name: str, meta: TensorMeta, where: Placement, subs: dict[int, CheckpointIndex],
                holes: dict[int, dict[str, list[tuple[tuple[int, ...], tuple[int, ...], str]]]], tp: int,
                prefix: str, lacking: dict[int, str]) -> TensorMeta:
        """One tensor whole: each rank's shard at its origin; a missing rank's shard (or one whose optimizer
        files are missing: ``lacking``) a hole; the copies of a replicated param on other ranks kept as
        replicas (``check`` compares them)."""
        chunks: list[Chunk] = []
        tensor_holes: list[tuple[tuple[int, ...], tuple[int, ...], str]] = []
        copies: list[Chunk] = []
        for rank in range(tp):
            origin = where.origins.get(rank)
            shard = where.shard_shapes.get(rank)
            local = subs[rank].tensors.get(name) if rank in subs else None
            if local is not None and rank not in lacking and local.dtype != meta.dtype:
                raise Unplaceable(f"{name}: TP rank {rank} stores {local.dtype}, rank 0 {meta.dtype}")
            if local is not None and shard is not None and local.shape != shard:
                raise Unplaceable(f"{name}: TP rank {rank} stores {list(local.shape)}, the affine map says "
                                  f"{list(shard)}")
            if origin is None:
                if local is not None and rank and len(local.chunks) == 1 and len(meta.chunks) == 1 \
                        and shard == where.shape and local.dtype == meta.dtype:
                    copies.append(local.chunks[0])
                continue
            if local is None or rank in lacking:
                missing = lacking.get(rank) or prefix + f"mp_rank_{rank:02d}_model_states.pt"
                tensor_holes.append((origin, shard or (), missing))
                continue
            chunks.extend(moved(local, origin))
            tensor_holes.extend(moved_holes(holes.get(rank, {}).get(name, []), origin))
        if tensor_holes:
            self._holes[name] = tensor_holes
        if copies and not name.startswith((MOMENT_PREFIX, LP_PREFIX)):
            self._replicas[name] = copies
        split = sum(o is not None for o in where.origins.values()) > 1
        attrs = meta.attrs + ((("tp", f"AutoTP, {tp} ranks"),) if split else ())
        return replace(meta, shape=where.shape, chunks=tuple(chunks), attrs=attrs)

    def _index_rank(self, index: CheckpointIndex, tag_dir: Path, prefix: str, layout: DsLayout,
                    info: dict[str, Any]) -> None:
        """The model (and training state) of one model-parallel rank's files: all of a save without model
        parallelism, one stage of a pipeline save."""
        # model states: param shapes, buffers, frozen params, shared params
        main_model = layout.model.get(None) or (layout.model.get(0) if 0 in layout.model else None)
        if main_model is None and layout.model:
            main_model = layout.model[min(k for k in layout.model if k is not None)]
        if main_model is None:
            raise CkptError(f"no mp_rank_{layout.mp:02d} *_model_states.pt: the param shapes needed to cut the flat "
                            "partitions are in it",
                            tag_dir)
        parsed_models: dict[int | None, TorchZip] = {}
        for dp, name in sorted(layout.model.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
            parsed_models[dp] = self._rank_file(tag_dir / name)
            index.files.append(FileInfo(prefix + name, (tag_dir / name).stat().st_size, "data"))
        states_key = None if None in parsed_models and main_model == layout.model.get(None) else \
            next(k for k, v in layout.model.items() if v == main_model)
        model_zip = parsed_models[states_key]
        model_obj = model_zip.obj if isinstance(model_zip.obj, dict) else {}
        if "param_shapes" not in model_obj and "module" not in model_obj:
            raise CkptError(f"{main_model} is not a DeepSpeed model-states file (no 'module')", tag_dir)

        if layout.universal:
            self._index_universal(index, tag_dir, prefix, layout, model_obj, model_zip, prefix + main_model,
                                  parsed_models)
            return

        # optimizer partitions
        parsed_optim: dict[int, TorchZip] = {}
        for dp, name in sorted(layout.optim.items()):
            parsed_optim[dp] = self._rank_file(tag_dir / name)
            index.files.append(FileInfo(prefix + name, (tag_dir / name).stat().st_size, "optimizer"))
        osds = {dp: (z.obj or {}).get("optimizer_state_dict") if isinstance(z.obj, dict) else None
                for dp, z in parsed_optim.items()}
        osds = {dp: o for dp, o in osds.items() if isinstance(o, dict)}
        info["ds_version"] = model_obj.get("ds_version")
        ds_config = model_obj.get("ds_config")
        if ds_config is not None:
            index.objects.append(ObjectEntry("ds_config", type_name(ds_config), to_plain(ds_config)))

        if not osds:
            stage = self._stage_from_config(ds_config)
            info.update({"zero_stage": stage, "world_size": model_obj.get("dp_world_size")})
            if layout.optim:
                index.warnings.append("the *_optim_states.pt files hold no optimizer_state_dict")
            self._index_module_only(index, model_obj, prefix + main_model, model_zip, stage)
            if layout.experts or layout.expert_optim or moe.is_moe_save(model_obj):
                self._index_experts(index, tag_dir, prefix, layout, model_obj)
            return

        first_dp = min(osds)
        first = osds[first_dp]
        stage = _as_int(first.get("zero_stage"))
        # DeepSpeed's BF16_Optimizer (bf16 at ZeRO stage 0, Megatron-DeepSpeed's usual setup) keeps the fp32
        # masters as ZeRO-1 does (flat partitions, the group aligned to 2 x world) but records no zero_stage
        bf16_optimizer = stage is None and isinstance(first.get("single_partition_of_fp32_groups"), list)
        if bf16_optimizer:  # (also ZeRO-1 with bf16 params and fp32 gradient accumulation)
            stage = 1
            info["optimizer"] = "BF16_Optimizer"
        count = first.get("partition_count")
        world = max(count) if isinstance(count, list) and count else count
        if stage not in _FLAT_KEYS or not isinstance(world, int) or world < 1:
            raise CkptError(f"{layout.optim[first_dp]}: unknown zero_stage {to_plain(first.get('zero_stage'))!r} or "
                            f"partition_count {to_plain(count)!r}", tag_dir)
        info.update({"zero_stage": (self._stage_from_config(ds_config) or 0) if bf16_optimizer else stage,
                     "world_size": world,
                     "optim_files": "bf16_" if layout.bf16 else ""})
        optim_name = ("bf16_" if layout.bf16 else "") + "zero_pp_rank_{}_mp_rank_" + f"{layout.mp:02d}_optim_states.pt"
        for dp in sorted(d for d in parsed_optim if d >= world):
            index.warnings.append(f"{layout.optim[dp]}: rank {dp} is outside world size {world}; ignored")
            osds.pop(dp, None)
        missing = [r for r in range(world) if r not in osds]
        for r in missing:
            index.add_issue("missing-file", f"missing (ZeRO-{stage}, world size {world} from partition_count); "
                            "the fp32 partitions it held cannot be read", file=prefix + optim_name.format(r))
        if stage == 3:
            for r in range(world):
                if r not in layout.model:
                    index.add_issue("missing-file", "missing (ZeRO-3 model states, one per rank); its frozen "
                                    "param fragments cannot be read",
                                    file=f"{prefix}zero_pp_rank_{r}_mp_rank_{layout.mp:02d}_model_states.pt")

        param_groups = [_ordered(g) for g in model_obj.get("param_shapes") or []]
        shapes: list[dict[str, tuple[int, ...]]] = []
        for group in param_groups:
            shapes.append({name: s for name, value in group.items() if (s := _shape(value)) is not None})
        if not shapes and bf16_optimizer:
            shapes = self._slice_mapping_shapes(osds, model_obj, tag_dir)
        built = _Built()
        files = {dp: prefix + layout.optim[dp] for dp in osds}
        if stage in (1, 2):
            self._zero12(index, built, shapes, osds, parsed_optim, files, world, optim_name, prefix,
                         experts=moe.is_moe_save(model_obj), data_before_expert=isinstance(ds_config, dict)
                         and bool(ds_config.get("use_data_before_expert_parallelism")))
        else:
            self._zero3(index, built, shapes, osds, parsed_optim, files, world, optim_name, prefix)
        self._model_extras(index, built, model_obj, model_zip, prefix + main_model, stage, world, parsed_models,
                           layout, prefix, shapes)
        self._finish(index, built, model_obj)
        if layout.experts or layout.expert_optim or moe.is_moe_save(model_obj):
            self._index_experts(index, tag_dir, prefix, layout, model_obj, copies=True)
        self._optimizer_objects(index, first, parsed_optim[first_dp], files[first_dp], stage)

    def _slice_mapping_shapes(self, osds: dict[int, dict], model_obj: dict,
                              tag_dir: Path) -> list[dict[str, tuple[int, ...]]]:
        """The param shapes of a BF16_Optimizer save, which records none: its params in flat order are the
        names of every rank's ``param_slice_mappings`` (rank after rank, each name once), each as many
        elements as its fragments hold; the shape is that of the module's own copy of the param (the
        model-states ``module``, or a pipeline's layer files), which must hold as many."""
        module = {str(k): v.shape for k, v in _ordered(model_obj.get("module")).items() if isinstance(v, TensorRef)}
        module.update(self._layer_shapes)
        groups: list[dict[str, int]] = []
        for dp in sorted(osds):
            mappings = osds[dp].get("param_slice_mappings")
            for g, mapping in enumerate(mappings if isinstance(mappings, list) else []):
                while len(groups) <= g:
                    groups.append({})
                for name, address in _ordered(mapping).items():
                    numel = _as_int((getattr(address, "state", None) or {}).get("numel"))
                    if numel is None:
                        raise CkptError(f"param_slice_mappings: {name!r} has no fragment size", tag_dir)
                    groups[g][str(name)] = groups[g].get(str(name), 0) + numel
        if not groups:
            raise CkptError("a BF16_Optimizer save with neither param_shapes nor param_slice_mappings: the flat fp32 "
                            "partitions cannot be cut into params", tag_dir)
        mapped = {name for group in groups for name in group} | self._pipeline_params
        count = osds[min(osds)].get("partition_count")
        world = max(count) if isinstance(count, list) and count else count
        absent = [r for r in range(world) if r not in osds] if isinstance(world, int) else []
        shapes: list[dict[str, tuple[int, ...]]] = []
        for group in groups:
            shapes.append({})
            for name, numel in group.items():
                shape = module.get(name) or self._tied_shape(name, numel, mapped, tag_dir)
                if absent and (shape is None or math.prod(shape) != numel):
                    raise CkptError(f"the optimizer files of data-parallel rank{'s' if len(absent) > 1 else ''} "
                                    f"{', '.join(map(str, absent))} are missing: a BF16_Optimizer save sizes its params "
                                    f"only by every rank's param_slice_mappings ({name!r} is cut short)", tag_dir)
                if shape is None and self._layer_shapes:
                    raise CkptError(f"{name!r}: no layer file holds this param, whose shape only its layer file "
                                    "records (BF16_Optimizer keeps no param shapes): a layer_NN-model_states.pt file "
                                    "is missing", tag_dir)
                if shape is None or math.prod(shape) != numel:
                    raise CkptError(f"{name!r}: param_slice_mappings give it {numel} elements but no module weight of "
                                    f"that name and size says its shape", tag_dir)
                shapes[-1][name] = tuple(shape)
        return shapes

    def _tied_shape(self, name: str, numel: int, mapped: set[str], tag_dir: Path) -> tuple[int, ...] | None:
        """A ``tied_modules.<key>.<param>``'s shape from a layer file that holds it under its layer id: one whose
        ``<layer>.<param>`` is no param of its own (a reviewer's layer 0, ``Linear(6, 10)``, gave a tied
        ``Linear(10, 6)`` its transposed shape). Candidates that disagree are refused, not guessed between."""
        if not name.startswith("tied_modules.") or name.count(".") < 2:
            return None
        local = name.split(".", 2)[2]
        found = {shape for candidate, shape in self._layer_shapes.items()
                 if candidate.split(".", 1)[-1] == local and candidate not in mapped and math.prod(shape) == numel}
        if len(found) > 1:
            raise CkptError(f"{name!r}: layer files of several shapes ({', '.join(map(str, sorted(found)))}) could hold "
                            "this tied module, and the save records none: not guessed", tag_dir)
        return next(iter(found), None)

    # --- pipeline saves ------------------------------------------------------------------------------

    def _index_pipeline(self, index: CheckpointIndex, tag_dir: Path, prefix: str, layout: DsLayout,
                        stages: list[int], info: dict[str, Any]) -> None:
        """A ``PipelineModule`` save: every stage's rank files read as a save of their own (its fp32
        masters cut from its optim files by its own ``param_shapes``), merged under the module's names
        (``<layer>.<param>``, ``tied_modules.<key>.<param>``: layer ids are global, so stages never share a
        name but a tied module's), then the layer files: the module's weights, the model itself when
        there are no masters apart (fp32 ZeRO-0), else their low-precision copies (``lp_params.``)."""
        info["pipeline_stages"] = len(stages)
        saved = stages
        stages = self._stages_with_model_states(index, tag_dir, prefix, saved)
        degree, tp = _parallel_degrees(tag_dir, stages[0], self._rank_file)
        if tp is not None and tp > 1:
            raise CkptError(f"a pipeline save with tensor parallelism (tp_degree {tp}), which ckptscope does not "
                            "assemble", tag_dir)
        self._layer_zips = {layer: self._rank_file(tag_dir / name) for layer, name in sorted(layout.layers.items())}
        self._layer_shapes = {f"{layer}.{local}": ref.shape for layer, zip_ in self._layer_zips.items()
                              if isinstance(zip_.obj, dict)
                              for local, ref in _ordered(zip_.obj).items() if isinstance(ref, TensorRef)}
        for mp in stages:  # every stage's own params first: a tied module's shape must not come from one of them
            for file_name in (ds_layout(tag_dir, mp) or DsLayout()).optim.values():
                osd = (self._rank_file(tag_dir / file_name).obj or {}).get("optimizer_state_dict")
                mappings = osd.get("param_slice_mappings") if isinstance(osd, dict) else None
                for mapping in mappings if isinstance(mappings, list) else []:
                    self._pipeline_params |= {str(name) for name in _ordered(mapping)}
        trained: set[str] = set()
        buffers: set[str] = set()
        tied_stages: dict[str, int] = {}
        """Tied key -> the stages whose masters hold it (each saves its copy in a layer file at most once)."""
        for mp in stages:
            sub = CheckpointIndex(path=index.path, format=index.format)
            stage_layout = ds_layout(tag_dir, mp)
            assert stage_layout is not None  # the same dir ds_layout read
            self._index_rank(sub, tag_dir, prefix, stage_layout, info if mp == stages[0] else {})
            objects = {o.name: o.value for o in sub.objects}
            stage_params = {name for name, meta in sub.tensors.items() if meta.attr("zero") is not None}
            for key in {n.split(".")[1] for n in stage_params if n.startswith("tied_modules.") and n.count(".") >= 2}:
                tied_stages[key] = tied_stages.get(key, 0) + 1
            trained |= stage_params
            names = objects.get("buffer_names")
            buffers |= {str(n) for n in names} if isinstance(names, list) else set()
            self._merge_stage(index, sub, mp, first=mp == stages[0], tag_dir=tag_dir)
        self._index_layer_files(index, tag_dir, prefix, layout, trained, buffers, tied_stages)
        self._missing_stage_files(index, tag_dir, prefix, saved, degree)

    @staticmethod
    def _stages_with_model_states(index: CheckpointIndex, tag_dir: Path, prefix: str, stages: list[int]) -> list[int]:
        """The stages whose model-states file is here. A stage with only its optimizer file lost the param
        shapes that cut its flat masters: a ``missing-file`` issue (``check`` lists it; exports refuse), and
        the other stages are still read (a probe's save with one such stage stopped every command, ``check``
        included, with exit 2). With no stage readable, the one-line error stands."""
        having = [mp for mp in stages if (ds_layout(tag_dir, mp) or DsLayout()).model]
        if not having:
            raise CkptError(f"no mp_rank_{stages[0]:02d} *_model_states.pt: the param shapes needed to cut the flat "
                            "partitions are in it", tag_dir)
        for mp in stages:
            if mp not in having:
                index.add_issue("missing-file", f"pipeline stage {mp}'s model-states file (its optimizer file is here): "
                                "the param shapes that cut its fp32 masters are in it, so its layers' masters and "
                                "optimizer state are not shown", file=f"{prefix}mp_rank_{mp:02d}_model_states.pt")
        return having

    @staticmethod
    def _missing_stage_files(index: CheckpointIndex, tag_dir: Path, prefix: str, stages: list[int],
                             degree: int | None) -> None:
        """Stages the save says it has (``degree``) without rank files, and stages without the optimizer files
        the others have: their fp32 masters and Adam state are gone (a probe deleted them and check said ok,
        the layer files' bf16 copies shown as the model)."""
        if degree is not None:
            for stage in range(degree):
                if stage not in stages:
                    index.add_issue("missing-file", f"pipeline stage {stage} of {degree} has no rank files: its layers' "
                                    "fp32 masters and optimizer state cannot be read",
                                    file=f"{prefix}mp_rank_{stage:02d}_model_states.pt")
        optim = {mp: (ds_layout(tag_dir, mp) or DsLayout()).optim for mp in stages}
        having = {mp: files for mp, files in optim.items() if files}
        if not having:
            return
        pattern = OPTIM_STATES.match(next(iter(next(iter(having.values())).values())))
        dp_ranks = sorted({dp for files in having.values() for dp in files})
        for mp in stages:
            for dp in dp_ranks:
                if dp not in optim[mp] and pattern is not None:
                    name = f"{pattern.group(1) or ''}zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt"
                    if not any(i.file == prefix + name for i in index.issues):
                        index.add_issue("missing-file", f"pipeline stage {mp}'s optimizer file (the other stages have "
                                        "theirs): its fp32 masters and Adam state cannot be read", file=prefix + name)

    @staticmethod
    def _merge_stage(index: CheckpointIndex, sub: CheckpointIndex, mp: int, *, first: bool, tag_dir: Path) -> None:
        """Stage ``mp``'s index into the save's. A tied module's master (and moments) is kept once, from
        the first stage that holds it; training state both stages name alike (``optimizer.param_groups``,
        a client optimizer's ``optimizer.state.0``) gets the stage in its name: ``optimizer.stage_1.``..."""
        from ckptscope.core.roles import training_kind

        def staged(name: str) -> str:
            root, dot, rest = name.partition(".")
            return f"{root}.stage_{mp}{dot}{rest}"

        known_files = {f.path for f in index.files}
        index.files.extend(f for f in sub.files if f.path not in known_files)
        index.warnings.extend(w for w in sub.warnings if w not in index.warnings)
        index.issues.extend(sub.issues)
        for key, value in sub.metadata.items():
            index.metadata.setdefault(key, value)
        params = {name for name, meta in sub.tensors.items() if meta.attr("zero") is not None}
        for name, meta in sub.tensors.items():
            model = training_kind(name, meta.attr("group")) is None
            if first or model or (name.startswith(MOMENT_PREFIX) and name.split(".", 3)[-1] in params):
                if name not in index.tensors:  # a param's master or moments: named by the param
                    index.tensors[name] = meta
                elif model and "tied_modules." not in name:
                    raise CkptError(f"stages {index.tensors[name].files[0]} and {meta.files[0]} both hold "
                                    f"{name!r}: not a pipeline save ckptscope can assemble", tag_dir)
                # else: a tied module's master or moments again, on a later stage: the first stage's is kept
                # (DeepSpeed reduces the tied weight's gradients across stages; params outside tied_weight_attr
                # may drift apart, a probe saw 0.02 after 2 steps: only the first stage's copy is shown)
            else:  # the stage's own bookkeeping (a client optimizer's state.0 is another param on each stage)
                index.tensors[staged(name)] = replace(meta, name=staged(name))
        known = {o.name: o.value for o in index.objects}
        for obj in sub.objects:
            if first:
                index.objects.append(obj)
            elif obj.name != "<root>" and (obj.name not in known or known[obj.name] != obj.value):
                index.objects.append(replace(obj, name=staged(obj.name)))  # the stage's own, or its own value

    def _index_layer_files(self, index: CheckpointIndex, tag_dir: Path, prefix: str, layout: DsLayout,
                           trained: set[str], buffers: set[str], tied_stages: dict[str, int]) -> None:
        """The layer files' tensors under ``PipelineModule``'s names. Layer ``i``'s params are ``i.<param>``,
        but a tied module's are ``tied_modules.<key>.<param>`` wherever it stands. Nothing in the save says which
        layers those are: a layer file is the tied module when none of its params is a master of its own and its
        params are exactly the tied module's, in the masters' shapes. A frozen layer can look the same (a
        reviewer's frozen ``Linear`` was taken for the tied one and vanished): when more layer files look
        tied than there are stages holding the tied master (each saves its copy once), none is guessed at; they
        keep their layer names and a warning says so."""
        masters = bool(trained)
        tied_locals: dict[str, dict[str, tuple[int, ...]]] = {}
        for name in trained:
            if name.startswith("tied_modules.") and name.count(".") >= 2:
                _, key, local = name.split(".", 2)
                tied_locals.setdefault(key, {})[local] = index.tensors[name].shape if name in index.tensors else ()
        refs_of: dict[int, dict[str, TensorRef]] = {}
        looks_tied: dict[str, list[int]] = {}
        for layer, file_name in sorted(layout.layers.items()):
            zip_ = self._layer_zips[layer]
            if not isinstance(zip_.obj, dict):
                raise CkptError(f"{file_name}: not a layer's state dict ({type_name(zip_.obj)})", tag_dir)
            refs = {str(k): v for k, v in _ordered(zip_.obj).items() if isinstance(v, TensorRef) and v.storage is not None}
            refs_of[layer] = refs
            if not masters or not refs or any(f"{layer}.{local}" in trained for local in refs):
                continue
            for key, locals_ in tied_locals.items():
                if locals_ == {local: tuple(ref.shape) for local, ref in refs.items()}:
                    looks_tied.setdefault(key, []).append(layer)
        tied_layer: dict[int, str] = {}
        unsure: set[str] = set()
        for key, layers in looks_tied.items():
            if len(layers) > tied_stages.get(key, 1):
                # more look-alikes than stages holding the tied master: one stage may save the module twice
                # (a probe: pp=1, tied at layers 0 and 5), and those copies are one module saved twice, so
                # byte for byte equal; a frozen look-alike is not. Read only in this rare case.
                groups: dict[bytes, list[int]] = {}
                for candidate in layers:
                    groups.setdefault(self._layer_digest(candidate, refs_of[candidate], prefix, layout), []).append(candidate)
                repeated = [g for g in groups.values() if len(g) > 1]
                if len(repeated) == 1:
                    layers = repeated[0]
                    tied_layer.update(dict.fromkeys(layers, key))
                    continue
                unsure.add(key)
                index.warnings.append(f"layer files {', '.join(map(str, layers))} all look like tied module {key!r} "
                                      "(a frozen layer of the same shape?); shown under their layer ids, the tied "
                                      "module's bf16 copy not picked among them")
            else:
                tied_layer.update(dict.fromkeys(layers, key))
        for layer, file_name in sorted(layout.layers.items()):
            path = tag_dir / file_name
            zip_ = self._layer_zips[layer]
            index.files.append(FileInfo(prefix + file_name, path.stat().st_size, "data"))
            owner = f"tied_modules.{tied_layer[layer]}." if layer in tied_layer else f"{layer}."
            for local, ref in refs_of[layer].items():
                name = owner + local
                meta = tensor_meta(name, ref, prefix + file_name, zip_.storages.get(ref.storage.key),
                                   big_endian=zip_.big_endian, path=self.path)
                if masters and name in trained:
                    lp = LP_PREFIX + name
                    if lp not in index.tensors:
                        index.tensors[lp] = replace(meta, name=lp, attrs=meta.attrs + (("group", "optimizer"),
                                                                                   ("lp_copy_of", name)))
                    continue
                if name in index.tensors:
                    if owner.startswith("tied_modules."):
                        continue  # the tied module's layer file on another stage
                    raise CkptError(f"{file_name}: {name!r} is held twice", tag_dir)
                if masters and name in buffers and meta.dtype_info.is_float and meta.dtype != "float32":
                    self._upcast[name] = meta.dtype  # read as float32, as the non-pipeline buffers are
                    meta = replace(meta, dtype="float32", attrs=meta.attrs + (("stored_as", ref.dtype.name),))
                elif masters and name not in buffers:
                    meta = replace(meta, attrs=meta.attrs + (("frozen", "not in the fp32 partitions; the layer "
                                                                         "file's copy"),))
                index.tensors[name] = meta
        lacking = sorted(name for name in trained if LP_PREFIX + name not in index.tensors
                         and not (name.startswith("tied_modules.") and name.split(".")[1] in unsure))
        if lacking:  # every trained param's layer writes its module copy: a layer file is gone
            index.add_issue("missing-file", f"no layer file holds the module's copy of {len(lacking)} trained "
                            f"params ({', '.join(lacking[:3])}{' ...' if len(lacking) > 3 else ''}): a "
                            "layer_NN-model_states.pt file is missing", tensors=tuple(lacking))

    def _layer_digest(self, layer: int, refs: dict[str, TensorRef], prefix: str, layout: DsLayout) -> bytes:
        """A digest of a layer file's tensors' bytes, by name (to tell copies of one module apart from
        look-alikes)."""
        import hashlib

        zip_ = self._layer_zips[layer]
        file_name = prefix + layout.layers[layer]
        digest = hashlib.blake2b(digest_size=16)
        for local in sorted(refs):
            ref = refs[local]
            chunk = tensor_meta(local, ref, file_name, zip_.storages.get(ref.storage.key), big_endian=zip_.big_endian,
                                path=self.path).chunks[0]
            with open(self.path / chunk.file, "rb") as handle:
                handle.seek(chunk.byte_offset)
                digest.update(local.encode() + b"\0" + handle.read(chunk.byte_length))
        return digest.digest()

    def _index_universal(self, index: CheckpointIndex, tag_dir: Path, prefix: str, layout: DsLayout, obj: dict,
                         zip_: TorchZip, file: str, parsed_models: dict[int | None, TorchZip]) -> None:
        """A universal checkpoint (``ds_to_universal``): each param's fp32 master in ``zero/<name>/fp32.pt``
        (whole, ``{"param": tensor, "cat_dim": ...}``; flat 1-D when made from ZeRO-3, shaped here by
        ``param_shapes``), its Adam moments beside it. The module copy in the model-states file is the
        low-precision one, listed apart as in a ZeRO-1/2 save."""
        shapes = [{name: s for name, value in _ordered(group).items() if (s := _shape(value)) is not None}
                  for group in obj.get("param_shapes") or []]
        expected = {name: shape for group in shapes for name, shape in group.items()}
        per_rank = None not in layout.model
        # read by the layout (per-rank model states are ZeRO-3's); labelled by the run's own ds_config, since a
        # universal checkpoint keeps no optimizer layout that tells ZeRO-1 from ZeRO-2 (or BF16_Optimizer's 0)
        stage = 3 if per_rank else 2
        configured = self._stage_from_config(obj.get("ds_config"))
        world = obj.get("dp_world_size") if isinstance(obj.get("dp_world_size"), int) else max(len(layout.model), 1)
        index.metadata["deepspeed"].update({"universal": True, "zero_stage": stage if configured is None else configured,
                                            "world_size": world})
        built = _Built()
        for name in layout.universal:
            for state in UNIVERSAL_STATES:
                path = tag_dir / UNIVERSAL_DIR / name / f"{state}.pt"
                if not path.is_file():
                    continue
                rel = f"{prefix}{UNIVERSAL_DIR}/{name}/{state}.pt"
                state_zip = read_rank_file(path)
                ref = state_zip.obj.get("param") if isinstance(state_zip.obj, dict) else state_zip.obj
                if not isinstance(ref, TensorRef) or ref.storage is None:
                    index.warnings.append(f"{rel}: no tensor under 'param'; skipped")
                    continue
                target = name if state == "fp32" else f"{MOMENT_PREFIX}{state}.{name}"
                meta = tensor_meta(target, ref, rel, state_zip.storages.get(ref.storage.key),
                                   big_endian=state_zip.big_endian, path=self.path)
                shape = expected.get(name)
                if shape is not None and meta.shape != shape:
                    chunk = meta.chunks[0]
                    if math.prod(shape) != meta.numel or chunk.encoding is not Encoding.RAW:
                        raise CkptError(f"{rel}: {list(meta.shape)} does not hold {name} {list(shape)}", self.path)
                    meta = replace(meta, shape=shape, chunks=(replace(chunk, offsets=(0,) * len(shape), shape=shape),))
                built.tensors[target] = meta
                index.files.append(FileInfo(rel, path.stat().st_size, "data" if state == "fp32" else "optimizer"))
        for name in expected:
            if name not in layout.universal:
                index.add_issue("missing-file", f"missing: the universal checkpoint has no fp32 master of {name}",
                                file=f"{prefix}{UNIVERSAL_DIR}/{name}/fp32.pt")
        self._model_extras(index, built, obj, zip_, file, stage, world, parsed_models, layout, prefix, shapes)
        self._finish(index, built, obj)

    @staticmethod
    def _stage_from_config(config: Any) -> int | None:
        plain = to_plain(config)
        if isinstance(plain, dict):
            zero = plain.get("zero_optimization")
            if isinstance(zero, dict) and isinstance(zero.get("stage"), int):
                return zero["stage"]
        return None

    # --- the flat partitions -------------------------------------------------------------------------

    @staticmethod
    def _segment(ref: Any, zip_: TorchZip, file: str, length: int | None = None) -> Segment | None:
        if not isinstance(ref, TensorRef) or ref.storage is None or not ref.is_contiguous or len(ref.shape) > 1:
            return None
        placement: StoragePlacement | None = zip_.storages.get(ref.storage.key)
        if placement is None:
            return None
        n = ref.numel if length is None else length
        if n > ref.numel or (ref.storage_offset + n) * ref.dtype.itemsize > placement.length:
            return None
        return Segment(n, file, placement.offset + ref.storage_offset * ref.dtype.itemsize)

    @staticmethod
    def _moment_refs(osd: dict, stage: int, group: int) -> dict[str, Any]:
        """The base optimizer's per-group state (``exp_avg``...) of one rank, by key."""
        base = osd.get("base_optimizer_state" if stage < 3 else "optimizer_state_dict")
        if isinstance(base, list):  # elastic checkpoints: one lean dict per group
            state = base[group] if group < len(base) else None
        elif isinstance(base, dict) and isinstance(base.get("state"), dict):
            state = base["state"].get(group, base["state"].get(str(group)))
        else:
            state = None
        return state if isinstance(state, dict) else {}

    def _flat_dtype(self, osds: dict[int, dict], key: str, group: int, at: dict[int, int] | None = None) -> str:
        for rank, osd in osds.items():
            groups, j = osd.get(key), (at or {}).get(rank, group)
            if isinstance(groups, list) and j < len(groups) and isinstance(groups[j], TensorRef):
                return groups[j].dtype.name
        return "float32"

    def _add_param(self, built: _Built, name: str, shape: tuple[int, ...], dtype: str, pieces: list[_Piece],
                   attrs: tuple[tuple[str, str], ...] = ()) -> None:
        itemsize = dtype_by_name(dtype).itemsize
        chunks: list[Chunk] = []
        holes = []
        for piece in pieces:
            for offsets, box, flat in flat_range_boxes(shape, piece.start, piece.stop):
                seg = piece.segment
                if seg.file is None:
                    holes.append((offsets, box, seg.missing))
                    continue
                chunks.append(Chunk(offsets=offsets, shape=box, file=seg.file,
                                    byte_offset=seg.byte_offset + (piece.offset + flat - piece.start) * itemsize,
                                    byte_length=math.prod(box) * itemsize))
        if holes:
            built.holes[name] = holes
            attrs += (("missing", ", ".join(sorted({h[2] for h in holes}))),)
        built.tensors[name] = TensorMeta(name=name, dtype=dtype, shape=shape, chunks=tuple(chunks), attrs=attrs)

    def _zero12(self, index: CheckpointIndex, built: _Built, shapes: list[dict[str, tuple[int, ...]]],
                osds: dict[int, dict], zips: dict[int, TorchZip], files: dict[int, str], world: int,
                optim_name: str, prefix: str, experts: bool = False, data_before_expert: bool = False) -> None:
        """Every param group's fp32 masters (and Adam moments) from the ranks' flat partitions; in an MoE save
        (``experts``) a group of experts from the partitions of each expert-data-parallel group
        (``moe.expert_groups``; ``data_before_expert``: the save's D + E topology), each rank's groups in its
        own order (``moe.group_orders``)."""
        first = min(osds)
        orders = moe.group_orders([list(group) for group in shapes],
                                  {r: (_slice_names(osd), _group_names(osd)) for r, osd in osds.items()}) \
            if experts else {}
        counts = osds[first].get("partition_count")
        for g, group in enumerate(shapes):
            at = {r: order[g] for r, order in orders.items() if g in order}
            j = at.get(first, g)  # the group's index in the first rank's optimizer state
            count = counts[j] if isinstance(counts, list) and j < len(counts) else None
            try:
                plans = moe.expert_groups(list(group), world, count, data_before_expert=data_before_expert)
            except ValueError as exc:
                raise CkptError(f"param group {g} of this MoE save: {exc}", self.path) from None
            for ranks, rename in plans or [(list(range(world)), None)]:
                self._zero12_group(index, built, g, group, osds, zips, files, ranks, rename, optim_name, at)

    def _zero12_group(self, index: CheckpointIndex, built: _Built, g: int, group: dict[str, tuple[int, ...]],
                      osds: dict[int, dict], zips: dict[int, TorchZip], files: dict[int, str], ranks: list[int],
                      rename: Callable[[str], str] | None, optim_name: str, at: dict[int, int] | None = None) -> None:
        """Param group ``g`` from the partitions of ``ranks``, in that order (every rank, or one expert-parallel
        rank's expert-data-parallel group), each param under ``rename(name)`` when given. ``at``: rank -> the
        group's index in that rank's optimizer state, where it is not ``g``."""
        key = "single_partition_of_fp32_groups"
        at = at or {}
        first = osds[min(osds)]
        paddings = first.get("param_alignment_paddings")
        padding_at = at.get(min(osds), g)
        # every rank but the last holds P elements: a present rank's lean length plus its padding
        full = None
        for dp in ranks:
            osd = osds.get(dp)
            if osd is None:
                continue
            refs, pads, j = osd.get(key), osd.get("group_paddings"), at.get(dp, g)
            if isinstance(refs, list) and j < len(refs) and isinstance(refs[j], TensorRef):
                pad = pads[j] if isinstance(pads, list) and j < len(pads) and isinstance(pads[j], int) else 0
                full = refs[j].numel + pad
                break
        if full is None:
            index.warnings.append(f"param group {g}: no rank holds its fp32 partition")
            return
        streams: dict[str, list[Segment]] = {}
        moment_keys: list[str] | None = None
        for i, r in enumerate(ranks):
            osd = osds.get(r)
            missing_seg = Segment(None if i == len(ranks) - 1 else full, None, missing=optim_name.format(r))
            if osd is None:
                for name in ["fp32", *(moment_keys or [])]:
                    streams.setdefault(name, []).append(missing_seg)
                continue
            refs, j = osd.get(key), at.get(r, g)
            ref = refs[j] if isinstance(refs, list) and j < len(refs) else None
            seg = self._segment(ref, zips[r], files[r])
            if seg is None:
                raise CkptError(f"{key}[{j}] of rank {r} is not a flat stored tensor", self.path)
            streams.setdefault("fp32", []).append(seg)
            moments = self._moment_refs(osd, 2, j)
            keys = [k for k, v in moments.items() if isinstance(v, TensorRef) and len(v.shape) == 1
                    and v.numel >= seg.length]
            if moment_keys is None:
                moment_keys = keys
                for k in keys:  # earlier missing ranks
                    streams[k] = [s for s in streams["fp32"][:-1]]
            for k in moment_keys:
                mseg = self._segment(moments.get(k), zips[r], files[r], seg.length)
                streams.setdefault(k, []).append(mseg or Segment(seg.length, None, missing=f"{files[r]} ({k})"))
        group_pads = paddings[padding_at] if isinstance(paddings, list) and padding_at < len(paddings) \
            and isinstance(paddings[padding_at], list) and len(paddings[padding_at]) == len(group) else None
        offset = 0
        dtype = self._flat_dtype({r: osds[r] for r in ranks if r in osds}, key, g, at)
        for i, (name, shape) in enumerate(group.items()):
            numel = math.prod(shape)
            name = rename(name) if rename else name
            for stream, segments in streams.items():
                pieces = [_Piece(a - offset, b - offset, seg, off)
                          for a, b, seg, off in _split(segments, offset, offset + numel)]
                if stream == "fp32":
                    self._add_param(built, name, shape, dtype, pieces, (("zero", f"ZeRO-1/2 group {g}"),))
                else:
                    self._add_param(built, f"{MOMENT_PREFIX}{stream}.{name}", shape, "float32", pieces,
                                    (("group", "optimizer"),))
            offset += numel + (group_pads[i] if group_pads else 0)
        if not any(s.length is None for s in streams["fp32"]):
            available = sum(s.length or 0 for s in streams["fp32"])
            align = 2 * len(ranks)
            if math.ceil(offset / align) != math.ceil(available / align):
                index.warnings.append(f"param group {g}: the params take {offset} elements but the ranks hold "
                                      f"{available} (padding to {align} does not explain it); values may be "
                                      "misplaced")

    def _zero3(self, index: CheckpointIndex, built: _Built, shapes: list[dict[str, tuple[int, ...]]],
               osds: dict[int, dict], zips: dict[int, TorchZip], files: dict[int, str], world: int,
               optim_name: str, prefix: str) -> None:
        key = "fp32_flat_groups"
        first = osds[min(osds)]
        lengths = [ref.numel if isinstance(ref, TensorRef) else 0 for ref in (first.get(key) or [])]
        moment_keys = [k for k, v in self._moment_refs(first, 3, 0).items()
                       if isinstance(v, TensorRef) and len(v.shape) == 1 and lengths and v.numel == lengths[0]]
        per_rank: dict[str, list[list[Segment]]] = {s: [] for s in ["fp32", *moment_keys]}
        for r in range(world):
            osd = osds.get(r)
            for stream in per_rank:
                segs: list[Segment] = []
                for g, length in enumerate(lengths):
                    if osd is None:
                        segs.append(Segment(length, None, missing=optim_name.format(r)))
                        continue
                    if stream == "fp32":
                        refs = osd.get(key)
                        ref = refs[g] if isinstance(refs, list) and g < len(refs) else None
                    else:
                        ref = self._moment_refs(osd, 3, g).get(stream)
                    seg = self._segment(ref, zips[r], files[r], length)
                    if seg is None:
                        if stream == "fp32":
                            raise CkptError(f"{key}[{g}] of rank {r} is not a flat stored tensor of {length} "
                                            "elements", self.path)
                        seg = Segment(length, None, missing=f"{files[r]} ({stream})")
                    segs.append(seg)
                per_rank[stream].append(segs)
        dtype = self._flat_dtype(osds, key, 0)
        offset = 0
        for group in shapes:
            for name, shape in group.items():
                numel = math.prod(shape)
                part = math.ceil(numel / world)
                for stream, ranks in per_rank.items():
                    pieces = []
                    for r, segs in enumerate(ranks):
                        lo, hi = r * part, min((r + 1) * part, numel)
                        if lo >= hi:
                            continue
                        for a, b, seg, off in _split(segs, offset, offset + hi - lo):
                            pieces.append(_Piece(lo + a - offset, lo + b - offset, seg, off))
                    if stream == "fp32":
                        self._add_param(built, name, shape, dtype, pieces, (("zero", f"ZeRO-3, {part} per rank"),))
                    else:
                        self._add_param(built, f"{MOMENT_PREFIX}{stream}.{name}", shape, "float32", pieces,
                                        (("group", "optimizer"),))
                offset += part
        if offset != sum(lengths):
            index.warnings.append(f"ZeRO-3: the params take {offset} elements per rank but the flat groups hold "
                                  f"{sum(lengths)}; values may be misplaced")

    # --- what the model-states files add -----------------------------------------------------------

    def _model_extras(self, index: CheckpointIndex, built: _Built, obj: dict, zip_: TorchZip, file: str,
                      stage: int, world: int, parsed_models: dict[int | None, TorchZip], layout: DsLayout,
                      prefix: str, shapes: list[dict[str, tuple[int, ...]]]) -> None:
        module = _ordered(obj.get("module"))
        buffer_names = set(obj.get("buffer_names") or [])
        trained = {name for group in shapes for name in group}
        shared = _ordered(obj.get("shared_params"))
        for name in obj.get("buffer_names") or []:
            ref = module.get(name)
            if not isinstance(ref, TensorRef) or ref.storage is None:
                continue
            meta = tensor_meta(name, ref, file, zip_.storages.get(ref.storage.key), big_endian=zip_.big_endian,
                               path=self.path)
            if meta.dtype_info.is_float and meta.dtype != "float32":
                self._upcast[name] = meta.dtype
                meta = replace(meta, dtype="float32", attrs=meta.attrs + (("stored_as", ref.dtype.name),))
            built.tensors[name] = replace(meta, attrs=meta.attrs + (("buffer", "module buffer"),))
        frozen = {k: s for k, v in _ordered(obj.get("frozen_param_shapes")).items() if (s := _shape(v)) is not None}
        if stage in (1, 2):
            fragments = _ordered(obj.get("frozen_param_fragments"))
            for name in frozen:
                ref = fragments.get(name)
                if name in built.tensors:  # (a universal checkpoint's own fp32 copy of it)
                    continue
                if isinstance(ref, TensorRef) and ref.storage is not None:
                    meta = tensor_meta(name, ref, file, zip_.storages.get(ref.storage.key),
                                       big_endian=zip_.big_endian, path=self.path)
                    built.tensors[name] = replace(meta, attrs=meta.attrs + (("frozen", "frozen_param_fragments"),))
            # params frozen but not recorded (bf16 ZeRO-1 keeps none): the module's own copy
            for name, ref in module.items():
                if name in trained or name in buffer_names or name in shared or name in built.tensors \
                        or not isinstance(ref, TensorRef):
                    continue
                if ref.storage is None or ref.numel == 0:
                    continue
                meta = tensor_meta(name, ref, file, zip_.storages.get(ref.storage.key), big_endian=zip_.big_endian,
                                   path=self.path)
                built.tensors[name] = replace(meta, attrs=meta.attrs + (
                    ("frozen", "not in the fp32 partitions; the module's own copy"),))
            # the low-precision module weights: derived from the fp32 masters, listed apart
            for name, ref in module.items():
                if name in trained and isinstance(ref, TensorRef) and ref.storage is not None and ref.numel:
                    meta = tensor_meta(LP_PREFIX + name, ref, file, zip_.storages.get(ref.storage.key),
                                       big_endian=zip_.big_endian, path=self.path)
                    built.tensors[LP_PREFIX + name] = replace(meta, attrs=meta.attrs + (
                        ("group", "optimizer"), ("lp_copy_of", name)))
        elif frozen:
            for name, shape in frozen.items():
                numel = math.prod(shape)
                part = math.ceil(numel / world)
                pieces, dtype = [], None
                for r in range(world):
                    lo, hi = r * part, min((r + 1) * part, numel)
                    if lo >= hi:
                        continue
                    rank_zip = parsed_models.get(r)
                    rank_file = layout.model.get(r)
                    seg = None
                    if rank_zip is not None and rank_file is not None and isinstance(rank_zip.obj, dict):
                        ref = _ordered(rank_zip.obj.get("frozen_param_fragments")).get(name)
                        seg = self._segment(ref, rank_zip, prefix + rank_file, hi - lo)
                        if isinstance(ref, TensorRef):
                            dtype = ref.dtype.name
                    if seg is None:
                        seg = Segment(hi - lo, None, missing=f"zero_pp_rank_{r}_mp_rank_{layout.mp:02d}_model_states.pt")
                    pieces.append(_Piece(lo, hi, seg, 0))
                self._add_param(built, name, shape, dtype or "float32", pieces,
                                (("frozen", "frozen_param_fragments of every rank"),))
        universal = bool((index.metadata.get("deepspeed") or {}).get("universal"))
        for alias, target in shared.items():
            meta = built.tensors.get(str(target))
            # ds_to_universal --inject_missing_state writes a tied alias a folder of its own, from the bf16
            # module copy: the save's tie (its target's fp32 master) is the model, as zero_to_fp32 gives it
            # (a probe: lm_head read from that copy was 1.4e-4 off the embedding)
            if meta is not None and (alias not in built.tensors or universal):
                # after its target: counts take an alias as the later of the two (storage_aliases); the universal
                # folders come sorted, lm_head before model.*, and the pair was counted twice (a probe: 2,029 for 1,696)
                built.tensors.pop(alias, None)
                built.tensors[alias] = replace(meta, name=alias,
                                               attrs=meta.attrs + ((SHARED, str(target)),))
                if str(target) in built.holes:
                    built.holes[alias] = built.holes[str(target)]
                if str(target) in self._upcast:
                    self._upcast[alias] = self._upcast[str(target)]
        skip = {"module", "frozen_param_fragments", "ds_config"}
        rest = {k: v for k, v in obj.items() if k not in skip}
        self._add_tree(index, built, rest, "", file, zip_)

    def _index_module_only(self, index: CheckpointIndex, obj: dict, file: str, zip_: TorchZip,
                           stage: int | None) -> None:
        """No optimizer partitions: the module's weights are the model (ZeRO 0/1/2, or a model-only save)."""
        built = _Built()
        module = _ordered(obj.get("module"))
        empty = 0
        for name, ref in module.items():
            if not isinstance(ref, TensorRef) or ref.storage is None:
                continue
            if ref.numel == 0:
                empty += 1
                continue
            built.tensors[name] = tensor_meta(name, ref, file, zip_.storages.get(ref.storage.key),
                                              big_endian=zip_.big_endian, path=self.path)
        if empty:
            index.warnings.append(f"{empty} module params are empty placeholders (ZeRO-3 keeps the weights in the "
                                  "*_optim_states.pt partitions, which are missing)")
            index.add_issue("missing-file", "no *_optim_states.pt: the ZeRO-3 weights cannot be rebuilt",
                            file=None, warning=None)
        rest = {k: v for k, v in obj.items() if k not in ("module", "ds_config")}
        self._add_tree(index, built, rest, "", file, zip_)
        self._finish(index, built, obj)

    def _index_experts(self, index: CheckpointIndex, tag_dir: Path, prefix: str, layout: DsLayout,
                       model_obj: dict, *, copies: bool = False) -> None:
        """An MoE save (``formats.deepspeed.moe``): every expert file's tensors join the module's under their
        global names; each other expert-parallel rank's optimizer state is listed under
        ``optimizer.expp_rank_{R}.`` (rank 0's is the model states' ``optimizer``, the same object).
        ``copies``: under ZeRO-1/2 the fp32 masters came from the partitions, and an expert file's tensor
        of a param with a master is its low-precision copy (``lp_params.``), as the module's are."""
        built = _Built()
        for (_, expert), name in sorted(layout.experts.items()):
            zip_ = self._rank_file(tag_dir / name)
            index.files.append(FileInfo(prefix + name, (tag_dir / name).stat().st_size, "data"))
            state = _ordered(zip_.obj)
            if not state:
                raise CkptError(f"{name}: not a DeepSpeed expert file (no state dict of expert {expert})", tag_dir)
            for key, ref in state.items():
                ids = moe.EXPERT_KEY.findall(key)
                if ids and int(ids[-1]) != expert:
                    raise CkptError(f"{name}: holds {key}, an entry of expert {ids[-1]}, not of expert {expert}: "
                                    "the file was renamed or mixed with another save's", tag_dir)
                master = index.tensors.get(key) if copies else None
                if master is not None and master.attr("zero") is not None:
                    attrs: tuple[tuple[str, str], ...] = (("group", "optimizer"), ("lp_copy_of", key))
                    key = LP_PREFIX + key
                else:
                    attrs = ()
                if key in index.tensors or key in built.tensors:
                    raise CkptError(f"{name}: {key} is stored twice (here and in another file of the save)", tag_dir)
                if isinstance(ref, TensorRef) and ref.storage is not None:
                    meta = tensor_meta(key, ref, prefix + name, zip_.storages.get(ref.storage.key),
                                       big_endian=zip_.big_endian, path=self.path)
                    built.tensors[key] = replace(meta, attrs=meta.attrs + attrs) if attrs else meta
        counts = to_plain(model_obj.get("num_experts"))
        for layer, expert in moe.missing_experts(set(layout.experts), counts):
            index.add_issue("missing-file", f"missing: the model states record {counts[layer]} experts in MoE layer "
                            f"{layer}; expert {expert}'s weights cannot be read",
                            file=prefix + moe.file_name(layer, expert, layout.mp))
        for name, meta in built.tensors.items():
            index.tensors[name] = meta
        optimizer = model_obj.get("optimizer")
        rank0_in_model_states = isinstance(optimizer, dict)
        if rank0_in_model_states and "fp32_groups" in optimizer:  # bf16/fp16 at ZeRO-0: FP16_Optimizer's masters
            index.warnings.append("the model shown is the module's own low-precision weights (as DeepSpeed's "
                                  "load_module_only restores them); their fp32 masters are in the optimizer state "
                                  "by position (optimizer.fp32_groups), not by name")
        for rank, name in sorted(layout.expert_optim.items()):
            index.files.append(FileInfo(prefix + name, (tag_dir / name).stat().st_size, "optimizer"))
            if rank == 0 and rank0_in_model_states:
                continue
            zip_ = self._rank_file(tag_dir / name)
            optimizer = zip_.obj.get("optimizer") if isinstance(zip_.obj, dict) else None
            if not isinstance(optimizer, dict):
                continue
            rank_state = _Built()
            self._add_tree(index, rank_state, optimizer, f"optimizer.expp_rank_{rank}", prefix + name, zip_)
            for key, meta in rank_state.tensors.items():
                index.tensors[key] = replace(meta, attrs=meta.attrs + (("rank", str(rank)),))

    def _add_tree(self, index: CheckpointIndex, built: _Built, tree: dict, prefix: str, file: str,
                  zip_: TorchZip) -> None:
        for name, leaf in flatten(tree, prefix):
            if isinstance(leaf, TensorRef):
                if leaf.storage is None or name in built.tensors:
                    continue
                built.tensors[name] = tensor_meta(name, leaf, file, zip_.storages.get(leaf.storage.key),
                                                  big_endian=zip_.big_endian, path=self.path)
            else:
                index.objects.append(ObjectEntry(name or "<root>", type_name(leaf), to_plain(leaf)))

    def _optimizer_objects(self, index: CheckpointIndex, osd: dict, zip_: TorchZip, file: str, stage: int) -> None:
        """Rank 0's optimizer state other than the flat partitions and moments: under ``optimizer.``."""
        drop = {"single_partition_of_fp32_groups", "fp32_flat_groups"}
        tree: dict[str, Any] = {}
        for key, value in osd.items():
            if key in drop:
                continue
            if key in ("base_optimizer_state", "optimizer_state_dict"):
                value = self._strip_moments(value)
            tree[str(key)] = value
        built = _Built()
        self._add_tree(index, built, tree, "optimizer", file, zip_)
        for name, meta in built.tensors.items():
            index.tensors[name] = replace(meta, attrs=meta.attrs + (("rank", "0"),))

    @staticmethod
    def _strip_moments(value: Any) -> Any:
        def lean(state: Any) -> Any:
            if not isinstance(state, dict):
                return state
            return {k: v for k, v in state.items() if not (isinstance(v, TensorRef) and len(v.shape) == 1)}

        if isinstance(value, list):
            return [lean(s) for s in value]
        if isinstance(value, dict) and isinstance(value.get("state"), dict):
            return {**value, "state": {k: lean(s) for k, s in value["state"].items()}}
        return value

    def _finish(self, index: CheckpointIndex, built: _Built, obj: dict) -> None:
        for name, meta in built.tensors.items():
            index.tensors.setdefault(name, meta)
        self._holes.update(built.holes)
        if built.holes:
            index.warnings.append(f"{len(built.holes)} tensors lack the elements of missing rank files; reading "
                                  "those regions fails")
        steps = obj.get("global_steps")
        if isinstance(steps, int) and not isinstance(steps, bool):
            index.metadata.setdefault("iteration", steps)
            index.metadata.setdefault("global_steps", steps)

    # --- reading -------------------------------------------------------------------------------------


    def byte_span(self, name: str, region: Region | None = None) -> tuple[Path, int, int] | None:
        if name in self._upcast:
            return None
        return super().byte_span(name, region)

    def _read_chunk(self, meta: TensorMeta, chunk: Chunk, local: tuple[tuple[int, int], ...]) -> Any:
        stored = self._upcast.get(meta.name)
        if stored is None:
            return super()._read_chunk(meta, chunk, local)
        import numpy as np

        return super()._read_chunk(replace(meta, dtype=stored), chunk, local).astype(np.float32)
