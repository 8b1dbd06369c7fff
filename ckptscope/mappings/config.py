"""``ModelConfig``: the handful of numbers every HF <-> Megatron-Core transform needs, and the
translation of HF ``config.json`` and Megatron ``args`` to and from it (MAPPING.md §1, §4.1).

Both sources spell the same facts differently (``num_key_value_heads`` vs ``num_query_groups``,
``head_dim`` vs ``kv_channels``, ``tie_word_embeddings`` vs ``untie_embeddings_and_output_weights``).
One neutral record lets the transforms stay free of either spelling, and derived values
(``head_dim`` when Qwen3 makes it differ from ``hidden/heads``, P6) are computed in one place.
"""

from __future__ import annotations

import json
import math

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.mappings import hf_layout as _hf_layout
from ckptscope.mappings import rope as _rope
from ckptscope.mappings import window as _window
from ckptscope.mappings.window import effective_window

ARCH_BY_MODEL_TYPE = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "mixtral": "mixtral",
    "qwen2_moe": "qwen2_moe",
    "qwen3_moe": "qwen3_moe",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
}
"""HF ``model_type`` -> our architecture name (``--arch`` takes the same names)."""

HF_CLASS_BY_ARCH = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}
HF_MODEL_TYPE_BY_ARCH = {"gemma3": "gemma3_text"}
"""Where the ``model_type`` a config.json needs is not the arch name (Gemma3ForCausalLM's text config)."""

ZERO_CENTRED_NORM = frozenset({"gemma2", "gemma3"})
"""Archs whose RMSNorm weights are stored zero-centred: HF computes ``x * (1 + w)``. Megatron-Core does
the same only with ``layernorm_zero_centered_gamma`` (Megatron-LM's ``--apply-layernorm-1p``, turned
into that TransformerConfig field by ``core_transformer_config_from_args``; Megatron-Bridge's Gemma
providers set it). Only then do the weights copy unchanged, so the export writes the setting and an
import refuses a Megatron checkpoint whose args do not record it (and a zero-centred checkpoint into
an arch that is not): adding or dropping the 1.0 silently would shift every norm."""

SQRT_HIDDEN_EMBEDDING = frozenset({"gemma2", "gemma3"})
"""Archs whose model multiplies the embedding output by ``sqrt(hidden_size)`` (HF Gemma's
``normalizer``; Megatron-Bridge's Gemma embedding). A model-level fact, no weight changes: it is kept
by keeping the arch (config.json ``model_type``; ``hf_config_extra.model_type`` in Megatron args)."""

HF_EXTRA_KEYS: dict[str, tuple[str, ...]] = {
    "gemma2": ("model_type", "hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping",
               "final_logit_softcapping", "sliding_window", "layer_types", "rope_parameters", "attention_bias",
               "pad_token_id", "bos_token_id", "eos_token_id"),
    "gemma3": ("model_type", "hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping",
               "final_logit_softcapping", "sliding_window", "layer_types", "rope_parameters", "rope_scaling",
               "rope_local_base_freq", "sliding_window_pattern", "_sliding_window_pattern",
               "use_bidirectional_attention", "attention_bias", "pad_token_id", "bos_token_id", "eos_token_id"),
}
"""HF config keys with no Megatron argument of the same meaning (soft-capping, sliding window and
its per-layer pattern, local/global RoPE, the attention scale). They travel verbatim in the Megatron
args under ``hf_config_extra`` so a round trip HF -> Megatron -> HF gives the same model."""
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
"""Special token ids of every arch's config.json, carried in ``hf_config_extra`` so a round trip keeps
them (generation stops at ``eos_token_id``)."""

_GEMMA_UNCARRIED = {"query_pre_attn_scalar": "the attention scale", "attn_logit_softcapping": "attention soft-capping",
                    "final_logit_softcapping": "logit soft-capping", "sliding_window": "the sliding window",
                    "hidden_activation": "the tanh GELU", "rope_local_base_freq": "the local layers' RoPE base",
                    "use_bidirectional_attention": "bidirectional attention"}


def _rope_theta_of(rope: Any) -> float | None:
    """The RoPE base in transformers 5's ``rope_parameters``: flat for one RoPE, or per layer type (Gemma 3's
    ``{"full_attention": {...}, "sliding_attention": {...}}``), where the global layers' base is what Megatron's
    ``rotary_base`` means. A probe's Gemma 3 export wrote the default 10000 for bases of 1e6 and 1000."""
    if not isinstance(rope, dict):
        return None
    if "rope_theta" in rope:
        return rope["rope_theta"]
    full = rope.get("full_attention")
    return full.get("rope_theta") if isinstance(full, dict) else None


def _local_rope_base(extra: dict) -> bool:
    """Whether the local (sliding-window) layers have a RoPE base of their own, in either spelling."""
    if extra.get("rope_local_base_freq") not in (None, False):
        return True
    rope = extra.get("rope_parameters")
    local = rope.get("sliding_attention") if isinstance(rope, dict) else None
    return isinstance(local, dict) and local.get("rope_theta") is not None


def _gemma_export_notes(cfg: "ModelConfig") -> list[str]:
    """What a Gemma 2/3 Megatron export carries only in ``hf_config_extra``: a probe found pairs of models
    whose logits differ by 0.6-4.0 written with the same Megatron args, so say it after every export."""
    extra = cfg.hf_extra or {}
    missing = [what for key, what in _GEMMA_UNCARRIED.items()
               if extra.get(key) not in (None, False) or (key == "rope_local_base_freq" and _local_rope_base(extra))]
    if not missing:
        return []
    return [f"{cfg.arch}: {', '.join(missing)} travel only in hf_config_extra (for the way back to HF); the "
            f"Megatron args do not describe them, so a megatron-core GPTModel built from these args alone "
            f"computes another model (Megatron-Bridge's Gemma providers add them)"]


HF_EXTRA_REQUIRED = frozenset({"gemma2", "gemma3"})
"""Archs whose config.json cannot be derived from Megatron args alone: their models compute with facts only
HF spells (soft-capping, sliding window and its pattern, the attention scale, local/global RoPE). Without
``hf_config_extra`` (a Megatron-LM run that never saw HF, a Megatron-Bridge save) transformers would fill in
its defaults, another model that loads without a complaint: refused unless ``--hf-config`` gives them."""

ROPE_CARRIED_BY_ARCH = frozenset({"gemma2", "gemma3"})
"""Archs whose RoPE (per layer type: local and global bases) travels only in ``hf_config_extra``; the others'
RoPE scaling is translated to Megatron args by mappings/rope.py, or refused."""

MLA_ARCHS: set[str] = set()
"""Multi-latent-attention archs: their attention tensors are not ``heads x head_dim`` (``hf_shape_problems``
leaves them be) and their local spec has no torch_dist keys map (the Megatron names follow ``--spec``)."""
MTP_ARCHS: set[str] = set()
"""Archs whose HF checkpoints keep multi-token-prediction layers after the decoder's, DeepSeek-V3's way
(``model.layers.{num_hidden_layers + k}``; mappings/deepseek.py renames them for the rules)."""
EXPERT_FFN_IS_INTERMEDIATE: set[str] = {"mixtral"}
"""Archs whose HF ``intermediate_size`` is the experts' FFN size (no ``moe_intermediate_size``)."""
RENORMALISED_TOPK_ARCHS: set[str] = {"qwen2_moe", "qwen3_moe"}
"""Archs whose config says by ``norm_topk_prob`` whether the top-k routing weights are renormalised
(Megatron: ``moe_router_pre_softmax`` False renormalises; True keeps the full softmax's weights)."""
LOCAL_EXPERTS_KEY: set[str] = {"mixtral"}
"""Archs whose HF config counts experts as ``num_local_experts`` (else ``num_experts``)."""
MEGATRON_FACT_KEYS = ("normalization", "softmax_type", "glu_linear_offset", "activation_func_clamp_value",
                      "quick_geglu", "openai_gelu", "squared_relu",
                      "add_bias_linear", "gated_linear_unit", "swiglu", "window_size", "window_attn_skip_freq",
                      "position_embedding_type", "rotary_interleaved", "qk_l2_norm", "no_rope_freq",
                      "moe_layer_freq", "moe_apply_probs_on_input", "moe_router_score_function", "rotary_percent",
                      "moe_router_topk_scaling_factor", "moe_router_enable_expert_bias", "moe_shared_expert_gate",
                      "moe_router_pre_softmax", "moe_router_num_groups", "moe_router_group_topk", "softmax_scale",
                      "moe_router_load_balancing_type")
"""Megatron args that decide what a layer computes beyond the tensors (kept in ``megatron_facts``)."""
MEGATRON_ARGS_HOOKS: dict[str, Callable[[ModelConfig, dict[str, Any]], None]] = {}
"""Arch -> edits of the Megatron args ``to_megatron_args`` writes (the arch's activation, attention)."""
HF_READ_HOOKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
"""Arch -> ``ModelConfig`` fields read from its config.json where the generic reading is wrong."""
EXPORT_NOTES: dict[str, Callable[[ModelConfig], list[str]]] = {"gemma2": _gemma_export_notes,
                                                                "gemma3": _gemma_export_notes}
