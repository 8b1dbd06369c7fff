"""DeepSeek-V3 (and the Kimi-K2 / Moonlight checkpoints that reuse ``model_type: deepseek_v3``) between HF
and Megatron-Core: multi-latent attention, first-k dense layers, routed + shared experts, the router's
score-correction bias and the multi-token-prediction (MTP) layers.

Names (megatron-core 0.16.1 ``multi_latent_attention.py``, ``multi_token_prediction.py``, ``gpt_layer_specs.py``;
Megatron-Bridge ``src/megatron/bridge/models/deepseek/common.py``; transformers
``models/deepseek_v3/modeling_deepseek_v3.py``):

* MLA. ``q_a_proj`` / ``q_b_proj`` are ``linear_q_down_proj`` / ``linear_q_up_proj``; with ``q_lora_rank``
  None there is one ``q_proj`` = ``linear_q_proj``. ``kv_a_proj_with_mqa`` is ``linear_kv_down_proj``
  (rows ``[kv_lora_rank; qk_rope_head_dim]`` in both), ``kv_b_proj`` is ``linear_kv_up_proj`` (per head
  ``[qk_nope_head_dim; v_head_dim]`` rows in both: identity, as Megatron-Bridge's ``AutoMapping``). The
  two latent norms live in the up projections with the TransformerEngine spec
  (``linear_q_up_proj.layer_norm_weight`` = ``q_a_layernorm``, ``linear_kv_up_proj.layer_norm_weight`` =
  ``kv_a_layernorm``) and are ``q_layernorm`` / ``kv_layernorm`` with the local spec, which has no keys
  map for MLA: the two specs store different torch_dist keys, so the spelling follows ``--spec``.
  ``input_layernorm`` stays its own module in both specs (0.16.1).
* RoPE. transformers' ``rope_interleave`` (default True) de-interleaves the rope half of q and k before a
  rotate-half RoPE; megatron-core does the same for every MLA model with ``rotary_interleaved=False``
  (``rope_utils._apply_rotary_pos_emb_bshd``: ``multi_latent_attention`` takes ``t[..., 0::2]``,
  ``t[..., 1::2]``). So the weights copy unchanged and the args say ``rotary_interleaved: False``; an HF
  config with ``rope_interleave: False`` has no Megatron equivalent and is refused.
* Layers ``< first_k_dense_replace`` have a dense MLP (their ``post_attention_layernorm`` is the TE
  spec's ``mlp.linear_fc1.layer_norm_weight``); the rest are MoE (``pre_mlp_layernorm``, router
  ``mlp.gate.weight`` = ``mlp.router.weight``, ``mlp.gate.e_score_correction_bias`` =
  ``mlp.router.expert_bias``, routed experts, ``mlp.shared_experts``). Megatron records the pattern
  in ``moe_layer_freq`` (a list), which also makes torch_dist store every layer under its own key.
* MTP. The release checkpoints keep MTP layer ``k`` as ``model.layers.{num_hidden_layers + k}``
  (transformers does not build it): ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm`` (=
  ``final_layernorm``) and a full decoder layer (= ``transformer_layer``). Its ``embed_tokens`` and
  ``shared_head.head`` are copies of the main embedding / head, which Megatron's MTP shares: they are
  not written to Megatron (said in the notes) and are re-created from the main tensors on export.
  In the rules the MTP layers are ``model.layers.N+{k}.…`` on the HF side (``to_view`` / ``from_view``
  rename to and from the stored index), so their rules cannot be confused with the main layers'.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace

from ckptscope.core.errors import CkptError
from ckptscope.mappings import config as _config
from ckptscope.mappings.links import Piece, Recipe
from ckptscope.mappings.schemas import DENSE_MLP, L_HF, L_MC, SCHEMAS, Rule, _experts, _layer

ARCH = "deepseek_v3"

MTP_HF = "model.layers.N+{i}."
"""HF prefix of MTP layer ``i`` in the rules: stored as ``model.layers.{N + i}.`` with ``N`` =
``num_hidden_layers``, which a name template cannot compute, so ``to_view`` / ``from_view`` rename
between the two (``N+`` keeps the rules apart from the main layers' ``model.layers.{i}.``)."""
MTP_MC = "mtp.layers.{i}."
MTP_LAYER_MC = MTP_MC + "transformer_layer."
MTP_SHARED = ("embed_tokens.weight", "shared_head.head.weight")
"""MTP tensors that are copies of ``model.embed_tokens.weight`` / ``lm_head.weight`` (shared in Megatron)."""
MTP_SHARED_SOURCE = {"embed_tokens.weight": "model.embed_tokens.weight", "shared_head.head.weight": "lm_head.weight"}

MOE_GATE = L_HF + "mlp.gate.weight"
"""A layer is a MoE layer iff its HF side has a router; the rules for its norm depend on it."""

MLA = (
    _layer("input_layernorm.weight", "input_layernorm.weight"),
    _layer("self_attn.q_a_proj.weight", "self_attention.linear_q_down_proj.weight"),
    _layer("self_attn.q_a_layernorm.weight", ("self_attention.linear_q_up_proj.layer_norm_weight",
                                              "self_attention.q_layernorm.weight"),
           local="self_attention.q_layernorm.weight"),
    _layer("self_attn.q_b_proj.weight", "self_attention.linear_q_up_proj.weight"),
    _layer("self_attn.q_proj.weight", "self_attention.linear_q_proj.weight"),  # q_lora_rank None
    _layer("self_attn.kv_a_proj_with_mqa.weight", "self_attention.linear_kv_down_proj.weight"),
    _layer("self_attn.kv_a_layernorm.weight", ("self_attention.linear_kv_up_proj.layer_norm_weight",
                                               "self_attention.kv_layernorm.weight"),
           local="self_attention.kv_layernorm.weight"),
    _layer("self_attn.kv_b_proj.weight", "self_attention.linear_kv_up_proj.weight"),
    _layer("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
)

DENSE = tuple(replace(rule, unless=MOE_GATE) for rule in DENSE_MLP)
"""The first ``first_k_dense_replace`` layers: Llama's MLP, norm fused into fc1 with the TE spec."""

MOE = (
    replace(_layer("post_attention_layernorm.weight", "pre_mlp_layernorm.weight"), when=MOE_GATE),
    _layer("mlp.gate.weight", "mlp.router.weight"),
    _layer("mlp.gate.e_score_correction_bias", "mlp.router.expert_bias"),
    *_experts("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight", "mlp.experts.{e}.down_proj.weight"),
    _layer(("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"),
           "mlp.shared_experts.linear_fc1.weight", "gate_up"),
    _layer("mlp.shared_experts.down_proj.weight", "mlp.shared_experts.linear_fc2.weight"),
)


def _in_mtp(rule: Rule) -> Rule:
    """A main-layer rule moved onto MTP layer ``{i}``'s decoder layer."""
    def hf(t: str | None) -> str | None:
        return MTP_HF + t[len(L_HF):] if t else None

    def mc(t: str | None) -> str | None:
        return MTP_LAYER_MC + t[len(L_MC):] if t else None

    return Rule(tuple(hf(t) for t in rule.hf), tuple(mc(t) for t in rule.mcore), rule.transform, mc(rule.local),
                hf(rule.when), hf(rule.unless))


def mtp_rules(layer: tuple[Rule, ...]) -> tuple[Rule, ...]:
    """The MTP layers' rules for a model whose decoder layer has the rules ``layer`` (DeepSeek-V3, GLM-4.5):
    that decoder layer as ``transformer_layer`` plus the MTP modules of their own."""
    return tuple(_in_mtp(r) for r in layer) + (
        Rule((MTP_HF + "enorm.weight",), (MTP_MC + "enorm.weight",)),
        Rule((MTP_HF + "hnorm.weight",), (MTP_MC + "hnorm.weight",)),
        Rule((MTP_HF + "eh_proj.weight",), (MTP_MC + "eh_proj.weight",)),
        Rule((MTP_HF + "shared_head.norm.weight",), (MTP_MC + "final_layernorm.weight",)),
    )


LAYER = MLA + DENSE + MOE
MTP = mtp_rules(LAYER)

_TOP = tuple(r for r in SCHEMAS["llama"] if not r.hf[0].startswith(L_HF))
SCHEMAS[ARCH] = _TOP + LAYER + MTP


# --- the MTP layers' stored HF names ---------------------------------------------------------------------

_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)\Z")
_MTP_NAME = re.compile(r"model\.layers\.N\+(\d+)\.(.+)\Z")


def to_view(names: Mapping[str, object], num_layers: int | None) -> tuple[dict[str, str], list[str]]:
    """(stored -> mapping name) for the MTP layers' tensors, and the stored names of their shared copies.

    Layer indices ``>= num_layers`` (config.json's ``num_hidden_layers``) are MTP layers."""
    renames: dict[str, str] = {}
    shared: list[str] = []
    if num_layers is None:
        return renames, shared
    for name in names:
        match = _HF_LAYER.match(name)
        if match and int(match.group(1)) >= num_layers:
            k, rest = int(match.group(1)) - num_layers, match.group(2)
            if rest in MTP_SHARED:
                shared.append(name)
            else:
                renames[name] = MTP_HF.format(i=k) + rest
    return renames, shared


def stored_name(name: str, num_layers: int) -> str:
    match = _MTP_NAME.match(name)
    return f"model.layers.{num_layers + int(match.group(1))}.{match.group(2)}" if match else name


def from_view(recipes: dict[str, Recipe], num_layers: int | None) -> dict[str, Recipe]:
    """HF recipes under the stored MTP names, with each MTP layer's copies of the embedding and head
    re-created from the main tensors (the release layout)."""
    if num_layers is None:
        if any(_MTP_NAME.match(n) for n in recipes):
            raise CkptError("MTP layers present but the number of main layers is unknown: pass --hf-config")
        return recipes
    out: dict[str, Recipe] = {}
    layers: set[int] = set()
    for name, recipe in recipes.items():
        match = _MTP_NAME.match(name)
        if match:
            layers.add(int(match.group(1)))
            name = stored_name(name, num_layers)
            recipe = Recipe(name, recipe.shape, recipe.dtype, recipe.pieces, recipe.transforms, recipe.padding,
                            recipe.fill)
        out[name] = recipe
    for k in sorted(layers):
        for rest, main in MTP_SHARED_SOURCE.items():
            source = out.get(main) or (out.get("model.embed_tokens.weight") if main == "lm_head.weight" else None)
            if source is not None:
                name = f"model.layers.{num_layers + k}.{rest}"
                out[name] = Recipe(name, source.shape, source.dtype, list(source.pieces), list(source.transforms),
                                   list(source.padding), list(source.fill))
    return out


def mtp_layers(names: Mapping[str, object]) -> int:
    """How many MTP layers the Megatron-side names hold."""
    found = {int(m.group(1)) for m in (re.match(r"mtp\.layers\.(\d+)\.", n) for n in names) if m}
    return max(found) + 1 if found else 0


def renamed_pieces(recipes: dict[str, Recipe], stored: Mapping[str, str]) -> None:
    """Point pieces that read mapping names back at the stored tensors (in place)."""
    for recipe in recipes.values():
        recipe.pieces = [Piece(p.dst_box, stored.get(p.source, p.source), p.src_box) for p in recipe.pieces]


# --- config: what Megatron must be told, and what HF keeps -----------------------------------------------

HF_KEYS = ("model_type", "hidden_act", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
           "v_head_dim", "qk_head_dim", "head_dim", "first_k_dense_replace", "n_routed_experts", "n_shared_experts",
           "moe_intermediate_size", "num_experts_per_tok", "routed_scaling_factor", "n_group", "topk_group",
           "norm_topk_prob", "topk_method", "scoring_func", "rope_interleave", "rope_parameters", "rope_scaling",
           "num_nextn_predict_layers", "attention_bias", "pad_token_id", "bos_token_id", "eos_token_id")
"""DeepSeek config keys with no Megatron argument of the same spelling: carried verbatim in the Megatron
args (``hf_config_extra``) so HF -> Megatron -> HF gives the same config.json."""
_MLA_DIMS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def rope_of(extra: dict) -> dict:
    rope = extra.get("rope_parameters") or extra.get("rope_scaling") or {}
    return rope if isinstance(rope, dict) else {}


def routed_moe_args(cfg: _config.ModelConfig, arch: str) -> dict:
    """Megatron args of the DeepSeek-style MoE (shared by GLM-4.5): first-k dense layers, a sigmoid router
    with the score-correction bias, group-limited routing, MTP. Refuses routings megatron-core computes
    differently from transformers' ``DeepseekV3TopkRouter`` / ``Glm4MoeTopkRouter``."""
    extra = cfg.hf_extra or {}
    topk = cfg.moe_router_topk or extra.get("num_experts_per_tok") or 1
    if extra.get("norm_topk_prob") is False and topk > 1:
        raise CkptError(f"{arch} with norm_topk_prob=false: megatron-core's sigmoid router always normalises "
                        "the top-k weights, so this model has no Megatron equivalent")
    groups, group_topk = extra.get("n_group") or 1, extra.get("topk_group") or 1
    if 1 < groups and group_topk < groups and topk // group_topk != 2:
        raise CkptError(f"{arch} with {topk} experts per token from {group_topk} of {groups} groups: transformers "
                        f"scores a group by its top 2 experts, megatron-core by its top {topk // group_topk}")
    layers = cfg.require("num_layers")
    dense = int(extra.get("first_k_dense_replace") or 0)
    return {
        "moe_layer_freq": [0] * dense + [1] * (layers - dense),
        "moe_router_enable_expert_bias": True,
        "moe_router_score_function": extra.get("scoring_func") or "sigmoid",
        "moe_router_topk_scaling_factor": extra.get("routed_scaling_factor"),
        "moe_router_num_groups": extra.get("n_group"),
        "moe_router_group_topk": extra.get("topk_group"),
        "mtp_num_layers": cfg.mtp_num_layers or None,
    }


def megatron_args(cfg: _config.ModelConfig) -> dict:
    """The Megatron-LM args a DeepSeek-V3 model needs besides the common ones (names as in arguments.py)."""
    extra = cfg.hf_extra or {}
    missing = [k for k in _MLA_DIMS if extra.get(k) is None]
    if missing:
        raise CkptError(f"deepseek_v3: the config does not say {', '.join(missing)}; pass --hf-config DIR")
    if extra.get("rope_interleave", True) is False:
        raise CkptError("deepseek_v3 with rope_interleave=false: megatron-core's MLA always de-interleaves "
                                "the rope half of q and k, so this model has no Megatron equivalent")
    args = {
        "multi_latent_attention": True,
        "q_lora_rank": extra.get("q_lora_rank"),
        "kv_lora_rank": extra["kv_lora_rank"],
        "qk_head_dim": extra["qk_nope_head_dim"],
        "qk_pos_emb_head_dim": extra["qk_rope_head_dim"],
        "v_head_dim": extra["v_head_dim"],
        "kv_channels": extra["v_head_dim"],
        "qk_layernorm": True,  # MLA's latent norms (q_a_layernorm, kv_a_layernorm)
        "rotary_interleaved": False,  # MLA de-interleaves by itself, as HF's rope_interleave=True
        **routed_moe_args(cfg, ARCH),
        "hf_config_extra": {**extra, "model_type": extra.get("model_type") or ARCH},  # kimi_k2 stays kimi_k2
    }
    return args  # RoPE and its YaRN scaling (rope_type, rotary_scaling_factor, mscale ...): mappings/rope.py


def edit_megatron_args(cfg: _config.ModelConfig, args: dict) -> None:
    """``MEGATRON_ARGS_HOOKS`` entry: the common args plus ``megatron_args``."""
    args.update(megatron_args(cfg))


def finish_hf_config(cfg: _config.ModelConfig, out: dict) -> None:
    """config.json for DeepSeek-V3: the MLA and MoE keys come from ``hf_config_extra`` (refused without)."""
    missing = [k for k in _MLA_DIMS if k not in out]
    if missing:
        raise CkptError(f"deepseek_v3: the Megatron args do not carry {', '.join(missing)} "
                                f"(hf_config_extra); pass --hf-config DIR")
    for key in ("num_experts", "shared_expert_intermediate_size"):  # DeepSeek spells them n_routed/n_shared_experts
        out.pop(key, None)
    out["model_type"] = (cfg.hf_extra or {}).get("model_type") or ARCH


TRANSFORMERS_LATENT_EPS = 1e-6
"""transformers builds ``q_a_layernorm`` / ``kv_a_layernorm`` with its RMSNorm's default eps, whatever
``rms_norm_eps`` says; megatron-core's MLA uses ``layernorm_epsilon`` for them as for every other norm."""


def latent_eps_notes(cfg: _config.ModelConfig) -> list[str]:
    """Say when the two sides' latent norms differ: a model whose norm epsilon is not 1e-6 computes (slightly)
    otherwise in transformers than in megatron-core, in both directions; no args or config key can say it."""
    eps = cfg.norm_epsilon
    if eps is None or math.isclose(float(eps), TRANSFORMERS_LATENT_EPS, rel_tol=1e-9):
        return []
    return [f"deepseek_v3: transformers computes the latent norms (q_a_layernorm, kv_a_layernorm) with eps "
            f"{TRANSFORMERS_LATENT_EPS:g}, megatron-core with the model's norm epsilon {float(eps):g}; the two "
            f"models differ slightly there (no config key or Megatron arg can say it)"]


_config.ARCH_BY_MODEL_TYPE.setdefault(ARCH, ARCH)
_config.ARCH_BY_MODEL_TYPE.setdefault("kimi_k2", ARCH)  # Kimi-K2: DeepseekV3ForCausalLM weights, own model_type
_config.HF_CLASS_BY_ARCH.setdefault(ARCH, "DeepseekV3ForCausalLM")
_config.HF_EXTRA_KEYS.setdefault(ARCH, HF_KEYS)
_config.MEGATRON_ARGS_HOOKS[ARCH] = edit_megatron_args
_config.HF_CONFIG_HOOKS[ARCH] = finish_hf_config
_config.EXPORT_NOTES.setdefault(ARCH, latent_eps_notes)
_config.HF_EXPORT_NOTES.setdefault(ARCH, latent_eps_notes)
_config.MLA_ARCHS.add(ARCH)
_config.MTP_ARCHS.add(ARCH)
_config.ARCH_FACTS[ARCH] = [
    "multi-latent attention: Megatron args say multi_latent_attention, q_lora_rank, kv_lora_rank, qk_head_dim, "
    "qk_pos_emb_head_dim, v_head_dim; rotary_interleaved=False (MLA de-interleaves itself = HF rope_interleave)",
    "q_a_layernorm / kv_a_layernorm: linear_q_up_proj / linear_kv_up_proj.layer_norm_weight (--spec te), "
    "q_layernorm / kv_layernorm (--spec local)",
    "layers < first_k_dense_replace are dense (moe_layer_freq list); router bias e_score_correction_bias = "
    "mlp.router.expert_bias (moe_router_enable_expert_bias)",
    "MTP layer k = model.layers.{num_hidden_layers + k} <-> mtp.layers.k (transformer_layer, enorm, hnorm, eh_proj, "
    "final_layernorm = shared_head.norm); its embed_tokens / shared_head.head copies are shared in Megatron",
]
