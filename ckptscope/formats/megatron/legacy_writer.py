"""The legacy Megatron writer (``--ckpt-format torch``, FORMATS.md §3): one ``model_optim_rng.pt`` per
(tp, pp[, ep]) rank, streamed.

A rank file needs its slices of many tensors, and each tensor feeds every TP rank (and, tied with
PP > 1, two stages). Building whole rank dicts would hold a stage in memory; calling ``produce`` per
rank would read every tensor TP times. Instead:

1. every rank file is written by ``torch.save`` itself, with FakeTensor placeholders under
   ``torch.serialization.skip_data(materialize_fake_tensors=True)``: torch's own pickle and zip
   layout, storage records reserved but not written, no memory allocated;
2. each tensor is produced once and its TP slices are written straight into their records
   (``os.pwrite`` at the offsets torch's zip reader reports);
3. the records' CRC-32s, which ``skip_data`` leaves 0, are patched in the data descriptors and the
   central directory, and ``.data/serialization_id``, which torch derives from the records' CRCs,
   is recomputed for the real data, so each file is byte for byte a ``torch.save`` of the real dict.
"""

from __future__ import annotations

import argparse
import os
import struct
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptscope.core.dtypes import DType
from ckptscope.core.errors import CkptError
from ckptscope.formats.checksum import crc32
from ckptscope.formats.megatron.model_layout import (
    COLUMN,
    EXPERTS,
    EXTRA,
    GLU,
    LAYERS,
    REPLICATED,
    ROW,
    Entry,
    ModelTensors,
    OutTensor,
    Progress,
    analyse,
    check_spec,
    extra_state_value,
    pipeline_layer_ranges,
    produce_array,
    raw_bytes,
    spec_sub,
)
from ckptscope.formats.torch_save.serialization_id import SERIALIZATION_ID, descriptor_values, serialization_id

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

LEGACY_FILE = "model_optim_rng.pt"
CHECKPOINT_VERSION = 3.0

_ATTN_POST_NORM = "self_attention.linear_proj.post_layernorm.weight"
_MLP_POST_NORM = "mlp.linear_fc2.post_layernorm.weight"
_SINKS = "self_attention.core_attention.softmax_offset"
"""GPT-OSS's attention sinks: the first module Attention builds is core_attention, so they come first."""
"""Gemma's post-norms: a child module of the row-parallel linear (Megatron-Bridge), so after the linear's
own parameters and ``_extra_state``. Megatron-Bridge builds Gemma with the TE spec only; a local-spec
file holding them follows the same module order (not checked against a real writer)."""
# Order of one layer in state_dict_for_save_checkpoint (module registration order: Attention builds
# core_attention and linear_proj before SelfAttention adds linear_qkv and the q/k norms; parameters
# before a module's _extra_state). Checked against megatron-core 0.16.1 for the local spec.
_ATTN_LOCAL = (
    "input_layernorm.weight", "input_layernorm.bias", _SINKS,
    "self_attention.linear_proj.weight", "self_attention.linear_proj.bias", "self_attention.linear_proj._extra_state",
    _ATTN_POST_NORM,
    "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias", "self_attention.linear_qkv._extra_state",
    "self_attention.q_layernorm.weight", "self_attention.q_layernorm.bias",
    "self_attention.k_layernorm.weight", "self_attention.k_layernorm.bias",
)
_MLP_LOCAL = (
    "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
    "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc1._extra_state",
    "mlp.linear_fc2.weight", "mlp.linear_fc2.bias", "mlp.linear_fc2._extra_state", _MLP_POST_NORM,
)
_ATTN_TE = (  # not checked against a real TE install (none here); from the TE module layouts
    _SINKS, "self_attention.core_attention._extra_state",
    "self_attention.linear_proj.weight", "self_attention.linear_proj.bias", "self_attention.linear_proj._extra_state",
    _ATTN_POST_NORM,
    "self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.layer_norm_bias",
    "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias", "self_attention.linear_qkv._extra_state",
    "self_attention.q_layernorm.weight", "self_attention.q_layernorm.bias",
    "self_attention.k_layernorm.weight", "self_attention.k_layernorm.bias",
)
_MLP_TE = (
    "mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.layer_norm_bias",
    "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc1._extra_state",
    "mlp.linear_fc2.weight", "mlp.linear_fc2.bias", "mlp.linear_fc2._extra_state", _MLP_POST_NORM,
)
_ORDER_TOP = ("embedding.word_embeddings.weight", "embedding.position_embeddings.weight", None,
              "decoder.final_layernorm.weight", "decoder.final_layernorm.bias",
              "output_layer.weight", "output_layer._extra_state")
