"""Key layout of Megatron-LM's two plain-DCP checkpoint formats, ``torch_dcp`` and ``fsdp_dtensor``.

Both are a ``torch.distributed.checkpoint.save`` of ``generate_state_dict``'s dict into
``iter_XXXXXXX/`` (``megatron/training/checkpointing.py``), with no ``metadata.json`` and no
``common.pt``: ``args``, ``iteration`` and ``checkpoint_version`` are DCP bytes entries of the
same save (FORMATS.md §4.10). They differ in the model's and the optimizer's keys:

* torch_dcp (``--use-torch-fsdp2``): ``model.<mcore name>`` per layer, optimizer as torch's
  ``state_dict()`` (``optimizer.state.<param index>.exp_avg``, ``optimizer.param_groups``);
* fsdp_dtensor (Megatron-FSDP): ``model.module.<mcore name>`` (the ``MegatronFSDP`` wrapper's
  child), SwiGLU fc1 split by ``handle_swiglu_in_state_dict``
  (``megatron/core/transformer/fsdp_dtensor_checkpoint.py``) into ``…linear_fc1.weight_w`` (gate
  rows) and ``…weight_v`` (up rows), optimizer ``optimizer.state.module.module.module.<mcore
  name>.<state>`` and ``optimizer.param_to_group_meta.…``.

Megatron itself tells them apart only by the run's ``--ckpt-format``; a checkpoint converted by
``tools/checkpoint/checkpoint_inspector.py`` even carries the torch_dist run's args. So the keys
decide here: a ``model.module.`` prefix or a split fc1 means fsdp_dtensor.

The split fc1 is shown fused again: ``…linear_fc1.weight`` ``[2F, H]`` whose chunks are those of
``_w`` (rows ``0..F``) then those of ``_v`` (rows ``F..2F``), i.e. exactly mcore's ``[gate; up]``
(the global DTensors hold every TP rank's gate rows in ``_w`` and up rows in ``_v``, in TP order).
Reading it reads the two stored tensors' bytes; nothing is copied or rewritten, and the mappings to
HF see the one fused tensor every other Megatron format has.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from ckptscope.core.tensor import TensorMeta

TORCH_DCP = "torch_dcp"
FSDP_DTENSOR = "fsdp_dtensor"
FSDP_MODEL_PREFIX = "model.module."
_SPLIT_FC1 = re.compile(r"(.*\.linear_fc1\.(?:weight|bias)\d*)_([wv])\Z")
"""``handle_swiglu_in_state_dict``'s split keys: dense, shared-expert, SequentialMLP
(``local_experts.{e}.linear_fc1.weight``) and grouped (``experts.linear_fc1.weight{e}``) fc1."""
FSDP_KEY_BYTES = re.compile(rb"model\.module\.|\.linear_fc1\.(?:weight|bias)\d*_[wv](?![A-Za-z0-9_])")
"""The same evidence as ``ckpt_format_of``, found in the raw bytes of ``.metadata`` (keys are pickled
verbatim), for callers that must not unpickle it."""


def split_fc1_pairs(names: Mapping[str, TensorMeta] | list[str]) -> dict[str, tuple[str, str]]:
    """Fused fc1 name -> (its ``_w`` name, its ``_v`` name), for every pair stored complete."""
    halves: dict[str, dict[str, str]] = {}
    for name in (n for n in names if n.endswith(("_w", "_v"))):  # C-level filter: every torch_dist index asks
        match = _SPLIT_FC1.match(name)
        if match:
            halves.setdefault(match.group(1), {})[match.group(2)] = name
    return {fused: (pair["w"], pair["v"]) for fused, pair in halves.items() if len(pair) == 2}


def ckpt_format_of(names: list[str]) -> str:
    """``fsdp_dtensor`` when the keys carry Megatron-FSDP's wrapper prefix or a split fc1, else ``torch_dcp``."""
    if any(name.startswith(FSDP_MODEL_PREFIX) for name in names) or split_fc1_pairs(names):
        return FSDP_DTENSOR
    return TORCH_DCP


def fuse_pair(name: str, gate: TensorMeta, up: TensorMeta) -> TensorMeta | None:
    """One tensor ``[gate; up]`` over the chunks of both halves, or None when they cannot stack
    (dtype or trailing shape differ: then both stay as stored)."""
    if gate.dtype != up.dtype or not gate.shape or gate.shape[1:] != up.shape[1:]:
        return None
    rows = gate.shape[0]
    chunks = gate.chunks + tuple(replace(c, offsets=(c.offsets[0] + rows,) + c.offsets[1:]) for c in up.chunks)
    stored_as = f"{gate.name} (rows 0-{rows - 1}) + {up.name} (rows {rows}-{rows + up.shape[0] - 1})"
    attrs = tuple((k, v) for k, v in gate.attrs if k != "dcp_key") + (("stored_as", stored_as),)
    return TensorMeta(name=name, dtype=gate.dtype, shape=(rows + up.shape[0],) + gate.shape[1:], chunks=chunks,
                      attrs=attrs)


def fuse_split_fc1(tensors: dict[str, TensorMeta]) -> tuple[dict[str, TensorMeta], list[str]]:
    """``tensors`` with every model ``_w``/``_v`` fc1 pair replaced by the fused tensor, in the
    place of its ``_w`` half; warnings for pairs left as stored. Optimizer moments keep their keys."""
    pairs = {fused: pair for fused, pair in split_fc1_pairs(list(tensors)).items()
             if tensors[pair[0]].attr("group") != "optimizer"}
    fused_at: dict[str, TensorMeta] = {}
    dropped: set[str] = set()
    warnings: list[str] = []
    for fused, (w_name, v_name) in pairs.items():
        meta = fuse_pair(fused, tensors[w_name], tensors[v_name]) if fused not in tensors else None
        if meta is None:
            warnings.append(f"{w_name} / {v_name}: the SwiGLU halves do not stack into {fused}; shown as stored")
            continue
        fused_at[w_name] = meta
        dropped.add(v_name)
    out: dict[str, TensorMeta] = {}
    for name, meta in tensors.items():
        if name in fused_at:
            out[fused_at[name].name] = fused_at[name]
        elif name not in dropped:
            out[name] = meta
    return out, warnings
