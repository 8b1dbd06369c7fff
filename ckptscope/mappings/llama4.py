"""Llama 4 text models (``Llama4ForCausalLM``, ``model_type: llama4_text``) between HF and Megatron-Core:
dense and MoE layers interleaved, a shared expert and a router on every MoE layer, fused experts.

transformers (``models/llama4/modeling_llama4.py``):

* a layer is MoE when its index is in ``config.moe_layers`` (from ``interleave_moe_layer_step``);
  dense layers hold ``feed_forward.{gate,up,down}_proj`` of ``intermediate_size_mlp``, MoE layers
  ``feed_forward.router`` (no bias), ``feed_forward.shared_expert.{gate,up,down}_proj`` and
  ``feed_forward.experts.gate_up_proj [E, H, 2I]`` / ``down_proj [E, I, H]`` used as ``x @ W``
  (``Llama4TextExperts``: ``gate, up = gate_up.chunk(2, -1)``, so ``[gate | up]`` along the last axis,
  not interleaved): Megatron's fc1 ``[2I, H]`` is the transpose of ``gate_up_proj[e]``, its fc2 the
  transpose of ``down_proj[e]``;
* the router's top-k scores go through a sigmoid and scale the experts' *input*; RoPE is applied to
  interleaved pairs (complex multiplication); the q/k norm is an L2 norm with no weights, only on RoPE
  layers; some layers have no RoPE; attention is chunked and its temperature tuned on long contexts.

Megatron-Core (0.16.1): ``moe_layer_freq`` (0/1 per layer; the layers are then saved under per-layer
torch_dist keys), ``mlp.shared_experts``, ``mlp.router``, ``moe_router_score_function="sigmoid"``,
``moe_apply_probs_on_input``, ``rotary_interleaved``, ``qk_l2_norm``, ``no_rope_freq``. What it lacks
(q/k norm on RoPE layers only, chunked attention, temperature tuning) is said in the export's notes.
"""

from __future__ import annotations

from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.mappings.config import fact_problems
from ckptscope.mappings.gpt_oss import fused_expert_rule
from ckptscope.mappings.schemas import ATTENTION, TOP, Rule, _layer

ARCH = "llama4"

RULES: tuple[Rule, ...] = TOP + ATTENTION + (
    # dense layers (the norm: fused into fc1 in the TE spec; on MoE layers the writers spell it pre_mlp_layernorm)
    _layer("post_attention_layernorm.weight", ("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"),
           local="pre_mlp_layernorm.weight"),
    _layer(("feed_forward.gate_proj.weight", "feed_forward.up_proj.weight"), "mlp.linear_fc1.weight", "gate_up"),
    _layer("feed_forward.down_proj.weight", "mlp.linear_fc2.weight"),
    # MoE layers
    _layer("feed_forward.router.weight", "mlp.router.weight"),
    _layer(("feed_forward.shared_expert.gate_proj.weight", "feed_forward.shared_expert.up_proj.weight"),
           "mlp.shared_experts.linear_fc1.weight", "gate_up"),
    _layer("feed_forward.shared_expert.down_proj.weight", "mlp.shared_experts.linear_fc2.weight"),
    fused_expert_rule("feed_forward.experts.gate_up_proj", "linear_fc1.weight", "transpose"),
    fused_expert_rule("feed_forward.experts.down_proj", "linear_fc2.weight", "transpose"),
)

HF_EXTRA = ("model_type", "intermediate_size_mlp", "interleave_moe_layer_step", "moe_layers", "use_qk_norm",
            "no_rope_layers", "no_rope_layer_interval", "attention_chunk_size", "layer_types",
            "attn_temperature_tuning", "floor_scale", "attn_scale", "rope_parameters", "attention_bias",
            "router_aux_loss_coef", "router_jitter_noise", "pad_token_id", "bos_token_id", "eos_token_id")
"""HF config keys carried verbatim in the Megatron args (``hf_config_extra``) for the way back."""

FACTS = [
    "dense and MoE layers interleaved (moe_layers / interleave_moe_layer_step <-> Megatron moe_layer_freq; "
    "torch_dist then saves per-layer keys)",
    "expert fc1 = transposed HF gate_up_proj[e] ([gate | up] columns), fc2 = transposed down_proj[e]; "
    "shared expert = mlp.shared_experts; router = mlp.router (sigmoid scores applied to the experts' input)",
    "RoPE on interleaved pairs (rotary_interleaved); q/k L2 norm without weights (qk_l2_norm); NoPE layers "
    "(no_rope_freq)",
]


def _read(text: dict[str, Any]) -> dict[str, Any]:
    """config.json facts the generic reading gets wrong: the dense FFN is ``intermediate_size_mlp``,
    ``intermediate_size`` is the experts' and the shared expert's."""
    inter = text.get("intermediate_size")
    return {"ffn_hidden_size": text.get("intermediate_size_mlp"), "moe_ffn_hidden_size": inter,
            "shared_expert_ffn_hidden_size": inter, "qk_norm": False}