"""Arch -> what a Megatron-Core export cannot carry (said in the convert notes and after the export)."""
HF_EXPORT_NOTES: dict[str, Callable[[ModelConfig], list[str]]] = {}
"""Arch -> what an HF export of a Megatron model computes otherwise (said as ``EXPORT_NOTES`` are)."""
HF_CONFIG_HOOKS: dict[str, Callable[[ModelConfig, dict[str, Any]], None]] = {}
"""Arch -> edits of the config.json ``to_hf_config`` derives."""
MEGATRON_CHECKS: dict[str, Callable[[ModelConfig], list[str]]] = {}
"""Arch -> why a Megatron checkpoint of it would compute something else in HF (one line each)."""
def fact_problems(cfg: ModelConfig, wanted: tuple[tuple[str, Any, str], ...]) -> list[str]:
    """``MEGATRON_CHECKS`` helper: one line per ``(arg, value, why)`` the Megatron args do not say."""
    facts = cfg.megatron_facts or {}
    problems = []
    for key, value, why in wanted:
        if facts.get(key) != value:
            said = "do not record" if key not in facts else f"say {facts[key]!r} for"
            problems.append(f"its Megatron args {said} {key} ({why})")
    return problems


ARCH_FACTS: dict[str, list[str]] = {}
"""Arch -> model-level facts in words (``ckptscope archs``), for archs registered from their own module."""


def arch_facts(arch: str) -> list[str]:
    """Model-level facts of ``arch`` a conversion carries beside the tensors (``ckptscope archs``)."""
    facts = []
    if arch in ZERO_CENTRED_NORM:
        facts.append("RMSNorm weights are zero-centred (x * (1 + w)); Megatron args must say apply_layernorm_1p "
                     "/ layernorm_zero_centered_gamma, else the export refuses")
    if arch in SQRT_HIDDEN_EMBEDDING:
        facts.append("the embedding output is multiplied by sqrt(hidden_size) (kept with the arch, no weight change)")
    facts += ARCH_FACTS.get(arch, [])
    if arch in _window.WINDOW_ARCHS:
        facts.append("a sliding window of W positions <-> window_size (W-1, 0)"
                     + ("" if arch in _window.WINDOW_ON_EVERY_LAYER else
                        "; the layers using it (layer_types) <-> window_attn_skip_freq as a per-layer list"))
    if arch not in ROPE_CARRIED_BY_ARCH:
        facts.append(_rope.fact(mla=arch in MLA_ARCHS))
    if arch in HF_EXTRA_KEYS:
        facts.append("config keys carried in Megatron args (hf_config_extra): " + ", ".join(HF_EXTRA_KEYS[arch]))
    return facts


@dataclass(frozen=True)
class ModelConfig:
    """Architecture facts in neutral names. ``None`` means "not known from this source"."""

    arch: str | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    ffn_hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int | None = None
    """The true (HF) vocabulary: rows at or beyond it in a Megatron table are padding."""
    padded_vocab_size: int | None = None
    make_vocab_size_divisible_by: int | None = None
    tie_word_embeddings: bool | None = None
    qkv_bias: bool | None = None
    linear_bias: bool | None = None
    """Every linear layer has a bias: Megatron's ``add_bias_linear`` (its default), HF Llama's
    ``attention_bias`` and ``mlp_bias`` together (q/k/v/o and gate/up/down)."""
    qk_norm: bool | None = None
    swiglu: bool | None = None
    num_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    shared_expert_ffn_hidden_size: int | None = None
    moe_router_topk: int | None = None
    moe_layer_freq: tuple[int, ...] | None = None
    """Per decoder layer 1 for MoE, 0 for a dense MLP (Megatron's ``moe_layer_freq`` list; Qwen MoE's
    ``mlp_only_layers`` / ``decoder_sparse_step``), when some layer is dense; None: every layer is MoE (or
    another arch's own key says it)."""
    norm_epsilon: float | None = None
    rope_theta: float | None = None
    max_position_embeddings: int | None = None
    dtype: str | None = None
    zero_centered_norm: bool | None = None
    """What the *Megatron* side records (``apply_layernorm_1p``); HF configs leave it unknown."""
    hf_extra: dict[str, Any] | None = None
    """Arch-specific HF config keys (``HF_EXTRA_KEYS``), verbatim."""
    mtp_num_layers: int | None = None
    """Multi-token-prediction layers the *tensors* hold (Megatron's ``mtp_num_layers``)."""
    megatron_facts: dict[str, Any] | None = None
    """What the Megatron args say of ``MEGATRON_FACT_KEYS`` (checked by ``MEGATRON_CHECKS``)."""
    rope_scaling: dict[str, Any] | None = None
    """The RoPE scaling the *HF* config says, in its spelling (``{"rope_type": "default"}`` when unscaled)."""
    megatron_rope: dict[str, Any] | None = None
    """The RoPE scaling the *Megatron* args describe, in HF spelling (mappings/rope.py)."""
    sliding_window: int | None = None
    """An HF config's sliding attention window when it applies (Mistral's ``sliding_window``, Qwen's with
    ``use_sliding_window``) and is shorter than ``max_position_embeddings``; None otherwise."""
    window_layers: tuple[bool, ...] | None = None
    """Which layers use ``sliding_window`` (Llama family, ``mappings.window``); None outside it."""
    hidden_act: str | None = None
    """The HF config's MLP activation as it spells it (``silu``, ``gelu``, ``gelu_pytorch_tanh`` ...)."""
    norm_topk_prob: bool | None = None
    """Whether the router renormalises the top-k weights (HF ``norm_topk_prob``; Megatron: not
    ``moe_router_pre_softmax``). Qwen2/3-MoE configs say it; transformers' default is False."""
    hf_model_type: str | None = None
    """The config.json's own ``model_type``, mapped or not: one no rule maps is refused, never guessed."""
    megatron_flags: dict[str, Any] | None = None
    """The Megatron args' on/off flags this config was read from, as stored (``MEGATRON_FLAGS``): a flag that
    is no boolean (``untie_embeddings_and_output_weights: "abc"``) would read as set; ``check_model_sizes``
    refuses it."""

    def merged(self, other: "ModelConfig") -> "ModelConfig":
        """Fill this config's unknowns from ``other`` (this side wins where both know)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in values.items():
            if value is None:
                values[key] = getattr(other, key)
        return ModelConfig(**values)

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts)

    @property
    def queries_per_group(self) -> int:
        return self.require("num_attention_heads") // self.require("num_kv_heads")

    def require(self, name: str) -> Any:
        value = getattr(self, name)
        if value is None:
            hint = "--arch NAME" if name == "arch" else "--hf-config DIR (a config.json that says it)"
            raise CkptError(f"the model config does not say {name}; pass {hint}")
        return value

    def with_shapes(self, **known: Any) -> "ModelConfig":
        return replace(self, **{k: v for k, v in known.items() if getattr(self, k) is None and v is not None})

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _first(mapping: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if mapping.get(key) is not None:
            return mapping[key]
    return None


MAX_LAYERS = 10_000
"""More decoder layers than any model has: a config that says more is damaged (a probe: 10**15 layers made
the per-layer rules build a set of that size)."""
_SIZE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "vocab_size", "max_position_embeddings", "moe_intermediate_size",
              "shared_expert_intermediate_size", "num_experts", "num_local_experts", "n_routed_experts",
              "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace", "decoder_sparse_step",
              "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "n_group",
              "topk_group", "num_nextn_predict_layers", "sliding_window", "interleave_moe_layer_step",
              "max_window_layers", "attention_chunk_size", "sliding_window_pattern")
"""Integer keys of the configs the mappings read: whole numbers, never negative (null: not said)."""
_POSITIVE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings")
_REAL_KEYS = ("rms_norm_eps", "rope_theta", "routed_scaling_factor", "swiglu_limit", "partial_rotary_factor",
              "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping", "rope_local_base_freq")
_BOOL_KEYS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "qkv_bias", "norm_topk_prob", "use_qk_norm",
              "use_sliding_window")
_INT_LIST_KEYS = ("mlp_only_layers", "moe_layers", "no_rope_layers")
_STR_LIST_KEYS = ("layer_types", "architectures")
_STR_KEYS = ("model_type", "hidden_act", "hidden_activation", "torch_dtype", "dtype")


MODEL_SIZES = (("num_layers", "num_hidden_layers / num_layers", MAX_LAYERS), ("hidden_size", "hidden_size", 2**31),
               ("ffn_hidden_size", "intermediate_size / ffn_hidden_size", 2**31),
               ("num_attention_heads", "num_attention_heads", 2**20), ("num_kv_heads", "num_key_value_heads", 2**20),
               ("head_dim", "head_dim / kv_channels", 2**20), ("vocab_size", "vocab_size", 2**31),
               ("num_experts", "the expert count", 2**20), ("moe_ffn_hidden_size", "moe_intermediate_size", 2**31),
               ("moe_router_topk", "num_experts_per_tok / moe_router_topk", 2**20))
"""Sizes the exports loop over or multiply: (field, how configs spell it, a bound no real model reaches)."""


MEGATRON_FLAGS = ("untie_embeddings_and_output_weights", "group_query_attention", "add_qkv_bias", "add_bias_linear",
                  "qk_layernorm", "swiglu", "gated_linear_unit", "moe_router_pre_softmax", "apply_layernorm_1p",
                  "layernorm_zero_centered_gamma", "rotary_interleaved", "qk_l2_norm", "openai_gelu", "squared_relu",
                  "quick_geglu", "bf16", "fp16")
"""Megatron's store_true args that ``from_megatron_args`` reads as on/off: argparse stores True or False."""


