"""Does a round trip's config.json describe the model the source's config.json describes?

Tensors alone cannot show a lost activation (``gelu`` written back as ``silu``), a router that no
longer renormalises its top-k weights, a dropped attention window or an architecture read as
another: the bytes are equal and the model computes something else. ``verify`` therefore also
compares what the two configs *mean*, fact by fact, with each fact read the way transformers reads
it (its defaults where a key is absent, RoPE from ``rope_theta`` or ``rope_parameters``, the expert
count under any of its names), so that spelling differences a derived config has are not reported
and meaning differences always are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ckptscope.mappings import rope as _rope
from ckptscope.mappings.config import ARCH_BY_MODEL_TYPE
from ckptscope.mappings.window import WINDOW_ARCHS, effective_window, window_layers

_DEFAULT_ACT = "silu"


def _text(config: dict[str, Any]) -> dict[str, Any]:
    return config["text_config"] if isinstance(config.get("text_config"), dict) else config


def _first(config: dict[str, Any], *keys: str) -> Any:
    return next((config[k] for k in keys if config.get(k) is not None), None)


def _rope_theta(config: dict[str, Any]) -> float | None:
    theta = config.get("rope_theta")
    found = _rope.hf_rope(config)
    if theta is None and found is not None:
        theta = found[1].get("rope_theta")
    return float(theta) if theta is not None else None


def facts(config: dict[str, Any]) -> dict[str, Any]:
    """What a config.json says the model computes, in one spelling (``None``: not said)."""
    text = _text(config)
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    arch = ARCH_BY_MODEL_TYPE.get(model_type, model_type)
    window = None if arch == "llama" else effective_window(text)  # transformers' Llama has no window
    layers = window_layers(text, arch)
    if layers is None and arch in WINDOW_ARCHS:
        window = None  # the window applies to no layer
    if arch == "mistral" and window is None:
        arch = "llama"  # Mistral without its window is Llama, module for module
    per_layer_rope = isinstance(text.get("rope_parameters"), dict) and text["rope_parameters"] and \
        all(isinstance(v, dict) for v in text["rope_parameters"].values())
    out = {
        "architecture": arch,
        "activation": _first(text, "hidden_act", "hidden_activation") or _DEFAULT_ACT,
        "hidden_size": text.get("hidden_size"),
        "intermediate_size": text.get("intermediate_size"),
        "layers": text.get("num_hidden_layers"),
        "attention_heads": text.get("num_attention_heads"),
        "kv_heads": _first(text, "num_key_value_heads", "num_attention_heads"),
        "head_dim": _first(text, "head_dim") or (text["hidden_size"] // text["num_attention_heads"]
                                                 if text.get("hidden_size") and text.get("num_attention_heads")
                                                 else None),
        "vocab_size": text.get("vocab_size"),
        "norm_eps": text.get("rms_norm_eps"),
        "rope_theta": None if per_layer_rope else _rope_theta(text),
        "rope_scaling": None if per_layer_rope else _rope.scaling_of(text),
        "per_layer_rope": text.get("rope_parameters") if per_layer_rope else None,
        "attention_bias": bool(text.get("attention_bias", False)),
        "mlp_bias": bool(text.get("mlp_bias", False)),
        "sliding_window": window,
        "sliding_layers": [i for i, on in enumerate(layers) if on] if layers else None,
        "experts": _first(text, "num_local_experts", "num_experts", "n_routed_experts"),
        "experts_per_token": text.get("num_experts_per_tok"),
        "expert_size": text.get("moe_intermediate_size"),
        "shared_expert_size": text.get("shared_expert_intermediate_size") or None,
        "norm_topk_prob": bool(text.get("norm_topk_prob", False)) if _first(
            text, "num_local_experts", "num_experts", "n_routed_experts") else None,
    }
    for key in ("routed_scaling_factor", "n_group", "topk_group", "scoring_func", "n_shared_experts",
                "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "use_qk_norm",
                "no_rope_layers", "attention_chunk_size", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
                "qk_rope_head_dim", "v_head_dim", "tie_word_embeddings"):
        out[key] = text.get(key, config.get(key))
    return out


def config_differences(src_dir: Path, back_dir: Path) -> list[tuple[str, Any, Any]]:
    """``(fact, source's, round trip's)`` for every fact the source's config.json says and the round
    trip's says otherwise; empty when either has no config.json."""
    def load(path: Path) -> dict[str, Any] | None:
        try:
            config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return config if isinstance(config, dict) else None

    before, after = load(src_dir), load(back_dir)
    if before is None or after is None:
        return []
    said, back = facts(before), facts(after)
    return [(key, value, back.get(key)) for key, value in said.items()
            if value is not None and value != back.get(key)]


ABSENT_IS_A_FACT = frozenset({"rope_scaling", "per_layer_rope", "sliding_window", "sliding_layers", "experts",
                              "shared_expert_size", "norm_topk_prob"})
"""Facts whose ``None`` says something (no RoPE scaling, no window, a dense MLP): for every other fact a
config that leaves it out takes transformers' default, which ``facts`` does not know per architecture."""


def fact_differences(config_a: dict[str, Any], config_b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(fact, A's, B's)`` for every fact two config.json files disagree on, either way round (``diff``).
    A fact one side leaves to transformers' default is not a difference, unless its absence is itself a
    fact (``ABSENT_IS_A_FACT``): a derived config that spells out a default is the same model."""
    said_a, said_b = facts(config_a), facts(config_b)
    out = []
    for key in [*said_a, *(k for k in said_b if k not in said_a)]:
        a, b = said_a.get(key), said_b.get(key)
        if a == b or ((a is None or b is None) and key not in ABSENT_IS_A_FACT):
            continue
        out.append((key, a, b))
    return out
