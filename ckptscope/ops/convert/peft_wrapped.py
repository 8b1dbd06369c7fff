"""A model wrapped by PEFT for LoRA training, taken apart into its base model and its adapter.

verl's LoRA actor (``model.lora_rank > 0``) saves ``model.state_dict()`` of the PEFT-wrapped model:
``base_model.model.<name>`` for every weight, ``<module>.base_layer.weight`` for each adapted linear
and ``<module>.lora_A.default.weight`` / ``lora_B.default.weight`` beside it; ``lora_train_meta.json``
records ``r``, ``lora_alpha`` and ``task_type`` (verl 0.9). verl's own model merger exports such a
save as the base model under transformers' names plus ``lora_adapter/`` (PEFT's saved layout:
adapter name dropped, ``base_model.model.`` kept), and never merges. ``convert --to hf`` writes the
same two parts, so the output loads with ``from_pretrained`` and ``PeftModel.from_pretrained``, and
``ckptscope lora merge`` merges it.

Why not merge silently: the merged weights are a different model from the one verl's tools give,
and what the adapter was trained with (``lora_alpha``) is only in a side file; an adapter written
with a guessed alpha would load and be wrong. So a missing or zero alpha refuses, and PEFT features
whose saved form this does not reproduce (DoRA, embedding LoRA, ``modules_to_save`` copies, a second
adapter) refuse by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex
from ckptscope.core.roles import PEFT_PREFIX, peft_base_name, saved_adapter_name
from ckptscope.ops.model import ModelEntries, peft_unwrapped

ADAPTER_DIR = "lora_adapter"
"""Where verl's model merger puts the adapter inside its output dir; the same here."""
_LORA_PARTS = (".lora_A.default.weight", ".lora_B.default.weight")
"""The plain LoRA of PEFT's adapter ``default`` (verl trains that one adapter)."""
_META_FILE = "lora_train_meta.json"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class AdapterExport:
    """The adapter of a PEFT-wrapped save, as PEFT's ``save_pretrained`` lays it out."""

    config: dict[str, Any]
    """``adapter_config.json``."""
    tensors: list[tuple[str, str]]
    """(name in ``adapter_model.safetensors``, stored name to read), in stored order."""
    dir: str = ADAPTER_DIR
    dtype: str | None = None
    """The dtype to write the adapter in (``--dtype``); None: as stored."""

    def describe(self) -> str:
        return (f"{len(self.tensors)} tensors, r={self.config['r']}, lora_alpha={self.config['lora_alpha']}, "
                f"target modules {', '.join(self.config['target_modules'])}")


def unwrap_peft(entries: ModelEntries, index: CheckpointIndex, src: Path) -> tuple[ModelEntries, AdapterExport] | None:
    """``entries`` of a PEFT-wrapped LoRA save as (the base model under its own names, the adapter), or
    None when the model is not PEFT-wrapped. Raises ``CkptError`` for what cannot be exported faithfully."""
    unwrapped = peft_unwrapped(entries)
    if unwrapped is None:
        return None
    base, lora = unwrapped
    for name in base.tensors:
        if ".modules_to_save." in name or ".original_module." in name:
            raise CkptError(f"{name}: PEFT's modules_to_save copies are not exported from a PEFT-wrapped save (which "
                            f"copy is the model's depends on the adapter's state)", src)
        if name.startswith(PEFT_PREFIX):
            raise CkptError(f"{name} and the base model's {peft_base_name(name)} "
                            f"would be one tensor once PEFT's names are taken off", src)
    adapter: list[tuple[str, str]] = []
    for name, stored in lora.items():
        if not name.endswith(_LORA_PARTS):
            raise CkptError(f"{name}: only PEFT's plain LoRA (lora_A / lora_B of the adapter 'default') is "
                            f"exported from a PEFT-wrapped save; DoRA, embedding LoRA and other adapters are not",
                            src)
        adapter.append((saved_adapter_name(name)[0], stored))  # type: ignore[index]  # a _LORA_PARTS name
    ranks = _check_pairs(entries, base, lora, src)
    return base, AdapterExport(_adapter_config(adapter, ranks, index, src), adapter)