def check_model_sizes(cfg: ModelConfig, path: str | Path | None = None) -> None:
    """Refuse, in one line, a model config (from config.json or Megatron args) whose sizes no model has:
    not a positive integer (``"4"``, ``[2]``), beyond any real model (10**15 layers), or a top-k routing
    to more experts than there are (a probe: top-k 2**63 of 4 experts exported with exit 0); or a
    Megatron flag that is no boolean (``"abc"`` read as set: a tied head exported untied, exit 0)."""
    for flag, value in (cfg.megatron_flags or {}).items():
        if value is not None and not isinstance(value, bool) and value not in (0, 1):
            raise CkptError(f"the model config's {flag} is {value!r}, not true or false", path)
    for name, spelled, bound in MODEL_SIZES:
        value = getattr(cfg, name)
        if value is None or (name == "moe_router_topk" and not cfg.num_experts):  # (a dense model's is unused)
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= bound:
            raise CkptError(f"the model config's {spelled} is {value!r}, not a positive integer"
                            f"{f' up to {bound:,}' if isinstance(value, int) and not isinstance(value, bool) else ''}",
                            path)
    if cfg.num_experts and cfg.moe_router_topk and cfg.moe_router_topk > cfg.num_experts:
        raise CkptError(f"the model config's top-k routes each token to {cfg.moe_router_topk} experts "
                        f"(num_experts_per_tok / moe_router_topk), of only {cfg.num_experts}", path)


def check_hf_config_types(config: dict[str, Any], where: str = "config.json") -> None:
    """Refuse, in one line, a config whose keys the mappings compute with hold values of another type (a
    probe: ``"qk_rope_head_dim": {}``, ``"swiglu_limit": [4]``, ``"first_k_dense_replace": "abc"`` were
    "internal error: TypeError"): transformers would not build the model either. Checks the text config of
    a multimodal one too."""
    for text, prefix in ((config, ""), (config.get("text_config"), "text_config.")):
        if not isinstance(text, dict):
            continue
        for key in _SIZE_KEYS:
            value = text.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise CkptError(f"{where}: {prefix}{key} is {value!r}, not a whole number >= 0")
            if value == 0 and key in _POSITIVE_KEYS:
                raise CkptError(f"{where}: {prefix}{key} is 0, not a positive integer")
        layers = text.get("num_hidden_layers")
        if isinstance(layers, int) and layers > MAX_LAYERS:
            raise CkptError(f"{where}: {prefix}num_hidden_layers is {layers}, not a positive integer up to "
                            f"{MAX_LAYERS:,} (more than any model has)")
        for key in _REAL_KEYS:
            value = text.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise CkptError(f"{where}: {prefix}{key} is {value!r}, not a finite number")
        for key, kinds, what in ((_BOOL_KEYS, bool, "true or false"), (_STR_KEYS, str, "a string")):
            for name in key:
                value = text.get(name)
                if value is not None and not isinstance(value, kinds):
                    raise CkptError(f"{where}: {prefix}{name} is {value!r}, not {what}")
        for key in _INT_LIST_KEYS:
            value = text.get(key)
            if value is not None and not (isinstance(value, list) and all(
                    isinstance(v, int) and not isinstance(v, bool) for v in value)):
                raise CkptError(f"{where}: {prefix}{key} is {value!r}, not a list of layer numbers")
        for key in _STR_LIST_KEYS:
            value = text.get(key)
            if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise CkptError(f"{where}: {prefix}{key} is {value!r}, not a list of strings")


def from_hf_config(config: dict[str, Any]) -> ModelConfig:
    """Read a transformers ``config.json`` (dense and MoE Llama/Mistral/Qwen families). Raises ``CkptError``
    for keys of the wrong type (``check_hf_config_types``)."""
    check_hf_config_types(config)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    heads = _first(text, "num_attention_heads")
    hidden = _first(text, "hidden_size")
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    arch = ARCH_BY_MODEL_TYPE.get(model_type)
    head_dim = _first(text, "head_dim")
    if head_dim is None and heads and hidden:
        head_dim = hidden // heads
    num_experts = _first(text, "num_local_experts", "num_experts", "n_routed_experts")
    shared_experts = _first(text, "shared_expert_intermediate_size")
    if shared_experts is None and _first(text, "n_shared_experts") and _first(text, "moe_intermediate_size"):
        shared_experts = text["n_shared_experts"] * text["moe_intermediate_size"]  # DeepSeek: n copies, one MLP
    rope = text.get("rope_parameters")  # transformers >= 5 keeps rope_theta there (flat for one RoPE)
    rope_theta = _first(text, "rope_theta") or _rope_theta_of(rope)
    # Qwen2-MoE spells it qkv_bias (default true), the rest attention_bias
    qkv_bias = _first(text, "qkv_bias") if arch == "qwen2_moe" else _first(text, "attention_bias")
    hf_extra = {k: text[k] for k in HF_EXTRA_KEYS[arch] if k in text} if arch in HF_EXTRA_KEYS else None
    found = _rope.hf_rope(text)
    if hf_extra is None and found and _rope.kind(found[1]) != "default":
        hf_extra = {found[0]: found[1]}  # kept verbatim in hf_config_extra, so the way back restores it
    tokens = {k: text[k] for k in TOKEN_ID_KEYS if text.get(k) is not None}
    if tokens:  # every arch: a round trip lost them (generation no longer knew its stop token; a probe)
        hf_extra = {**tokens, **(hf_extra or {})}
    if qkv_bias is None and arch in ("qwen2", "qwen2_moe"):
        qkv_bias = True  # Qwen2's config has no flag: its q/k/v projections always carry biases
    return replace(ModelConfig(
        arch=arch,
        hf_model_type=model_type or None,
        num_layers=_first(text, "num_hidden_layers"),
        hidden_size=hidden,
        ffn_hidden_size=_first(text, "intermediate_size"),
        num_attention_heads=heads,
        num_kv_heads=_first(text, "num_key_value_heads") or heads,
        head_dim=head_dim,
        vocab_size=_first(text, "vocab_size"),
        tie_word_embeddings=bool(_first(config, "tie_word_embeddings") or False),
        qkv_bias=bool(qkv_bias),
        linear_bias=bool(qkv_bias) and bool(_first(text, "mlp_bias")) if arch == "llama" else False,
        qk_norm=arch in ("qwen3", "qwen3_moe", "gemma3"),
        swiglu=str(_first(text, "hidden_act", "hidden_activation") or "silu") == "silu",
        hidden_act=str(_first(text, "hidden_act", "hidden_activation") or "silu"),
        sliding_window=effective_window(text),
        window_layers=_window.window_layers(text, arch or ""),
        num_experts=num_experts,
        moe_ffn_hidden_size=_first(text, "moe_intermediate_size") or (_first(text, "intermediate_size")
                                                                      if arch in EXPERT_FFN_IS_INTERMEDIATE else None),
        shared_expert_ffn_hidden_size=shared_experts,
        moe_router_topk=_first(text, "num_experts_per_tok"),
        moe_layer_freq=_qwen_moe_layer_freq(text, arch),
        norm_topk_prob=bool(text.get("norm_topk_prob", False)) if arch in RENORMALISED_TOPK_ARCHS else None,
        norm_epsilon=_first(text, "rms_norm_eps"),
        rope_theta=rope_theta,
        max_position_embeddings=_first(text, "max_position_embeddings"),
        dtype=_first(config, "torch_dtype", "dtype"),
        hf_extra=hf_extra,
        rope_scaling=None if arch in ROPE_CARRIED_BY_ARCH else _rope.scaling_of(text),
    ), **(HF_READ_HOOKS[arch](text) if arch in HF_READ_HOOKS else {}))


QWEN_MOE_ARCHS = ("qwen2_moe", "qwen3_moe")


def _qwen_moe_layer_freq(text: dict[str, Any], arch: str | None) -> tuple[int, ...] | None:
    """Qwen2/3-MoE's dense layers (``mlp_only_layers``, ``decoder_sparse_step``) as a ``moe_layer_freq``
    list, by transformers' own rule (``hf_layout.moe_layers``); None when every layer is MoE."""
    layers = text.get("num_hidden_layers")
    if arch not in QWEN_MOE_ARCHS or not isinstance(layers, int):
        return None
    moe = _hf_layout.moe_layers(arch, text, layers) or set()
    return None if len(moe) == layers else tuple(int(i in moe) for i in range(layers))


