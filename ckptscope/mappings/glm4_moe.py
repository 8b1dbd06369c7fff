"""GLM-4.5 / GLM-4.5-Air (transformers ``Glm4MoeForCausalLM``, ``model_type: glm4_moe``) between HF and
Megatron-Core: DeepSeek-V3's MoE body under plain grouped-query attention.

Nothing here is new machinery; the model is assembled from rules other archs already use:

* attention = Llama's (``linear_qkv`` with per-group ``[q; k; v]`` rows) plus Qwen2's fused QKV *bias*
  (``attention_bias``, True in every GLM-4.5 release) and Qwen3's per-head q/k RMSNorm when ``use_qk_norm``
  (GLM-4.5 has it, GLM-4.5-Air does not). transformers applies the norm before RoPE, per head, as
  megatron-core's ``qk_layernorm`` does.
* RoPE is rotate-half on the first ``partial_rotary_factor`` of each head (transformers
  ``apply_rotary_pos_emb``: ``q[..., :rotary_dim]``), which is megatron-core's ``rotary_percent`` with
  ``rotary_interleaved=False`` (``RotaryEmbedding`` takes ``int(kv_channels * rotary_percent)`` dims and
  ``_apply_rotary_pos_emb_bshd`` rotates ``t[..., :rot_dim]``): no weight changes.
* MLP = DeepSeek-V3's: ``first_k_dense_replace`` dense layers, then routed experts, ``shared_experts``, a
  sigmoid router ``mlp.gate`` whose ``e_score_correction_bias`` is megatron-core's ``mlp.router.expert_bias``
  (``moe_router_enable_expert_bias``); MTP layers stored as ``model.layers.{num_hidden_layers + k}`` with
  ``enorm`` / ``hnorm`` / ``eh_proj`` / ``shared_head.norm`` (mappings/deepseek.py).

Megatron names and settings are Megatron-Bridge's (``src/megatron/bridge/models/glm/glm45_bridge.py``
``mapping_registry`` and ``provider_bridge``; ``glm45_provider.py``): ``add_qkv_bias``, ``qk_layernorm``,
``rotary_percent`` 0.5, ``moe_router_score_function="sigmoid"``, ``moe_router_enable_expert_bias``,
``moe_router_dtype="fp32"``, ``moe_router_pre_softmax=False``, ``moe_layer_freq`` list,
``moe_shared_expert_intermediate_size``, ``moe_router_topk_scaling_factor`` = ``routed_scaling_factor``,
``mtp_num_layers`` = ``num_nextn_predict_layers``.
"""

from __future__ import annotations

from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.mappings import config as _config
from ckptscope.mappings import deepseek
from ckptscope.mappings.schemas import ATTENTION, QK_NORM, QKV_BIAS, SCHEMAS, TOP

ARCH = "glm4_moe"

LAYER = ATTENTION + QKV_BIAS + QK_NORM + deepseek.DENSE + deepseek.MOE
RULES = TOP + LAYER + deepseek.mtp_rules(LAYER)

HF_KEYS = ("model_type", "hidden_act", "head_dim", "attention_bias", "use_qk_norm", "partial_rotary_factor",
           "rope_parameters", "rope_scaling", "first_k_dense_replace", "n_routed_experts", "n_shared_experts",
           "moe_intermediate_size", "num_experts_per_tok", "routed_scaling_factor", "n_group", "topk_group",
           "norm_topk_prob", "num_nextn_predict_layers", "pad_token_id", "bos_token_id", "eos_token_id")
"""GLM-4.5 config keys carried verbatim in the Megatron args (``hf_config_extra``) for the way back."""

DEFAULT_PARTIAL_ROTARY = 0.5
"""``Glm4MoeConfig.__post_init__``: ``partial_rotary_factor`` defaults to 0.5 when a config.json omits it."""

FACTS = [
    "attention: fused linear_qkv with its bias (attention_bias <-> add_qkv_bias), per-head q/k norm when "
    "use_qk_norm (qk_layernorm)",
    "partial RoPE: rope_parameters.partial_rotary_factor <-> rotary_percent (rotate-half, rotary_interleaved=False)",
    "layers < first_k_dense_replace are dense (moe_layer_freq list); router mlp.gate (sigmoid) with "
    "e_score_correction_bias = mlp.router.expert_bias (moe_router_enable_expert_bias); shared_experts",
    "MTP layer k = model.layers.{num_hidden_layers + k} <-> mtp.layers.k, as DeepSeek-V3",
]


def partial_rotary(extra: dict[str, Any]) -> float:
    """The fraction of each head RoPE rotates, wherever the config keeps it (v5 ``rope_parameters``, older
    configs at the top level)."""
    rope = deepseek.rope_of(extra)
    value = rope.get("partial_rotary_factor", extra.get("partial_rotary_factor"))
    return float(value if value is not None else DEFAULT_PARTIAL_ROTARY)


def _read(text: dict[str, Any]) -> dict[str, Any]:
    """config.json facts the generic reading gets wrong: the q/k norm is ``use_qk_norm``."""
    return {"qk_norm": bool(text.get("use_qk_norm"))}


