"""verl actor/critic checkpoint dirs (FORMATS.md §6, MAPPING.md §7), shown as one logical model.

**FSDP backend** (``global_step_N/actor/``): every rank ``torch.save``s its own ``model.state_dict()``
to ``model_world_size_{W}_rank_{R}.pt``. The values are DTensors (FSDP2, or FSDP1 with a device
mesh; HSDP ``(Replicate(), Shard(0))`` stores each shard once per replica group, the lowest rank's
copy is shown) or, for FSDP1 without a mesh, ShardedTensors; ``pickles/dtensor.py`` decodes them from
the safe unpickler's stubs into local tensors with global offsets (``torch.chunk`` semantics).

Each rank file's local tensor becomes one chunk pointing into that file's storage bytes, so no
file is loaded whole and no torch is imported. World size comes from ``fsdp_config.json`` or, for
old verl without it, from the file names. A missing rank file is a warning; reading a region it
held is an error naming it. Optimizer and extra-state files are listed as opaque objects (rank 0's
extra state, lr scheduler and rng, is decoded safely); ``huggingface/`` adds config objects.

**Megatron backend**, pre-v2 layout (``actor/dist_ckpt/`` next to ``huggingface/``): a Megatron-Core
torch_dist checkpoint; reading is delegated to ``MegatronDistReader`` and the HF config is attached
as objects. The current layout (``model/``, ``optimizer/``, ``extra/``, ``ckpt_contents.json``) is
``v2.py`` / ``v2_reader.py``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex, FileInfo, ObjectEntry, mark_config_tie
from ckptscope.core.roles import is_lora_tensor, training_kind
from ckptscope.core.tensor import Chunk, TensorMeta
from ckptscope.formats.base import CheckpointReader
from ckptscope.formats.hf.reader import HFDirReader, missing_numbered_shards
from ckptscope.formats.megatron.dist_reader import MegatronDistReader
from ckptscope.formats.pickles.dtensor import EXTRA_GLOBALS, Decoded, walk_state
from ckptscope.formats.pickles.safe import to_plain, type_name
from ckptscope.formats.pickles.torch_file import piece_chunk, read_torch_zip
from ckptscope.formats.registry import register_reader
from ckptscope.formats.verl.compose import ComposedReader
from ckptscope.formats.verl.side_files import json_file

FSDP_CONFIG = "fsdp_config.json"
HF_SUBDIR = "huggingface"
TRANSFORMER_CONFIG = "transformer_config.json"
DIST_CKPT_DIRS = ("dist_ckpt",)
"""Where verl's Megatron manager put the torch_dist dir before layout schema v2 (``v2.py``)."""
RANK_FILE = re.compile(r"^(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt$")
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_MAX_DECODED_EXTRA = 4 << 20
_HF_CONFIGS = ("config.json", "generation_config.json", "preprocessor_config.json", "adapter_config.json")
_TOKENIZER_HINTS = ("tokenizer", "vocab", "merges.txt", "special_tokens_map", "chat_template", "processor")


# --- directory layout ---------------------------------------------------------------------------------


def verl_rank_file(kind: str, world: int, rank: int) -> str:
    """The file verl's FSDP manager writes for ``kind`` (model, optim, extra_state) on ``rank``."""
    return f"{kind}_world_size_{world}_rank_{rank}.pt"


@dataclass(slots=True)
class FsdpLayout:
    """Which rank files an FSDP actor dir has, and the world size they belong to."""

    world_size: int | None
    source: str
    """Where ``world_size`` came from: ``fsdp_config.json`` or ``file names`` (old verl)."""
    fsdp_version: int | None
    files: dict[str, dict[int, str]]
    """``model``/``optim``/``extra_state`` -> rank -> file name, for ``world_size`` only."""
    config: Any = None
    warnings: list[str] = field(default_factory=list)
    ambiguous: tuple[int, ...] = ()
    """World sizes with a whole set of model files when no ``fsdp_config.json`` says which is the save."""
    newest: int | None = None
    """Of ``ambiguous``, the world size whose model files were written last."""
    config_mismatch: str | None = None
    """``fsdp_config.json`` names a world size whose files are not here (verl's merger then fails)."""
    rank_file: Callable[[str, int, int], str] = verl_rank_file
    """How the writer names a rank's file (``kind, world, rank``): verl's, or accelerate's (``formats.verl.accelerate_ranks``)."""

    def missing(self, kind: str = "model") -> list[str]:
        if self.world_size is None:
            return []
        have = self.files.get(kind, {})
        return [self.rank_file(kind, self.world_size, r) for r in range(self.world_size) if r not in have]