def megatron_moe_layer_freq(args: dict[str, Any]) -> tuple[int, ...] | None:
    """Megatron's ``moe_layer_freq`` per layer (a 0/1 list, or every N-th layer from layer 0, as
    ``TransformerConfig`` expands an int); None when every layer is MoE or the args do not say."""
    freq, layers = args.get("moe_layer_freq"), args.get("num_layers")
    if isinstance(freq, (list, tuple)) and all(f in (0, 1) for f in freq):
        if isinstance(layers, int) and len(freq) != layers:
            raise CkptError(f"the Megatron args' moe_layer_freq has {len(freq)} entries for {layers} layers")
        pattern = tuple(int(f) for f in freq)
    elif isinstance(freq, int) and not isinstance(freq, bool) and freq > 1 and isinstance(layers, int):
        pattern = tuple(int(i % freq == 0) for i in range(layers))
    else:
        return None
    return None if all(pattern) else pattern


def from_megatron_args(args: dict[str, Any]) -> ModelConfig:
    """Read the ``argparse.Namespace`` Megatron stores in common.pt / model_optim_rng.pt."""
    heads = args.get("num_attention_heads")
    hidden = args.get("hidden_size")
    groups = args.get("num_query_groups") if args.get("group_query_attention") else None
    whole = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (hidden, heads))
    # (a value of another type is refused by name where the shapes are checked, plan._model_config_problems)
    head_dim = args.get("kv_channels") or (hidden // heads if whole else None)
    num_experts = args.get("num_experts")
    dtype = "bfloat16" if args.get("bf16") else "float16" if args.get("fp16") else None
    extra = args.get("hf_config_extra") if isinstance(args.get("hf_config_extra"), dict) else None
    zero_centred = _first(args, "apply_layernorm_1p", "layernorm_zero_centered_gamma")
    return ModelConfig(
        arch=ARCH_BY_MODEL_TYPE.get(str((extra or {}).get("model_type"))),
        num_layers=args.get("num_layers"),
        hidden_size=hidden,
        ffn_hidden_size=args.get("ffn_hidden_size"),
        num_attention_heads=heads,
        num_kv_heads=groups or heads,
        head_dim=head_dim,
        vocab_size=args.get("vocab_size") if isinstance(args.get("vocab_size"), int) else None,
        padded_vocab_size=args.get("padded_vocab_size"),
        make_vocab_size_divisible_by=args.get("make_vocab_size_divisible_by"),
        tie_word_embeddings=(not args["untie_embeddings_and_output_weights"]
                             if "untie_embeddings_and_output_weights" in args else None),
        qkv_bias=(bool(args.get("add_qkv_bias")) or bool(args.get("add_bias_linear"))
                  if "add_qkv_bias" in args or "add_bias_linear" in args else None),
        linear_bias=bool(args["add_bias_linear"]) if "add_bias_linear" in args else None,
        qk_norm=args.get("qk_layernorm") if "qk_layernorm" in args else None,
        swiglu=args.get("swiglu") if "swiglu" in args else None,
        num_experts=num_experts,
        moe_ffn_hidden_size=args.get("moe_ffn_hidden_size"),
        shared_expert_ffn_hidden_size=args.get("moe_shared_expert_intermediate_size"),
        moe_router_topk=args.get("moe_router_topk"),
        moe_layer_freq=megatron_moe_layer_freq(args) if num_experts else None,
        norm_topk_prob=not args.get("moe_router_pre_softmax", False) if num_experts else None,
        norm_epsilon=args.get("norm_epsilon"),
        rope_theta=args.get("rotary_base"),
        max_position_embeddings=args.get("max_position_embeddings"),
        dtype=dtype,
        zero_centered_norm=bool(zero_centred) if zero_centred is not None else None,
        hf_extra=dict(extra) if extra else None,
        mtp_num_layers=args.get("mtp_num_layers"),
        megatron_facts={k: args[k] for k in MEGATRON_FACT_KEYS if k in args} or None,
        megatron_flags={k: args[k] for k in MEGATRON_FLAGS if k in args} or None,
        rope_scaling=_rope.scaling_of(extra) if extra and _rope.hf_rope(extra) else None,
        megatron_rope=_rope.from_megatron_args(args),
    )


_AGREEING_FIELDS = (("rope_theta", "rope_theta", "rotary_base"), ("norm_epsilon", "rms_norm_eps", "norm_epsilon"),
                    ("moe_router_topk", "num_experts_per_tok", "moe_router_topk"),
                    ("norm_topk_prob", "norm_topk_prob", "not moe_router_pre_softmax"),
                    ("tie_word_embeddings", "tie_word_embeddings", "not untie_embeddings_and_output_weights"),
                    ("num_experts", "the expert count", "num_experts"),
                    ("moe_ffn_hidden_size", "moe_intermediate_size", "moe_ffn_hidden_size"),
                    ("shared_expert_ffn_hidden_size", "the shared expert's size", "moe_shared_expert_intermediate_size"),
                    ("head_dim", "head_dim", "kv_channels"),
                    ("moe_layer_freq", "the dense layers (mlp_only_layers, decoder_sparse_step)", "moe_layer_freq"))
"""(ModelConfig field, its HF spelling, its Megatron spelling) that an HF config and the Megatron args
both state, and must state alike for the export to compute the trained model."""
_AGREEING_FACTS = (("moe_router_topk_scaling_factor", "routed_scaling_factor", 1.0),
                   ("moe_router_num_groups", "n_group", None), ("moe_router_group_topk", "topk_group", None))
"""(Megatron arg, HF key, Megatron's default when the args lack it) of DeepSeek-style routing."""


def _is_number(value: Any) -> bool:
    """A real number as JSON or a pickled Namespace carries one (never a bool, a string or a list)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def hf_config_conflicts(args_cfg: ModelConfig, hf_config: dict[str, Any]) -> list[str]:
    """Where ``hf_config`` (``--hf-config``, or the one a Megatron save carries) says another model than
    the Megatron args, one line each. The HF config's values are what the export writes, so a run
    trained with another RoPE base, norm epsilon, top-k or scaling would come out another model with
    exit 0 (a probe measured logits off by 0.005-2.6)."""
    return [c.line for c in config_conflicts(args_cfg, hf_config)]


@dataclass(frozen=True)
class Conflict:
    """One fact an HF config and the Megatron args state otherwise (``config_conflicts``)."""

    fact: str
    """The Megatron spelling of what differs (``rotary_base``, ``swiglu``)."""
    hf: Any
    """What the HF config says (its own spelling's value)."""
    args: Any
    """What the Megatron args say."""
    line: str
    """The whole sentence, as convert refuses with it."""


def config_conflicts(args_cfg: ModelConfig, hf_config: dict[str, Any]) -> list[Conflict]:
    """``hf_config_conflicts``, each with the two values apart (``diff`` shows them side by side)."""
    hf = from_hf_config(hf_config)
    problems = []
    for name, hf_name, megatron_name in _AGREEING_FIELDS:
        if name == "head_dim" and hf.arch in MLA_ARCHS:
            continue  # MLA's heads are q/k/v dims of their own (checked by the MLA mapping)
        ours, theirs = getattr(args_cfg, name), getattr(hf, name)
        if ours is None or theirs is None:
            continue
        if isinstance(ours, float) or isinstance(theirs, float):
            if not all(_is_number(v) for v in (ours, theirs)):
                # (the HF side is type-checked on reading; a probe set the args' norm_epsilon to [] or "")
                problems.append(Conflict(megatron_name, theirs, ours,
                                         f"the Megatron args' {megatron_name} is {ours!r}, not a number"))
                continue
            same = math.isclose(float(ours), float(theirs), rel_tol=1e-9)
        else:
            same = ours == theirs
        if not same:
            problems.append(Conflict(megatron_name, theirs, ours,
                                     f"{hf_name} {theirs!r} where the Megatron args say {megatron_name} {ours!r}"))
    facts = args_cfg.megatron_facts or {}
    if hf.arch and not _carries_own_window(hf.arch):  # (Gemma and GPT-OSS carry their own activation)
        act = megatron_activation(args_cfg) if "swiglu" in facts else None
        if act is not None and hf.hidden_act is not None and act != hf.hidden_act:
            problems.append(Conflict("swiglu", hf.hidden_act, act, f"hidden_act {hf.hidden_act!r} where the Megatron "
                                     f"args compute {act} (swiglu={facts.get('swiglu')})"))
    text = hf_config.get("text_config") if isinstance(hf_config.get("text_config"), dict) else hf_config
    if (hf.arch in MLA_ARCHS or hf.arch == "glm4_moe") and hf.is_moe:
        for key, hf_key, default in _AGREEING_FACTS:
            ours, theirs = facts.get(key, default), text.get(hf_key)
            if ours is None or theirs is None:
                continue
            if not _is_number(ours):  # (a probe set moe_router_group_topk to [])
                problems.append(Conflict(key, theirs, ours, f"the Megatron args' {key} is {ours!r}, not a number"))
                continue
            if not _is_number(theirs):
                problems.append(Conflict(key, theirs, ours, f"config.json: {hf_key} is {theirs!r}, not a number"))
                continue
            if not math.isclose(float(ours), float(theirs), rel_tol=1e-9):
                problems.append(Conflict(key, theirs, ours,
                                         f"{hf_key} {theirs!r} where the Megatron args say {key} {ours!r}"))
        score = facts.get("moe_router_score_function")
        if score not in (None, "sigmoid"):
            problems.append(Conflict("moe_router_score_function", "sigmoid", score, f"a sigmoid router where the "
                                     f"Megatron args say moe_router_score_function {score!r}"))
    window = facts.get("window_size")
    sliding = text.get("sliding_window")
    if hf.arch == "gpt_oss" and isinstance(window, (list, tuple)) and len(window) == 2 and isinstance(sliding, int):
        if window[0] + 1 != sliding:
            problems.append(Conflict("window_size", sliding, list(window), f"sliding_window {sliding} where the "
                                     f"Megatron args say window_size {list(window)} (a window of {window[0] + 1})"))
    return problems


_ARGS_FIELDS = (("num_layers", "num_layers"), ("hidden_size", "hidden_size"), ("ffn_hidden_size", "ffn_hidden_size"),
                ("num_attention_heads", "num_attention_heads"), ("num_kv_heads", "num_query_groups"),
                ("head_dim", "kv_channels"), ("vocab_size", "vocab_size"), ("qkv_bias", "add_qkv_bias"),
                ("linear_bias", "add_bias_linear"), ("qk_norm", "qk_layernorm"), ("swiglu", "swiglu"),
                ("num_experts", "num_experts"), ("moe_ffn_hidden_size", "moe_ffn_hidden_size"),
                ("shared_expert_ffn_hidden_size", "moe_shared_expert_intermediate_size"),
                ("moe_router_topk", "moe_router_topk"), ("moe_layer_freq", "moe_layer_freq"),
                ("norm_epsilon", "norm_epsilon"), ("rope_theta", "rotary_base"),
                ("zero_centered_norm", "apply_layernorm_1p"), ("mtp_num_layers", "mtp_num_layers"),
                ("megatron_rope", "rope_scaling"), ("arch", "hf_config_extra.model_type"))
"""(ModelConfig field, the Megatron arg a user knows it by) of what two saves' args say the model computes:
its shape, biases, norms, RoPE, MoE routing. Not the parallel layout (TP, PP, EP, the padded vocabulary),
which two saves of one model may differ in."""


def args_differences(cfg_a: ModelConfig, cfg_b: ModelConfig) -> list[tuple[str, Any, Any]]:
    """``(arg, A's, B's)`` for every fact two saves' Megatron args (``from_megatron_args``) state otherwise
    (``diff``): equal tensors under another RoPE base, activation or router are another model. A fact
    one side does not state (an older Megatron's args lack it) is not a difference; neither is a number
    spelt as an int on one side and a float on the other."""
    out: list[tuple[str, Any, Any]] = []

    def differ(a: Any, b: Any) -> bool:
        if _is_number(a) and _is_number(b):
            return not math.isclose(float(a), float(b), rel_tol=1e-9)
        return a != b

    for name, arg in _ARGS_FIELDS:
        a, b = getattr(cfg_a, name), getattr(cfg_b, name)
        if a is not None and b is not None and differ(a, b):
            out.append((arg, a, b))
    if cfg_a.tie_word_embeddings is not None and cfg_b.tie_word_embeddings is not None \
            and cfg_a.tie_word_embeddings != cfg_b.tie_word_embeddings:
        out.append(("untie_embeddings_and_output_weights", not cfg_a.tie_word_embeddings, not cfg_b.tie_word_embeddings))
    if cfg_a.norm_topk_prob is not None and cfg_b.norm_topk_prob is not None \
            and cfg_a.norm_topk_prob != cfg_b.norm_topk_prob:
        out.append(("moe_router_pre_softmax", not cfg_a.norm_topk_prob, not cfg_b.norm_topk_prob))
    facts_a, facts_b = cfg_a.megatron_facts or {}, cfg_b.megatron_facts or {}
    for key in MEGATRON_FACT_KEYS:
        if key in facts_a and key in facts_b and key not in ("swiglu", "add_bias_linear", "moe_layer_freq") \
                and differ(facts_a[key], facts_b[key]):
            out.append((key, facts_a[key], facts_b[key]))
    extra_a, extra_b = cfg_a.hf_extra or {}, cfg_b.hf_extra or {}
    for key in [*extra_a, *(k for k in extra_b if k not in extra_a)]:
        if key != "model_type" and key in extra_a and key in extra_b and differ(extra_a[key], extra_b[key]):
            out.append((f"hf_config_extra.{key}", extra_a[key], extra_b[key]))
    return out


def padded_vocab(vocab: int, divisible_by: int = 128, tp: int = 1) -> int:
    """Megatron's padding: ``ceil(V / (m·T)) · (m·T)`` (MAPPING.md §4.1)."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def to_hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """A transformers ``config.json`` for ``cfg`` (used when a Megatron source has no HF config)."""
    arch = cfg.arch or "llama"
    if arch in HF_EXTRA_REQUIRED and not cfg.hf_extra:
        raise CkptError(f"{arch}: the Megatron args do not carry the settings only its HF config spells "
                        f"({', '.join(k for k in HF_EXTRA_KEYS[arch][1:6])} ..., hf_config_extra); pass --hf-config DIR "
                        "(the HF model the run started from)")
    heads = cfg.require("num_attention_heads")
    out: dict[str, Any] = {
        "architectures": [HF_CLASS_BY_ARCH[arch]],
        "model_type": HF_MODEL_TYPE_BY_ARCH.get(arch, arch),
        "hidden_size": cfg.require("hidden_size"),
        "intermediate_size": _hf_intermediate_size(cfg, arch),
        "num_hidden_layers": cfg.require("num_layers"),
        "num_attention_heads": heads,
        "num_key_value_heads": cfg.num_kv_heads or heads,
        "head_dim": cfg.head_dim or cfg.require("hidden_size") // heads,
        "vocab_size": cfg.require("vocab_size"),
        "hidden_act": _hf_activation(cfg, arch),
        "rms_norm_eps": cfg.norm_epsilon or 1e-5,
        "rope_theta": cfg.rope_theta or 10000.0,
        "max_position_embeddings": cfg.max_position_embeddings or 4096,
        "tie_word_embeddings": bool(cfg.tie_word_embeddings),
    }
    if arch in ("llama", "mistral"):
        out["attention_bias"] = bool(cfg.qkv_bias or cfg.linear_bias)
    if arch == "llama" and cfg.linear_bias:
        out["mlp_bias"] = True  # Megatron's add_bias_linear: every linear, the MLP's too
    if arch == "qwen2_moe":
        out["qkv_bias"] = cfg.qkv_bias is not False  # Qwen2-MoE's default: q/k/v biases
    if cfg.dtype:
        set_config_dtype(out, cfg.dtype)
    if cfg.is_moe:
        if arch in LOCAL_EXPERTS_KEY:
            out["num_local_experts"] = cfg.num_experts
        else:
            out["num_experts"] = cfg.num_experts
            out["moe_intermediate_size"] = cfg.moe_ffn_hidden_size
        if cfg.shared_expert_ffn_hidden_size:
            out["shared_expert_intermediate_size"] = cfg.shared_expert_ffn_hidden_size
        if cfg.moe_router_topk:
            out["num_experts_per_tok"] = cfg.moe_router_topk
        if arch in RENORMALISED_TOPK_ARCHS and cfg.norm_topk_prob is not None:
            out["norm_topk_prob"] = cfg.norm_topk_prob
        if arch in QWEN_MOE_ARCHS and cfg.moe_layer_freq is not None:
            out["mlp_only_layers"] = [i for i, moe in enumerate(cfg.moe_layer_freq) if not moe]
            out["decoder_sparse_step"] = 1
    if arch in HF_EXTRA_KEYS:
        out.pop("hidden_act")  # Gemma names it hidden_activation (carried in hf_extra)
        extra = {k: v for k, v in (cfg.hf_extra or {}).items() if k in HF_EXTRA_KEYS[arch]}
        if "rope_parameters" in extra:
            out.pop("rope_theta")  # transformers >= 5 keeps RoPE (local and global) in rope_parameters
        out.update(extra)
        out["model_type"] = HF_MODEL_TYPE_BY_ARCH.get(arch, arch)
    elif cfg.hf_extra and _rope.hf_rope(cfg.hf_extra):
        key, carried = _rope.hf_rope(cfg.hf_extra)
        out[key] = carried  # the HF spelling the model came with, verbatim
        if key == "rope_parameters":
            out.pop("rope_theta")
    carried = cfg.hf_extra or {}
    out.update({key: carried[key] for key in TOKEN_ID_KEYS if carried.get(key) is not None and key not in out})
    if arch not in ROPE_CARRIED_BY_ARCH and not any(key in out for key in _rope.HF_KEYS):
        scaling = cfg.rope_scaling if cfg.rope_scaling is not None else cfg.megatron_rope
        if _rope.kind(scaling) != "default":
            out["rope_scaling"] = dict(scaling)  # read by transformers 4 and 5 alike
    if not _carries_own_window(arch):
        window = _window.from_megatron(cfg.megatron_facts or {}, cfg.num_layers)
        if window is not None:  # hf_export_problems has refused what the arch cannot spell
            out.update(_window.hf_keys(arch, window[0], window[2]))
    if arch in HF_CONFIG_HOOKS:
        HF_CONFIG_HOOKS[arch](cfg, out)
    return out


def to_megatron_args(cfg: ModelConfig, *, tp: int = 1, pp: int = 1, ep: int = 1, ckpt_format: str = "torch_dist",
                     make_vocab_size_divisible_by: int = 128) -> dict[str, Any]:
    """The Megatron argument values a checkpoint of ``cfg`` carries (names as in arguments.py)."""
    window = megatron_window_args(cfg, cfg.arch or "llama")
    heads = cfg.require("num_attention_heads")
    kv = cfg.num_kv_heads or heads
    vocab = cfg.require("vocab_size")
    args: dict[str, Any] = {
        "num_layers": cfg.require("num_layers"),
        "hidden_size": cfg.require("hidden_size"),
        "ffn_hidden_size": cfg.ffn_hidden_size,
        "num_attention_heads": heads,
        "group_query_attention": kv != heads,
        "num_query_groups": kv,
        "kv_channels": cfg.head_dim or cfg.require("hidden_size") // heads,
        "vocab_size": vocab,
        "padded_vocab_size": padded_vocab(vocab, make_vocab_size_divisible_by, tp),
        "make_vocab_size_divisible_by": make_vocab_size_divisible_by,
        "untie_embeddings_and_output_weights": not cfg.tie_word_embeddings,
        "swiglu": _megatron_swiglu(cfg),
        "gated_linear_unit": True,  # every arch we map has a gated MLP ([gate; up] fc1): SwiGLU or GeGLU
        "apply_layernorm_1p": cfg.arch in ZERO_CENTRED_NORM,
        "layernorm_zero_centered_gamma": cfg.arch in ZERO_CENTRED_NORM,
        "normalization": "RMSNorm",
        "norm_epsilon": cfg.norm_epsilon or 1e-5,
        "add_qkv_bias": bool(cfg.qkv_bias),
        "add_bias_linear": bool(cfg.linear_bias),
        "qk_layernorm": bool(cfg.qk_norm),
        "position_embedding_type": "rope",
        "rotary_base": cfg.rope_theta or 10000,
        "max_position_embeddings": cfg.max_position_embeddings or 4096,
        "seq_length": cfg.max_position_embeddings or 4096,
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "ckpt_format": ckpt_format,
        "bf16": cfg.dtype == "bfloat16",
        "fp16": cfg.dtype == "float16",
        **window,
    }
    # the latter: an HF RoPE scaling dict, kept verbatim; a window: its arch says how HF spells it
    if cfg.arch in HF_EXTRA_KEYS or cfg.hf_extra or window:
        arch = cfg.arch or "llama"
        args["hf_config_extra"] = {**(cfg.hf_extra or {}), "model_type": HF_MODEL_TYPE_BY_ARCH.get(arch, arch)}
    if cfg.arch not in ROPE_CARRIED_BY_ARCH:
        scaling = cfg.rope_scaling if cfg.rope_scaling is not None else cfg.megatron_rope
        args.update(_rope.megatron_args(scaling, mla=cfg.arch in MLA_ARCHS, arch=cfg.arch or "llama",
                                        max_position_embeddings=cfg.max_position_embeddings))
    if cfg.is_moe:
        args["num_experts"] = cfg.num_experts
        args["moe_ffn_hidden_size"] = cfg.moe_ffn_hidden_size
        args["expert_model_parallel_size"] = ep
        if cfg.moe_router_topk:
            args["moe_router_topk"] = cfg.moe_router_topk
        if cfg.arch in RENORMALISED_TOPK_ARCHS:
            # softmax over every expert, then top-k, weights not renormalised: HF norm_topk_prob=False
            args["moe_router_pre_softmax"] = not cfg.norm_topk_prob
        if cfg.shared_expert_ffn_hidden_size:
            args["moe_shared_expert_intermediate_size"] = cfg.shared_expert_ffn_hidden_size
            args["moe_shared_expert_gate"] = cfg.arch == "qwen2_moe"  # Qwen2-MoE gates its shared expert
        if cfg.moe_layer_freq is not None:  # dense layers use ffn_hidden_size, the experts moe_ffn_hidden_size
            args["moe_layer_freq"] = list(cfg.moe_layer_freq)
    if cfg.arch in MEGATRON_ARGS_HOOKS:
        MEGATRON_ARGS_HOOKS[cfg.arch](cfg, args)
    return args


MEGATRON_GELU = "gelu"
"""The activation Megatron applies to a gated fc1 without ``--swiglu`` and without another activation
flag: ``F.gelu``, the exact (erf) GELU, HF's ``gelu``."""
_OTHER_ACTIVATIONS = ("openai_gelu", "squared_relu", "quick_geglu", "bias_swiglu_fusion_only")


def _carries_own_window(arch: str) -> bool:
    """Gemma carries its window in hf_extra; GPT-OSS writes ``window_size`` itself."""
    return arch in HF_EXTRA_KEYS or arch in HF_CONFIG_HOOKS or arch in MEGATRON_ARGS_HOOKS


def megatron_window_args(cfg: ModelConfig, arch: str) -> dict[str, Any]:
    """HF -> Megatron: the ``window_size`` / ``window_attn_skip_freq`` args of a Llama-family sliding
    window (``mappings.window``); none for Llama, which has no window, or for Gemma and GPT-OSS, which
    carry theirs. Any other arch with a window is refused: converted, it would attend to every position."""
    if cfg.sliding_window is None or _carries_own_window(arch) or arch == "llama":
        return {}
    if cfg.window_layers is not None:
        return _window.to_megatron(cfg.sliding_window, cfg.window_layers)
    if arch in _window.WINDOW_ARCHS:
        return {}  # the window applies to no layer (window_layers found none)
    raise CkptError(f"the config's attention uses a sliding window of {cfg.sliding_window} positions; ckptscope "
                    f"does not carry sliding-window attention for {arch} into Megatron, so the converted model "
                    f"would attend to every position: not converted")


def megatron_activation(cfg: ModelConfig) -> str | None:
    """The HF ``hidden_act`` of the MLP the Megatron args describe: ``silu`` for ``--swiglu``, ``gelu``
    for a gated fc1 with Megatron's default (exact) GELU; None when it has no HF spelling here (not
    gated, ``openai_gelu``, ``squared_relu`` ...)."""
    facts = cfg.megatron_facts or {}
    if cfg.swiglu is not False:
        return "silu"
    if any(facts.get(k) for k in _OTHER_ACTIVATIONS) or ("gated_linear_unit" in facts and not facts["gated_linear_unit"]):
        return None
    return MEGATRON_GELU


def hf_export_problems(cfg: ModelConfig, arch: str) -> list[str]:
    """Why a Megatron model (``cfg``: the HF config the export writes, merged over the Megatron args)
    would compute something else as HF ``arch``, one line each; empty when it would not. Gemma and
    GPT-OSS carry their own activation and window (hf_extra, ``MEGATRON_CHECKS``); the rest of the
    family must be gated, SiLU or Megatron's GELU as its HF config says, with a sliding window only
    where the arch spells it (``mappings.window``), and MoE routing its HF model computes."""
    problems = _llama_moe_problems(cfg, arch)
    facts = cfg.megatron_facts or {}
    if facts.get("normalization") not in (None, "RMSNorm"):  # a probe: LayerNorm exported as RMSNorm, exit 0
        problems.append(f"its norms are {facts['normalization']} (args: normalization) while every {arch} norm is "
                        f"an RMSNorm")
    if _carries_own_window(arch):
        return problems
    problems += _llama_attention_problems(cfg, arch, facts)
    if "swiglu" in facts and not facts["swiglu"] and not facts.get("gated_linear_unit"):
        problems.append(f"its MLP is not gated (args: swiglu=False, no gated_linear_unit: linear_fc1 is one GELU "
                        f"projection) while every {arch} MLP has gate_proj + up_proj")
    else:
        act = megatron_activation(cfg)
        if act is None:
            others = ", ".join(k for k in _OTHER_ACTIVATIONS if facts.get(k))
            problems.append(f"its MLP activation ({others}) has no {arch} hidden_act")
        elif cfg.hidden_act is not None and cfg.hidden_act != act:
            problems.append(f"its MLP computes {act} but the HF config says hidden_act {cfg.hidden_act!r}")
    try:
        window = _window.from_megatron(facts, cfg.num_layers)
    except ValueError as exc:
        return problems + [f"its sliding window's {exc}"]
    if window is not None:
        hf_text = _window_text(cfg) if cfg.hf_model_type is not None else None
        problems += _window.hf_problems(arch, window, hf_text)
    elif cfg.hf_model_type is not None and cfg.window_layers:
        problems.append(f"the HF config's attention uses a sliding window of {cfg.sliding_window} positions, "
                        f"which its Megatron args (no window_size) do not")
    return problems


def _llama_attention_problems(cfg: ModelConfig, arch: str, facts: dict[str, Any]) -> list[str]:
    """Megatron attention and MLP variants a Llama-family HF model has no knob for, one line each: the
    HF model would compute plain RoPE attention over the whole head, a vanilla softmax scaled by
    1/sqrt(head_dim), and an unclamped GLU. (A probe found each of these exported with exit 0, the
    logits then off by 0.7-3.8 against megatron-core's forward.)"""
    problems = []
    position = facts.get("position_embedding_type")
    if position not in (None, "rope", "yarn"):
        problems.append(f"its positions are {position!r} (position_embedding_type), {arch}'s are RoPE")
    percent = facts.get("rotary_percent")
    if percent is not None and not _is_number(percent):  # (a probe set it to {}, [] and "")
        problems.append(f"its rotary_percent is {percent!r}, not a number")
    elif percent is not None and percent != 1:
        problems.append(f"it rotates {percent:g} of each head (rotary_percent), {arch} rotates all of it")
    if facts.get("rotary_interleaved"):
        problems.append(f"its RoPE rotates interleaved pairs (rotary_interleaved), {arch}'s rotates halves")
    if facts.get("qk_l2_norm"):
        problems.append(f"it L2-normalises queries and keys (qk_l2_norm), which {arch} does not")
    if facts.get("no_rope_freq"):
        problems.append(f"some of its layers have no RoPE (no_rope_freq), every {arch} layer has")
    if facts.get("softmax_type") not in (None, "vanilla"):
        problems.append(f"its attention softmax is {facts['softmax_type']!r} (softmax_type), {arch}'s is vanilla")
    if facts.get("glu_linear_offset") not in (None, 0, 0.0):
        problems.append(f"its GLU adds {facts['glu_linear_offset']} to the linear half (glu_linear_offset), "
                        f"{arch}'s does not")
    if facts.get("activation_func_clamp_value") is not None:
        problems.append(f"its activations are clamped at {facts['activation_func_clamp_value']} "
                        f"(activation_func_clamp_value), {arch}'s are not")
    scale = facts.get("softmax_scale")
    if scale is not None and not (cfg.head_dim and math.isclose(scale, cfg.head_dim ** -0.5, rel_tol=1e-6)):
        problems.append(f"its attention scores are scaled by {scale} (softmax_scale), {arch}'s by "
                        f"1/sqrt(head_dim){f' = {cfg.head_dim ** -0.5:.6g}' if cfg.head_dim else ''}")
    return problems


LLAMA_MOE_ARCHS = frozenset({"mixtral", "qwen2_moe", "qwen3_moe"})
"""MoE archs whose HF model has a softmax router and no knob for the others Megatron has."""


def _llama_moe_problems(cfg: ModelConfig, arch: str) -> list[str]:
    """Why a Megatron MoE would route or mix differently as HF Mixtral / Qwen2-MoE / Qwen3-MoE, one line
    each. Those models take a softmax over the experts, then the top-k, with no score bias and no
    scaling; Mixtral renormalises the top-k weights (Qwen says so in ``norm_topk_prob``, carried); every
    layer is MoE; only Qwen2-MoE has a shared expert, always behind a sigmoid gate. A fact the args do
    not record is Megatron's default, which is what these models do."""
    if arch not in LLAMA_MOE_ARCHS or not cfg.is_moe:
        return []
    facts = cfg.megatron_facts or {}
    problems = []
    score = facts.get("moe_router_score_function") or "softmax"
    if score != "softmax":
        problems.append(f"its router scores are {score} (moe_router_score_function), {arch}'s are a softmax")
    groups = facts.get("moe_router_num_groups")
    if isinstance(groups, int) and groups > 1 and facts.get("moe_router_group_topk"):
        problems.append(f"its router picks experts within {facts['moe_router_group_topk']} of {groups} groups "
                        f"(moe_router_num_groups / moe_router_group_topk), {arch}'s routes over every expert")
    if facts.get("moe_router_enable_expert_bias"):
        problems.append(f"its router adds a per-expert bias (moe_router_enable_expert_bias), which {arch} has not")
    if facts.get("moe_router_load_balancing_type") == "sinkhorn":
        # megatron-core's sinkhorn router weights experts by the plain softmax (sigmoid at top-1), never
        # renormalised, whatever moe_router_pre_softmax says (logits off 0.15-1.2 in a probe)
        problems.append(f"its router is sinkhorn-balanced (moe_router_load_balancing_type), whose weights {arch}'s "
                        f"softmax router does not compute")
    scaling = facts.get("moe_router_topk_scaling_factor")
    if scaling not in (None, 1, 1.0):
        problems.append(f"its routing weights are scaled by {scaling} (moe_router_topk_scaling_factor), which "
                        f"{arch} does not do")
    if arch == "mixtral" and facts.get("moe_router_pre_softmax"):
        problems.append("its top-k weights are not renormalised (moe_router_pre_softmax), Mixtral's always are")
    if facts.get("moe_apply_probs_on_input"):
        problems.append(f"it weights the experts' input, not their output (moe_apply_probs_on_input), unlike {arch}")
    freq = facts.get("moe_layer_freq")
    if arch in QWEN_MOE_ARCHS:  # mlp_only_layers spells any pattern that keeps one MoE layer
        if cfg.moe_layer_freq is not None and not any(cfg.moe_layer_freq):
            problems.append(f"no layer is MoE (moe_layer_freq {freq!r})")
    elif not (freq in (None, 1) or (isinstance(freq, (list, tuple)) and all(f == 1 for f in freq))):
        problems.append(f"not every layer is MoE (moe_layer_freq {freq!r}), every {arch} layer is")
    shared = bool(cfg.shared_expert_ffn_hidden_size)
    if arch == "qwen2_moe":
        if not shared:
            problems.append("it has no shared expert, every Qwen2-MoE layer has one")
        elif "moe_shared_expert_gate" in facts and not facts["moe_shared_expert_gate"]:
            problems.append("its shared expert has no gate (moe_shared_expert_gate=False), Qwen2-MoE's is "
                            "always gated")
    elif shared:
        problems.append(f"it has a shared expert (moe_shared_expert_intermediate_size), which {arch} has not")
    return problems


def _hf_intermediate_size(cfg: ModelConfig, arch: str) -> int:
    """HF ``intermediate_size``: Mixtral's is its experts' FFN (Megatron's ``moe_ffn_hidden_size`` when set:
    Megatron-LM's args always carry ``ffn_hidden_size`` too, and a probe's save with 48 / 24 was refused with a
    conflict the derived config made with itself); the dense MLP's for the others."""
    if cfg.is_moe and arch in EXPERT_FFN_IS_INTERMEDIATE:
        return cfg.moe_ffn_hidden_size or cfg.require("ffn_hidden_size")
    if not cfg.is_moe or arch == "qwen2_moe" or cfg.ffn_hidden_size:
        return cfg.require("ffn_hidden_size")
    return cfg.moe_ffn_hidden_size


def _window_text(cfg: ModelConfig) -> dict[str, Any]:
    """The window keys of the HF config ``cfg`` was read from, as ``mappings.window`` reads them."""
    if cfg.sliding_window is None or not cfg.window_layers:
        return {}
    return {"sliding_window": cfg.sliding_window, "num_hidden_layers": len(cfg.window_layers),
            "layer_types": ["sliding_attention" if on else "full_attention" for on in cfg.window_layers]}


def _hf_activation(cfg: ModelConfig, arch: str) -> str:
    """``hidden_act`` of a derived config: what the Megatron MLP computes (``hf_export_problems`` has
    refused what has no spelling); Gemma spells its GeGLU in hf_extra, GPT-OSS in its own hook."""
    if arch in HF_EXTRA_KEYS or arch in HF_CONFIG_HOOKS:
        return "silu"
    return megatron_activation(cfg) or "silu"


def _megatron_swiglu(cfg: ModelConfig) -> bool:
    """``--swiglu`` for a SiLU-gated MLP; False for GELU-gated (Megatron's default activation is the
    exact GELU, HF's ``gelu``). Any other HF activation is refused: Megatron would compute another."""
    act = cfg.hidden_act
    if act is None or act == "silu":
        return cfg.swiglu if cfg.swiglu is not None else True
    if cfg.arch in HF_EXTRA_KEYS or cfg.arch in MEGATRON_ARGS_HOOKS:
        return False  # Gemma's GeGLU, GPT-OSS's own activation: their hooks write the activation args
    if act == MEGATRON_GELU:
        return False
    raise CkptError(f"hidden_act {act!r} has no Megatron activation in ckptscope (silu -> --swiglu, gelu -> "
                    f"Megatron's default GELU); not converted")


def parallel_problems(cfg: ModelConfig, *, tp: int = 1, pp: int = 1, ep: int = 1) -> list[str]:
    """Why Megatron-Core could not build ``cfg`` at these parallel sizes, one line each (empty: it can).

    Megatron splits attention heads, query groups and the FFN (dense, expert and shared) evenly over
    TP ranks and asserts divisibility when it builds the model; a checkpoint written at sizes it
    cannot build loads nowhere, and a round trip through our own reader would still look exact. So
    these are checked against the config (HF config.json or the source's Megatron args) before
    anything is written. Pipeline stages are checked by the layer split itself.
    """
    problems = []
    groups = cfg.num_kv_heads
    if tp > 1 and groups and groups < tp:
        # megatron-core builds a model with fewer query groups than TP ranks when the groups divide TP:
        # each rank holds an even 1/TP of the fused QKV rows (groups kept whole in the global tensor)
        # and all-gathers them before attention (attention.py, num_query_groups < world_size)
        rows = (cfg.num_attention_heads or 0) + 2 * groups
        if tp % groups:
            problems.append(f"--tp {tp} is neither a multiple nor a divisor of the model's {groups} query groups "
                            f"(KV heads)")
        elif cfg.head_dim and (rows * cfg.head_dim) % tp:
            problems.append(f"--tp {tp} does not divide the fused QKV's {rows * cfg.head_dim} rows")
        groups = None  # checked here
    checks = (
        ("attention heads", cfg.num_attention_heads, tp, "--tp"),
        ("query groups (KV heads)", groups, tp, "--tp"),
        ("FFN hidden size", None if cfg.is_moe else cfg.ffn_hidden_size, tp, "--tp"),  # MoE: experts' own
        ("expert FFN hidden size", cfg.moe_ffn_hidden_size, tp, "--tp"),
        ("shared-expert FFN hidden size", cfg.shared_expert_ffn_hidden_size, tp, "--tp"),
        ("experts", cfg.num_experts, ep, "--ep"),
    )
    for what, count, size, flag in checks:
        if size > 1 and count and count % size:
            problems.append(f"{flag} {size} does not divide the model's {count} {what}")
    if tp > 1 and cfg.num_attention_heads is None:
        problems.append(f"--tp {tp}: the number of attention heads is unknown, so the split cannot be checked; "
                        f"pass --hf-config DIR")
    if pp > 1 and cfg.num_layers is not None and pp > cfg.num_layers:
        problems.append(f"--pp {pp} is more pipeline stages than the model's {cfg.num_layers} layers")
    renormalised = cfg.arch == "mixtral" or (cfg.arch in RENORMALISED_TOPK_ARCHS and cfg.norm_topk_prob)
    if cfg.is_moe and cfg.moe_router_topk == 1 and cfg.arch in LLAMA_MOE_ARCHS and renormalised:
        # megatron-core refuses top-1 softmax routing without moe_router_pre_softmax, which weights each
        # token's expert by its softmax probability instead of the renormalised 1.0 (logits off by 0.6-2.7)
        problems.append("its router sends each token to 1 expert with weight 1.0 (top-1, renormalised), which "
                        "megatron-core does not build (top-1 needs moe_router_pre_softmax: the softmax weight)")
    return problems


_HF_SHAPE_RULES: tuple[tuple[str, Any], ...] = (
    # (name suffix, shape from the config); None in a shape means "not known from this config"
    ("model.embed_tokens.weight", lambda c: (c.vocab_size, c.hidden_size)),
    ("lm_head.weight", lambda c: (c.vocab_size, c.hidden_size)),
    ("model.norm.weight", lambda c: (c.hidden_size,)),
    ("self_attn.q_proj.weight", lambda c: (_mul(c.num_attention_heads, c.head_dim), c.hidden_size)),
    ("self_attn.k_proj.weight", lambda c: (_mul(c.num_kv_heads, c.head_dim), c.hidden_size)),
    ("self_attn.v_proj.weight", lambda c: (_mul(c.num_kv_heads, c.head_dim), c.hidden_size)),
    ("self_attn.o_proj.weight", lambda c: (c.hidden_size, _mul(c.num_attention_heads, c.head_dim))),
    ("mlp.gate_proj.weight", lambda c: (c.ffn_hidden_size, c.hidden_size)),
    ("mlp.up_proj.weight", lambda c: (c.ffn_hidden_size, c.hidden_size)),
    ("mlp.down_proj.weight", lambda c: (c.hidden_size, c.ffn_hidden_size)),
    ("input_layernorm.weight", lambda c: (c.hidden_size,)),
    ("post_attention_layernorm.weight", lambda c: (c.hidden_size,)),
)


def _mul(a: int | None, b: int | None) -> int | None:
    return a * b if a is not None and b is not None else None


def hf_shape_problems(hf_config: dict[str, Any], shapes: dict[str, tuple[int, ...]], *,
                      shapes_only: bool = False) -> list[str]:
    """Where the tensors an HF export writes disagree with the shapes its ``config.json`` implies.

    transformers builds the model from the config and then loads the tensors: a config derived
    from incomplete Megatron args (``num_query_groups`` without ``group_query_attention``, say)
    gives a model that refuses or, worse, silently re-initialises mismatched weights. Checked
    before anything is written; one line per kind of tensor. ``shapes_only``: only the tensors
    there are, not which ones a layer lacks (``check`` asks that of a format whose shapes it infers).
    """
    cfg = from_hf_config(hf_config)
    problems: dict[str, str] = {}
    rules = [r for r in _HF_SHAPE_RULES if cfg.arch not in MLA_ARCHS or "self_attn." not in r[0]]
    for name, shape in shapes.items():
        for suffix, rule in rules:
            if name == suffix or name.endswith("." + suffix):
                expected = rule(cfg)
                if None not in expected and tuple(expected) != tuple(shape) and suffix not in problems:
                    problems[suffix] = (f"{name} is {list(shape)} but config.json implies {list(expected)}")
                break
    if cfg.is_moe:
        problems.update(_expert_shape_problems(cfg, shapes))
    if shapes_only:
        return list(problems.values())
    text = hf_config.get("text_config") if isinstance(hf_config.get("text_config"), dict) else hf_config
    problems.update(_hf_layout.layout_problems(cfg.arch, text, cfg.num_layers, cfg.hidden_size,
                                               cfg.num_attention_heads, cfg.head_dim, shapes))
    layers = {int(m.group(1)) for name in shapes if (m := _HF_DECODER_LAYER.match(name))}
    mtp = int(hf_config.get("num_nextn_predict_layers") or 0)  # DeepSeek's MTP layers follow the decoder's
    if layers and cfg.num_layers and not set(range(cfg.num_layers)) <= layers <= set(range(cfg.num_layers + mtp)):
        # A pipeline stage's share (Megatron's stage-local layer keys collide across stages in one
        # DCP save) would load with the missing layers silently re-initialised.
        problems["layers"] = (f"the tensors hold decoder layers {_hf_layout.ranges(layers)} but config.json "
                              f"implies {cfg.num_layers} (0-{cfg.num_layers - 1})")
    return list(problems.values())


_HF_DECODER_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_HF_EXPERT = re.compile(r"\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|w1|w3|down_proj|w2)\.weight$")
_HF_SHARED = re.compile(r"\.mlp\.shared_experts?\.(gate_proj|up_proj|down_proj)\.weight$")


def _expert_shape_problems(cfg: ModelConfig, shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """Per-expert and shared-expert weights (HF's per-expert names) against the expert count and sizes
    the config implies: Megatron args that disagree with the stored experts gave a config.json that
    transformers loads with mismatched sizes (a probe: an expert size or count that the tensors have not)."""
    problems: dict[str, str] = {}
    hidden, size = cfg.hidden_size, cfg.moe_ffn_hidden_size
    counted = -1
    for name, shape in shapes.items():
        if m := _HF_EXPERT.search(name):
            expert, kind = int(m.group(1)), m.group(2)
            counted = max(counted, expert)
            if cfg.num_experts is not None and expert >= cfg.num_experts and "experts" not in problems:
                problems["experts"] = f"{name} is expert {expert} but config.json implies {cfg.num_experts} experts"
            down = kind in ("down_proj", "w2")
            expected = (hidden, size) if down else (size, hidden)
            key = f"experts.{'down' if down else 'in'}"
        elif m := _HF_SHARED.search(name):
            down = m.group(1) == "down_proj"
            size_shared = cfg.shared_expert_ffn_hidden_size
            expected = (hidden, size_shared) if down else (size_shared, hidden)
            key = f"shared.{'down' if down else 'in'}"
        else:
            continue
        if None not in expected and tuple(expected) != tuple(shape) and key not in problems:
            problems[key] = f"{name} is {list(shape)} but config.json implies {list(expected)}"
    if counted >= 0 and cfg.num_experts is not None and counted + 1 < cfg.num_experts and "experts" not in problems:
        # the experts past the stored ones would be initialised at random by transformers
        problems["experts"] = f"the tensors hold {counted + 1} experts per layer but config.json implies {cfg.num_experts}"
    return problems


def set_config_dtype(config: dict[str, Any], dtype: str) -> None:
    """Record the weights' dtype in an HF ``config.json`` under both of its names.

    transformers 5 reads ``dtype`` (4.56 renamed ``torch_dtype``) and older releases read
    ``torch_dtype``; a config copied from a v5 save already has ``dtype``, and setting only
    ``torch_dtype`` beside it left ``from_pretrained`` loading bf16 weights as the copied float32.
    """
    config["dtype"] = dtype
    config["torch_dtype"] = dtype


def read_hf_config(path: Path) -> dict[str, Any]:
    """``--hf-config DIR`` (or the config.json itself) as a dict; a file that is not one JSON object is one
    error naming it."""
    config_file = path / "config.json" if path.is_dir() else path
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CkptError(f"--hf-config: cannot read config.json: {exc.strerror or exc}", config_file) from None
    except json.JSONDecodeError as exc:
        raise CkptError(f"--hf-config: config.json is not valid JSON: {exc}", config_file) from None
    if not isinstance(data, dict):
        raise CkptError("--hf-config: config.json is not an object", config_file)
    return data
