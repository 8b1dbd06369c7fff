"""Which optional tensors transformers builds from a config.json, to check an HF export against the
config it writes.

The shapes of the always-present tensors are checked in ``config.hf_shape_problems``. This module covers
what a config switches on or off: attention biases, q/k norms, multi-latent attention's projections
(``q_lora_rank``) and their sizes, and which decoder layers are MoE; and that every layer holds what
transformers builds in every layer of its kind (a save that left frozen parameters out lacks some). A
config derived from Megatron args or given with ``--hf-config`` that disagrees with the stored tensors
here gave an export that transformers loaded with tensors dropped as unexpected and others initialised
at random, exit 0 (a probe: DeepSeek-V3 with another ``q_lora_rank``, ``kv_lora_rank`` or
``first_k_dense_replace``, an ``attention_bias`` the tensors lack). The rules below are transformers 5's modeling code, checked
per arch against a model it builds from the same config (tests/test_hf_layout.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)\Z")

_ALL_FOUR = ("q_proj", "k_proj", "v_proj", "o_proj")
_QKV = ("q_proj", "k_proj", "v_proj")
_BIASED = {
    "llama": ("attention_bias", False, _ALL_FOUR), "qwen3": ("attention_bias", False, _ALL_FOUR),
    "qwen3_moe": ("attention_bias", False, _ALL_FOUR), "gemma2": ("attention_bias", False, _ALL_FOUR),
    "gemma3": ("attention_bias", False, _ALL_FOUR), "gpt_oss": ("attention_bias", False, _ALL_FOUR),
    "llama4": ("attention_bias", False, _ALL_FOUR), "glm4_moe": ("attention_bias", False, _QKV),
    "qwen2": (None, True, _QKV), "qwen2_moe": ("qkv_bias", True, _QKV),
    "mistral": (None, False, ()), "mixtral": (None, False, ()),
    "deepseek_v3": ("attention_bias", False, ("q_a_proj", "kv_a_proj_with_mqa", "o_proj")),
}
"""arch -> (the config key that switches the attention biases on, its default, the projections that then
carry one). ``None``: the arch has no such key (Qwen2 always has q/k/v biases, Mistral never)."""
_BIAS_CANDIDATES = frozenset(_ALL_FOUR + ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"))

_QK_NORM = {"qwen3": True, "qwen3_moe": True, "gemma3": True, "glm4_moe": "use_qk_norm"}
"""arch -> whether its attention has ``q_norm`` / ``k_norm`` weights (True, or the config key saying it).
Llama 4's ``use_qk_norm`` is an L2 norm without weights; the other archs have none."""


def _layer_of(name: str) -> tuple[int, str] | None:
    match = _LAYER.search(name)
    return (int(match.group(1)), match.group(2)) if match else None


def moe_layers(arch: str, text: dict[str, Any], num_layers: int) -> set[int] | None:
    """The decoder layers transformers builds with routed experts, by each modeling file's own rule;
    None for an arch without MoE layers. ``text`` has passed ``config.check_hf_config_types``."""
    every = set(range(num_layers))
    if arch in ("mixtral", "gpt_oss"):
        return every
    if arch == "deepseek_v3" or arch == "glm4_moe":
        default = 3 if arch == "deepseek_v3" else 1
        first = text.get("first_k_dense_replace")
        return set(range(int(default if first is None else first), num_layers))
    if arch in ("qwen2_moe", "qwen3_moe"):
        dense = set(text.get("mlp_only_layers") or ())
        step = int(text.get("decoder_sparse_step") or 1)
        experts = int(text.get("num_experts") or text.get("num_local_experts") or 0)  # 5.x saves the latter
        return {i for i in every if i not in dense and experts > 0 and (i + 1) % step == 0}
    if arch == "llama4":
        if text.get("moe_layers") is not None:
            return {int(i) for i in text["moe_layers"]} & every
        step = int(text.get("interleave_moe_layer_step") or 1)
        return set(range(step - 1, num_layers, step))
    return None


def _mla_shapes(text: dict[str, Any], hidden: int, heads: int) -> dict[str, tuple[int, ...] | None]:
    """DeepSeek-V3's attention tensors as transformers builds them; None for one it does not build."""
    q_lora, kv_lora = text.get("q_lora_rank"), text.get("kv_lora_rank")
    nope, rope, v = text.get("qk_nope_head_dim"), text.get("qk_rope_head_dim"), text.get("v_head_dim")
    if None in (kv_lora, nope, rope, v):
        return {}
    q_out = heads * (nope + rope)
    shapes: dict[str, tuple[int, ...] | None] = {
        "self_attn.kv_a_proj_with_mqa.weight": (kv_lora + rope, hidden),
        "self_attn.kv_a_layernorm.weight": (kv_lora,),
        "self_attn.kv_b_proj.weight": (heads * (nope + v), kv_lora),
        "self_attn.o_proj.weight": (hidden, heads * v),
    }
    if q_lora is None:
        shapes.update({"self_attn.q_proj.weight": (q_out, hidden), "self_attn.q_a_proj.weight": None,
                       "self_attn.q_a_layernorm.weight": None, "self_attn.q_b_proj.weight": None})
    else:
        shapes.update({"self_attn.q_proj.weight": None, "self_attn.q_a_proj.weight": (q_lora, hidden),
                       "self_attn.q_a_layernorm.weight": (q_lora,), "self_attn.q_b_proj.weight": (q_out, q_lora)})
    return shapes