def fsdp_layout(path: Path) -> FsdpLayout | None:
    """The rank files of a verl FSDP actor/critic dir, or None when ``path`` is not one. Never raises."""
    try:
        names = [p.name for p in path.iterdir() if p.is_file()]
    except OSError:
        return None
    found: dict[int, dict[str, dict[int, str]]] = {}
    for name in names:
        m = RANK_FILE.match(name)
        if m:
            found.setdefault(int(m.group(2)), {}).setdefault(m.group(1), {})[int(m.group(3))] = name
    has_config = FSDP_CONFIG in names
    if not found and not has_config:
        return None
    layout = FsdpLayout(world_size=None, source="file names", fsdp_version=None, files={})
    if has_config:
        config, problem = json_file(path / FSDP_CONFIG)
        layout.config = config
        if problem:
            layout.warnings.append(problem)
        if isinstance(config, dict):
            world, version = config.get("world_size"), config.get("FSDP_version")
            if isinstance(world, int) and not isinstance(world, bool) and world > 0:
                layout.world_size, layout.source = world, FSDP_CONFIG
            if isinstance(version, int) and not isinstance(version, bool):
                layout.fsdp_version = version
    with_models = sorted(w for w, kinds in found.items() if "model" in kinds)
    if layout.world_size is None:
        # Old verl: no fsdp_config.json; the merger parses W from model_world_size_W_rank_0.pt.
        candidates = [w for w in with_models if 0 in found[w]["model"]] or with_models or sorted(found)
        if candidates:
            layout.world_size = candidates[-1]
    elif with_models and layout.world_size not in with_models:
        layout.config_mismatch = (f"says world size {layout.world_size} but the model files are for world size "
                                  f"{with_models[-1]}; using the files (verl's merger and resume follow the config "
                                  f"and fail)")
        layout.world_size, layout.source = with_models[-1], "file names"
    stale = sorted(w for w in found if w != layout.world_size)
    whole = [w for w in with_models if set(found[w]["model"]) >= set(range(w))]
    if layout.source == "file names" and len(whole) > 1:
        layout.ambiguous = tuple(whole)
        layout.newest = max(whole, key=lambda w: max(_mtime(path / f) for f in found[w]["model"].values()))
    elif stale:
        layout.warnings.append(f"rank files of another world size ({', '.join(map(str, stale))}) are present "
                               f"and ignored; showing world size {layout.world_size}")
    if layout.world_size is not None:
        layout.files = found.get(layout.world_size, {})
        for ranks in layout.files.values():
            extra = sorted(r for r in ranks if r >= layout.world_size)
            for r in extra:
                layout.warnings.append(f"{ranks.pop(r)}: rank {r} is outside world size {layout.world_size}; ignored")
    return layout


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def megatron_dist_dir(path: Path) -> Path | None:
    """The torch_dist dir of a verl Megatron actor dir, or None. Never raises."""
    for rel in DIST_CKPT_DIRS:
        try:
            if (path / rel).is_dir():
                return path / rel
        except OSError:
            return None
    return None


def verl_complete(path: Path) -> bool | None:
    """For save-root listings: whether a verl actor/critic dir holds a whole save, None if it is not one.

    FSDP: every ``model_*`` rank file of the world size is there (a crash mid-save leaves some out).
    Megatron: ``ckpt_contents.json`` (layout v2, written last); before v2, the torch_dist dir has the
    ``metadata.json`` marker (written last) and ``.metadata``.
    """
    from ckptscope.formats.verl.v2 import v2_complete

    v2 = v2_complete(path)
    if v2 is not None:
        return v2
    dist = megatron_dist_dir(path)
    if dist is not None:
        return MegatronDistReader.supports(dist) and (dist / ".metadata").is_file()
    if hf_weights_only(path):  # save_contents=["hf_model"]: whole unless save_pretrained was cut short
        return not missing_numbered_shards([p.name for p in (path / HF_SUBDIR).iterdir()])
    layout = fsdp_layout(path)
    if layout is None:
        return None
    return layout.world_size is not None and bool(layout.files.get("model")) and not layout.missing("model")


