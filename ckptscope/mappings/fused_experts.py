"""transformers v5's fused MoE expert layout, read as (and written from) the per-expert HF layout.

transformers >= 5 holds a MoE layer's experts as two 3-D tensors (``src/transformers/conversion_mapping.py``,
the ``mixtral`` and ``qwen2_moe`` entries, which ``qwen3_moe`` reuses):

* ``model.layers.{i}.mlp.experts.gate_up_proj`` ``[E, 2I, H]``: expert ``e`` is ``[gate_e; up_e]``
  (``MergeModulelist(dim=0)`` then ``Concatenate(dim=1)``);
* ``model.layers.{i}.mlp.experts.down_proj`` ``[E, H, I]``: expert ``e`` is ``down_e``;
* Mixtral also renames ``.block_sparse_moe.`` to ``.mlp.`` (its router becomes ``mlp.gate.weight``).

``save_pretrained`` converts back to the per-expert names by default; ``save_original_format=False``
(and any ``model.state_dict()`` saved directly: FSDP, DCP, verl) keeps the fused names. Both are the
same model, so both are presented under the per-expert names the schemas use: each expert is one box
of the fused tensor, a block copy, and conversion, diff and the inverse (``fuse``) reuse ``Recipe``.
The per-expert names are not listed here: they come from the schema's expert rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ckptscope.core.errors import CkptError
from ckptscope.mappings.links import Piece, Recipe, full_box
from ckptscope.mappings.schemas import L_HF, SCHEMAS

FUSED_GATE_UP = "mlp.experts.gate_up_proj"
FUSED_DOWN = "mlp.experts.down_proj"
V5_RENAMES: dict[str, tuple[tuple[str, str], ...]] = {"mixtral": ((".block_sparse_moe.", ".mlp."),)}
"""Per-layer name changes transformers v5 applies besides fusing (conversion_mapping.py ``mixtral``)."""

_FUSED = re.compile(r"model\.layers\.(\d+)\.(mlp\.experts\.(?:gate_up_proj|down_proj))\Z")


NATIVE_FUSED_MARKERS = (".self_attn.sinks", ".mlp.experts.gate_up_proj_bias")
"""Names only GPT-OSS has: there the fused tensors are the checkpoint's own layout, read by its schema's
rules (mappings.gpt_oss), not transformers v5's fusing of a per-expert checkpoint."""


def has_fused_experts(names: Iterable[str]) -> bool:
    """Whether any name is one of transformers v5's fused expert tensors (of a per-expert arch)."""
    names = list(names)
    if any(name.endswith(NATIVE_FUSED_MARKERS) for name in names):
        return False
    return any(_FUSED.match(name) for name in names)


_PER_EXPERT = re.compile(r"\.experts\.\d+\.")


def names_experts_one_by_one(names: Iterable[str]) -> bool:
    """Whether HF names hold routed experts one by one (``...experts.3.gate_proj``, as save_pretrained
    writes Mixtral / Qwen-MoE): the layout a fused side is unfused to when compared with it."""
    return any(_PER_EXPERT.search(name) for name in names)


def expert_templates(arch: str) -> tuple[str, str, str]:
    """(gate, up, down) per-expert HF name templates of ``arch``, read from its schema's expert rules."""
    rules = [r for r in SCHEMAS.get(arch, ()) if "{e}" in r.hf[0] and r.hf[0].startswith(L_HF)]  # not MTP's copy
    gate_up = [r for r in rules if r.transform == "gate_up"]
    down = [r for r in rules if r.transform == "identity"]
    if len(gate_up) != 1 or len(down) != 1:
        raise CkptError(f"{arch} has no routed experts: transformers' fused expert tensors do not fit it")
    return gate_up[0].hf[0], gate_up[0].hf[1], down[0].hf[0]


def stores_per_expert(arch: str) -> bool:
    """Whether ``arch``'s HF checkpoints name experts one by one (Mixtral, Qwen-MoE: ``save_pretrained``
    writes per expert and v5 fuses them in memory). Archs whose HF model holds fused expert parameters
    natively (GPT-OSS, Llama 4) keep their fused tensors as they are."""
    try:
        expert_templates(arch)
    except CkptError:
        return False
    return True


def _renamed(name: str, arch: str, *, to_v5: bool) -> str:
    for per_expert, v5 in V5_RENAMES.get(arch, ()):
        old, new = (per_expert, v5) if to_v5 else (v5, per_expert)
        if name.startswith("model.layers.") and old in name:
            name = name.replace(old, new, 1)
    return name


