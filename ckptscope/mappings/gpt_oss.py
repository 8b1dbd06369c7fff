"""GPT-OSS (bf16) between HF transformers and Megatron-Core: attention sinks, biases on attention,
router and experts, and the fused expert tensors with their interleaved gate/up.

transformers keeps a layer's experts fused (``models/gpt_oss/modeling_gpt_oss.py``, ``GptOssExperts``):

* ``mlp.experts.gate_up_proj`` ``[E, H, 2I]``, used as ``x @ gate_up_proj[e]``: the *transpose* of a
  Megatron linear's ``[out, in]`` weight, and gate/up are **interleaved** along the last axis
  (``gate = h[..., ::2]``, ``up = h[..., 1::2]``), not ``[gate; up]``;
* ``mlp.experts.gate_up_proj_bias`` ``[E, 2I]``, interleaved the same way;
* ``mlp.experts.down_proj`` ``[E, I, H]`` (transposed) and ``down_proj_bias`` ``[E, H]``.

Megatron-Core holds expert ``e`` as ``linear_fc1.weight [2I, H]`` = ``[gate; up]`` rows and
``linear_fc2.weight [H, I]``, with biases (``add_bias_linear``), as Megatron-Bridge's GPT-OSS bridge
maps them (src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py: ``_interleave`` = rows ``::2`` then
``1::2`` of the transposed HF slice; sinks -> ``self_attention.core_attention.softmax_offset``, the
learnable softmax offset of ``softmax_type="learnable"``; router weight and bias).

Every transform here is still a block copy, written once as links: row ``j`` of the gate half of
fc1 is column ``2j`` of the HF slice, row ``I + j`` of the up half is column ``2j + 1``, row ``h`` of
fc2 is column ``h`` of ``down_proj[e]``. A link pairs a row with a column of the same length
(``links.map_box`` pairs their non-unit axes in order), so convert, diff and the inverse all come
from the same table. One link per row: exact at any size, but a column of a row-major tensor is a
strided read, so large models convert slowly (no fast byte-run copy for these tensors).

The HF names carry no ``{e}``: one HF tensor holds every expert of a layer, expert ``e`` is index
``e`` on its leading axis (``resolve`` adds that axis; ``Rule.hf`` without ``{e}`` and ``Rule.mcore``
with it is what marks such a rule).
"""

from __future__ import annotations

from ckptscope.core.errors import CkptError
from ckptscope.mappings.config import fact_problems
from ckptscope.mappings.links import Link
from ckptscope.mappings.schemas import ATTENTION, QKV_BIAS, TOP, Rule, _layer
from ckptscope.mappings.transforms import Transform

ARCH = "gpt_oss"
SINKS = "self_attention.core_attention.softmax_offset"


# --- transforms (per expert: the HF end is one expert's slice, without the expert axis) ------------


def _interleaved_t_shapes(cfg, mcore, hf):
    """fc1 ``[2I, H]`` <-> HF slice ``[H, 2I]`` (interleaved columns)."""
    if mcore is not None:
        if len(mcore) != 2 or mcore[0] % 2:
            raise CkptError(f"a GPT-OSS expert fc1 is [2I, H] with an even 2I, got {list(mcore)}")
        return tuple(mcore), [(mcore[1], mcore[0])]
    if len(hf[0]) != 2 or hf[0][1] % 2:
        raise CkptError(f"a GPT-OSS gate_up_proj expert slice is [H, 2I] with an even 2I, got {list(hf[0])}")
    return (hf[0][1], hf[0][0]), [tuple(hf[0])]


def _interleaved_t_links(cfg, mname, mshape, hf_names, hf_shapes):
    """Gate row ``j`` is HF column ``2j``, up row ``I + j`` is HF column ``2j + 1``."""
    rows, cols = mshape
    half = rows // 2
    links = []
    for j in range(half):
        for part in (0, 1):  # 0: gate, 1: up
            links.append(Link(mname, ((part * half + j, part * half + j + 1), (0, cols)), hf_names[0],
                              ((0, cols), (2 * j + part, 2 * j + part + 1)), "gate_up_interleaved"))
    return links


def _interleaved_shapes(cfg, mcore, hf):
    """fc1 bias ``[2I]`` <-> HF ``[2I]`` (interleaved)."""
    shape = tuple(mcore if mcore is not None else hf[0])
    if len(shape) != 1 or shape[0] % 2:
        raise CkptError(f"a GPT-OSS expert fc1 bias is [2I] with an even 2I, got {list(shape)}")
    return shape, [shape]