def _step_of(path: Path) -> int | None:
    for part in (path.name, path.parent.name, path.parent.parent.name):
        m = _STEP_DIR.match(part)
        if m:
            return int(m.group(1))
    return None


def add_hf_subdir(index: CheckpointIndex, hf: Path, rel: str) -> None:
    """List ``huggingface/`` (config, tokenizer, maybe weights) as files, its configs as objects."""
    try:
        entries = sorted(p for p in hf.iterdir() if p.is_file())
    except OSError:
        return
    weights = []
    for path in entries:
        name = path.name
        if name in _HF_CONFIGS:
            role = "config"
        elif any(h in name for h in _TOKENIZER_HINTS):
            role = "tokenizer"
        elif name.endswith((".safetensors", ".bin", ".index.json")):
            role = "hf_weights"
            weights.append(name)
        else:
            role = "other"
        index.files.append(FileInfo(f"{rel}/{name}", path.stat().st_size, role))
        if role != "config":
            continue
        config, problem = json_file(path)
        if problem:
            index.warnings.append(f"{rel}/{problem}")
            continue
        index.objects.append(ObjectEntry(f"{rel}.{name.removesuffix('.json')}", "json", config))
        if name == "config.json" and isinstance(config, dict):
            for key in ("architectures", "model_type", "torch_dtype", "dtype", "tie_word_embeddings"):
                if key in config:
                    index.metadata.setdefault(key, config[key])
    if weights:
        index.metadata.setdefault("verl", {})["hf_weights"] = f"{rel}/ also holds HF weights ({len(weights)} files); " \
                                                             f"open it to browse them"


# --- the readers -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Assembly:
    """Everything the rank files say about one tensor name."""

    first: Decoded
    chunks: list[Chunk] = field(default_factory=list)
    copies: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = field(default_factory=dict)
    """How many rank files hold each box (HSDP replicas; plain tensors: every rank)."""


