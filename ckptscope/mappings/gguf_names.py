"""llama.cpp tensor names <-> Hugging Face Llama names, and undoing convert_hf_to_gguf.py's Q/K
permutation: the building blocks for comparing a GGUF file with the HF model it came from.

``mappings.gguf`` uses them to present a GGUF under HF names for ``ckptscope diff``;
``tests/test_gguf.py`` checks them on a GGUF written from a real transformers Llama the way
llama.cpp's converter writes it.

convert_hf_to_gguf.py (``LlamaModel.modify_tensors``) rewrites q_proj with
``permute(w, n_head, n_head)`` and k_proj with ``permute(w, n_head, n_head_kv)``::

    w.reshape(n, 2, rows // n // 2, *rest).swapaxes(1, 2).reshape(w.shape)

which turns HF's rotate-half pairing (dims ``i`` and ``i + d/2`` of each head) into ggml's
interleaved pairs (``2i``, ``2i+1``). ``unpermute_qk`` is its inverse.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

_LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_BLOCK = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)\Z")


def gguf_to_hf_name(name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (llama family); None when unknown."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    found = _BLOCK.match(name)
    if found is None or found.group(2) not in _LAYER:
        return None
    layer, part, kind = found.groups()
    return f"model.layers.{layer}.{_LAYER[part]}.{kind}"


def hf_to_gguf_name(name: str) -> str | None:
    """The inverse of ``gguf_to_hf_name``."""
    for gguf_name, hf in _GLOBAL.items():
        if name == hf:
            return gguf_name
    found = re.match(r"model\.layers\.(\d+)\.([a-z_]+\.[a-z_]+|[a-z_]+)\.(weight|bias)\Z", name)
    if found is None:
        return None
    layer, module, kind = found.groups()
    for part, hf_module in _LAYER.items():
        if hf_module == module:
            return f"blk.{layer}.{part}.{kind}"
    return None


def qk_heads(name: str, n_head: int, n_head_kv: int | None) -> int | None:
    """The head count the converter permuted ``name`` (a GGUF name) with, or None if it did not."""
    if re.search(r"\.attn_q\.(weight|bias)\Z", name):
        return n_head
    if re.search(r"\.attn_k\.(weight|bias)\Z", name):
        return n_head_kv if n_head_kv else n_head
    return None


def unpermute_qk(values: "np.ndarray", heads: int) -> "np.ndarray":
    """Undo ``permute(w, ...)`` of convert_hf_to_gguf.py along axis 0 (numpy order: [out, in])."""
    rows = values.shape[0]
    return (values.reshape(heads, rows // heads // 2, 2, *values.shape[1:])
            .swapaxes(1, 2)
            .reshape(values.shape))


def permute_qk(values: "np.ndarray", heads: int) -> "np.ndarray":
    """convert_hf_to_gguf.py's ``permute`` (HF -> GGUF), for tests and writers."""
    rows = values.shape[0]
    return (values.reshape(heads, 2, rows // heads // 2, *values.shape[1:])
            .swapaxes(1, 2)
            .reshape(values.shape))