def _interleaved_links(cfg, mname, mshape, hf_names, hf_shapes):
    half = mshape[0] // 2
    return [Link(mname, ((part * half + j, part * half + j + 1),), hf_names[0],
                 ((2 * j + part, 2 * j + part + 1),), "gate_up_interleaved")
            for j in range(half) for part in (0, 1)]


TRANSFORMS = {
    "gate_up_interleaved_t": Transform("gate_up_interleaved_t", 1, _interleaved_t_shapes, _interleaved_t_links),
    "gate_up_interleaved": Transform("gate_up_interleaved", 1, _interleaved_shapes, _interleaved_links),
}


# --- rules ----------------------------------------------------------------------------------------


def fused_expert_rule(hf: str, linear_param: str, transform: str) -> Rule:
    """One fused HF expert tensor <-> expert ``{e}``'s Megatron tensor (SequentialMLP, torch_dist's
    stacked ``experts.experts`` and TEGroupedMLP spellings)."""
    linear, param = linear_param.split(".")
    return _layer(hf, (f"mlp.experts.local_experts.{{e}}.{linear}.{param}", f"mlp.experts.experts.{linear}.{param}[{{e}}]",
                       f"mlp.experts.{linear}.{param}{{e}}"), transform)


RULES: tuple[Rule, ...] = TOP + ATTENTION + QKV_BIAS + (
    _layer("self_attn.o_proj.bias", "self_attention.linear_proj.bias"),
    _layer("self_attn.sinks", SINKS),
    _layer("post_attention_layernorm.weight", ("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight")),
    _layer("mlp.router.weight", "mlp.router.weight"),
    _layer("mlp.router.bias", "mlp.router.bias"),
    fused_expert_rule("mlp.experts.gate_up_proj", "linear_fc1.weight", "gate_up_interleaved_t"),
    fused_expert_rule("mlp.experts.gate_up_proj_bias", "linear_fc1.bias", "gate_up_interleaved"),
    fused_expert_rule("mlp.experts.down_proj", "linear_fc2.weight", "transpose"),
    fused_expert_rule("mlp.experts.down_proj_bias", "linear_fc2.bias", "identity"),
)
"""Attention with biases on q/k/v and o, sinks; a MoE MLP on every layer (router with bias, experts
with biases). Norm names as Mixtral's MoE layers (``MOE_NORM``)."""


# --- config facts ---------------------------------------------------------------------------------

QUICK_GELU_ALPHA = 1.702
"""megatron-core's ``quick_gelu`` is ``x * sigmoid(1.702 x)`` with the constant fixed in its code
(megatron/core/fusions/fused_bias_geglu.py); HF's ``swiglu_alpha`` must equal it."""

HF_EXTRA = ("model_type", "swiglu_alpha", "swiglu_limit", "sliding_window", "layer_types", "rope_parameters",
            "attention_bias", "router_aux_loss_coef", "hidden_act", "pad_token_id", "bos_token_id", "eos_token_id")
"""HF config keys carried verbatim in the Megatron args (``hf_config_extra``) for the way back."""

FACTS = [
    "expert fc1 = transposed HF gate_up_proj[e] with gate/up de-interleaved (HF columns ::2 -> gate rows, "
    "1::2 -> up rows); fc2 = transposed down_proj[e]; expert, router and attention biases",
    "attention sinks = self_attention.core_attention.softmax_offset (softmax_type=learnable)",
    "activation: clamped SwiGLU (gate <= limit, |up| <= limit, (up + 1) * gate * sigmoid(1.702 gate)) = Megatron "
    "quick_geglu with glu_linear_offset=1 and activation_func_clamp_value=limit; Megatron sources whose args do "
    "not say so are refused",
]


def _hf_config(cfg, out: dict) -> None:
    """config.json of a GPT-OSS model derived from Megatron args (``to_hf_config``)."""
    out["attention_bias"] = True
    out.setdefault("hidden_act", "silu")  # unused by GPT-OSS's experts; GptOssConfig's default
    out.pop("moe_intermediate_size", None)
    if not any(key in out for key in ("rope_parameters", "rope_scaling")):  # GptOssConfig's default is YaRN
        out["rope_scaling"] = {"rope_type": "default"}