@register_reader
class VerlFsdpReader(CheckpointReader):
    """A verl FSDP actor/critic dir: per-rank ``model_world_size_W_rank_R.pt`` files."""

    format_name = "verl_fsdp"
    priority = 70

    def __init__(self, path: Path, *, trust_pickle: bool = False) -> None:
        super().__init__(path, trust_pickle=trust_pickle)

    @classmethod
    def supports(cls, path: Path) -> bool:
        try:
            if not path.is_dir():
                return False
        except OSError:
            return False
        return fsdp_layout(path) is not None

    def _build_index(self) -> CheckpointIndex:
        layout = fsdp_layout(self.path)
        if layout is None or layout.world_size is None:
            raise CkptError("no model_world_size_*_rank_*.pt files and no usable fsdp_config.json", self.path)
        world = layout.world_size
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        index.warnings.extend(layout.warnings)
        if layout.config_mismatch:  # an issue, so `check` says it (it said ok; a probe with verl 0.9.1)
            index.add_issue("config-mismatch", layout.config_mismatch, file=FSDP_CONFIG)
        index.metadata["verl"] = {"backend": "fsdp", "world_size": world, "world_size_from": layout.source,
                                  "fsdp_version": layout.fsdp_version, "role": self.path.name}
        step = _step_of(self.path)
        if step is not None:
            index.metadata["iteration"] = step
        if layout.ambiguous:  # a probe's old-verl dir held a newer W=2 set beside a W=3 one: W=3 was exported
            sizes = " and ".join(map(str, layout.ambiguous))
            index.add_issue("ambiguous-files", f"whole sets of model files for world sizes {sizes} and no "
                            f"{FSDP_CONFIG} to say which is this save (the newest files are world size "
                            f"{layout.newest}'s); showing {world}. Remove the stale set: exports refuse until one is left")
        missing = layout.missing("model")
        for name in missing:  # an issue, so `check` reports the file (not only the holes it leaves)
            index.add_issue("missing-file", f"missing (world size {world} from {layout.source}); "
                            "the shards it held cannot be read", file=name)
        assembled = self._read_rank_files(index, layout)
        self._finish(index, assembled, {r for r in range(world) if r not in layout.files.get("model", {})}, world,
                     rank_file=layout.rank_file)
        self._add_side_files(index, layout)
        # huggingface/config.json ties the embeddings while the rank files hold both (a probe: 18,912
        # parameters where model.parameters() gives 17,280)
        mark_config_tie(index, {"tie_word_embeddings": index.metadata.get("tie_word_embeddings")})
        return index

    def _read_rank_files(self, index: CheckpointIndex, layout: FsdpLayout, kind: str = "model") -> dict[str, _Assembly]:
        assembled: dict[str, _Assembly] = {}
        world = layout.world_size or 0
        object_names = {o.name for o in index.objects}
        for rank, file in sorted(layout.files.get(kind, {}).items()):
            path = self.path / file
            parsed = read_torch_zip(path, extra_globals=EXTRA_GLOBALS)
            index.files.append(FileInfo(file, path.stat().st_size, "data"))
            for name, leaf, decoded in walk_state(parsed.obj, rank, world):
                if decoded is None or decoded.problem is not None:
                    if decoded is not None and name not in object_names:
                        index.warnings.append(f"{name}: {decoded.problem}; shown as an object")
                    if name not in object_names:
                        object_names.add(name)
                        index.objects.append(ObjectEntry(name or "<root>", type_name(leaf), to_plain(leaf)))
                    continue
                entry = assembled.get(name)
                if entry is None:
                    entry = assembled[name] = _Assembly(decoded)
                elif (entry.first.kind, entry.first.shape, entry.first.dtype) != \
                        (decoded.kind, decoded.shape, decoded.dtype):
                    index.warnings.append(f"{name}: rank {rank} saved {decoded.kind} {decoded.dtype}"
                                          f"{list(decoded.shape)}, an earlier rank {entry.first.kind} "
                                          f"{entry.first.dtype}{list(entry.first.shape)}; rank {rank} ignored")
                    continue
                for piece in decoded.pieces:
                    key = (piece.offsets, piece.ref.shape)
                    entry.copies[key] = entry.copies.get(key, 0) + 1
                    if entry.copies[key] > 1:  # a replica: the lowest rank's copy is the one shown
                        continue
                    if piece.ref.numel == 0 and math.prod(decoded.shape) != 0:
                        continue
                    entry.chunks.append(piece_chunk(name, piece.ref, piece.offsets, file, parsed, path))
        return assembled

    def _finish(self, index: CheckpointIndex, assembled: dict[str, _Assembly], missing_ranks: set[int],
                world: int, kind: str = "model", rank_file: Callable[[str, int, int], str] = verl_rank_file) -> None:
        """Turn the per-rank pieces into tensors; record holes left by missing rank files."""
        incomplete = 0
        for name, entry in assembled.items():
            first = entry.first
            attrs = first.attrs
            copies = max(entry.copies.values(), default=1)
            if copies > 1:
                attrs += (("copies", f"stored {copies}x; the lowest rank's copy is read"),)
            holes = []
            if missing_ranks:
                stored = {(c.offsets, c.shape) for c in entry.chunks}
                for offsets, shape, owner in first.expected:
                    if owner in missing_ranks and math.prod(shape) and (offsets, shape) not in stored:
                        holes.append((offsets, shape, rank_file(kind, world, owner)))
            if holes:
                incomplete += 1
                self._holes[name] = holes
                attrs += (("missing", ", ".join(sorted({h[2] for h in holes}))),)
            index.tensors[name] = TensorMeta(name=name, dtype=first.dtype, shape=first.shape,
                                             chunks=tuple(entry.chunks), attrs=attrs)
        if incomplete:
            index.warnings.append(f"{incomplete} tensors lack the shards of missing rank files; reading those "
                                  "regions fails")

    def _add_side_files(self, index: CheckpointIndex, layout: FsdpLayout) -> None:
        if layout.config is not None:
            index.files.append(FileInfo(FSDP_CONFIG, (self.path / FSDP_CONFIG).stat().st_size, "config"))
            index.objects.insert(0, ObjectEntry("fsdp_config", "json", layout.config))
        for kind, role in (("optim", "optimizer"), ("extra_state", "extra_state")):
            files = layout.files.get(kind, {})
            sizes = {}
            for _rank, file in sorted(files.items()):
                size = (self.path / file).stat().st_size
                sizes[file] = size
                index.files.append(FileInfo(file, size, role))
            if sizes:
                index.objects.append(ObjectEntry(kind, "opaque torch.save per rank",
                                                 {"files": len(sizes), "bytes": sum(sizes.values()),
                                                  "per_file": sizes}))
            for name in layout.missing(kind):
                # an issue, so `check` fails: verl's load_checkpoint opens every rank's optim and extra_state
                # file and a resume dies on this one (it said ok; a probe with verl 0.9.1's own manager)
                index.add_issue("missing-state-file", f"missing: every rank loads its own {kind} file, so a resume "
                                f"from this save would fail (the model itself is whole)", file=name,
                                warning=f"{name}: missing")
        extra = layout.files.get("extra_state", {}).get(0)
        if extra is not None and (self.path / extra).stat().st_size <= _MAX_DECODED_EXTRA:
            try:
                obj = read_torch_zip(self.path / extra, extra_globals=EXTRA_GLOBALS).obj
            except CkptError as exc:
                index.warnings.append(f"{extra}: {exc.problem}")
            else:
                for key, value in (obj.items() if isinstance(obj, dict) else [("value", obj)]):
                    index.objects.append(ObjectEntry(f"extra_state.{key}", type_name(value), to_plain(value)))
        if (self.path / HF_SUBDIR).is_dir():
            add_hf_subdir(index, self.path / HF_SUBDIR, HF_SUBDIR)
        _add_lora_meta(index, self.path)



