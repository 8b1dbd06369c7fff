"""What a PEFT LoRA adapter holds, from its stored names, shapes and ``adapter_config.json`` alone.

``PeftModel.save_pretrained`` stores, for every adapted module ``M`` of the base model, the pair
``base_model.model.M.lora_A.weight`` ``[r, in]`` and ``base_model.model.M.lora_B.weight``
``[out, r]`` (the adapter name is stripped). The update it stands for is
``W_M += scaling * (B @ A)`` (transposed when ``fan_in_fan_out``), with ``scaling = lora_alpha / r``,
or ``lora_alpha / sqrt(r)`` with ``use_rslora``. ``rank_pattern`` / ``alpha_pattern`` override
``r`` / ``lora_alpha`` for the modules whose name ends with a pattern (PEFT's ``get_pattern_key``:
``re.match(rf"(.*\\.)?({key})$", module)``, first matching key wins).

Anything else in the file is listed, and each feature this description does not turn into a plain
``W + scaling * B @ A`` (DoRA magnitudes, embedding or conv LoRA, ``modules_to_save`` copies,
trainable tokens, biases) is named in ``unsupported_merge``, so a merge can refuse it by name.
No torch, no tensor bytes: this runs on every ``inspect``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ckptscope.core.roles import PEFT_PREFIX, peft_base_name
from ckptscope.core.tensor import TensorMeta
_LORA_KEY = re.compile(
    r"^(?P<module>.+?)\.(?P<part>lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_magnitude_vector)"
    r"(?:\.(?P<param>weight|bias))?$"
)


UNMERGED_VARIANTS = (
    ("alora_invocation_tokens", "aLoRA: it acts only after its invocation tokens, so no merged weight is it; "
                                "PEFT's merge refuses it too"),
    ("use_bdlora", "BD-LoRA (block-diagonal factors)"),
    ("arrow_config", "Arrow routing over several adapters"),
    ("velora_config", "VeLoRA"),
    ("kasa_config", "KaSA"),
    ("monteclora_config", "MonteCLoRA"),
)
"""LoRA variants PEFT 0.21 marks only in ``adapter_config.json``: merged as plain LoRA they would be
another model (aLoRA has no tensor of its own to give it away)."""


def pattern_value(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    """``rank_pattern`` / ``alpha_pattern`` lookup exactly as PEFT does it (``get_pattern_key``)."""
    for key in patterns:
        try:
            if re.match(rf"(.*\.)?({key})$", module):
                return patterns[key]
        except re.error:
            continue
    return default


def lora_scaling(alpha: float, r: int, use_rslora: bool) -> float:
    """PEFT's ``LoraLayer.update_layer``: ``alpha / sqrt(r)`` with rsLoRA, else ``alpha / r``."""
    return alpha / math.sqrt(r) if use_rslora else alpha / r