"""Top-level order; ``None`` is where the layers go."""


def _moe_mlp_order(local_experts: int) -> tuple[str, ...]:
    """A MoE layer's MLP part: the separate norm, then MoELayer's router (weight, then the expert_bias
    buffer), SequentialMLP's local experts, the shared experts (their own ``gate_weight`` before their
    linears). Checked against megatron-core 0.16.1 for the local spec; the TE spec has the same modules."""
    order = ["pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias", "mlp.router.weight", "mlp.router.bias",
             "mlp.router.expert_bias"]
    for e in range(local_experts):
        for linear in ("linear_fc1", "linear_fc2"):
            order += [f"{EXPERTS}{e}.{linear}.weight", f"{EXPERTS}{e}.{linear}.bias", f"{EXPERTS}{e}.{linear}{EXTRA}"]
    order += ["mlp.shared_experts.gate_weight",
              "mlp.shared_experts.linear_fc1.weight", f"mlp.shared_experts.linear_fc1{EXTRA}",
              "mlp.shared_experts.linear_fc2.weight", f"mlp.shared_experts.linear_fc2{EXTRA}"]
    return tuple(order)


def _layer_order(spec: str, moe: bool, local_experts: int) -> tuple[str, ...]:
    if moe:
        return (_ATTN_LOCAL if spec == "local" else _ATTN_TE) + _moe_mlp_order(local_experts)
    return _ATTN_LOCAL + _MLP_LOCAL if spec == "local" else _ATTN_TE + _MLP_TE


def legacy_rank_dir(tp_rank: int, pp_rank: int, pp: int, ep_rank: int = 0, ep: int = 1) -> str:
    """``mp_rank_{tp:02d}``, ``_{pp:03d}`` appended when PP > 1, ``_{ep:03d}`` when EP > 1 (FORMATS.md §3.1)."""
    name = f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    return name if ep == 1 else f"{name}_{ep_rank:03d}"


@dataclass
class _Slot:
    """One tensor of one rank file: its shape there and the zip record it fills."""

    shape: tuple[int, ...]
    dtype: DType
    record: str = ""
    offset: int = -1
    nbytes: int = 0
    written: int = 0
    crc: int = 0


@dataclass
class _RankFile:
    path: Path
    model: OrderedDict = field(default_factory=OrderedDict)
    """Legacy name -> ``_Slot`` (a tensor) or the ``_extra_state`` value itself."""
    fd: int = -1