LORA_META = "lora_train_meta.json"
"""verl's LoRA runs write ``{"r", "lora_alpha", "task_type"}`` beside the shards: the adapter's scaling."""


def add_json_object(index: CheckpointIndex, directory: Path, file: str, name: str, *, first: bool = False) -> None:
    """``directory/file``, when there, listed as a config file and shown as the JSON object ``name`` (first
    among the objects with ``first``); a file that does not parse is a warning."""
    path = directory / file
    if not path.is_file():
        return
    index.files.append(FileInfo(file, path.stat().st_size, "config"))
    value, problem = json_file(path)
    if problem:
        index.warnings.append(problem)
    elif first:
        index.objects.insert(0, ObjectEntry(name, "json", value))
    else:
        index.objects.append(ObjectEntry(name, "json", value))


def _add_lora_meta(index: CheckpointIndex, path: Path) -> None:
    """A LoRA run's ``lora_train_meta.json`` as an object, and a warning when the shards hold the adapter
    alone (``checkpoint.save_lora_only``): it was shown as a small model of its own (a probe with verl 0.9.1)."""
    add_json_object(index, path, LORA_META, "lora_train_meta")
    names = [n for n in index.tensors if training_kind(n) is None]
    if names and all(map(is_lora_tensor, names)):
        index.warnings.append(f"adapter-only LoRA save (verl checkpoint.save_lora_only): the {len(names)} tensors are "
                              f"lora_A/lora_B, not the model; the base weights are the model training started from")


class VerlOptimReader(VerlFsdpReader):
    """The optimizer rank files of a verl FSDP actor dir (``optim_world_size_W_rank_R.pt``, each a
    ``torch.save`` of that rank's ``optimizer.state_dict()``) read like its model files: every
    ``state.<k>.<moment>`` one tensor assembled from the ranks' DTensor shards, ``param_groups`` an
    object. Not in the registry (a verl dir opens as its model): ``timeline`` opens it for Adam
    statistics (``ops.timeline.optim_verl``)."""

    format_name = "verl_optim"

    def _build_index(self) -> CheckpointIndex:
        layout = fsdp_layout(self.path)
        if layout is None or layout.world_size is None or not layout.files.get("optim"):
            raise CkptError("no optim_world_size_*_rank_*.pt files", self.path)
        world = layout.world_size
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        assembled = self._read_rank_files(index, layout, kind="optim")
        self._finish(index, assembled, {r for r in range(world) if r not in layout.files["optim"]}, world, "optim")
        return index


