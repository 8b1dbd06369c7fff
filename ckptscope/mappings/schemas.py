"""Per-architecture HF <-> Megatron-Core name tables, as data (MAPPING.md §1, §6).

A ``Rule`` pairs HF tensor names with one Megatron-Core tensor and names the transform between them
(transforms.py). Names are templates: ``{i}`` is the global layer, ``{e}`` the global expert. The
Megatron side lists aliases: the first is what a torch_dist checkpoint (and the TransformerEngine
spec) calls the tensor, the others are spellings we also read (local spec, grouped experts, stacked
experts ``name[{e}]`` = index ``e`` on the tensor's leading axis). ``local`` is the name the local
spec uses in per-rank ``torch`` files, where local-spec norms are not renamed (MAPPING.md §1.2).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Rule:
    hf: tuple[str, ...]
    mcore: tuple[str, ...]
    transform: str = "identity"
    local: str | None = None
    when: str | None = None
    """HF name template (same ``{i}``) that must exist for the rule to apply to HF tensors (to_mcore)."""
    unless: str | None = None
    """HF name template that must not exist: DeepSeek's dense and MoE layers name their norm differently."""


L_HF = "model.layers.{i}."
L_MC = "decoder.layers.{i}."


def _layer(hf: tuple[str, ...] | str, mcore: tuple[str, ...] | str, transform: str = "identity",
           local: str | None = None) -> Rule:
    hf = (hf,) if isinstance(hf, str) else hf
    mcore = (mcore,) if isinstance(mcore, str) else mcore
    return Rule(tuple(L_HF + h for h in hf), tuple(L_MC + m for m in mcore), transform,
                L_MC + local if local else None)


TOP = (
    Rule(("model.embed_tokens.weight",), ("embedding.word_embeddings.weight",), "vocab"),
    Rule(("model.norm.weight",), ("decoder.final_layernorm.weight",)),
    Rule(("lm_head.weight",), ("output_layer.weight",), "vocab"),
)

