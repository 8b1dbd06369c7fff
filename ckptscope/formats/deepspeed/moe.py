"""DeepSpeed MoE saves (``deepspeed.moe.layer.MoE``): where the experts are, and which ones must be there.

``DeepSpeedEngine._save_moe_checkpoint`` takes every expert parameter out of the module state dict before
it writes ``mp_rank_{tp:02d}_model_states.pt`` (the gate, ``...deepspeed_moe.gate.wg.weight``, stays in
it) and writes each expert on its own, once per save (by the first expert-data-parallel rank of its
expert-parallel group)::

    layer_{L}_expert_{E}_mp_rank_{tp:02d}_model_states.pt   # {"<module>.deepspeed_moe.experts.deepspeed_experts.{E}.<param>": tensor}
    expp_rank_{R}_mp_rank_{tp:02d}_optim_states.pt          # {"optimizer": rank R's optimizer.state_dict(), or None under ZeRO}

``L`` counts the model's MoE layers in module order; ``E`` is the *global* expert id: the writer renames
its local expert ``e`` to ``R * num_local_experts + e`` in the file name and in every key, so the files of
all expert-parallel ranks together hold each expert once, under its own name. (Files written before
DeepSpeed numbered layers are ``expert_{E}_mp_rank_{tp:02d}_model_states.pt``.) The model-states file
records ``num_experts``, one count per MoE layer, which says which files must be there.

Under ZeRO-1/2 the fp32 masters of the experts are partitions of their own expert groups in the
``zero_pp_rank_*`` optim files (named by local ids of each rank); that layout is not assembled here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

EXPERT_FILE = re.compile(r"^(?:layer_(?P<layer>\d+)_)?expert_(?P<expert>\d+)_mp_rank_(?P<mp>\d+)_model_states\.pt$")
EXPERT_OPTIM = re.compile(r"^expp_rank_(?P<expp>\d+)_mp_rank_(?P<mp>\d+)_optim_states\.pt$")
EXPERT_KEY = re.compile(r"\.deepspeed_experts\.(\d+)\.")
"""The expert id inside a key of an expert file (the global one, as the file name's)."""

NO_LAYER = -1
"""The layer of an ``expert_{E}_...`` file (DeepSpeed before it numbered MoE layers)."""


@dataclass(frozen=True, slots=True)
class ExpertFile:
    layer: int
    expert: int
    mp: int


def expert_file(name: str) -> ExpertFile | None:
    m = EXPERT_FILE.match(name)
    if m is None:
        return None
    layer = m["layer"]
    return ExpertFile(int(layer) if layer is not None else NO_LAYER, int(m["expert"]), int(m["mp"]))


def expert_optim_rank(name: str) -> tuple[int, int] | None:
    """``(expert-parallel rank, model-parallel rank)`` of an ``expp_rank_*`` optim file, or None."""
    m = EXPERT_OPTIM.match(name)
    return (int(m["expp"]), int(m["mp"])) if m else None


def missing_experts(found: set[tuple[int, int]], num_experts: object) -> list[tuple[int, int]]:
    """``(layer, expert)`` pairs the model-states ``num_experts`` (one count per MoE layer) says were saved
    and no file holds. Legacy files without a layer stand for the first MoE layer. [] when the counts are
    not a list of ints (nothing to check against)."""
    if not isinstance(num_experts, list) or not all(type(n) is int and n >= 0 for n in num_experts):
        return []
    legacy = {(0, e) for layer, e in found if layer == NO_LAYER}
    have = found | legacy
    return [(layer, e) for layer, count in enumerate(num_experts) for e in range(count) if (layer, e) not in have]


def file_name(layer: int, expert: int, mp: int) -> str:
    """The name DeepSpeed gives the file of ``expert`` of MoE layer ``layer`` (model-parallel rank ``mp``)."""
    return f"layer_{layer}_expert_{expert}_mp_rank_{mp:02d}_model_states.pt"
