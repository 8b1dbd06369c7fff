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

Under ZeRO-1/2 the experts' fp32 masters are partitions of param groups of their own (the optimizer's
expert groups, ``split_params_into_different_moe_groups_for_optimizer``): such a group is partitioned
over an *expert-data-parallel* group of ranks (``partition_count``), not over the world, and each
expert-parallel rank's partitions hold its own local experts, which the model states' ``param_shapes``
name by rank 0's local ids (``expert_groups``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

EXPERT_FILE = re.compile(r"^(?:layer_(?P<layer>\d+)_)?expert_(?P<expert>\d+)_mp_rank_(?P<mp>\d+)_model_states\.pt$")
EXPERT_OPTIM = re.compile(r"^expp_rank_(?P<expp>\d+)_mp_rank_(?P<mp>\d+)_optim_states\.pt$")
EXPERT_KEY = re.compile(r"\.deepspeed_experts\.(\d+)\.")
"""The expert id inside a key of an expert file (the global one, as the file name's)."""
_EXPERT_PARAM = re.compile(r"^(?P<module>.*\.deepspeed_experts\.)(?P<expert>\d+)(?P<param>\..*)$")

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


def is_moe_save(model_states: object) -> bool:
    """Written by DeepSpeed's MoE save path: its model states record ``num_experts`` (one count per MoE layer);
    other saves have no such key."""
    return isinstance(model_states, dict) and isinstance(model_states.get("num_experts"), list)


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


def expert_groups(names: list[str], world: int, count: object, *, data_before_expert: bool = False,
                  ) -> list[tuple[list[int], Callable[[str], str]]] | None:
    """How a ZeRO-1/2 param group of expert params (every name ``...deepspeed_experts.{e}...``) is laid out:
    per expert-parallel rank ``k``, the ranks whose partitions of the group, in that order, make its flat
    group, and the renaming of rank 0's local expert ids (``param_shapes`` is rank 0's) to ``k``'s global
    ones (``k * num_local + e``, as the expert files are named). None for a group that is not one of experts.

    ``count`` is the group's ``partition_count`` (the expert-data-parallel size), so there are
    ``world // count`` expert-parallel ranks. DeepSpeed's default topology (E + D,
    ``groups._create_expert_and_data_parallel``) makes expert-parallel groups of consecutive ranks: rank
    ``r`` is expert-parallel rank ``r % ep`` and holds partition ``r // ep``; with the DeepSpeed config's
    ``use_data_before_expert_parallelism`` (D + E) it is the other way round. ``ValueError`` when the
    counts do not fit together."""
    if not names or not all(EXPERT_KEY.search(n) for n in names):
        return None
    if type(count) is not int or count < 1 or world % count:
        raise ValueError(f"partition_count {count!r} of an expert param group does not divide the {world} ranks")
    ep = world // count
    local: dict[str, set[int]] = {}
    for name in names:
        m = _EXPERT_PARAM.match(name)
        if m is None:
            raise ValueError(f"{name}: not an expert param name")
        local.setdefault(m["module"], set()).add(int(m["expert"]))
    for module, ids in local.items():
        if ids != set(range(len(ids))):
            raise ValueError(f"{module}: the local expert ids {sorted(ids)} are not 0..{len(ids) - 1}")

    def renamer(k: int) -> Callable[[str], str]:
        def rename(name: str) -> str:
            m = _EXPERT_PARAM.match(name)
            assert m is not None  # every name matched above
            return f"{m['module']}{k * len(local[m['module']]) + int(m['expert'])}{m['param']}"
        return rename

    if data_before_expert:
        return [(list(range(k * count, (k + 1) * count)), renamer(k)) for k in range(ep)]
    return [([k + ep * j for j in range(count)], renamer(k)) for k in range(ep)]


def group_orders(shapes: list[list[str]], ranks: dict[int, tuple[list[list[str]] | None, list[object] | None]],
                 ) -> dict[int, dict[int, int]]:
    """Per rank, ``param_shapes`` group ``g`` -> the index of the same group in that rank's optimizer state.

    DeepSpeed's MoE param groups (``split_params_into_different_moe_groups_for_optimizer``, one per expert-
    parallel size) come in an order of each process's own: in a probe with experts at ep_size 2 and 4 on 4
    ranks, ranks 1 and 2 had the two expert groups the other way round from ranks 0 and 3. ``param_shapes``
    follows rank 0's. ``ranks``: per rank, its ``param_slice_mappings`` keys per group (the names of the params
    its partition holds, local expert ids as in ``param_shapes``) and its base optimizer's group names. A
    group is found by the params its partition holds, else by the name the group has where it was found.
    Groups found nowhere are left out (the caller keeps the index)."""
    owners = [set(names) for names in shapes]
    found: dict[int, dict[int, int]] = {}
    group_names: dict[int, object] = {}
    for rank, (slices, names) in ranks.items():
        order = found.setdefault(rank, {})
        for j, keys in enumerate(slices or []):
            held = set(keys)
            hits = [g for g, owner in enumerate(owners) if held and held <= owner]
            if len(hits) == 1 and hits[0] not in order:
                order[hits[0]] = j
                if names and j < len(names) and names[j] is not None:
                    group_names.setdefault(hits[0], names[j])
    for rank, (_, names) in ranks.items():
        order = found[rank]
        for g, name in group_names.items():
            if g not in order and names and names.count(name) == 1 and names.index(name) not in order.values():
                order[g] = names.index(name)
    return found
