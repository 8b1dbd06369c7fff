"""The supported architectures, described from the mapping data itself (``ckptscope archs``; the TUI
can show the same records).

Nothing here is a hand-written list: every row comes from a ``Rule`` in ``mappings.schemas.SCHEMAS``,
its transform from ``mappings.transforms.TRANSFORMS``, and the parallel splits from the same tables
the Megatron readers and writers use (``formats.megatron.legacy_layout.tp_split``, ``is_expert``,
``model_layout.split_layer``). A rule added to a schema therefore shows up here, with the split the
writers will actually apply, and a documentation table that drifts from the code cannot exist.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.formats.megatron.legacy_layout import Split, is_expert, tp_split
from ckptscope.formats.megatron.model_layout import split_layer
from ckptscope.mappings.config import ARCH_BY_MODEL_TYPE, HF_CLASS_BY_ARCH, arch_facts
from ckptscope.mappings.fused_experts import FUSED_DOWN, FUSED_GATE_UP, V5_RENAMES, expert_templates
from ckptscope.mappings.resolve import rules_for
from ckptscope.mappings.schemas import L_HF, SCHEMAS, Rule
from ckptscope.mappings.transforms import TRANSFORMS

STACK = "[{e}]"
"""A Megatron alias ending so is the stacked torch_dist expert tensor (index ``e`` on its leading axis)."""

TP_TEXT = {
    Split.COLUMN: "column (dim 0)",
    Split.ROW: "row (dim 1)",
    Split.GLU: "column, [gate_t; up_t] per rank",
    Split.REPLICATED: "replicated",
}


@dataclass(frozen=True)
class ArchTensor:
    """One rule: HF tensor(s) <-> one Megatron-Core tensor, and how the parallel dims split it."""

    hf: list[str]
    mcore: str
    """The name torch_dist (and the TransformerEngine spec) uses."""
    aliases: list[str]
    """Other Megatron spellings read too (local spec, grouped or stacked experts)."""
    local: str | None
    """The local spec's name in per-rank ``torch`` files, when it differs."""
    transform: str
    tp: str
    ep: bool
    """Split over expert-parallel ranks (global expert = ep_rank * E/EP + local)."""
    pp: str
    """Which pipeline stage holds it: ``layer {i}'s stage``, ``first stage`` or ``last stage``."""
    layers: str | None = None
    """Which decoder layers the rule applies to, when not all (``layers with mlp.gate.weight``:
    MoE and dense layers name their norm and MLP differently); None: every layer."""


@dataclass(frozen=True)
class ArchInfo:
    name: str
    hf_class: str
    model_types: list[str]
    tensors: list[ArchTensor]
    facts: list[str] = field(default_factory=list)
    """Model-level facts a conversion must carry (zero-centred norms, embedding scale, ...)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _example(template: str) -> str:
    """A concrete name for a template (layer 0, expert 0), as the split tables read names."""
    return template.removesuffix(STACK).format(i=0, e=0)


def _tp(rule: Rule) -> Split:
    # fc1 is gated exactly when its rule fuses two HF tensors as [gate; up]: the data says so
    return tp_split(_example(rule.mcore[0]), swiglu=rule.transform == "gate_up")


def _pp(mcore: str) -> str:
    if split_layer(_example(mcore)) is not None:
        return "layer {i}'s stage"
    return "first stage" if mcore.startswith("embedding.") else "last stage"


def _tensor(rule: Rule) -> ArchTensor:
    if rule.transform not in TRANSFORMS:
        raise CkptError(f"rule {rule.mcore[0]} names an unknown transform {rule.transform!r}")
    example = _example(rule.mcore[0])
    ep = any(is_expert(_example(alias)) for alias in rule.mcore) or is_expert(example)
    return ArchTensor(
        hf=list(rule.hf),
        mcore=rule.mcore[0],
        aliases=list(rule.mcore[1:]),
        local=rule.local if rule.local and rule.local != rule.mcore[0] else None,
        transform=rule.transform,
        tp=("expert-TP " if ep else "") + TP_TEXT[_tp(rule)],  # experts split over their own TP group
        ep=ep,
        pp=_pp(rule.mcore[0]),
        layers=(f"layers with {_in_layer(rule.when)}" if rule.when
                else f"layers without {_in_layer(rule.unless)}" if rule.unless else None),
    )


def _in_layer(template: str) -> str:
    """A layer's tensor by its name inside the layer (``mlp.gate.weight``): short enough for a table cell."""
    return template.removeprefix(L_HF)


def _fused_facts(name: str) -> list[str]:
    """The transformers v5 fused expert layout, for archs whose schema has routed experts."""
    try:
        gate, up, down = expert_templates(name)
    except CkptError:
        return []
    renames = "".join(f"; {old.strip('.')} -> {new.strip('.')}" for old, new in V5_RENAMES.get(name, ()))
    return [f"transformers v5 fused experts read too (--hf-experts fused writes them): {FUSED_GATE_UP} [E, 2I, H] = "
            f"[{gate.rsplit('.', 2)[-2]}; {up.rsplit('.', 2)[-2]}] per expert, {FUSED_DOWN} [E, H, I]{renames}"]


def arch_info(name: str) -> ArchInfo:
    """One architecture, from its rules. Unknown names are one clear error listing the known ones."""
    rules = rules_for(name)
    model_types = sorted(t for t, arch in ARCH_BY_MODEL_TYPE.items() if arch == name)
    return ArchInfo(name, HF_CLASS_BY_ARCH.get(name, "?"), model_types, [_tensor(r) for r in rules],
                    list(arch_facts(name)) + _fused_facts(name))


def arch_names() -> list[str]:
    """The architecture names ``--arch`` takes, in table order (cheap: no per-rule work)."""
    return list(SCHEMAS)


def list_archs() -> list[ArchInfo]:
    """Every architecture in the mapping tables, in table order."""
    return [arch_info(name) for name in SCHEMAS]