def _slice_shape(shape: tuple[int, ...], layout: str, tp: int, name: str) -> tuple[int, ...]:
    if layout == REPLICATED or tp == 1:
        return shape
    if layout == ROW:
        if shape[1] % tp:
            raise CkptError(f"{name}: dim 1 of {shape} does not split over TP={tp}")
        return (shape[0], shape[1] // tp) + shape[2:]
    if shape[0] % (2 * tp if layout == GLU else tp):
        raise CkptError(f"{name}: dim 0 of {shape} does not split over TP={tp}"
                        + (" (SwiGLU: the gate and up halves each)" if layout == GLU else ""))
    return (shape[0] // tp,) + shape[1:]


def _pieces(array: np.ndarray, layout: str, tp: int, rank: int) -> list[np.ndarray]:
    """TP rank ``rank``'s slice of a full tensor, as pieces in storage order (MAPPING.md §3.2, §4)."""
    if layout == REPLICATED or tp == 1:
        return [array]
    if layout == ROW:
        cols = array.shape[1] // tp
        return [array[:, rank * cols:(rank + 1) * cols]]
    if layout == GLU:  # rank t holds [gate_t; up_t]
        half = array.shape[0] // 2
        rows = half // tp
        return [array[rank * rows:(rank + 1) * rows], array[half + rank * rows:half + (rank + 1) * rows]]
    assert layout == COLUMN
    rows = array.shape[0] // tp
    return [array[rank * rows:(rank + 1) * rows]]


@dataclass
class _Place:
    """One slot an entry fills: the rank file, the legacy name, and which of ``split`` TP slices."""

    rank: _RankFile
    name: str
    split: int
    part: int


def _layout(model: ModelTensors, tp: int, pp: int, ep: int, etp: int, args: dict[str, Any], spec: str,
            iter_dir: Path) -> tuple[list[_RankFile], list[list[_Place]]]:
    """Every rank file with its model entries in order, and for each entry of ``model.entries`` the
    slots it fills. A stage's dense tensors go to each of its EP ranks' files; a routed expert only
    to the file of EP rank ``e // E_local``, as local expert ``e % E_local`` (MAPPING.md §6.2), split
    over the expert TP size ``etp`` (TP, or 1: every TP file holds the whole expert)."""
    ranges = pipeline_layer_ranges(model.num_layers, pp, args)
    stage_of = {layer: p for p, r in enumerate(ranges) for layer in r}
    files = {(p, x, t): _RankFile(iter_dir / legacy_rank_dir(t, p, pp, x, ep) / LEGACY_FILE)
             for p in range(pp) for x in range(ep) for t in range(tp)}
    local_experts = model.num_experts // ep
    targets: list[list[_Place]] = []
    placed: dict[tuple[int, int, str], Entry] = {}  # (stage, ep rank, legacy name) -> entry
    for entry in model.entries:
        places: list[tuple[int, int, str]] = []
        if entry.layer is None:
            if entry.sub.startswith("embedding."):
                places += [(0, x, entry.sub) for x in range(ep)]
                if entry.sub == "embedding.word_embeddings.weight" and model.tied and pp > 1:
                    # the last stage's own copy (MAPPING.md §1.5)
                    places += [(pp - 1, x, "output_layer.weight") for x in range(ep)]
            else:
                places += [(pp - 1, x, entry.sub) for x in range(ep)]
        elif entry.expert is not None:
            p = stage_of[entry.layer]
            x, local = divmod(entry.expert, local_experts)
            places.append((p, x, f"{LAYERS}{entry.layer - ranges[p].start}.{EXPERTS}{local}.{entry.expert_sub}"))
        else:
            p = stage_of[entry.layer]
            places += [(p, x, f"{LAYERS}{entry.layer - ranges[p].start}.{spec_sub(entry.sub, spec)}")
                       for x in range(ep)]
        for place in places:
            placed[place] = entry
        split = etp if entry.expert is not None else tp
        targets.append([_Place(files[(p, x, t)], name, split, t if split > 1 else 0)
                        for p, x, name in places for t in range(tp)])

    extra = extra_state_value(spec)
    orders = {moe: _layer_order(spec, moe, local_experts) for moe in (False, True)}
    for p, stage in enumerate(ranges):
        for x in range(ep):
            names: list[str] = []
            for top in _ORDER_TOP:
                if top is None:
                    for local in range(len(stage)):
                        for sub in orders[model.is_moe_layer(stage.start + local)]:
                            name = f"{LAYERS}{local}.{sub}"
                            if sub.endswith(EXTRA):
                                module = sub[: -len(EXTRA)]
                                owner = "self_attention.linear_qkv" if module.endswith("core_attention") else module
                                if (p, x, f"{LAYERS}{local}.{spec_sub(owner + '.weight', spec)}") in placed:
                                    names.append(name)
                            elif (p, x, name) in placed:
                                names.append(name)
                elif top == "output_layer._extra_state":
                    if p == pp - 1:  # mcore's own ColumnParallelLinear: present even when tied and weightless
                        names.append(top)
                elif (p, x, top) in placed:
                    names.append(top)
            _fill_stage(files, (p, x), names, placed, tp, etp, extra)
    return list(files.values()), targets


def _fill_stage(files: dict, stage: tuple[int, int], names: list[str], placed: dict, tp: int, etp: int,
                extra: Any) -> None:
    """Put ``names`` (in order) into the TP files of one (pp, ep) stage: a ``_Slot`` per tensor, the
    ``_extra_state`` values themselves; every tensor placed on the stage must be among the names."""
    p, x = stage
    # kept FP8 block scales (ops/convert/fp8_keep.py) follow their weight: ``<weight>_scale_inv``
    names = [n for name in names for n in (name, name + "_scale_inv") if n == name or (p, x, n) in placed]
    unplaced = {name for (stage_index, ep_rank, name) in placed if (stage_index, ep_rank) == (p, x)} - set(names)
    if unplaced:  # unreachable: every known tensor has its place in the orders
        raise CkptError(f"no place in the legacy state dict for {sorted(unplaced)[:3]}")
    for t in range(tp):
        rank = files[(p, x, t)]
        for name in names:
            if name == "output_layer._extra_state":  # mcore's own linear in both specs
                rank.model[name] = None
            elif name.endswith(EXTRA):
                rank.model[name] = extra if extra is None else extra.clone()
            else:
                entry = placed[(p, x, name)]
                split = etp if entry.expert is not None else tp
                rank.model[name] = _Slot(_slice_shape(entry.out.shape, entry.layout, split, entry.out.name),
                                         entry.dtype)


_MLA_LOCAL = (  # megatron-core 0.16.1 MLASelfAttention, local spec: state_dict() order checked on CPU
    "input_layernorm.weight",
    "self_attention.linear_proj.weight", "self_attention.linear_proj._extra_state",
    "self_attention.linear_q_proj.weight", "self_attention.linear_q_proj._extra_state",
    "self_attention.linear_q_down_proj.weight", "self_attention.linear_q_down_proj._extra_state",
    "self_attention.linear_q_up_proj.weight", "self_attention.linear_q_up_proj._extra_state",
    "self_attention.linear_kv_down_proj.weight", "self_attention.linear_kv_down_proj._extra_state",
    "self_attention.linear_kv_up_proj.weight", "self_attention.linear_kv_up_proj._extra_state",
    "self_attention.q_layernorm.weight", "self_attention.kv_layernorm.weight",
)
_MLA_TE = (  # the same modules with TE's fused latent norms (not checked against a TE install)
    "input_layernorm.weight", "self_attention.core_attention._extra_state",
    "self_attention.linear_proj.weight", "self_attention.linear_proj._extra_state",
    "self_attention.linear_q_proj.weight", "self_attention.linear_q_proj._extra_state",
    "self_attention.linear_q_down_proj.weight", "self_attention.linear_q_down_proj._extra_state",
    "self_attention.linear_q_up_proj.layer_norm_weight",
    "self_attention.linear_q_up_proj.weight", "self_attention.linear_q_up_proj._extra_state",
    "self_attention.linear_kv_down_proj.weight", "self_attention.linear_kv_down_proj._extra_state",
    "self_attention.linear_kv_up_proj.layer_norm_weight",
    "self_attention.linear_kv_up_proj.weight", "self_attention.linear_kv_up_proj._extra_state",
)
_MTP_HEAD = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "eh_proj._extra_state")
"""An MTP layer's own modules before its ``transformer_layer`` (then ``final_layernorm``), megatron-core 0.16.1."""


def _layout_heterogeneous(model: ModelTensors, tp: int, pp: int, ep: int, etp: int, args: dict[str, Any],
                          spec: str, iter_dir: Path) -> tuple[list[_RankFile], list[list[_Place]]]:
    """``_layout`` for layers that differ (dense and MoE layers mixed: Llama 4, DeepSeek; MLA; MTP layers).
    Each name is ``Entry.owner`` + ``sub`` in ``spec``'s spelling; MTP layers live on the last stage, after
    the decoder's final norm, as in ``GPTModel.state_dict()``. A layer's entries follow ``_MLA_*`` and
    the dense or MoE MLP order; the ``_extra_state`` of each linear present follows its weight."""
    ranges = pipeline_layer_ranges(model.num_layers, pp, args)
    stage_of = {layer: p for p, r in enumerate(ranges) for layer in r}
    files = {(p, x, t): _RankFile(iter_dir / legacy_rank_dir(t, p, pp, x, ep) / LEGACY_FILE)
             for p in range(pp) for x in range(ep) for t in range(tp)}
    local_experts = max(model.num_experts // ep, 1)
    targets: list[list[_Place]] = []
    placed: dict[tuple[int, int, str], Entry] = {}
    for entry in model.entries:
        if not entry.owner:
            stage = 0 if entry.sub.startswith("embedding.") else pp - 1
            prefix, sub = "", entry.sub
        elif entry.layer is not None:
            stage = stage_of[entry.layer]
            prefix, sub = f"{LAYERS}{entry.layer - ranges[stage].start}.", spec_sub(entry.sub, spec)
        else:
            stage, prefix, sub = pp - 1, entry.owner, spec_sub(entry.sub, spec)
        if entry.expert is not None:
            x, local = divmod(entry.expert, local_experts)
            places = [(stage, x, f"{prefix}{EXPERTS}{local}.{entry.expert_sub}")]
        else:
            places = [(stage, x, prefix + sub) for x in range(ep)]
        for place in places:
            placed[place] = entry
        split = etp if entry.expert is not None else tp
        targets.append([_Place(files[(p, x, t)], name, split, t if split > 1 else 0)
                        for p, x, name in places for t in range(tp)])

    if model.mla:
        attention = _MLA_LOCAL if spec == "local" else _MLA_TE
    else:
        attention = _ATTN_LOCAL if spec == "local" else _ATTN_TE
    mlp = _MLP_LOCAL if spec == "local" else _MLP_TE
    layer_order = list(dict.fromkeys(attention + mlp + _moe_mlp_order(local_experts)))
    mtp_layers = sorted({e.owner.split(".")[2] for e in model.entries if e.owner.startswith("mtp.")}, key=int)
    extra = extra_state_value(spec)
    for p, stage in enumerate(ranges):
        for x in range(ep):
            candidates: list[str] = []
            for top in _ORDER_TOP:
                if top is None:
                    candidates += [f"{LAYERS}{local}.{sub}" for local in range(len(stage)) for sub in layer_order]
                    continue
                if top == "output_layer.weight" and p == pp - 1:
                    for k in mtp_layers:
                        head = f"mtp.layers.{k}."
                        candidates += [head + sub for sub in _MTP_HEAD]
                        candidates += [f"{head}transformer_layer.{sub}" for sub in layer_order]
                        candidates.append(head + "final_layernorm.weight")
                candidates.append(top)
            names = []
            for name in candidates:
                if name == "output_layer._extra_state":
                    if p == pp - 1:
                        names.append(name)
                elif name.endswith(EXTRA):
                    module = name[: -len(EXTRA)]
                    owner = module.rpartition(".")[0] + ".linear_proj" if module.endswith("core_attention") else module
                    if (p, x, owner + ".weight") in placed:
                        names.append(name)
                elif (p, x, name) in placed:
                    names.append(name)
            _fill_stage(files, (p, x), names, placed, tp, etp, extra)
    return list(files.values()), targets


def _save_skeleton(rank: _RankFile, header: dict[str, Any]) -> None:
    """``torch.save`` the rank's dict with FakeTensor placeholders and no data, then find each
    placeholder's storage record in the zip."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    model: OrderedDict = OrderedDict()
    with FakeTensorMode():
        for name, value in rank.model.items():
            model[name] = torch.empty(value.shape, dtype=getattr(torch, value.dtype.name)) \
                if isinstance(value, _Slot) else value
    rank.path.parent.mkdir(parents=True, exist_ok=True)
    with torch.serialization.skip_data(materialize_fake_tensors=True):
        torch.save({**header, "model": model}, rank.path)
    del model
    # torch.save numbers storages in the order its pickler meets them: the model's tensors in dict
    # order (the header holds none; the caller checks). Every record's size is checked.
    reader = torch._C.PyTorchFileReader(str(rank.path))
    with zipfile.ZipFile(rank.path) as archive:
        sizes = {info.filename.split("/", 1)[1]: info.file_size for info in archive.infolist()}
    key = 0
    for name, value in rank.model.items():
        if isinstance(value, _Slot):
            value.record = f"data/{key}"
            value.nbytes = value.dtype.nbytes(_numel(value.shape))
            if sizes.get(value.record) != value.nbytes:
                raise RuntimeError(f"{rank.path}: record {value.record} of {name} holds {sizes.get(value.record)} "
                                   f"bytes, expected {value.nbytes}")
            value.offset = reader.get_record_offset(value.record)
        if isinstance(value, (_Slot, torch.Tensor)):
            key += 1


def _numel(shape: tuple[int, ...]) -> int:
    numel = 1
    for size in shape:
        numel *= size
    return numel


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _fill(entry: Entry, places: list[_Place]) -> None:
    """Produce one tensor and write its slices into every slot it feeds (locals die on return, so the
    array never outlives this tensor's turn)."""
    array = produce_array(entry)
    for place in places:
        rank = place.rank
        slot = rank.model[place.name]
        for piece in _pieces(array, entry.layout, place.split, place.part):
            data = raw_bytes(piece)
            _pwrite_all(rank.fd, data, slot.offset + slot.written)
            slot.crc = crc32(data, slot.crc)
            slot.written += len(data)


def _patch_crcs(path: Path, patches: list[tuple[str, int, int]]) -> None:
    """Put each record's CRC-32 where torch's zip writer keeps it: the data descriptor after the data
    (general-purpose flag bit 3), else the local header, and the central directory entry.
    ``patches``: (record name, offset just past its data, CRC-32)."""
    with zipfile.ZipFile(path) as archive:
        infos = {info.filename.split("/", 1)[1]: info for info in archive.infolist()}
        start_dir = archive.start_dir  # type: ignore[attr-defined]
    full_names = {infos[record].filename: crc for record, _, crc in patches}
    with open(path, "r+b") as handle:
        for record, end, crc in patches:
            info = infos[record]
            if info.flag_bits & 0x08:
                handle.seek(end)
                handle.seek(end + 4 if handle.read(4) == b"PK\x07\x08" else end)
            else:
                handle.seek(info.header_offset + 14)
            handle.write(struct.pack("<I", crc))
        handle.seek(start_dir)
        while full_names:  # central directory: 46 fixed bytes, then name, extra, comment
            entry = handle.tell()
            fixed = handle.read(46)
            if len(fixed) < 46 or fixed[:4] != b"PK\x01\x02":
                raise RuntimeError(f"{path}: the zip central directory ends before every record was found")
            name_len, extra_len, comment_len = struct.unpack("<HHH", fixed[28:34])
            name = handle.read(name_len).decode("utf-8")
            if name in full_names:
                handle.seek(entry + 16)
                handle.write(struct.pack("<I", full_names.pop(name)))
            handle.seek(entry + 46 + name_len + extra_len + comment_len)


def _data_offset(handle: Any, info: zipfile.ZipInfo) -> int:
    """Where a record's data starts: after its local header, name and extra field (the local
    extra holds torch's alignment padding, so it is read from the file, not the central directory)."""
    handle.seek(info.header_offset + 26)
    name_len, extra_len = struct.unpack("<HH", handle.read(4))
    return info.header_offset + 30 + name_len + extra_len


def _restamp_serialization_id(path: Path) -> None:
    """Rewrite ``.data/serialization_id`` for the data now in the file.

    ``torch.save`` under ``skip_data`` derived the id from the records it wrote, whose data was
    not there yet. Once the data and its CRC-32s are in place (``_patch_crcs``) it is recomputed
    from the file as torch would have for the real data (``torch_save.serialization_id``: record
    names, then each record's CRC-32), so the id follows the content and the file is what torch's
    writer makes of these records."""
    names: list[str] = []
    values: list[int] = []
    with zipfile.ZipFile(path) as archive, open(path, "r+b") as handle:
        stamp = None
        for info in archive.infolist():  # central directory order: the order torch wrote them
            name = info.filename.split("/", 1)[1]
            offset = _data_offset(handle, info)
            if name == SERIALIZATION_ID:
                stamp = (offset, info.file_size)
                continue
            handle.seek(offset)
            names.append(name)
            values += descriptor_values(handle.read(min(8, info.file_size)), info.file_size, info.CRC)
        value = serialization_id(names, values).encode()
        if stamp is None or stamp[1] != len(value):  # torch always writes it, 40 digits
            raise RuntimeError(f"{path}: no {SERIALIZATION_ID} record of {len(value)} bytes to rewrite")
        handle.seek(stamp[0])
        handle.write(value)
    _patch_crcs(path, [(SERIALIZATION_ID, stamp[0] + len(value), crc32(value))])


def write_torch_legacy(iter_dir: Path, tensors: list[OutTensor], *, args: dict, iteration: int, tp: int, pp: int,
                       ep: int = 1, spec: str = "local", progress: Progress | None = None,
                       files: set[str] | None = None) -> None:
    """Write a Megatron ``--ckpt-format torch`` iteration dir into ``iter_dir``.

    One ``mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt`` per (tp, pp, ep) rank holding ``{"args":
    Namespace(**args), "checkpoint_version": 3.0, "iteration": iteration, "model": ...}`` where the
    model is what megatron-core's ``GPTModel.state_dict_for_save_checkpoint()`` gives on that rank for
    ``spec`` ("local" or "te"): TP slices per MAPPING.md §4 (column-parallel dim 0, SwiGLU fc1
    ``[gate_t; up_t]``, row-parallel dim 1, norms replicated), local layer indices per stage
    (``pipeline_layer_ranges``), embeddings on the first stage, final norm and ``output_layer`` on
    the last, with tied embeddings and PP > 1 the last stage's own ``output_layer.weight`` copy, and
    the ``_extra_state`` entries. MoE (SequentialMLP): router and shared-expert gate replicated,
    shared experts split like a dense MLP, routed experts split over ``expert_tensor_parallel_size``
    (default TP; 1 also works) and, with ``ep`` > 1 (args must say ``expert_model_parallel_size``),
    ``E/ep`` local experts per EP rank file (MAPPING.md §6.2). No optimizer or RNG state, as
    Megatron's converters write it (load with ``--no-load-optim --no-load-rng`` or ``--finetune``).
    Each tensor is produced once, in list order; ``progress(nbytes)`` follows each.

    ``files``: write only these rank files (names relative to ``iter_dir``, as ``legacy_file_bytes``
    lists them); tensors none of them holds are not produced. Each file's bytes do not depend on
    which others are written, so processes can share the work file by file (``ops.parallel``).
    """
    iter_dir = Path(iter_dir)
    model, ranks, targets, header = _prepare(iter_dir, tensors, args=args, iteration=iteration, tp=tp, pp=pp,
                                             ep=ep, spec=spec)
    if files is not None:
        ranks = [rank for rank in ranks if str(rank.path.relative_to(iter_dir)) in files]
        kept = {id(rank) for rank in ranks}
        targets = [[place for place in places if id(place.rank) in kept] for places in targets]
    iter_dir.mkdir(parents=True, exist_ok=True)
    for rank in ranks:
        _save_skeleton(rank, header)
    try:
        for rank in ranks:
            rank.fd = os.open(rank.path, os.O_RDWR)
        for entry, places in zip(model.entries, targets):
            if not places:
                continue
            _fill(entry, places)
            if progress:
                progress(entry.nbytes)
    finally:
        for rank in ranks:
            if rank.fd >= 0:
                os.close(rank.fd)
                rank.fd = -1
    for rank in ranks:
        slots = [slot for slot in rank.model.values() if isinstance(slot, _Slot)]
        for slot in slots:
            if slot.written != slot.nbytes:  # unreachable: every slot has exactly one source tensor
                raise RuntimeError(f"{rank.path}: {slot.record} got {slot.written} of {slot.nbytes} bytes")
        _patch_crcs(rank.path, [(slot.record, slot.offset + slot.nbytes, slot.crc) for slot in slots if slot.nbytes])
        _restamp_serialization_id(rank.path)


def legacy_file_bytes(tensors: list[OutTensor], *, args: dict, tp: int, pp: int, ep: int = 1,
                      spec: str = "local") -> dict[str, int]:
    """Tensor bytes of every rank file ``write_torch_legacy`` would write (relative name -> bytes),
    from metadata alone: what a split of the work between processes balances."""
    _, ranks, _, _ = _prepare(Path("."), tensors, args=args, iteration=0, tp=tp, pp=pp, ep=ep, spec=spec)
    return {str(rank.path): sum(slot.dtype.nbytes(_numel(slot.shape)) for slot in rank.model.values()
                                if isinstance(slot, _Slot)) for rank in ranks}


def _prepare(iter_dir: Path, tensors: list[OutTensor], *, args: dict, iteration: int, tp: int, pp: int, ep: int,
             spec: str) -> tuple[ModelTensors, list[_RankFile], list[list[_Place]], dict[str, Any]]:
    """Check the options and lay out every rank file: (model, rank files, places per entry, header)."""
    check_spec(spec)
    if tp < 1 or pp < 1 or ep < 1:
        raise CkptError(f"tensor, pipeline and expert parallel sizes must be >= 1, got tp={tp}, pp={pp}, ep={ep}")
    for key, size in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp),
                      ("expert_model_parallel_size", ep)):
        if args.get(key) is not None and int(args[key]) != size:
            raise CkptError(f"args say {key}={args[key]} but the checkpoint is written with {size}")
    if ep > 1 and args.get("expert_model_parallel_size") is None:  # readers need it to parse mp_rank_TT_EEE
        raise CkptError(f"expert parallel size {ep}: args must say expert_model_parallel_size={ep}")
    etp = int(args.get("expert_tensor_parallel_size") or tp)
    if etp not in (1, tp):
        raise CkptError(f"expert_tensor_parallel_size={etp}: only 1 or the TP size ({tp}) is supported")
    model = analyse(tensors, args)
    if ep > 1 and (not model.num_experts or model.num_experts % ep):
        raise CkptError(f"expert parallel size {ep} needs a MoE model whose expert count divides by it "
                        f"(got {model.num_experts} experts)")
    import torch

    if any(isinstance(v, torch.Tensor) for v in args.values()):  # would shift torch.save's storage numbering
        raise CkptError("args must not hold tensors")
    iter_dir = Path(iter_dir)
    layout = _layout_heterogeneous if model.hetero else _layout
    ranks, targets = layout(model, tp, pp, ep, etp, args, spec, iter_dir)
    header = {"args": argparse.Namespace(**args), "checkpoint_version": CHECKPOINT_VERSION, "iteration": iteration}
    return model, ranks, targets, header