def _megatron_args(cfg: _config.ModelConfig, args: dict[str, Any]) -> None:
    """``MEGATRON_ARGS_HOOKS`` entry: Megatron-Bridge's GLM-4.5 settings on top of the common args."""
    extra = cfg.hf_extra or {}
    rope = deepseek.rope_of(extra)
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind != "default":
        raise CkptError(f"glm4_moe with rope type {kind!r}: only plain (partial) RoPE has Megatron args here")
    args.update(deepseek.routed_moe_args(cfg, ARCH))
    args.update(rotary_percent=partial_rotary(extra), rotary_interleaved=False, moe_router_pre_softmax=False,
                moe_router_dtype="fp32", moe_shared_expert_gate=False)
    if rope.get("rope_theta"):
        args["rotary_base"] = rope["rope_theta"]


def _hf_config(cfg: _config.ModelConfig, out: dict[str, Any]) -> None:
    """config.json for GLM-4.5. Keys the Megatron args carried verbatim (``hf_config_extra``) are already in
    ``out``; without them (a Megatron run that never saw HF) they are derived from the Megatron facts."""
    facts = cfg.megatron_facts or {}
    for key in ("num_experts", "shared_expert_intermediate_size"):  # GLM spells them n_routed/n_shared_experts
        out.pop(key, None)
    out["model_type"] = ARCH
    # transformers' defaults (first_k_dense_replace=1, n_shared_experts=1) would make another model: both said
    out.setdefault("first_k_dense_replace", _first_moe_layer(facts.get("moe_layer_freq")) or 0)
    out.setdefault("n_routed_experts", cfg.num_experts)
    out.setdefault("moe_intermediate_size", cfg.moe_ffn_hidden_size)
    if cfg.shared_expert_ffn_hidden_size and cfg.moe_ffn_hidden_size:
        out.setdefault("n_shared_experts", cfg.shared_expert_ffn_hidden_size // cfg.moe_ffn_hidden_size)
    out.setdefault("hidden_act", "silu")
    out.setdefault("attention_bias", bool(cfg.qkv_bias))
    out.setdefault("use_qk_norm", bool(cfg.qk_norm))
    out.setdefault("num_nextn_predict_layers", cfg.mtp_num_layers or 0)
    if facts.get("moe_router_topk_scaling_factor") is not None:
        out.setdefault("routed_scaling_factor", facts["moe_router_topk_scaling_factor"])
    if "rope_parameters" not in out and "partial_rotary_factor" not in out:
        out.pop("rope_theta", None)
        out["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rope_theta or 10000.0,
                                  "partial_rotary_factor": facts.get("rotary_percent", DEFAULT_PARTIAL_ROTARY)}


def _first_moe_layer(freq: Any) -> int | None:
    """``first_k_dense_replace`` of a ``moe_layer_freq``: 0 when every layer is MoE (None, 1, all ones),
    k for k dense layers then MoE ones; None for any other pattern (GLM-4.5 cannot spell it)."""
    if freq in (None, 1):
        return 0
    if isinstance(freq, (list, tuple)) and 1 in freq:
        k = list(freq).index(1)
        if all(f == 0 for f in freq[:k]) and all(f == 1 for f in freq[k:]):
            return k
    return None


def _megatron_problems(cfg: _config.ModelConfig) -> list[str]:
    """Why a Megatron checkpoint would not compute GLM-4.5 in transformers (one line each)."""
    wanted = (("moe_router_score_function", "sigmoid", "GLM-4.5's router scores are sigmoids"),
              ("rotary_interleaved", False, "GLM-4.5 rotates halves, not interleaved pairs"))
    problems = _config.fact_problems(cfg, wanted)
    facts = cfg.megatron_facts or {}
    if _first_moe_layer(facts.get("moe_layer_freq")) is None:
        problems.append(f"its MoE layers (moe_layer_freq {facts.get('moe_layer_freq')!r}) are not dense layers "
                        f"followed by MoE ones, the only pattern GLM-4.5 spells (first_k_dense_replace)")
    if cfg.is_moe and not cfg.shared_expert_ffn_hidden_size:
        problems.append("it has no shared experts, while every GLM-4.5 MoE layer has them (n_shared_experts)")
    if "rotary_percent" in facts and cfg.hf_extra and float(facts["rotary_percent"]) != partial_rotary(cfg.hf_extra):
        problems.append(f"its Megatron args say rotary_percent={facts['rotary_percent']} but its HF config "
                        f"partial_rotary_factor={partial_rotary(cfg.hf_extra)}")
    return problems


SCHEMAS.setdefault(ARCH, RULES)
_config.ARCH_BY_MODEL_TYPE.setdefault(ARCH, ARCH)
_config.HF_CLASS_BY_ARCH.setdefault(ARCH, "Glm4MoeForCausalLM")
_config.HF_EXTRA_KEYS.setdefault(ARCH, HF_KEYS)
_config.HF_READ_HOOKS.setdefault(ARCH, _read)
_config.MEGATRON_ARGS_HOOKS.setdefault(ARCH, _megatron_args)
_config.HF_CONFIG_HOOKS.setdefault(ARCH, _hf_config)
_config.MEGATRON_CHECKS.setdefault(ARCH, _megatron_problems)
_config.MTP_ARCHS.add(ARCH)
_config.ARCH_FACTS.setdefault(ARCH, FACTS)
