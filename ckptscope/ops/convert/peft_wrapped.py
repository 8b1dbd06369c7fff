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
from ckptscope.ops.model import PEFT_PREFIX, ModelEntries, peft_unwrapped

ADAPTER_DIR = "lora_adapter"
"""Where verl's model merger puts the adapter inside its output dir; the same here."""
_ADAPTER_NAME = ".default."
"""PEFT's adapter name in a live model's state dict (verl trains one adapter, ``default``)."""
_LORA_PARTS = (".lora_A.default.weight", ".lora_B.default.weight")


@dataclass
class AdapterExport:
    """The adapter of a PEFT-wrapped save, as PEFT's ``save_pretrained`` lays it out."""

    config: dict[str, Any]
    """``adapter_config.json``."""
    tensors: list[tuple[str, str]]
    """(name in ``adapter_model.safetensors``, stored name to read), in stored order."""
    dir: str = ADAPTER_DIR

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
            raise CkptError(f"{name} and the base model's {name[len(PEFT_PREFIX):].replace('.base_layer.', '.')} "
                            f"would be one tensor once PEFT's names are taken off", src)
    adapter: list[tuple[str, str]] = []
    ranks: set[int] = set()
    for name, stored in lora.items():
        if not name.endswith(_LORA_PARTS):
            raise CkptError(f"{name}: only PEFT's plain LoRA (lora_A / lora_B of the adapter 'default') is "
                            f"exported from a PEFT-wrapped save; DoRA, embedding LoRA and other adapters are not",
                            src)
        adapter.append((name.replace(_ADAPTER_NAME, ".", 1), stored))
        if ".lora_A." in name:
            ranks.add(entries.tensors[name].shape[0])
    return base, AdapterExport(_adapter_config(adapter, ranks, index, src), adapter)


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
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
        found = "has no lora_train_meta.json" if meta is None else f"has lora_alpha {alpha!r} in lora_train_meta.json"
        raise CkptError(f"a model wrapped by PEFT for LoRA training ({adapter[0][1]}, ...) {found}: the adapter's "
                        f"lora_alpha is unknown, and an adapter written with a guessed one would load and compute "
                        f"another model (verl's merger writes 0, which merges to nothing); " + (
                            "put lora_train_meta.json with the run's \"r\" and \"lora_alpha\" beside the rank files "
                            "(as verl 0.9 writes it)" if index.format.startswith("verl") else
                            "save the adapter with PEFT's save_pretrained, which records it"), src)
    meta_rank = meta.get("r")
    if meta_rank is not None and meta_rank != rank:
        raise CkptError(f"lora_train_meta.json says r={meta_rank} but the saved lora_A tensors have rank {rank}", src)
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