def _distinct(values: list[Any]) -> list[Any]:
    """The distinct values, sorted; values a config got wrong (a list, a string: refused for a merge)
    are kept as written, once each."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sorted(set(values))
    return list({repr(v): v for v in values}.values())


def _range(values: list[Any]) -> str:
    """``8`` or ``8..16``."""
    distinct = _distinct(values)
    if len(distinct) == 1:
        return _num(distinct[0])
    return f"{_num(distinct[0])}..{_num(distinct[-1])}"


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _group(found: list[tuple[str, str | None]]) -> list[str]:
    """One line per feature: ``DoRA (lora_magnitude_vector) on 6 modules (model.layers.0.mlp.down_proj, ...)``."""
    modules: dict[str, list[str]] = {}
    for feature, module in found:
        modules.setdefault(feature, [])
        if module is not None:
            modules[feature].append(module)
    lines = []
    for feature, names in modules.items():
        if not names:
            lines.append(feature)
        elif len(names) == 1:
            lines.append(f"{feature} on {names[0]}")
        else:
            lines.append(f"{feature} on {len(names)} modules ({names[0]}, ...)")
    return lines


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _config_errors(r: Any, alpha: Any, rank_pattern: Any, alpha_pattern: Any) -> list[str]:
    """What in ``adapter_config.json`` no LoRA scale can be computed from (PEFT fails on it too): each one
    line for ``check``, the reason ``lora stats`` and ``lora merge`` refuse (a probe: a string ``r`` or a list
    ``alpha_pattern`` was "internal error: TypeError")."""
    errors = []
    if not _whole(r):
        errors.append(f"r is {r!r}, not a positive integer")
    if not _real(alpha):
        errors.append(f"lora_alpha is {alpha!r}, not a number")
    for key, pattern, ok, what in (("rank_pattern", rank_pattern, _whole, "a positive integer"),
                                   ("alpha_pattern", alpha_pattern, _real, "a number")):
        if not isinstance(pattern, dict):
            errors.append(f"{key} is {pattern!r}, not a mapping of module patterns")
            continue
        errors.extend(f"{key}[{k!r}] is {v!r}, not {what}" for k, v in pattern.items() if not ok(v))
    return errors


def describe_lora(config: Mapping[str, Any], tensors: Mapping[str, TensorMeta]) -> dict[str, Any]:
    """The adapter as JSON-able data: config essentials, one entry per A/B pair, one summary per
    target module kind (``q_proj``), the tensors no pair claims, and what a merge cannot do."""
    r_default = config.get("r", 8)
    alpha_default = config.get("lora_alpha", 8)
    rank_pattern = config.get("rank_pattern") or {}
    alpha_pattern = config.get("alpha_pattern") or {}
    use_rslora = bool(config.get("use_rslora", False))
    use_dora = bool(config.get("use_dora", False))
    warnings: list[str] = []
    damage: list[str] = []
    """The warnings that make the adapter one PEFT cannot load as saved (``check`` problems)."""
    unsupported: list[tuple[str, str | None]] = []
    config_errors = _config_errors(r_default, alpha_default, rank_pattern, alpha_pattern)
    for error in config_errors:
        warnings.append(f"adapter_config.json: {error}")
        damage.append(warnings[-1])
        unsupported.append((f"adapter_config.json: {error}", None))
    if not isinstance(rank_pattern, dict):
        rank_pattern = {}
    if not isinstance(alpha_pattern, dict):
        alpha_pattern = {}

    modules: dict[str, dict[str, str]] = {}
    extra: list[str] = []
    for name in tensors:
        match = _LORA_KEY.match(name)
        if match is None:
            extra.append(name)
            continue
        part = match["part"] + (f".{match['param']}" if match["param"] else "")
        modules.setdefault(match["module"], {})[part] = name

    pairs: list[dict[str, Any]] = []
    for stored_module, parts in modules.items():
        module = stored_module.removeprefix(PEFT_PREFIX)
        a_name, b_name = parts.get("lora_A.weight"), parts.get("lora_B.weight")
        entry: dict[str, Any] = {"module": module, "kind": module.rsplit(".", 1)[-1], "A": a_name, "B": b_name}
        if "lora_embedding_A" in parts or "lora_embedding_B" in parts:
            entry.update(A=parts.get("lora_embedding_A"), B=parts.get("lora_embedding_B"), layer="embedding")
            unsupported.append(("embedding LoRA (lora_embedding_A/B)", module))
        if "lora_magnitude_vector" in parts or "lora_magnitude_vector.weight" in parts:
            entry["magnitude"] = parts.get("lora_magnitude_vector") or parts.get("lora_magnitude_vector.weight")
            unsupported.append(("DoRA (lora_magnitude_vector)", module))
        if "lora_B.bias" in parts:
            entry["lora_bias"] = parts["lora_B.bias"]
        a = tensors.get(entry["A"]) if entry["A"] else None
        b = tensors.get(entry["B"]) if entry["B"] else None
        if a is None or b is None:
            missing = "lora_A" if a is None else "lora_B"
            warnings.append(f"{module}: {missing} is missing, the pair is incomplete")
            damage.append(warnings[-1])
            unsupported.append((f"incomplete pair ({missing} missing)", module))
            pairs.append(entry)
            continue
        if entry.get("layer") != "embedding" and (len(a.shape) != 2 or len(b.shape) != 2):
            unsupported.append((f"non-linear LoRA (lora_A shape {list(a.shape)}, e.g. conv)", module))
        configured_r = pattern_value(rank_pattern, module, r_default)
        alpha = pattern_value(alpha_pattern, module, alpha_default)
        stored_r = a.shape[0] if a.shape else 0  # lora_A (and lora_embedding_A) is [r, ...]
        if len(b.shape) >= 2 and b.shape[1] != stored_r:
            warnings.append(f"{module}: lora_A has rank {stored_r} but lora_B has {b.shape[1]}")
            damage.append(warnings[-1])
            unsupported.append(("lora_A/lora_B rank mismatch", module))
        if configured_r != stored_r:
            warnings.append(f"{module}: adapter_config.json says r={configured_r}, lora_A is stored with rank {stored_r}")
            damage.append(warnings[-1])
            # the scale (alpha / r) would be another than the one trained with; PEFT refuses to load it
            unsupported.append((f"r={configured_r!r} in adapter_config.json but lora_A has rank {stored_r}", module))
        try:
            if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
                raise ValueError
            scaling = lora_scaling(float(alpha), int(configured_r), use_rslora)
            if not math.isfinite(scaling) or configured_r <= 0:
                raise ValueError
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):
            scaling = float("nan")
            unsupported.append((f"no usable r/lora_alpha (r={configured_r!r}, lora_alpha={alpha!r})", module))
        entry.update(r=configured_r, lora_alpha=alpha, scaling=scaling,
                     in_features=a.shape[-1] if a.shape else None,
                     out_features=b.shape[0] if b.shape else None, dtype=a.dtype)
        pairs.append(entry)

    kinds: dict[str, dict[str, Any]] = {}
    for entry in pairs:
        kinds.setdefault(entry["kind"], {"layers": 0, "r": [], "lora_alpha": [], "scaling": []})
        summary = kinds[entry["kind"]]
        summary["layers"] += 1
        for key in ("r", "lora_alpha", "scaling"):
            if key in entry:
                summary[key].append(entry[key])
    lines = {}
    for kind, summary in kinds.items():
        text = f"{kind}: {summary['layers']} layer{'s' if summary['layers'] != 1 else ''}"
        if summary["r"]:
            text += f", r={_range(summary['r'])}, alpha={_range(summary['lora_alpha'])}"
            text += f", scale={_range([round(s, 6) for s in summary['scaling']])}"
            text += " (alpha/sqrt(r))" if use_rslora else ""
        lines[kind] = text

    bias = config.get("bias", "none")
    saved_biases = [n for n in extra if n.endswith(".bias")]
    if bias not in (None, "none") and not saved_biases:
        warnings.append(f"bias={bias!r} but the adapter stores no bias tensors")
    modules_to_save = config.get("modules_to_save") or []
    # Whole weights saved beside the pairs, each loaded by PEFT over the base model's before it merges:
    # ``modules_to_save`` copies (``base_model.model.lm_head.weight``), and save_embedding_layers' embedding
    # and head ("auto", PEFT's default, when one is a target or the vocabulary was resized), as
    # ``...embed_tokens.weight`` or, for a LoRA-targeted module, ``...lm_head.base_layer.weight``.
    saved_weights = [n for n in extra if n not in saved_biases]
    if not isinstance(modules_to_save, (list, tuple)) or not all(isinstance(m, str) for m in modules_to_save):
        warnings.append(f"adapter_config.json: modules_to_save is {modules_to_save!r}, not a list of module names")
        damage.append(warnings[-1])
        unsupported.append((warnings[-1], None))
        modules_to_save = []
    else:
        held = {peft_base_name(n).rsplit(".", 1)[0] for n in [*saved_weights, *saved_biases]}
        for module in modules_to_save:
            if not any(h == module or h.endswith(f".{module}") for h in held):
                warnings.append(f"modules_to_save names {module!r} but the adapter holds no copy of it")
                damage.append(warnings[-1])
                unsupported.append((f"modules_to_save {module!r} without its saved copy", None))
    if config.get("trainable_token_indices"):
        unsupported.append(("trainable_token_indices (trainable tokens)", None))
    if use_dora and not any(u[0].startswith("DoRA") for u in unsupported):
        unsupported.append(("DoRA (use_dora)", None))
    if config.get("layer_replication"):
        unsupported.append(("layer_replication", None))
    for key, what in UNMERGED_VARIANTS:
        if config.get(key):
            unsupported.append((f"{what} ({key})", None))
    peft_type = config.get("peft_type")
    if peft_type not in (None, "LORA"):
        unsupported.append((f"peft_type {peft_type} (only LORA is understood)", None))

    return {
        "peft_type": peft_type,
        "base_model_name_or_path": config.get("base_model_name_or_path"),
        "r": r_default,
        "lora_alpha": alpha_default,
        "use_rslora": use_rslora,
        "use_dora": use_dora,
        "fan_in_fan_out": bool(config.get("fan_in_fan_out", False)),
        "bias": bias,
        "lora_bias": bool(config.get("lora_bias", False)),
        "target_modules": config.get("target_modules"),
        "rank_pattern": dict(rank_pattern),
        "alpha_pattern": dict(alpha_pattern),
        "modules_to_save": list(modules_to_save),
        "num_pairs": len(pairs),
        "pairs": pairs,
        "modules": {kind: {"layers": s["layers"], "r": _distinct(s["r"]), "lora_alpha": _distinct(s["lora_alpha"]),
                           "line": lines[kind]} for kind, s in kinds.items()},
        "saved_biases": saved_biases,
        "other_tensors": saved_weights,  # whole weights beside the pairs: modules_to_save, save_embedding_layers
        "unsupported_merge": _group(unsupported),
        "config_errors": config_errors,
        "warnings": warnings,
        "damage": damage,
    }