ATTENTION = (
    _layer("input_layernorm.weight", ("self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"),
           local="input_layernorm.weight"),
    _layer(("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
           "self_attention.linear_qkv.weight", "qkv"),
    _layer("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
)

QKV_BIAS = (
    _layer(("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
           "self_attention.linear_qkv.bias", "qkv"),
)

LINEAR_BIAS = QKV_BIAS + (
    _layer("self_attn.o_proj.bias", "self_attention.linear_proj.bias"),
    _layer(("mlp.gate_proj.bias", "mlp.up_proj.bias"), "mlp.linear_fc1.bias", "gate_up"),
    _layer("mlp.down_proj.bias", "mlp.linear_fc2.bias"),
)
"""Megatron's ``add_bias_linear`` (its default): a bias on every linear, HF Llama's ``attention_bias`` +
``mlp_bias``. The fc1 bias is ``[gate; up]`` as its weight is; the rules apply only where the tensors are."""

QK_NORM = (
    _layer("self_attn.q_norm.weight", "self_attention.q_layernorm.weight"),
    _layer("self_attn.k_norm.weight", "self_attention.k_layernorm.weight"),
)

DENSE_MLP = (
    _layer("post_attention_layernorm.weight", ("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"),
           local="pre_mlp_layernorm.weight"),
    _layer(("mlp.gate_proj.weight", "mlp.up_proj.weight"), "mlp.linear_fc1.weight", "gate_up"),
    _layer("mlp.down_proj.weight", "mlp.linear_fc2.weight"),
)


def _experts(hf_gate: str, hf_up: str, hf_down: str) -> tuple[Rule, ...]:
    """Expert weights: SequentialMLP, TEGroupedMLP, torch_dist's stacked ``experts.experts`` and its
    ``singleton_local_shards`` layout (``experts.experts.{e}.``, global expert ids)."""
    fc1 = ("mlp.experts.local_experts.{e}.linear_fc1.weight", "mlp.experts.experts.linear_fc1.weight[{e}]",
           "mlp.experts.linear_fc1.weight{e}", "mlp.experts.experts.{e}.linear_fc1.weight")
    fc2 = ("mlp.experts.local_experts.{e}.linear_fc2.weight", "mlp.experts.experts.linear_fc2.weight[{e}]",
           "mlp.experts.linear_fc2.weight{e}", "mlp.experts.experts.{e}.linear_fc2.weight")
    return (_layer((hf_gate, hf_up), fc1, "gate_up"), _layer(hf_down, fc2))


MOE_NORM = (_layer("post_attention_layernorm.weight", ("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight")),)
"""MoE layers keep a real pre-MLP norm; in torch_dist the local spec's keys map stores it under the
fused TE name ``mlp.linear_fc1.layer_norm_weight`` (the TE spec keeps ``pre_mlp_layernorm``)."""

MIXTRAL_MOE = MOE_NORM + (_layer("block_sparse_moe.gate.weight", "mlp.router.weight"),) + _experts(
    "block_sparse_moe.experts.{e}.w1.weight", "block_sparse_moe.experts.{e}.w3.weight",
    "block_sparse_moe.experts.{e}.w2.weight")

MOE_ROUTER = L_HF + "mlp.gate.weight"
"""A Qwen MoE layer is one with a router; the others (``mlp_only_layers``, ``decoder_sparse_step``) have a
dense MLP of ``intermediate_size``, its norm named as in a dense model."""

QWEN_MOE = (
    tuple(replace(rule, when=MOE_ROUTER) for rule in MOE_NORM)
    + tuple(replace(rule, unless=MOE_ROUTER) for rule in DENSE_MLP)
    + (_layer("mlp.gate.weight", "mlp.router.weight"),)
    + _experts("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight", "mlp.experts.{e}.down_proj.weight"))

QWEN_SHARED_EXPERT = (
    _layer(("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight"),
           "mlp.shared_experts.linear_fc1.weight", "gate_up"),
    _layer("mlp.shared_expert.down_proj.weight", "mlp.shared_experts.linear_fc2.weight"),
    _layer("mlp.shared_expert_gate.weight", "mlp.shared_experts.gate_weight"),
)

GEMMA_NORMS = (
    _layer("post_attention_layernorm.weight", "self_attention.linear_proj.post_layernorm.weight"),
    _layer("pre_feedforward_layernorm.weight", ("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"),
           local="pre_mlp_layernorm.weight"),
    _layer("post_feedforward_layernorm.weight", "mlp.linear_fc2.post_layernorm.weight"),
)
"""Gemma 2/3 norm four times per layer (sandwich norms). HF's ``post_attention_layernorm`` is the norm
*after* attention here, not the pre-MLP norm it is in Llama. Megatron-Bridge puts the two post-norms
inside the row-parallel linears (``TERowParallelLinearLayerNorm.post_layernorm``, replicated) and the
pre-MLP norm in the fused fc1 (src/megatron/bridge/models/gemma/gemma2_bridge.py and gemma3_bridge.py,
``mapping_registry``; the module in src/megatron/bridge/models/gemma/modules.py). All four hold
zero-centred weights (the model computes ``x * (1 + w)``): see ``mappings.config.ZERO_CENTRED_NORM``."""

GEMMA_MLP = GEMMA_NORMS + (
    _layer(("mlp.gate_proj.weight", "mlp.up_proj.weight"), "mlp.linear_fc1.weight", "gate_up"),
    _layer("mlp.down_proj.weight", "mlp.linear_fc2.weight"),
)
"""GeGLU (gelu-tanh gate): the same ``[gate; up]`` fc1 layout as SwiGLU, only the activation differs."""

SCHEMAS: dict[str, tuple[Rule, ...]] = {
    "llama": TOP + ATTENTION + DENSE_MLP + LINEAR_BIAS,
    "mistral": TOP + ATTENTION + DENSE_MLP,
    "qwen2": TOP + ATTENTION + QKV_BIAS + DENSE_MLP,
    "qwen3": TOP + ATTENTION + QK_NORM + DENSE_MLP,
    "mixtral": TOP + ATTENTION + MIXTRAL_MOE,
    "qwen2_moe": TOP + ATTENTION + QKV_BIAS + QWEN_MOE + QWEN_SHARED_EXPERT,
    "qwen3_moe": TOP + ATTENTION + QK_NORM + QWEN_MOE,
    "gemma2": TOP + ATTENTION + GEMMA_MLP,
    "gemma3": TOP + ATTENTION + QK_NORM + GEMMA_MLP,
}
"""Architecture name -> its rules. ``--arch`` accepts these keys."""

IGNORED_SUFFIXES = ("._extra_state", "rotary_emb.inv_freq")
"""Never values (MAPPING.md §1.3, §1.6): TE fp8 metadata and the derivable RoPE buffer."""


def is_ignored(name: str) -> bool:
    base = name.split("/", 1)[0]
    return any(base.endswith(s) or s + "/" in name for s in IGNORED_SUFFIXES) or "._extra_state" in base
