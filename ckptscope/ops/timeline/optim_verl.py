"""Names for the Adam state of a verl FSDP checkpoint, whose ``optim_world_size_W_rank_R.pt`` has none.

verl's ``FSDPCheckpointManager.save_checkpoint`` writes, per rank, ``torch.save(model.state_dict())``
and ``torch.save(optimizer.state_dict())``: the optimizer state is numbered by parameter position
(``state.<k>.exp_avg_sq``, DTensor shards), with no names. verl builds its optimizer from
``actor_module_fsdp.parameters()`` (``build_optimizer`` in ``verl/workers/fsdp_workers.py``): one
param group of every parameter, frozen ones included, in ``named_parameters()`` order, which is the
order of the tensors in the model rank files' ``state_dict()`` when the model has no persistent
buffers. So position k is the model file's k-th tensor, accepted only when the save has one param
group whose positions are 0 .. N-1 for a model of N tensors and every saved ``exp_avg_sq`` has the
global shape of the tensor at its position; anything else (several groups, a buffer in the state
dict, another model's optimizer) leaves the iteration without Adam statistics, with the reason:
statistics under the wrong name are worse than none.

The optimizer files are read through the safe stub unpickler (``VerlOptimReader``), never ``torch.load``.
"""

from __future__ import annotations

import re
from pathlib import Path

from ckptscope.core.errors import CkptError
from ckptscope.formats.verl.reader import VerlOptimReader, fsdp_layout
from ckptscope.ops.timeline.optim_hf import NamedState, param_groups

OPTIMIZER_FILES = "optim_world_size_*_rank_*.pt"
_STATE_KEY = re.compile(r"^state\.(\d+)\.exp_avg_sq$")
GROUPING = "verl: one param group of every parameter in model order"


def has_verl_optimizer(directory: str | Path) -> bool:
    layout = fsdp_layout(Path(directory))
    return bool(layout is not None and layout.files.get("optim"))


def verl_fsdp_state(directory: str | Path, order: list[tuple[str, tuple[int, ...]]]) -> tuple[NamedState | None, str]:
    """The named Adam state of one verl FSDP actor dir, or None and the reason. ``order``: the model
    rank files' tensors in their ``state_dict()`` order, as (model name, global shape)."""
    try:
        reader = VerlOptimReader(Path(directory))
        index = reader.index()
    except CkptError as exc:
        return None, f"{OPTIMIZER_FILES} unreadable: {exc.args[0]}"
    keep = False
    try:
        groups = param_groups(reader)
        if groups is None:
            return None, f"{OPTIMIZER_FILES} has no param_groups with parameter positions"
        if len(groups) != 1:
            return None, f"{len(groups)} param groups, where verl builds one of every parameter"
        positions = groups[0]["params"]
        layout = fsdp_layout(Path(directory))
        if layout is not None and layout.fsdp_version == 1 and len(positions) < len(order):
            # FSDP1 with use_orig_params=False (verl's default): the optimizer steps the flat parameters
            return None, (f"its param group has {len(positions)} positions for the model's {len(order)} tensors: FSDP1 "
                          f"flat parameters (use_orig_params=False), one per wrapped module, whose state is not "
                          f"per tensor")
        if positions != list(range(len(order))):
            return None, (f"its param group has {len(positions)} positions and the model {len(order)} tensors "
                          "(a buffer in the state dict, or another model's optimizer?)")
        moments = {int(m.group(1)): tuple(meta.shape) for name, meta in index.tensors.items()
                   if (m := _STATE_KEY.match(name))}
        if not moments:
            return None, f"{OPTIMIZER_FILES} holds no exp_avg_sq"
        for k, shape in sorted(moments.items()):
            name, expected = order[k]
            if shape != expected:
                return None, f"state {k}'s exp_avg_sq is {list(shape)}, the model's tensor {k} ({name}) {list(expected)}"
        eps = groups[0].get("eps")
        stored = {order[k][0]: f"state.{k}.exp_avg_sq" for k in moments}
        keep = True
        return NamedState(reader, stored, float(eps) if isinstance(eps, (int, float)) else None, GROUPING), ""
    finally:
        if not keep:
            reader.close()