def hf_weights_only(path: Path) -> bool:
    """A verl FSDP role dir whose ``save_contents`` had ``hf_model`` but not ``model``: ``fsdp_config.json``
    and the whole model in ``huggingface/`` (``save_pretrained``), no model rank file (optimizer and extra
    state rank files may be there). Never raises."""
    try:
        if not (path / FSDP_CONFIG).is_file():
            return False
        names = (p.name for p in path.iterdir())
        if any(m is not None and m.group(1) == "model" for m in map(RANK_FILE.match, names)):
            return False  # model rank files: the FSDP reader's
        return HFDirReader.supports(path / HF_SUBDIR)
    except OSError:
        return False


@register_reader
class VerlHfOnlyReader(ComposedReader):
    """A verl FSDP actor/critic dir whose save kept the HF model but no model rank files (``save_contents``
    with ``hf_model``, without ``model``): the model is ``huggingface/``. It was read as an FSDP dir missing
    every rank file: "damaged", and a run root of such saves had "no complete iteration" (a probe)."""

    format_name = "verl_hf"
    priority = 69  # before VerlFsdpReader, which takes any dir with fsdp_config.json

    @classmethod
    def supports(cls, path: Path) -> bool:
        return path.is_dir() and hf_weights_only(path)

    def _build_index(self) -> CheckpointIndex:
        if not hf_weights_only(self.path):
            raise CkptError(f"no model in {HF_SUBDIR}/ and no rank files", self.path)
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        inner = self._adopt(index, HFDirReader(self.path / HF_SUBDIR, trust_pickle=self.trust_pickle), HF_SUBDIR)
        index.metadata = dict(inner.metadata)
        index.metadata["verl"] = {"backend": "fsdp", "contents": "hf_model", "role": self.path.name}
        step = _step_of(self.path)
        if step is not None:
            index.metadata.setdefault("iteration", step)
        index.files.append(FileInfo(FSDP_CONFIG, (self.path / FSDP_CONFIG).stat().st_size, "config"))
        # optimizer / extra-state rank files when save_contents kept them: listed, not read
        for rank_file in sorted(p for p in self.path.iterdir() if RANK_FILE.match(p.name)):
            role = "optimizer" if rank_file.name.startswith("optim") else "other"
            index.files.append(FileInfo(rank_file.name, rank_file.stat().st_size, role))
        return index


@register_reader
class VerlMegatronReader(ComposedReader):
    """A pre-v2 verl Megatron actor/critic dir: ``dist_ckpt/`` + ``huggingface/``."""

    format_name = "verl_megatron"
    priority = 72

    @classmethod
    def supports(cls, path: Path) -> bool:
        try:
            return path.is_dir() and megatron_dist_dir(path) is not None
        except OSError:
            return False

    def _build_index(self) -> CheckpointIndex:
        dist = megatron_dist_dir(self.path)
        if dist is None:
            raise CkptError("no dist_ckpt/ directory", self.path)
        rel = dist.relative_to(self.path).as_posix()
        if not MegatronDistReader.supports(dist):
            raise CkptError(f"{rel}/ has no Megatron torch_dist metadata.json (incomplete save?)", self.path)
        index = CheckpointIndex(path=str(self.path), format=self.format_name)
        inner = self._adopt(index, MegatronDistReader(dist, trust_pickle=self.trust_pickle), rel)
        index.metadata = dict(inner.metadata)
        index.metadata["verl"] = {"backend": "megatron", "dist_ckpt": rel, "role": self.path.name}
        step = _step_of(self.path)
        if step is not None:
            index.metadata.setdefault("iteration", step)
        add_json_object(index, self.path, TRANSFORMER_CONFIG, "transformer_config", first=True)
        if (self.path / HF_SUBDIR).is_dir():
            add_hf_subdir(index, self.path / HF_SUBDIR, HF_SUBDIR)
        _add_lora_meta(index, self.path)
        return index