def _moe_layers(cfg) -> list[int]:
    extra = cfg.hf_extra or {}
    layers = extra.get("moe_layers")
    if layers is None:
        step = int(extra.get("interleave_moe_layer_step") or 1)
        layers = list(range(step - 1, cfg.require("num_layers"), step))
    return [int(i) for i in layers]


def _hf_config(cfg, out: dict) -> None:
    out["intermediate_size"] = cfg.moe_ffn_hidden_size
    out["intermediate_size_mlp"] = cfg.ffn_hidden_size
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        out.pop(key, None)
    out.setdefault("hidden_act", "silu")


def _megatron_args(cfg, args: dict) -> None:
    """Megatron-Core's settings for Llama 4 (TransformerConfig field names)."""
    extra = cfg.hf_extra or {}
    if cfg.moe_router_topk not in (None, 1):
        raise CkptError(f"Llama 4 with num_experts_per_tok={cfg.moe_router_topk}: megatron-core scales the experts' "
                        "input by the router scores (moe_apply_probs_on_input) only with top-1 routing")
    moe = set(_moe_layers(cfg))
    layers = cfg.require("num_layers")
    args.update(moe_layer_freq=[int(i in moe) for i in range(layers)], moe_router_score_function="sigmoid",
                moe_apply_probs_on_input=True, moe_router_pre_softmax=False, rotary_interleaved=True,
                qk_l2_norm=bool(extra.get("use_qk_norm", True)), qk_layernorm=False, moe_shared_expert_gate=False,
                moe_shared_expert_intermediate_size=cfg.moe_ffn_hidden_size)
    no_rope = extra.get("no_rope_layers")
    if no_rope and not all(no_rope):
        args["no_rope_freq"] = [0 if use_rope else 1 for use_rope in no_rope]  # HF: 1 = this layer uses RoPE
    rope = extra.get("rope_parameters")  # its llama3 scaling: mappings/rope.py
    if isinstance(rope, dict) and rope.get("rope_theta"):
        args["rotary_base"] = rope["rope_theta"]


def _export_notes(cfg) -> list[str]:
    """What megatron-core 0.16.1 would compute differently, said where a Llama 4 export is written."""
    extra = cfg.hf_extra or {}
    notes = []
    no_rope = extra.get("no_rope_layers") or []
    nope = [i for i, use_rope in enumerate(no_rope) if not use_rope]
    if extra.get("use_qk_norm", True) and nope:
        notes.append(f"Llama 4 skips its q/k L2 norm on the NoPE layers {nope}; megatron-core's qk_l2_norm "
                     f"normalises every layer, so those layers compute differently in a stock GPTModel")
    if extra.get("attn_temperature_tuning", True) and nope:
        notes.append(f"Llama 4 tunes the attention temperature on NoPE layers beyond {extra.get('floor_scale', 8192)}"
                     f" tokens; megatron-core has no such setting (kept in hf_config_extra only)")
    if extra.get("attention_chunk_size"):
        notes.append(f"Llama 4 attends in chunks of {extra['attention_chunk_size']} tokens on its RoPE layers; "
                     "megatron-core has no such setting (kept in hf_config_extra only)")
    return notes


def _megatron_problems(cfg) -> list[str]:
    wanted = (("rotary_interleaved", True, "Llama 4 rotates interleaved pairs"),
              ("moe_router_score_function", "sigmoid", "Llama 4's router scores are sigmoids"),
              ("moe_apply_probs_on_input", True, "Llama 4 scales the experts' input by the scores"))
    return fact_problems(cfg, wanted)


def register() -> None:
    """Add Llama 4 (text) to the mapping tables (called once by ``ckptscope.mappings``)."""
    from ckptscope.mappings import config, schemas

    schemas.SCHEMAS.setdefault(ARCH, RULES)
    config.ARCH_BY_MODEL_TYPE.setdefault("llama4_text", ARCH)
    config.HF_CLASS_BY_ARCH.setdefault(ARCH, "Llama4ForCausalLM")
    config.HF_MODEL_TYPE_BY_ARCH.setdefault(ARCH, "llama4_text")
    config.HF_EXTRA_KEYS.setdefault(ARCH, HF_EXTRA)
    config.LOCAL_EXPERTS_KEY.add(ARCH)
    config.HF_READ_HOOKS.setdefault(ARCH, _read)
    config.MEGATRON_ARGS_HOOKS.setdefault(ARCH, _megatron_args)
    config.HF_CONFIG_HOOKS.setdefault(ARCH, _hf_config)
    config.MEGATRON_CHECKS.setdefault(ARCH, _megatron_problems)
    config.EXPORT_NOTES.setdefault(ARCH, _export_notes)
    config.ARCH_FACTS.setdefault(ARCH, FACTS)
