"""The reversible transforms between one Megatron-Core tensor and its HF tensor(s), as links.

Each transform answers two questions, both direction-free:
* ``shapes``: given the shape of either end (and the config), the shapes of both ends;
* ``links``: which box of the Megatron tensor is which box of which HF tensor.

Conversion in either direction and the mapping-aware diff all consume these links (see links.py),
so the exact layouts of MAPPING.md §2.1 (grouped QKV), §3.1 ([gate; up]) and §4.1 (vocab padding)
are written exactly once, here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ckptscope.core.errors import CkptError
from ckptscope.mappings.config import ModelConfig
from ckptscope.mappings.links import Link, full_box

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Transform:
    name: str
    arity: int
    """How many HF tensors one Megatron tensor holds."""
    shapes: Callable[[ModelConfig, Shape | None, Sequence[Shape] | None], tuple[Shape, list[Shape]]]
    links: Callable[[ModelConfig, str, Shape, Sequence[str], Sequence[Shape]], list[Link]]


# --- identity ------------------------------------------------------------------------------------


def _identity_shapes(cfg, mcore, hf):
    shape = mcore if mcore is not None else hf[0]
    return shape, [shape]


def _identity_links(cfg, mname, mshape, hf_names, hf_shapes):
    return [Link(mname, full_box(mshape), hf_names[0], full_box(hf_shapes[0]), "identity")]


# --- QKV with grouped-query attention (MAPPING.md §2.1, §2.3) -------------------------------------


def _qkv_dims(cfg: ModelConfig) -> tuple[int, int, int]:
    groups = cfg.require("num_kv_heads")
    return groups, cfg.queries_per_group, cfg.require("head_dim")


def _qkv_shapes(cfg, mcore, hf):
    groups, r, d = _qkv_dims(cfg)
    rest = tuple(mcore[1:]) if mcore is not None else tuple(hf[0][1:])
    fused = (groups * (r + 2) * d,) + rest
    if mcore is not None and tuple(mcore) != fused:
        raise CkptError(f"fused QKV has {mcore[0]} rows but {groups} groups x ({r}+2) x head_dim {d} "
                        f"= {fused[0]}: the config does not match this checkpoint")
    if hf is not None and (hf[0][0] != groups * r * d or hf[1][0] != groups * d or hf[2][0] != groups * d):
        raise CkptError(f"q/k/v rows {hf[0][0]}/{hf[1][0]}/{hf[2][0]} do not match {groups * r} heads, "
                        f"{groups} kv heads of size {d}")
    return fused, [(groups * r * d,) + rest, (groups * d,) + rest, (groups * d,) + rest]


def _qkv_links(cfg, mname, mshape, hf_names, hf_shapes):
    """Group g is the row block ``[q heads of g; k_g; v_g]`` of ``(r+2)·d`` rows."""
    groups, r, d = _qkv_dims(cfg)
    rest = full_box(tuple(mshape[1:]))
    q, k, v = hf_names
    links = []
    for g in range(groups):
        base = g * (r + 2) * d
        links.append(Link(mname, ((base, base + r * d),) + rest, q, ((g * r * d, (g + 1) * r * d),) + rest, "qkv"))
        links.append(Link(mname, ((base + r * d, base + (r + 1) * d),) + rest, k, ((g * d, (g + 1) * d),) + rest,
                          "qkv"))
        links.append(Link(mname, ((base + (r + 1) * d, base + (r + 2) * d),) + rest, v,
                          ((g * d, (g + 1) * d),) + rest, "qkv"))
    return links


# --- SwiGLU fc1 = [gate; up] (MAPPING.md §3.1) ----------------------------------------------------


def _gate_up_shapes(cfg, mcore, hf):
    if mcore is not None:
        if mcore[0] % 2:
            raise CkptError(f"a gated fc1 needs an even number of rows, got {mcore[0]}")
        half = (mcore[0] // 2,) + tuple(mcore[1:])
        return tuple(mcore), [half, half]
    if hf[0] != hf[1]:
        raise CkptError(f"gate {hf[0]} and up {hf[1]} projections differ in shape")
    return (2 * hf[0][0],) + tuple(hf[0][1:]), [tuple(hf[0]), tuple(hf[1])]


def _gate_up_links(cfg, mname, mshape, hf_names, hf_shapes):
    half = mshape[0] // 2
    rest = full_box(tuple(mshape[1:]))
    gate, up = hf_names
    return [Link(mname, ((0, half),) + rest, gate, ((0, half),) + rest, "gate_up"),
            Link(mname, ((half, 2 * half),) + rest, up, ((0, half),) + rest, "gate_up")]


# --- vocabulary padding (MAPPING.md §4.1) ---------------------------------------------------------


def _vocab_shapes(cfg, mcore, hf):
    if mcore is not None:
        vocab = cfg.vocab_size or mcore[0]
        if vocab > mcore[0] and mcore[0] == 1:  # verl's Megatron critic: LinearForLastLayer(hidden, 1)
            raise CkptError(f"the output layer has 1 row where a language model has one per token ({vocab}): a value "
                            "head (a critic or reward model, such as verl's Megatron critic); ckptscope exports "
                            "language models from Megatron, not value heads")
        if vocab > mcore[0]:
            raise CkptError(f"the vocabulary has {vocab} rows but the Megatron table only {mcore[0]}")
        return tuple(mcore), [(vocab,) + tuple(mcore[1:])]
    vocab = hf[0][0]
    if cfg.vocab_size and vocab != cfg.vocab_size:
        # transformers refuses such a model (size mismatch); padded on, its rows past the table would
        # come back as zero rows of a model that seems whole
        raise CkptError(f"the config's vocab_size is {cfg.vocab_size} but the embedding/output table has {vocab} rows")
    padded = cfg.padded_vocab_size or vocab
    return (padded,) + tuple(hf[0][1:]), [tuple(hf[0])]


def _vocab_links(cfg, mname, mshape, hf_names, hf_shapes):
    vocab = hf_shapes[0][0]
    rest = full_box(tuple(mshape[1:]))
    return [Link(mname, ((0, vocab),) + rest, hf_names[0], ((0, vocab),) + rest, "vocab")]


# --- transposed 2-D weight (HF stores x @ W, Megatron W x: GPT-OSS and Llama 4 fused experts) --------


def _transposed_shapes(cfg, mcore, hf):
    shape = tuple(mcore if mcore is not None else hf[0])
    if len(shape) != 2:
        raise CkptError(f"a transposed weight is 2-D, got {list(shape)}")
    return (shape if mcore is not None else shape[::-1]), [shape[::-1] if mcore is not None else shape]


def _transposed_links(cfg, mname, mshape, hf_names, hf_shapes):
    """Megatron row ``r`` is HF column ``r`` (one link per row: ``links.map_box`` pairs a row with a column)."""
    rows, cols = mshape
    return [Link(mname, ((r, r + 1), (0, cols)), hf_names[0], ((0, cols), (r, r + 1)), "transpose")
            for r in range(rows)]


TRANSFORMS: dict[str, Transform] = {
    "identity": Transform("identity", 1, _identity_shapes, _identity_links),
    "qkv": Transform("qkv", 3, _qkv_shapes, _qkv_links),
    "gate_up": Transform("gate_up", 2, _gate_up_shapes, _gate_up_links),
    "vocab": Transform("vocab", 1, _vocab_shapes, _vocab_links),
    "transpose": Transform("transpose", 1, _transposed_shapes, _transposed_links),
}


def stacked(links: list[Link], index: int, mname: str) -> list[Link]:
    """The same links for a Megatron tensor stacked on a new leading axis at ``index`` (experts)."""
    return [Link(mname, ((index, index + 1),) + link.mcore_box, link.hf, link.hf_box, link.transform)
            for link in links]


def hf_stacked(links: list[Link], index: int) -> list[Link]:
    """The same links for an HF tensor that stacks experts on a leading axis, at ``index`` (GPT-OSS)."""
    return [Link(link.mcore, link.mcore_box, link.hf, ((index, index + 1),) + link.hf_box, link.transform)
            for link in links]