def _check_pairs(entries: ModelEntries, base: ModelEntries, lora: dict[str, str], src: Path) -> set[int]:
    """Every adapted module has its lora_A ``[r, in]`` and lora_B ``[out, r]`` and a base weight ``[out, in]``;
    returns the ranks. A module missing its lora_B was written as a 7-tensor adapter that PEFT loads with a
    warning and a zero update there (a probe: logits off by 0.02, exit 0)."""
    modules: dict[str, dict[str, tuple[int, ...]]] = {}
    for name in lora:
        module, _, part = name.rpartition(".lora_")
        modules.setdefault(module, {})[part.partition(".")[0]] = tuple(entries.tensors[name].shape)
    ranks = set()
    for module, parts in sorted(modules.items()):
        plain = peft_base_name(module) + ".weight"
        if set(parts) != {"A", "B"}:
            missing = "lora_B" if "A" in parts else "lora_A"
            raise CkptError(f"{module}: the LoRA pair is incomplete ({missing} missing); the adapter would load "
                            f"with that module's update dropped", src)
        a, b, weight = parts["A"], parts["B"], tuple(base.tensors[plain].shape) if plain in base.tensors else None
        # (a GPT-2 Conv1D stores its weight [in, out]; PEFT's lora_A / lora_B are [r, in] / [out, r] either way)
        if len(a) != 2 or len(b) != 2 or a[0] != b[1] or (weight is not None and weight not in ((b[0], a[1]),
                                                                                            (a[1], b[0]))):
            raise CkptError(f"{module}: lora_A {list(a)} and lora_B {list(b)} do not make a LoRA update of its base "
                            f"weight {list(weight) if weight else '(none)'}", src)
        ranks.add(a[0])
    return ranks


def _adapter_config(adapter: list[tuple[str, str]], ranks: set[int], index: CheckpointIndex,
                    src: Path) -> dict[str, Any]:
    """PEFT's ``adapter_config.json`` for the adapter: the rank of its lora_A tensors (one for all), alpha and
    task type from ``lora_train_meta.json``."""
    if len(ranks) != 1:
        raise CkptError(f"the LoRA ranks differ between modules ({', '.join(map(str, sorted(ranks)))}): a per-module "
                        f"rank is not exported from a PEFT-wrapped save", src)
    rank = ranks.pop()
    meta = next((o.value for o in index.objects if o.name == "lora_train_meta"), None)
    alpha = meta.get("lora_alpha") if isinstance(meta, dict) else None
    if not _is_number(alpha) or alpha <= 0:
        if meta is None and any(f.path == _META_FILE for f in index.files):
            found = f"has a {_META_FILE} that does not parse as JSON"
        elif meta is None:
            found = f"has no {_META_FILE}"
        elif not isinstance(meta, dict):
            found = f"has a {_META_FILE} that is no JSON object"
        else:
            found = f"has lora_alpha {alpha!r} in {_META_FILE}"
        raise CkptError(f"a model wrapped by PEFT for LoRA training ({adapter[0][1]}, ...) {found}: the adapter's "
                        f"lora_alpha is unknown, and an adapter written with a guessed one would load and compute "
                        f"another model (verl's merger writes 0, which merges to nothing); " + (
                            "put lora_train_meta.json with the run's \"r\" and \"lora_alpha\" beside the rank files "
                            "(as verl 0.9 writes it)" if index.format.startswith("verl") else
                            "save the adapter with PEFT's save_pretrained, which records it"), src)
    meta_rank = meta.get("r")
    if meta_rank is not None and not _is_number(meta_rank):
        raise CkptError(f"{_META_FILE} has r {meta_rank!r}, which is no number (the saved lora_A tensors have rank "
                        f"{rank})", src)
    if meta_rank is not None and meta_rank != rank:
        raise CkptError(f"{_META_FILE} says r={meta_rank} but the saved lora_A tensors have rank {rank}", src)
    targets = sorted({saved.split(".")[-3] for saved, _ in adapter})  # q_proj of ...q_proj.lora_A.weight
    return {
        "peft_type": "LORA",
        "task_type": meta.get("task_type") or None,
        "base_model_name_or_path": None,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
    }