def _layer_window(cfg) -> dict:
    extra = cfg.hf_extra or {}
    types, window = extra.get("layer_types"), extra.get("sliding_window")
    if not types or window is None:
        return {}
    if "sliding_attention" not in types:
        return {}
    if list(types) != ["sliding_attention", "full_attention"] * (len(types) // 2) or len(types) % 2:
        raise CkptError(f"GPT-OSS layer_types {types} do not alternate sliding/full from the first layer: "
                        "Megatron's window_attn_skip_freq cannot express that pattern")
    return {"window_size": [int(window) - 1, 0], "window_attn_skip_freq": 2}


def _megatron_args(cfg, args: dict) -> None:
    """What a Megatron run needs to compute GPT-OSS (``to_megatron_args``). Field names as megatron-core's
    TransformerConfig and Megatron-Bridge's GPT-OSS provider spell them (gpt_oss_provider.py)."""
    extra = cfg.hf_extra or {}
    alpha, limit = extra.get("swiglu_alpha", QUICK_GELU_ALPHA), extra.get("swiglu_limit", 7.0)
    if cfg.qkv_bias is False:
        raise CkptError("GPT-OSS with attention_bias false: Megatron's add_bias_linear gives the attention "
                        "output and the experts biases alike, so it cannot leave only the attention's out")
    if float(alpha) != QUICK_GELU_ALPHA:
        raise CkptError(f"GPT-OSS swiglu_alpha={alpha}: Megatron's quick_gelu has 1.702 built in, so a Megatron "
                        "model would compute a different activation")
    args.update(swiglu=False, gated_linear_unit=True, quick_geglu=True, glu_linear_offset=1.0,
                activation_func_clamp_value=float(limit), add_bias_linear=True, add_qkv_bias=True,
                softmax_type="learnable", moe_router_pre_softmax=False, moe_router_score_function="softmax",
                moe_router_load_balancing_type="none")
    args.update(_layer_window(cfg))  # YaRN (position_embedding_type="yarn", yarn_*): mappings/rope.py


def _megatron_problems(cfg) -> list[str]:
    """Where a Megatron GPT-OSS checkpoint's args do not describe GPT-OSS's computation."""
    limit = float((cfg.hf_extra or {}).get("swiglu_limit", 7.0))
    wanted = (("softmax_type", "learnable", "attention sinks need the learnable softmax offset"),
              ("add_bias_linear", True, "GPT-OSS's linears carry biases"),
              ("gated_linear_unit", True, "the experts are gated"),
              ("quick_geglu", True, "the gate is x * sigmoid(1.702 x)"),
              ("glu_linear_offset", 1.0, "GPT-OSS computes (up + 1)"),
              ("activation_func_clamp_value", limit, f"GPT-OSS clamps at swiglu_limit={limit}"))
    problems = fact_problems(cfg, wanted)
    facts = cfg.megatron_facts or {}
    if facts.get("moe_router_pre_softmax"):
        problems.append("its Megatron args say moe_router_pre_softmax (GPT-OSS takes the softmax over the top-k only)")
    if facts.get("window_size") is not None and facts.get("window_attn_skip_freq") in (None, 1):
        problems.append("its Megatron args slide the window on every layer (no window_attn_skip_freq); GPT-OSS "
                        "alternates sliding and full attention")
    return problems


def register() -> None:
    """Add GPT-OSS to the mapping tables (called once by ``ckptscope.mappings``)."""
    from ckptscope.mappings import config, schemas, transforms

    schemas.SCHEMAS.setdefault(ARCH, RULES)
    for name, transform in TRANSFORMS.items():
        transforms.TRANSFORMS.setdefault(name, transform)
    config.ARCH_BY_MODEL_TYPE.setdefault("gpt_oss", ARCH)
    config.HF_CLASS_BY_ARCH.setdefault(ARCH, "GptOssForCausalLM")
    config.HF_EXTRA_KEYS.setdefault(ARCH, HF_EXTRA)
    config.EXPERT_FFN_IS_INTERMEDIATE.add(ARCH)
    config.LOCAL_EXPERTS_KEY.add(ARCH)
    config.MEGATRON_ARGS_HOOKS.setdefault(ARCH, _megatron_args)
    config.HF_CONFIG_HOOKS.setdefault(ARCH, _hf_config)
    config.MEGATRON_CHECKS.setdefault(ARCH, _megatron_problems)
    config.ARCH_FACTS.setdefault(ARCH, FACTS)
