"""A NeMo 1.x ``model_config.yaml`` (inside a ``.nemo``) read as the Megatron args it stands for.

NeMo 1.x's Megatron GPT models are configured by ``megatron_gpt_config.yaml``'s ``model`` section, which
``model.to_config_file`` writes into the archive. Most sizes are spelled as Megatron-LM's args
(``num_layers``, ``hidden_size``, ``ffn_hidden_size``, ``num_attention_heads``, ``num_query_groups``,
``kv_channels``, ``rotary_base``, ``make_vocab_size_divisible_by``); what decides the computation is spelled
otherwise and translated here: ``normalization`` (``rmsnorm``, ``layernorm``, ``layernorm1p``),
``activation`` (``fast-swiglu``/``swiglu``, ``gelu``, ``fast-geglu``/``geglu``, ``squared-relu``),
``position_embedding_type`` (``rope``, ``learned_absolute``), ``rotary_percentage``, ``layernorm_epsilon``,
``bias``, ``share_embeddings_and_output_weights``.

A setting that changes the computation and has no Megatron spelling here (RoPE interpolation or Llama 3.1
scaling, ALiBi and the other position schemes, post-LN blocks, head scaling, MoE, another activation)
makes the whole config unreadable (None): the caller then asks for the HF config rather than export a model
that computes something else. NeMo keeps the vocabulary size in the tokenizer, not here.
"""

from __future__ import annotations

from typing import Any

from ckptscope.mappings.config import ModelConfig, from_megatron_args

NEMO1_CONFIG = "nemo_model_config"
"""The index object the ``.nemo`` reader (``formats.nemo.reader.CONFIG_OBJECT``) puts the config in."""

_NORMS = {"rmsnorm": {"normalization": "RMSNorm"}, "layernorm": {"normalization": "LayerNorm"},
          "layernorm1p": {"normalization": "LayerNorm", "apply_layernorm_1p": True}}
_ACTIVATIONS = {"fast-swiglu": {"swiglu": True, "gated_linear_unit": True},
                "swiglu": {"swiglu": True, "gated_linear_unit": True},
                "gelu": {"swiglu": False, "gated_linear_unit": False},
                "fast-geglu": {"swiglu": False, "gated_linear_unit": True},
                "geglu": {"swiglu": False, "gated_linear_unit": True},
                "squared-relu": {"swiglu": False, "gated_linear_unit": False, "squared_relu": True}}
_POSITIONS = ("rope", "learned_absolute")
_SIZES = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "kv_channels",
          "max_position_embeddings", "make_vocab_size_divisible_by", "rotary_base")
_NEUTRAL = {"seq_len_interpolation_factor": (None, 1, 1.0), "scale_positional_embedding": (None, False),
            "transformer_block_type": (None, "pre_ln"), "headscale": (None, False),
            "normalize_attention_scores": (None, True), "num_moe_experts": (None, 0, 1),
            "openai_gelu": (None, False)}
"""Settings that change the computation: the values that leave it as the translated args say."""


def is_nemo1_config(value: Any) -> bool:
    """Whether ``value`` looks like a NeMo 1.x Megatron GPT model config."""
    return isinstance(value, dict) and "num_layers" in value and "hidden_size" in value and "activation" in value


def unread_settings(config: dict[str, Any]) -> list[str]:
    """The settings of ``config`` that change the computation and are not translated, as ``key=value``."""
    found = [f"{key}={config[key]!r}" for key, neutral in _NEUTRAL.items()
             if key in config and config[key] not in neutral]
    for key, table in (("normalization", _NORMS), ("activation", _ACTIVATIONS)):
        if config.get(key) not in table:
            found.append(f"{key}={config.get(key)!r}")
    if config.get("position_embedding_type", "learned_absolute") not in _POSITIONS:
        found.append(f"position_embedding_type={config['position_embedding_type']!r}")
    return found


def megatron_args(config: dict[str, Any]) -> dict[str, Any] | None:
    """The Megatron-LM args ``config`` says, or None when a setting has no translation (``unread_settings``)."""
    if unread_settings(config):
        return None
    args: dict[str, Any] = {k: config[k] for k in _SIZES if config.get(k) is not None}
    if "max_position_embeddings" not in args and config.get("encoder_seq_length") is not None:
        args["max_position_embeddings"] = config["encoder_seq_length"]
    heads, groups = config.get("num_attention_heads"), config.get("num_query_groups")
    if isinstance(groups, int) and not isinstance(groups, bool) and groups != heads:
        args.update(group_query_attention=True, num_query_groups=groups)
    else:
        args["group_query_attention"] = False
    args.update(_NORMS[config["normalization"]])
    args.update(_ACTIVATIONS[config["activation"]])
    args["position_embedding_type"] = config.get("position_embedding_type", "learned_absolute")
    if config.get("rotary_percentage") is not None:
        args["rotary_percent"] = config["rotary_percentage"]
    if config.get("layernorm_epsilon") is not None:
        args["norm_epsilon"] = config["layernorm_epsilon"]
    if "bias" in config:
        args["add_bias_linear"] = config["bias"]
        args["add_qkv_bias"] = config.get("qkv_bias", config["bias"])
    if "share_embeddings_and_output_weights" in config:
        args["untie_embeddings_and_output_weights"] = not config["share_embeddings_and_output_weights"]
    return args


def from_nemo1_config(config: dict[str, Any]) -> ModelConfig | None:
    """``ModelConfig`` of a NeMo 1.x model config, as ``from_megatron_args`` reads Megatron-LM's args; None
    when a setting has no translation."""
    args = megatron_args(config)
    return from_megatron_args(args) if args is not None else None
