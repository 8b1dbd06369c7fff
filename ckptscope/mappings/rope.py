"""RoPE scaling (YaRN, Llama 3's ``llama3``, ``linear``) between an HF ``config.json`` and Megatron args.

A checkpoint's weights do not say how positions are scaled: a model exported without its scaling loads,
runs, and is wrong past a few tokens (YaRN and llama3 change the frequencies themselves, so every
position moves). So the scaling is translated both ways here, once, and whatever megatron-core 0.16.1
cannot compute the way transformers does is refused instead of dropped.

HF spells it as ``rope_scaling`` (release checkpoints, transformers 4) or inside ``rope_parameters``
(transformers 5, with ``rope_theta``), type under ``rope_type`` or the older ``type``. What megatron-core
reads, by model (names as Megatron-LM's arguments.py / Megatron-Bridge's providers store them):

* **YaRN on GPT attention** (GPT-OSS, Qwen): ``position_embedding_type="yarn"`` and the ``yarn_*`` fields
  ``GPTModel`` reads off its config (``yarn_rotary_scaling_factor``, ``yarn_original_max_position_embeddings``,
  ``yarn_beta_fast``, ``yarn_beta_slow``, ``yarn_mscale``, ``yarn_mscale_all_dim``,
  ``yarn_correction_range_round_to_int`` = HF ``truncate``). Megatron-LM's CLI takes the factor as
  ``rotary_scaling_factor``, so that spelling is written too. ``YarnRotaryEmbedding`` computes its ramp over
  all of ``kv_channels``, so YaRN on a partial rotary head is refused.
* **YaRN on MLA** (DeepSeek-V3, Kimi-K2): ``MLATransformerConfig``'s unprefixed fields ``rope_type="yarn"``,
  ``rotary_scaling_factor``, ``original_max_position_embeddings``, ``beta_fast``, ``beta_slow``, ``mscale``,
  ``mscale_all_dim``. MLA's YaRN always rounds the correction range (``truncate: false`` is refused).
* **llama3**: ``use_rope_scaling`` / ``rope_scaling_factor`` (Bridge: ``rope_scaling``). megatron-core's
  ``RotaryEmbedding._apply_scaling`` fixes ``low_freq_factor=1``, ``high_freq_factor=4`` and
  ``original_max_position_embeddings=8192`` (Llama 3.1 / 3.2); other values (Llama 4's) are refused.
* **linear**: ``rotary_seq_len_interpolation_factor`` (Bridge: ``seq_len_interpolation_factor``); positions
  are divided by the factor, which HF does to the frequencies (the same product, rounded differently).

The attention factor: transformers derives it as ``get_mscale(factor, mscale) / get_mscale(factor,
mscale_all_dim)`` only when both are non-zero, else ``get_mscale(factor)``; megatron-core divides whenever
both are set (MLA always has them). So the two are passed only where HF uses both (MLA: ``mscale=1``,
``mscale_all_dim=0`` otherwise, which gives HF's value). An HF ``attention_factor`` has no Megatron field and
is refused; the other way it is how a Megatron run's lone ``--mscale`` (a factor transformers would not
derive) is written into config.json.
"""

from __future__ import annotations

import math
from typing import Any

from ckptscope.core.errors import CkptError

