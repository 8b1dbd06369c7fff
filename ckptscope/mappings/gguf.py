"""A GGUF (llama.cpp) Llama-family checkpoint presented under HF names, for ``diff`` across naming.

Names come from ``mappings.gguf_names``; the values need one transform: llama.cpp's converter
permutes the rows of q_proj / k_proj inside each head (HF's rotate-half pairs ``i, i + d/2`` become
ggml's interleaved ``2i, 2i+1``). Undoing it is a pure row permutation, so each HF row is one
``Piece`` reading one GGUF row: the diff engine then compares element by element and a difference
is reported at the HF index it is at. Comparing without undoing it is the classic "the GGUF is
broken" report: every q/k row differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptscope.core.tensor import TensorMeta
from ckptscope.mappings.gguf_names import gguf_to_hf_name, qk_heads
from ckptscope.mappings.links import Piece, Recipe, full_box


def gguf_heads(metadata: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(attention heads, KV heads) from a GGUF index's metadata (``<arch>.attention.head_count``)."""
    kv = (metadata.get("gguf") or {}).get("kv") or {}
    arch = kv.get("general.architecture")
    heads = kv.get(f"{arch}.attention.head_count")
    return (heads if isinstance(heads, int) else None,
            kv.get(f"{arch}.attention.head_count_kv") if isinstance(kv.get(f"{arch}.attention.head_count_kv"), int)
            else None)


def _unpermuted_rows(meta: TensorMeta, hf_name: str, heads: int) -> Recipe:
    rows = meta.shape[0]
    head_dim = rows // heads
    half = head_dim // 2
    rest = full_box(tuple(meta.shape[1:]))
    pieces = []
    for head in range(heads):
        for j in range(half):
            for k in range(2):
                hf_row = head * head_dim + k * half + j
                gguf_row = head * head_dim + 2 * j + k
                pieces.append(Piece(((hf_row, hf_row + 1),) + rest, meta.name, ((gguf_row, gguf_row + 1),) + rest))
    return Recipe(hf_name, tuple(meta.shape), meta.dtype, pieces, ["gguf-name", "unpermute-qk"])


def gguf_as_hf(tensors: Mapping[str, TensorMeta], metadata: Mapping[str, Any]) -> tuple[dict[str, Recipe], list[str]]:
    """Recipes under HF names for every GGUF tensor with a Llama-family name, and the names left
    (compared under their own names). Q/K rows are un-permuted when the head counts are known."""
    heads, kv_heads = gguf_heads(metadata)
    recipes: dict[str, Recipe] = {}
    unmapped: list[str] = []
    for name, meta in tensors.items():
        hf_name = gguf_to_hf_name(name)
        if hf_name is None:
            unmapped.append(name)
            continue
        permuted = qk_heads(name, heads, kv_heads) if heads else None
        if permuted and meta.shape and meta.shape[0] % (2 * permuted) == 0:
            recipes[hf_name] = _unpermuted_rows(meta, hf_name, permuted)
        else:
            recipes[hf_name] = Recipe(hf_name, tuple(meta.shape), meta.dtype,
                                      [Piece(full_box(tuple(meta.shape)), name, full_box(tuple(meta.shape)))],
                                      ["gguf-name"])
    return recipes, unmapped
