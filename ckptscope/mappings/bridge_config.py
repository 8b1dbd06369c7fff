"""The model section of a Megatron-Bridge ``run_config.yaml`` read as the Megatron args it stands for.

Megatron-Bridge keeps no ``args`` Namespace: its model provider (a ``GPTModelProvider`` subclass, which is
a megatron-core ``TransformerConfig``) is serialised field by field into the ``model`` section
(formats/megatron/run_config.py says how). Most fields are spelled as Megatron-LM's args
(``num_layers``, ``hidden_size``, ``num_query_groups``, ``kv_channels``, ``ffn_hidden_size``,
``add_qkv_bias``, ``qk_layernorm``, ``layernorm_zero_centered_gamma``, ``moe_*``, ``rotary_percent`` ...);
the rest are translated here, once, so ``config.from_megatron_args`` reads both:

* ``num_moe_experts`` -> ``num_experts``, ``layernorm_epsilon`` -> ``norm_epsilon``,
  ``share_embeddings_and_output_weights`` -> ``untie_embeddings_and_output_weights`` (negated),
  ``seq_length`` -> ``max_position_embeddings`` when the latter is absent;
* ``group_query_attention`` is implied by ``num_query_groups`` < ``num_attention_heads``;
* ``swiglu`` is ``gated_linear_unit`` with ``activation_func`` serialised as ``{_target_: ...silu}``.

Values that are serialised objects (``{_target_: ...}``: functions, dtypes, enums, layer specs) are left
out: they are strings describing code, and nothing here imports or calls them. Lists stay lists
(``moe_layer_freq``); a ``rotary_base`` pair (Gemma 3's local/global bases) is not one base and is left
to the HF config.
"""

from __future__ import annotations

from typing import Any

from ckptscope.mappings.config import ModelConfig, from_megatron_args

MODEL_SECTION = "model"
RENAMES = {"num_moe_experts": "num_experts", "layernorm_epsilon": "norm_epsilon"}


def is_run_config(value: Any) -> bool:
    """Whether ``value`` looks like a parsed Bridge ``run_config.yaml`` (a ``model`` mapping with layers)."""
    return (isinstance(value, dict) and isinstance(value.get(MODEL_SECTION), dict)
            and "num_layers" in value[MODEL_SECTION])


def _plain(value: Any) -> bool:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return True
    return isinstance(value, list) and all(_plain(v) for v in value)


def _target(value: Any) -> str:
    return str(value.get("_target_") or "") if isinstance(value, dict) else ""


def megatron_args(run_config: dict[str, Any]) -> dict[str, Any]:
    """The Megatron-LM args (names as in arguments.py) the ``model`` section of ``run_config`` says."""
    model = run_config[MODEL_SECTION]
    args = {RENAMES.get(k, k): v for k, v in model.items() if not k.startswith("_") and _plain(v)}
    heads, groups = model.get("num_attention_heads"), model.get("num_query_groups")
    if isinstance(heads, int) and isinstance(groups, int):
        args["group_query_attention"] = groups != heads
    if isinstance(model.get("share_embeddings_and_output_weights"), bool):
        args["untie_embeddings_and_output_weights"] = not model["share_embeddings_and_output_weights"]
    if "max_position_embeddings" not in args and isinstance(model.get("seq_length"), int):
        args["max_position_embeddings"] = model["seq_length"]
    if isinstance(model.get("gated_linear_unit"), bool):
        activation = _target(model.get("activation_func"))
        args["swiglu"] = model["gated_linear_unit"] and activation.rsplit(".", 1)[-1] == "silu"
    if not isinstance(args.get("rotary_base"), (int, float)):
        args.pop("rotary_base", None)
    if not isinstance(args.get("vocab_size"), int):
        args.pop("vocab_size", None)
    return args


def from_transformer_config(fields: dict[str, Any]) -> ModelConfig:
    """``ModelConfig`` of a ``TransformerConfig`` dumped as JSON (verl's ``transformer_config.json``). Its
    ``activation_func`` is a function and is left out of the dump: a gated fc1 then says nothing of
    SwiGLU (unknown, not "another activation")."""
    args = megatron_args({MODEL_SECTION: fields})
    if "activation_func" not in fields:
        args.pop("swiglu", None)
    return from_megatron_args(args)


def from_run_config(run_config: dict[str, Any]) -> ModelConfig:
    """``ModelConfig`` of a Bridge save, as ``from_megatron_args`` reads a Megatron-LM one."""
    return from_megatron_args(megatron_args(run_config))