HF_KEYS = ("rope_parameters", "rope_scaling")
"""Where a config.json keeps its RoPE: transformers 5 writes ``rope_parameters``, older ones ``rope_scaling``."""
PLAIN = {"rope_type": "default"}
"""What a config says when it knows the RoPE is not scaled (``None`` means "not known")."""
LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
"""megatron-core 0.16.1's ``RotaryEmbedding._apply_scaling`` defaults, which ``GPTModel`` never overrides."""
YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0}
"""transformers' ``_compute_yarn_parameters`` fallbacks (``or 32`` / ``or 1``), written out for Megatron."""
MLA_DEFAULTS = {"rotary_scaling_factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0}
"""``MLATransformerConfig``'s defaults: what a Megatron run used for a field its args do not carry."""
SCALING_ARGS = ("position_embedding_type", "rope_type", "rotary_scaling_factor", "original_max_position_embeddings",
                "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "use_rope_scaling", "rope_scaling",
                "rope_scaling_factor", "rotary_seq_len_interpolation_factor", "seq_len_interpolation_factor",
                "multi_latent_attention", "yarn_rotary_scaling_factor", "yarn_original_max_position_embeddings",
                "yarn_beta_fast", "yarn_beta_slow", "yarn_mscale", "yarn_mscale_all_dim",
                "yarn_correction_range_round_to_int")
"""Every Megatron arg this module reads or writes."""


def kind(rope: dict[str, Any] | None) -> str:
    """The scaling's type in HF's words (``default`` for plain RoPE)."""
    if not rope:
        return "default"
    return str(rope.get("rope_type") or rope.get("type") or "default")


def hf_rope(config: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """``(key, dict)`` of the RoPE a config.json spells, verbatim; None when it has none or a per-layer one
    (Gemma 3's ``{"full_attention": {...}, ...}``, which its arch carries itself)."""
    for key in HF_KEYS:
        rope = config.get(key)
        if isinstance(rope, dict) and rope and not all(isinstance(v, dict) for v in rope.values()):
            return key, rope
    return None


def scaling_of(config: dict[str, Any]) -> dict[str, Any]:
    """The RoPE scaling of an HF config (``PLAIN`` when not scaled), without ``rope_theta``."""
    found = hf_rope(config)
    if found is None or kind(found[1]) == "default":
        return dict(PLAIN)
    return {k: v for k, v in found[1].items() if k != "rope_theta"}


def _mscales(rope: dict[str, Any]) -> tuple[float | None, float | None]:
    """``(mscale, mscale_all_dim)`` as transformers uses them for the attention factor: both or neither."""
    mscale, all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    return (float(mscale), float(all_dim)) if mscale and all_dim else (None, None)


def megatron_args(rope: dict[str, Any] | None, *, mla: bool, arch: str, max_position_embeddings: int | None = None,
                  partial_rotary: float = 1.0) -> dict[str, Any]:
    """The Megatron args that make megatron-core compute ``rope`` (HF spelling); refuses what it cannot."""
    what = kind(rope)
    if what == "default":
        return {"rope_type": "rope"} if mla else {}
    assert rope is not None
    if what == "yarn":
        return _yarn_args(rope, mla=mla, arch=arch, max_position_embeddings=max_position_embeddings,
                          partial_rotary=partial_rotary)
    if mla:
        raise CkptError(f"{arch} with rope_type {what!r}: megatron-core's multi-latent attention has only plain "
                        "and YaRN RoPE")
    if what == "llama3":
        wrong = {k: rope.get(k) for k, v in LLAMA3_FIXED.items() if rope.get(k) is None or float(rope[k]) != v}
        if wrong:
            raise CkptError(f"{arch} llama3 RoPE with {', '.join(f'{k}={v}' for k, v in wrong.items())}: "
                            f"megatron-core fixes {', '.join(f'{k}={v}' for k, v in LLAMA3_FIXED.items())}, so a "
                            "Megatron model would compute other frequencies")
        return {"use_rope_scaling": True, "rope_scaling_factor": float(rope["factor"])}
    if what == "linear":
        return {"rotary_seq_len_interpolation_factor": rope["factor"]}
    raise CkptError(f"{arch} with rope_type {what!r}: megatron-core has no such RoPE scaling "
                    "(only yarn, llama3 and linear are mapped); refusing rather than exporting it unscaled")


def _yarn_args(rope: dict[str, Any], *, mla: bool, arch: str, max_position_embeddings: int | None,
               partial_rotary: float) -> dict[str, Any]:
    original = rope.get("original_max_position_embeddings")
    if original is None:
        raise CkptError(f"{arch} YaRN RoPE without original_max_position_embeddings: transformers refuses it too")
    factor = rope.get("factor")
    if factor is None:  # transformers: the ratio of the context lengths
        if not max_position_embeddings:
            raise CkptError(f"{arch} YaRN RoPE without factor and without max_position_embeddings")
        factor = max_position_embeddings / original
    if rope.get("attention_factor") is not None:
        raise CkptError(f"{arch} YaRN RoPE with an explicit attention_factor: megatron-core derives it from "
                        "factor, mscale and mscale_all_dim and has no field for it")
    beta_fast = float(rope.get("beta_fast") or YARN_DEFAULTS["beta_fast"])
    beta_slow = float(rope.get("beta_slow") or YARN_DEFAULTS["beta_slow"])
    truncate = bool(rope.get("truncate", True))
    mscale, all_dim = _mscales(rope)
    if mla:
        if not truncate:
            raise CkptError(f"{arch} YaRN RoPE with truncate=false: megatron-core's MLA always rounds the "
                            "correction range")
        if rope.get("mscale_all_dim") and mscale is None:
            raise CkptError(f"{arch} YaRN RoPE with mscale_all_dim but no mscale: transformers scales cos/sin by "
                            "get_mscale(factor), which megatron-core's MLA cannot be told")
        return {"rope_type": "yarn", "rotary_scaling_factor": float(factor), "original_max_position_embeddings": original,
                "beta_fast": beta_fast, "beta_slow": beta_slow, "mscale": mscale if mscale is not None else 1.0,
                "mscale_all_dim": all_dim if all_dim is not None else float(rope.get("mscale_all_dim") or 0.0)}
    if float(partial_rotary) != 1.0 or float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
        raise CkptError(f"{arch} YaRN RoPE on part of each head: megatron-core's YarnRotaryEmbedding computes its "
                        "ramp over the whole kv_channels")
    args: dict[str, Any] = {
        "position_embedding_type": "yarn", "rotary_scaling_factor": float(factor),
        "yarn_rotary_scaling_factor": float(factor), "yarn_original_max_position_embeddings": original,
        "yarn_beta_fast": beta_fast, "yarn_beta_slow": beta_slow, "yarn_mscale": mscale, "yarn_mscale_all_dim": all_dim,
        "yarn_correction_range_round_to_int": truncate,
    }
    if mscale is not None:  # Megatron-LM's CLI spelling, read into yarn_mscale / yarn_mscale_all_dim
        args.update(mscale=mscale, mscale_all_dim=all_dim)
    return args


def fact(*, mla: bool) -> str:
    """What ``ckptscope archs`` says of an arch's RoPE scaling."""
    if mla:
        return ("RoPE scaling: yarn <-> rope_type=yarn, rotary_scaling_factor, original_max_position_embeddings, "
                "beta_fast, beta_slow, mscale, mscale_all_dim (MLATransformerConfig); other types are refused")
    return ("RoPE scaling: yarn <-> position_embedding_type=yarn + yarn_* args; llama3 (low 1, high 4, original "
            "8192 only) <-> use_rope_scaling + rope_scaling_factor; linear <-> rotary_seq_len_interpolation_factor; "
            "other types are refused")


def from_megatron_args(args: dict[str, Any]) -> dict[str, Any] | None:
    """The RoPE scaling Megatron args describe, in HF spelling (``PLAIN`` if none; None if they say nothing
    of positions). Reads Megatron-LM's and Megatron-Bridge's spellings, with megatron-core's defaults for a
    field a run left out."""
    if not any(key in args for key in SCALING_ARGS):
        return None
    if args.get("multi_latent_attention"):
        if args.get("rope_type") not in (None, "yarn"):  # Megatron-LM: None leaves MLATransformerConfig's yarn
            return dict(PLAIN)
        get = {k: args[k] if args.get(k) is not None else v for k, v in MLA_DEFAULTS.items()}
        if float(get["rotary_scaling_factor"]) <= 1.0:  # YaRN with factor 1 is plain RoPE
            return dict(PLAIN)
        out = {"rope_type": "yarn", "factor": get["rotary_scaling_factor"],
               "original_max_position_embeddings": get["original_max_position_embeddings"],
               "beta_fast": get["beta_fast"], "beta_slow": get["beta_slow"], "mscale": get["mscale"],
               "mscale_all_dim": get["mscale_all_dim"]}
        return out
    if args.get("position_embedding_type") == "yarn":
        def first(*keys, default=None):
            return next((args[k] for k in keys if args.get(k) is not None), default)

        out = {"rope_type": "yarn", "factor": first("yarn_rotary_scaling_factor", "rotary_scaling_factor", default=1.0),
               "original_max_position_embeddings": first("yarn_original_max_position_embeddings", default=4096),
               "beta_fast": first("yarn_beta_fast", default=32.0), "beta_slow": first("yarn_beta_slow", default=1.0),
               "truncate": bool(first("yarn_correction_range_round_to_int", default=True))}
        mscale, all_dim = first("yarn_mscale", "mscale"), first("yarn_mscale_all_dim", "mscale_all_dim")
        if mscale and all_dim:
            out.update(mscale=mscale, mscale_all_dim=all_dim)
        elif mscale is not None and all_dim is not None and not (float(mscale) == 1.0 and float(all_dim) == 0.0):
            # megatron-core divides whenever both are set, transformers only when both are non-zero: say the
            # product it computes, which transformers takes as is
            out["attention_factor"] = _concentration(float(out["factor"]), float(mscale), float(all_dim))
        return out
    if args.get("use_rope_scaling") or args.get("rope_scaling") is True:
        factor = args.get("rope_scaling_factor")
        return {"rope_type": "llama3", "factor": float(factor if factor is not None else 8.0), **LLAMA3_FIXED}
    factor = args.get("rotary_seq_len_interpolation_factor") or args.get("seq_len_interpolation_factor")
    if factor:
        return {"rope_type": "linear", "factor": factor}
    return dict(PLAIN)


def _concentration(factor: float, mscale: float, all_dim: float) -> float:
    """megatron-core's YaRN cos/sin factor for both mscales set (``_yarn_get_concentration_factor``)."""
    def get(scale: float, m: float) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    return float(get(factor, mscale) / get(factor, all_dim))


def problems(cfg: Any, *, mla: bool) -> list[str]:
    """Where the RoPE scaling a Megatron checkpoint's args describe (``cfg.megatron_rope``) differs from the
    one its HF config says (``cfg.rope_scaling``): megatron-core computes one, transformers would the other."""
    said, hf = cfg.megatron_rope, cfg.rope_scaling
    if said is None or hf is None:
        return []
    arch = str(cfg.arch)
    try:
        theirs = megatron_args(hf, mla=mla, arch=arch, max_position_embeddings=cfg.max_position_embeddings)
    except CkptError as exc:
        return [f"its HF RoPE cannot be computed by megatron-core ({exc})"]
    try:
        ours = megatron_args(said, mla=mla, arch=arch, max_position_embeddings=cfg.max_position_embeddings)
    except CkptError:  # an explicit attention_factor (mscale without mscale_all_dim): compare as HF spells it
        ours = None
    if ours is None and said != hf or ours is not None and _comparable(theirs) != _comparable(ours):
        return [f"its Megatron args describe RoPE {describe(said)} but its HF config says {describe(hf)}"]
    return []


def _comparable(args: dict[str, Any]) -> dict[str, Any]:
    """Megatron args with numbers as floats (``4`` and ``4.0`` are the same factor)."""
    return {k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for k, v in args.items()}


def describe(rope: dict[str, Any] | None) -> str:
    """``yarn (factor=4.0, original_max_position_embeddings=16, ...)`` or ``default`` (for messages)."""
    what = kind(rope)
    if what == "default" or rope is None:
        return "default (unscaled)"
    params = ", ".join(f"{k}={v}" for k, v in rope.items() if k not in ("rope_type", "type", "rope_theta"))
    return f"{what} ({params})"