def _bias_set(arch: str, text: dict[str, Any]) -> tuple[str, frozenset[str]] | None:
    """(how the config says it, the projections transformers gives a bias) for ``arch``."""
    if arch not in _BIASED:
        return None
    key, default, projections = _BIASED[arch]
    on = default if key is None or text.get(key) is None else bool(text[key])
    said = f"{key} {str(on).lower()}" if key else f"{arch} ({'always' if on else 'never'} biased)"
    if arch == "deepseek_v3" and text.get("q_lora_rank") is None:
        projections = tuple(p for p in projections if p != "q_a_proj")  # its q_proj has no bias
    return said, frozenset(projections if on else ())


def layout_problems(arch: str | None, text: dict[str, Any], num_layers: int | None, hidden: int | None,
                    heads: int | None, head_dim: int | None,
                    shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """One line per kind of disagreement between the tensors an HF export writes and the optional
    tensors its config makes transformers build (keys: what kind, for the caller to merge)."""
    if not arch or not num_layers:
        return {}
    per_layer: dict[int, dict[str, tuple[int, ...]]] = {}
    for name, shape in shapes.items():
        found = _layer_of(name)
        if found and found[0] < num_layers:  # MTP layers follow the decoder's and are not built
            per_layer.setdefault(found[0], {})[found[1]] = tuple(shape)
    if not per_layer:
        return {}
    problems: dict[str, str] = {}

    moe = moe_layers(arch, text, num_layers)
    missing = _missing_in_layers(per_layer, moe, _required(arch, text))
    if missing:
        problems["missing"] = missing
    if not any(name.endswith("embed_tokens.weight") and ".layers." not in name for name in shapes):
        problems["embedding"] = "the tensors have no embed_tokens.weight (transformers would initialise it at random)"
    if not any(name.endswith("norm.weight") and ".layers." not in name for name in shapes):
        problems["final-norm"] = "the tensors have no final norm.weight (transformers would initialise it at random)"
    if moe is not None:
        stored = {i for i, names in per_layer.items() if any(".experts." in n for n in names)}
        if stored != moe & set(per_layer):
            problems["moe-layers"] = (f"the tensors have routed experts in layers {ranges(stored) or 'none'} but "
                                      f"config.json makes layers {ranges(moe) or 'none'} MoE "
                                      f"({_moe_keys(arch)})")

    biases = _bias_set(arch, text)
    if biases is not None:
        said, wanted = biases
        for i, names in sorted(per_layer.items()):
            have = {n.split(".")[1] for n in names
                    if n.startswith("self_attn.") and n.endswith(".bias") and n.split(".")[1] in _BIAS_CANDIDATES}
            if have != wanted:
                extra, missing = sorted(have - wanted), sorted(wanted - have)
                parts = ([f"the tensors have {', '.join(f'self_attn.{p}.bias' for p in extra)}, which "
                          "config.json does not build"] if extra else []) + (
                    [f"config.json implies {', '.join(f'self_attn.{p}.bias' for p in missing)}, which the "
                     "tensors lack"] if missing else [])
                problems["bias"] = f"layer {i}: {' and '.join(parts)} ({said})"
                break

    if arch == "llama":  # mlp_bias: gate/up/down biases (Megatron's add_bias_linear exports set it)
        wanted_mlp = bool(text.get("mlp_bias"))
        for i, names in sorted(per_layer.items()):
            have_mlp = any(n.startswith("mlp.") and n.endswith("_proj.bias") for n in names)
            if have_mlp != wanted_mlp:
                problems["mlp-bias"] = (f"layer {i}: the tensors {'have' if have_mlp else 'have no'} mlp "
                                        f"gate/up/down biases but config.json says mlp_bias {str(wanted_mlp).lower()}")
                break

    norm = _QK_NORM.get(arch, False)
    wanted_norm = bool(text.get(norm)) if isinstance(norm, str) else norm
    for i, names in sorted(per_layer.items()):
        have_norm = "self_attn.q_norm.weight" in names or "self_attn.k_norm.weight" in names
        if have_norm != wanted_norm:
            how = f"{norm} {str(wanted_norm).lower()}" if isinstance(norm, str) else f"{arch} has " + (
                "q/k norms" if wanted_norm else "no q/k norm weights")
            problems["qk-norm"] = (f"layer {i}: the tensors {'have' if have_norm else 'have no'} "
                                   f"self_attn.q_norm/k_norm weights but config.json says otherwise ({how})")
            break
        if wanted_norm and head_dim:
            for key in ("self_attn.q_norm.weight", "self_attn.k_norm.weight"):
                if key in names and names[key] != (head_dim,):
                    problems["qk-norm"] = f"layer {i}: {key} is {list(names[key])} but config.json implies [{head_dim}]"
                    break

    if arch == "deepseek_v3" and hidden and heads:
        expected = _mla_shapes(text, hidden, heads)
        for i, names in sorted(per_layer.items()):
            for key, shape in expected.items():
                got = names.get(key)
                if shape is None and got is not None:
                    problems["mla"] = (f"layer {i}: the tensors have {key} but config.json builds no such tensor "
                                       f"(q_lora_rank {text.get('q_lora_rank')!r})")
                elif shape is not None and got is None:
                    problems["mla"] = (f"layer {i}: config.json implies {key} {list(shape)} but the tensors have "
                                       f"none (q_lora_rank {text.get('q_lora_rank')!r})")
                elif shape is not None and got != shape:
                    problems["mla"] = (f"layer {i}: {key} is {list(got)} but config.json implies {list(shape)} "
                                       f"(q_lora_rank, kv_lora_rank, qk_nope/rope_head_dim, v_head_dim)")
                else:
                    continue
                break
            if "mla" in problems:
                break
    return problems


_ATTENTION = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight")
_MLA = ("self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_layernorm.weight", "self_attn.kv_b_proj.weight",
        "self_attn.o_proj.weight")
_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")


def _required(arch: str, text: dict[str, Any]) -> dict[bool, set[str]]:
    """Per-layer tensors every decoder layer of ``arch`` has, by kind (False: dense, True: MoE): the
    attention, the two norms, and a dense layer's MLP."""
    mlp = "feed_forward." if arch == "llama4" else "mlp."
    common = set(_NORMS) | set(_MLA if arch == "deepseek_v3" else _ATTENTION)
    moe = set(common)
    if arch == "qwen2_moe":  # every Qwen2-MoE block has a shared expert behind a sigmoid gate (a probe: a
        # Megatron MoE whose shared expert has no gate exported with the gate initialised at random)
        moe |= {f"mlp.shared_expert.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
        moe.add("mlp.shared_expert_gate.weight")
    return {False: common | {f"{mlp}{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}, True: moe}


def _missing_in_layers(per_layer: dict[int, dict[str, tuple[int, ...]]], moe: set[int] | None,
                       required: dict[bool, set[str]]) -> str | None:
    """A layer that lacks a tensor its arch builds in every layer, or one every other layer of its kind
    (dense or MoE) has: a save that left some parameters out (DeepSpeed's ``exclude_frozen_parameters``:
    a probe's export loaded with the frozen weights initialised at random, exit 0). None when whole."""
    def kind(i: int) -> bool:
        return moe is not None and i in moe

    union: dict[bool, set[str]] = {k: set(names) for k, names in required.items()}
    for i, names in per_layer.items():
        union.setdefault(kind(i), set()).update(names)
    for i, names in sorted(per_layer.items()):
        lacking = sorted(union[kind(i)] - names.keys())
        if lacking:
            more = f" (+{len(lacking) - 3} more)" if len(lacking) > 3 else ""
            why = ("an ungated shared expert: Megatron's moe_shared_expert_gate was off, and Qwen2-MoE always gates "
                   "it" if lacking == ["mlp.shared_expert_gate.weight"] else "a save that left frozen parameters out?")
            return (f"layer {i} lacks {', '.join(lacking[:3])}{more}, which transformers builds in every "
                    f"{'MoE ' if kind(i) and moe != set(per_layer) else ''}layer and would initialise at random "
                    f"({why})")
    return None


def _moe_keys(arch: str) -> str:
    return {"deepseek_v3": "first_k_dense_replace", "glm4_moe": "first_k_dense_replace",
            "qwen2_moe": "mlp_only_layers, decoder_sparse_step", "qwen3_moe": "mlp_only_layers, decoder_sparse_step",
            "llama4": "moe_layers, interleave_moe_layer_step"}.get(arch, "every layer is MoE")


def ranges(values: Iterable[int]) -> str:
    """``0-3, 7`` for {0, 1, 2, 3, 7}."""
    out: list[list[int]] = []
    for value in sorted(values):
        if out and value == out[-1][1] + 1:
            out[-1][1] = value
        else:
            out.append([value, value])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)
