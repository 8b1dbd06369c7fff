"""Apply a schema to a concrete checkpoint: which tensors exist, which rule each one matches, and the
recipes that present the checkpoint in the other name space (``to_hf`` / ``to_mcore``).

Works on names and shapes only (no tensor bytes, no torch), so ``--dry-run`` plans, the TUI preview
and the diff pairing are all cheap.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache

from ckptscope.core.errors import CkptError
from ckptscope.core.index import CheckpointIndex
from ckptscope.core.roles import naming_family
from ckptscope.core.tensor import TensorMeta
from ckptscope.mappings import deepseek
from ckptscope.mappings.bridge_config import from_run_config, from_transformer_config, is_run_config
from ckptscope.mappings.config import ARCH_BY_MODEL_TYPE, MTP_ARCHS, ModelConfig, from_hf_config, from_megatron_args
from ckptscope.mappings.links import Link, Recipe, box_shape, recipes_from_links, uncovered
from ckptscope.mappings.nemo1_config import NEMO1_CONFIG, from_nemo1_config, is_nemo1_config
from ckptscope.mappings.schemas import SCHEMAS, Rule, is_ignored
from ckptscope.mappings.transforms import TRANSFORMS, hf_stacked, stacked

__all__ = ["MappedView", "TensorShape", "naming_family", "to_hf", "to_mcore"]
"""``naming_family`` is core's (``core.roles``), named here for the mapping's callers."""


@dataclass(frozen=True, slots=True)
class TensorShape:
    shape: tuple[int, ...]
    dtype: str


@dataclass
class MappedView:
    """A checkpoint presented in another name space (``space`` is ``"hf"`` or ``"mcore"``)."""

    space: str
    arch: str
    config: ModelConfig
    recipes: dict[str, Recipe]
    unmapped: list[str] = field(default_factory=list)
    """Source tensors no rule consumed; the caller decides (diff keeps them by name, convert refuses)."""
    ignored: list[str] = field(default_factory=list)
    """Source tensors that are never values (``_extra_state``, ``inv_freq``), or copies the target keeps once."""
    notes: list[str] = field(default_factory=list)


def config_from_index(index: CheckpointIndex) -> ModelConfig:
    """Everything the checkpoint itself says about the model: an HF config.json (HF dirs, verl's
    ``huggingface/``) first, then Megatron ``args`` (or Megatron-Bridge's ``run_config.yaml``), then what
    tensor shapes imply."""
    hf_cfg = ModelConfig()
    for obj in index.objects:
        value = obj.value
        if isinstance(value, dict) and _is_hf_config(value) and hf_cfg.hidden_size is None:
            hf_cfg = from_hf_config(value)
    for key in ("hf_config", "huggingface_config"):
        if isinstance(index.metadata.get(key), dict) and hf_cfg.hidden_size is None:
            hf_cfg = from_hf_config(index.metadata[key])
    return hf_cfg.merged(megatron_config_from_index(index) or ModelConfig())


def _is_hf_config(value: dict) -> bool:
    return "model_type" in value and ("hidden_size" in value or "text_config" in value)


def megatron_config_from_index(index: CheckpointIndex) -> ModelConfig | None:
    """What the Megatron args (or Megatron-Bridge's ``run_config.yaml``) alone say of the model, or None
    when the save carries neither: the side an HF config given beside it must agree with. The first
    that states a hidden size wins."""
    found: ModelConfig | None = None
    for obj in index.objects:
        value = obj.value
        if not isinstance(value, dict) or _is_hf_config(value):
            continue
        if value.get("__class__", "").endswith("Namespace") and "num_layers" in value:
            found = from_megatron_args(value)
        elif obj.name == "run_config" and is_run_config(value):
            found = from_run_config(value)  # Megatron-Bridge: the model section of run_config.yaml
        elif obj.name == "nemo_model" and is_run_config({"model": value.get("config")}):
            found = from_run_config({"model": value["config"]})  # NeMo 2.0: context/model.yaml's GPTConfig
        elif obj.name == NEMO1_CONFIG and is_nemo1_config(value):
            found = from_nemo1_config(value)  # NeMo 1.x: a .nemo's model_config.yaml (None: a setting not read)
        elif obj.name == "transformer_config" and "num_layers" in value and "hidden_size" in value:
            # verl's Megatron saves: its TransformerConfig as JSON (transformer_config.json), the fields a
            # Bridge model section has; a wrong --hf-config was exported with exit 0 (a probe with verl 0.9.1)
            found = from_transformer_config(value)
        if found is not None and found.hidden_size is not None:
            return found
    return found


def config_from_names(tensors: Mapping[str, TensorShape]) -> ModelConfig:
    """What the tensor names and shapes alone imply (layers, hidden size, HF vocabulary)."""
    layers = set()
    for name in tensors:
        match = _LAYER_RE.match(name)
        if match:
            layers.add(int(match.group(1)))
    embed = tensors.get("model.embed_tokens.weight")
    down = tensors.get("model.layers.0.mlp.down_proj.weight") or tensors.get("decoder.layers.0.mlp.linear_fc2.weight")
    return ModelConfig(
        num_layers=max(layers) + 1 if layers else None,
        ffn_hidden_size=down.shape[-1] if down and len(down.shape) == 2 else None,
        hidden_size=embed.shape[1] if embed and len(embed.shape) == 2 else None,
        vocab_size=embed.shape[0] if embed else None,
        tie_word_embeddings=("lm_head.weight" not in tensors) if embed else None,
    )


_LAYER_RE = re.compile(r"(?:model|decoder)\.layers\.(\d+)\.")


def detect_arch(names: Iterable[str], cfg: ModelConfig) -> str:
    """The schema to use: the config's ``model_type`` when known, else guessed from key names."""
    if cfg.arch:
        return cfg.arch
    if cfg.hf_model_type and cfg.hf_model_type not in ARCH_BY_MODEL_TYPE:
        # Gemma, Granite, SmolLM3 ... have Llama's tensor names and compute otherwise: guessing from
        # the names would convert them silently wrong.
        raise CkptError(f"config.json says model_type {cfg.hf_model_type!r}, which ckptscope has no HF <-> "
                        f"Megatron-Core mapping for (`ckptscope archs` lists those it has); --arch NAME "
                        f"converts it as NAME, right only if it computes exactly like NAME")
    joined = "\n".join(names)
    if "kv_a_proj_with_mqa." in joined or "linear_kv_down_proj." in joined:  # multi-latent attention
        return deepseek.ARCH
    if "e_score_correction_bias" in joined or ".router.expert_bias" in joined:  # DeepSeek's router, plain attention
        return "glm4_moe"
    if ".self_attn.sinks" in joined or ".core_attention.softmax_offset" in joined:  # attention sinks
        return "gpt_oss"
    if ".feed_forward." in joined:  # Llama 4's HF module names
        return "llama4"
    if "post_layernorm." in joined or "pre_feedforward_layernorm." in joined:  # Gemma's sandwich norms
        return "gemma3" if "q_norm." in joined or "q_layernorm." in joined else "gemma2"
    moe = cfg.is_moe or ".experts." in joined or "block_sparse_moe" in joined
    qk_norm = "q_norm." in joined or "q_layernorm." in joined
    bias = "q_proj.bias" in joined or "linear_qkv.bias" in joined
    every_linear = "o_proj.bias" in joined or "linear_proj.bias" in joined  # Megatron's add_bias_linear
    if moe:
        if "block_sparse_moe" in joined:
            return "mixtral"
        if "shared_expert" in joined or bias:
            return "qwen2_moe"
        return "qwen3_moe" if qk_norm else "mixtral"
    if qk_norm:
        return "qwen3"
    return "qwen2" if bias and not every_linear else "llama"


@lru_cache(maxsize=512)
def _template_regex(template: str) -> re.Pattern[str]:
    pattern = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{e\}", r"(?P<e>\d+)")
    return re.compile(pattern + r"\Z")


def _literal_suffix(template: str) -> str:
    return template.rsplit("}", 1)[-1]


def _matches(template: str, names: Iterable[str]) -> Iterable[tuple[str, dict[str, str]]]:
    suffix = _literal_suffix(template)
    regex = _template_regex(template)
    for name in names:
        if name.endswith(suffix):
            match = regex.match(name)
            if match:
                yield name, match.groupdict()


def _fmt(template: str, found: Mapping[str, object]) -> str:
    return template.format(i=found.get("i"), e=found.get("e"))


def rules_for(arch: str) -> tuple[Rule, ...]:
    """The rules of ``arch``; an unknown name is one clear error listing the known ones (every command
    that takes ``--arch`` says it this way)."""
    if arch not in SCHEMAS:
        raise CkptError(f"unknown architecture {arch!r}; known: {', '.join(sorted(SCHEMAS))}")
    return SCHEMAS[arch]


def to_hf(tensors: Mapping[str, TensorShape], cfg: ModelConfig, arch: str | None = None) -> MappedView:
    """Present Megatron-Core tensors (global, per-layer names; stacked torch_dist layers already
    split into per-layer views) as HF tensors."""
    arch = arch or detect_arch(tensors, cfg)
    rules = rules_for(arch)
    names = [n for n in tensors if not is_ignored(n)]
    links: list[Link] = []
    consumed: set[str] = set()
    dst_shapes: dict[str, tuple[int, ...]] = {}
    dst_dtypes: dict[str, str] = {}
    fused_experts: dict[str, set[int]] = {}
    for rule in rules:
        transform = TRANSFORMS[rule.transform]
        for alias in rule.mcore:
            is_stack = alias.endswith("[{e}]")
            base = alias[: -len("[{e}]")] if is_stack else alias
            for name, found in list(_matches(base, names)):
                if name in consumed:
                    continue
                meta = tensors[name]
                experts = range(meta.shape[0]) if is_stack else [found.get("e")]
                elem_shape = meta.shape[1:] if is_stack else meta.shape
                for expert in experts:
                    where = dict(found, e=expert)
                    hf_names = [_fmt(t, where) for t in rule.hf]
                    mshape, hshapes = transform.shapes(cfg, tuple(elem_shape), None)
                    new = transform.links(cfg, name, mshape, hf_names, hshapes)
                    if _hf_fuses_experts(rule):  # one HF tensor [E, ...] holds every expert (GPT-OSS)
                        new = hf_stacked(new, int(expert))
                        seen = fused_experts.setdefault(hf_names[0], set())
                        seen.add(int(expert))
                        hshapes = [(len(seen),) + tuple(hshapes[0])]
                    links.extend(stacked(new, expert, name) if is_stack else new)
                    for hf_name, shape in zip(hf_names, hshapes):
                        dst_shapes[hf_name] = tuple(shape)
                        dst_dtypes[hf_name] = meta.dtype
                consumed.add(name)
    for hf_name, seen in fused_experts.items():
        if seen != set(range(len(seen))):
            raise CkptError(f"{hf_name} holds every expert of its layer, but experts {sorted(seen)} are there, "
                            f"not 0..{len(seen) - 1}")
    recipes = recipes_from_links(links, to="hf", shapes=dst_shapes, dtypes=dst_dtypes)
    _attach_padding(recipes, links, tensors)
    if arch in MTP_ARCHS:  # MTP layers back under their stored names, with their shared copies
        recipes = deepseek.from_view(recipes, cfg.num_layers)
    unmapped = [n for n in names if n not in consumed]
    ignored = [n for n in tensors if is_ignored(n)]
    return MappedView("hf", arch, cfg, recipes, unmapped, ignored)


def to_mcore(tensors: Mapping[str, TensorShape], cfg: ModelConfig, arch: str | None = None, *,
             local_spec: bool = False) -> MappedView:
    """Present HF tensors as Megatron-Core tensors (full TP=1 tensors, per-layer names).

    ``local_spec`` names the two norms the way local-spec per-rank ``torch`` files do.
    """
    arch = arch or detect_arch(tensors, cfg)
    rules = rules_for(arch)
    stored: dict[str, str] = {}
    shared: list[str] = []
    if arch in MTP_ARCHS:  # MTP layers under their own names (see mappings/deepseek.py)
        renames, shared = deepseek.to_view(tensors, cfg.num_layers)
        stored = {new: old for old, new in renames.items()}
        tensors = {renames.get(n, n): m for n, m in tensors.items() if n not in shared}
        cfg = replace(cfg, mtp_num_layers=len({n.split(".")[2] for n in stored}) or None)
    names = [n for n in tensors if not is_ignored(n)]
    present = set(names)
    links: list[Link] = []
    consumed: set[str] = set()
    dst_shapes: dict[str, tuple[int, ...]] = {}
    dst_dtypes: dict[str, str] = {}
    for rule in rules:
        transform = TRANSFORMS[rule.transform]
        mcore_template = rule.local if (local_spec and rule.local) else rule.mcore[0]
        for first, found in list(_matches(rule.hf[0], names)):
            if (rule.when and _fmt(rule.when, found) not in present) or (rule.unless and _fmt(rule.unless, found)
                                                                          in present):
                continue
            hf_names = [_fmt(t, found) for t in rule.hf]
            missing = [n for n in hf_names if n not in present]
            if missing:
                raise CkptError(f"{first} is there but {', '.join(missing)} is missing: cannot build "
                                f"{_fmt(mcore_template, found)}")
            dtypes = {tensors[n].dtype for n in hf_names}
            if len(dtypes) > 1:
                raise CkptError(f"{', '.join(hf_names)} have different dtypes {sorted(dtypes)}: cannot fuse them "
                                f"(DeepSpeed keeps a frozen parameter in its 16-bit dtype); convert to HF with "
                                f"--dtype float32 first, then that to Megatron")
            dtype = dtypes.pop()
            if _hf_fuses_experts(rule):  # one HF tensor [E, ...] -> one Megatron tensor per expert (GPT-OSS)
                fused = tuple(tensors[hf_names[0]].shape)
                if len(fused) < 2:
                    raise CkptError(f"{first} is {list(fused)}; it should hold one row block per expert")
                for expert in range(fused[0]):
                    mname = _fmt(mcore_template, dict(found, e=expert))
                    mshape, hshapes = transform.shapes(cfg, None, [fused[1:]])
                    links.extend(hf_stacked(transform.links(cfg, mname, mshape, hf_names, hshapes), expert))
                    dst_shapes[mname] = tuple(mshape)
                    dst_dtypes[mname] = dtype
                consumed.update(hf_names)
                continue
            mname = _fmt(mcore_template, found)
            mshape, hshapes = transform.shapes(cfg, None, [tensors[n].shape for n in hf_names])
            links.extend(transform.links(cfg, mname, mshape, hf_names, hshapes))
            dst_shapes[mname] = tuple(mshape)
            dst_dtypes[mname] = dtype
            consumed.update(hf_names)
    recipes = recipes_from_links(links, to="mcore", shapes=dst_shapes, dtypes=dst_dtypes)
    for recipe in recipes.values():
        recipe.fill = uncovered(recipe.shape, [p.dst_box for p in recipe.pieces])
    deepseek.renamed_pieces(recipes, stored)
    unmapped = [stored.get(n, n) for n in names if n not in consumed]
    ignored = [stored.get(n, n) for n in tensors if is_ignored(n)]
    view = MappedView("mcore", arch, cfg, recipes, unmapped, ignored + shared)
    if shared:
        view.notes.append(f"{len(shared)} MTP copies of the embedding / output head not written ({shared[0]}, ...): "
                          f"Megatron's MTP layers share the main model's")
    return view


def _hf_fuses_experts(rule: Rule) -> bool:
    """The HF side is one tensor for all experts (no ``{e}``), the Megatron side one per expert."""
    return "{e}" in rule.mcore[0] and not any("{e}" in h for h in rule.hf)


def _attach_padding(recipes: dict[str, Recipe], links: list[Link], tensors: Mapping[str, TensorShape]) -> None:
    """Source rows no link reads (vocab padding) are recorded on the recipe that reads the rest."""
    boxes: dict[str, list] = {}
    owner: dict[str, str] = {}
    for link in links:
        boxes.setdefault(link.mcore, []).append(link.mcore_box)
        owner.setdefault(link.mcore, link.hf)
    for source, used in boxes.items():
        shape = tensors[source].shape
        if sum(_volume(b) for b in used) == _volume(tuple((0, n) for n in shape)):
            continue
        for gap in uncovered(shape, used):
            recipes[owner[source]].padding.append((source, gap))


def _volume(box) -> int:
    out = 1
    for n in box_shape(box):
        out *= n
    return out


def shapes_of(tensors: Mapping[str, TensorMeta]) -> dict[str, TensorShape]:
    return {name: TensorShape(tuple(meta.shape), meta.dtype) for name, meta in tensors.items()}