def unfuse(tensors: Mapping[str, object], arch: str, *, hidden: int | None = None) -> dict[str, Recipe]:
    """Recipes for every tensor under the per-expert (``save_pretrained``) names.

    ``tensors`` maps names to objects with ``shape`` and ``dtype``. Fused tensors become one recipe
    per expert and part; Mixtral's v5 names are renamed back; everything else is kept as it is.
    ``hidden`` (the config's hidden size, when known) is checked against the layout: a fused tensor
    whose last axis is not the hidden size is some other layout (GPT-OSS's transposed
    ``[E, hidden, 2*inter]``) and is refused rather than cut along the wrong axis.
    """
    gate_t, up_t, down_t = expert_templates(arch)
    recipes: dict[str, Recipe] = {}
    for name, meta in tensors.items():
        shape, dtype = tuple(meta.shape), meta.dtype
        match = _FUSED.match(name)
        if match is None:
            own = _renamed(name, arch, to_v5=False)
            recipes[own] = Recipe(own, shape, dtype, [Piece(full_box(shape), name, full_box(shape))])
            continue
        layer = int(match.group(1))
        if len(shape) != 3:
            raise CkptError(f"{name} is {list(shape)}; transformers' fused experts are 3-D [experts, rows, cols]")
        experts, rows, cols = shape
        if match.group(2) == FUSED_GATE_UP and hidden is not None and cols != hidden:
            raise CkptError(f"{name} is {list(shape)}: its last axis is not the hidden size {hidden}, so it is "
                            f"not the [experts, 2*intermediate, hidden] layout {arch} fuses; pass --arch if the "
                            "architecture was guessed wrong")
        if match.group(2) == FUSED_GATE_UP:
            if rows % 2:
                raise CkptError(f"{name} is {list(shape)}: [gate; up] needs an even number of rows")
            half = rows // 2
            parts = ((gate_t, 0), (up_t, half))
        else:
            half = rows
            parts = ((down_t, 0),)
        for e in range(experts):
            for template, start in parts:
                target = template.format(i=layer, e=e)
                recipes[target] = Recipe(target, (half, cols), dtype,
                                         [Piece(((0, half), (0, cols)), name, ((e, e + 1), (start, start + half),
                                                                               (0, cols)))], ["unfuse-experts"])
    return recipes


def fuse(recipes: dict[str, Recipe], arch: str) -> dict[str, Recipe]:
    """The inverse of ``unfuse`` on destination recipes: per-expert HF recipes stacked into the v5
    fused tensors (pieces placed at their expert and half; nothing is read twice), Mixtral renamed."""
    gate_t, up_t, down_t = expert_templates(arch)
    patterns = [(re.compile(re.escape(t).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{e\}", r"(?P<e>\d+)") + r"\Z"),
                 part) for t, part in ((gate_t, "gate"), (up_t, "up"), (down_t, "down"))]
    out: dict[str, Recipe] = {}
    found: dict[tuple[int, str], dict[int, Recipe]] = {}
    for name, recipe in recipes.items():
        for regex, part in patterns:
            match = regex.match(name)
            if match:
                found.setdefault((int(match.group("i")), part), {})[int(match.group("e"))] = recipe
                break
        else:
            own = _renamed(name, arch, to_v5=True)
            out[own] = Recipe(own, recipe.shape, recipe.dtype, list(recipe.pieces), list(recipe.transforms),
                              list(recipe.padding), list(recipe.fill))
    for (layer, part), experts in sorted(found.items()):
        if part == "up":
            continue
        if sorted(experts) != list(range(len(experts))):
            raise CkptError(f"layer {layer}: experts {sorted(experts)} are not 0..{len(experts) - 1}")
        halves = [experts] if part == "down" else [experts, found.get((layer, "up"), {})]
        if len(halves) == 2 and sorted(halves[1]) != sorted(experts):
            raise CkptError(f"layer {layer}: gate and up projections cover different experts")
        first = experts[0]
        rows = first.shape[0]
        name = L_HF.format(i=layer) + (FUSED_DOWN if part == "down" else FUSED_GATE_UP)
        fused = Recipe(name, (len(experts), rows * len(halves)) + tuple(first.shape[1:]), first.dtype,
                       transforms=["fuse-experts"])
        for h, group in enumerate(halves):
            for e, recipe in group.items():
                if recipe.shape != first.shape or recipe.dtype != first.dtype:
                    raise CkptError(f"{recipe.name}: {list(recipe.shape)} {recipe.dtype} differs from "
                                    f"{first.name}: experts must match to be fused")
                for piece in recipe.pieces:
                    (lo, hi), rest = piece.dst_box[0], piece.dst_box[1:]
                    box = ((e, e + 1), (lo + h * rows, hi + h * rows)) + tuple(rest)
                    fused.pieces.append(Piece(box, piece.source, piece.src_box))
                for t in recipe.transforms:
                    if t not in fused.transforms:
                        fused.transforms.append(t)
                fused.fill += [((e, e + 1), (lo + h * rows, hi + h * rows)) + tuple(rest)
                               for (lo, hi), *rest in recipe.fill]
        out[name] = fused
    return out
