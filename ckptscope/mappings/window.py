"""Sliding-window attention of the Llama family (Mistral, Mixtral, Qwen2/3 dense and MoE), both ways.

An HF config says a window in ``sliding_window`` and, for some archs, which layers use it
(``layer_types``, or transformers' default pattern from ``max_window_layers``). Megatron-Core says
it in ``window_size = (left, right)`` and ``window_attn_skip_freq`` (None: every layer; an int N:
every layer whose 1-based number N does not divide; a list: 1 = window, per layer). An HF window of
W positions is a query attending to itself and the W - 1 before it, which is Megatron's
``(W - 1, 0)``. Gemma and GPT-OSS carry their windows their own way (``hf_config_extra``, their
hooks); Llama has no window (transformers ignores a stray ``sliding_window`` there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

WINDOW_ON_EVERY_LAYER = frozenset({"mistral", "mixtral", "qwen3_moe"})
"""Archs whose transformers model applies ``sliding_window`` to every layer when it applies at all."""

_MAX_WINDOW_LAYERS_DEFAULT = 28
WINDOW_BY_LAYER_TYPES: dict[str, Callable[[int, dict[str, Any]], bool]] = {
    # transformers' default ``layer_types`` (is layer i sliding?) for a config.json that has none
    "qwen2": lambda i, text: i >= text.get("max_window_layers", _MAX_WINDOW_LAYERS_DEFAULT),
    "qwen3": lambda i, text: i >= text.get("max_window_layers", _MAX_WINDOW_LAYERS_DEFAULT),
    "qwen2_moe": lambda i, text: bool((i + 1) % 2) and i < text.get("max_window_layers", _MAX_WINDOW_LAYERS_DEFAULT),
}
"""Archs whose window applies per layer, as ``layer_types`` says."""

WINDOW_ARCHS = WINDOW_ON_EVERY_LAYER | frozenset(WINDOW_BY_LAYER_TYPES)


def effective_window(text: dict[str, Any]) -> int | None:
    """The sliding window a config's attention uses when shorter than the model's positions; None when
    it never applies (no window, switched off by ``use_sliding_window``, every ``layer_types`` entry
    full attention, or at least the positions). Which layers use it: ``window_layers``."""
    window = text.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None
    if "use_sliding_window" in text and not text.get("use_sliding_window"):
        return None
    layer_types = text.get("layer_types")
    if isinstance(layer_types, list) and layer_types and all(t == "full_attention" for t in layer_types):
        return None
    limit = text.get("max_position_embeddings")
    return None if isinstance(limit, int) and window >= limit else window


def window_layers(text: dict[str, Any], arch: str) -> tuple[bool, ...] | None:
    """Which decoder layers of a Llama-family ``arch`` attend through ``effective_window``, as
    transformers builds the model; None when no window applies or ``arch`` is outside the family."""
    if arch not in WINDOW_ARCHS or effective_window(text) is None:
        return None
    count = text.get("num_hidden_layers")
    if not isinstance(count, int) or count <= 0:
        return None
    if arch in WINDOW_ON_EVERY_LAYER:
        return (True,) * count
    types = text.get("layer_types")
    if isinstance(types, list) and len(types) == count:
        layers = tuple(t == "sliding_attention" for t in types)
    else:
        layers = tuple(WINDOW_BY_LAYER_TYPES[arch](i, text) for i in range(count))
    return layers if any(layers) else None


def to_megatron(window: int, layers: tuple[bool, ...]) -> dict[str, Any]:
    """Megatron args for an HF window of ``window`` positions on ``layers``."""
    return {"window_size": [window - 1, 0],
            "window_attn_skip_freq": None if all(layers) else [int(on) for on in layers]}


def from_megatron(facts: dict[str, Any], num_layers: int | None) -> tuple[int, int, tuple[bool, ...]] | None:
    """``(left, right, layers)`` of the window Megatron args describe; None when there is none
    (no ``window_size``, or an unbounded left side). Raises ValueError for a skip pattern that does
    not fit the layer count."""
    size = facts.get("window_size")
    if not isinstance(size, (list, tuple)) or len(size) != 2:
        return None
    left, right = (-1 if w is None else int(w) for w in size)
    if left < 0 and right <= 0:
        return None  # (-1, 0) / (-1, -1): causal or full attention, no window
    count = int(num_layers or 0)
    freq = facts.get("window_attn_skip_freq")
    if freq is None:
        layers = (True,) * count
    elif isinstance(freq, int) and not isinstance(freq, bool) and freq > 0:
        layers = tuple((i + 1) % freq != 0 for i in range(count))
    elif isinstance(freq, (list, tuple)) and len(freq) == count:
        layers = tuple(bool(on) for on in freq)
    else:
        raise ValueError(f"window_attn_skip_freq {freq!r} does not fit {count} layers")
    return left, right, layers


def hf_problems(arch: str, megatron: tuple[int, int, tuple[bool, ...]], hf_text: dict[str, Any] | None) -> list[str]:
    """Why the Megatron window ``megatron`` (``from_megatron``) would not be what HF ``arch`` computes,
    one line each. ``hf_text``: an HF config the export will write as given (then its window must be
    the same), or None when the export derives the config (then it writes the window)."""
    left, right, layers = megatron
    said = f"window_size ({left}, {right})"
    if right != 0 or left < 0:
        return [f"it attends through a {said} that is not causal-left-only, which no HF config spells"]
    if arch not in WINDOW_ARCHS:
        hint = f" (--arch {' or '.join(sorted(WINDOW_ARCHS))} exports it with its window)" if arch == "llama" else ""
        return [f"it attends through a sliding window ({said}), which a {arch} config does not carry{hint}"]
    if arch in WINDOW_ON_EVERY_LAYER and not all(layers):
        return [f"its sliding window ({said}) skips layers {[i for i, on in enumerate(layers) if not on]}, "
                f"while {arch} applies its window to every layer"]
    if hf_text is None:
        return []
    hf_window, hf_layers = effective_window(hf_text), window_layers(hf_text, arch)
    if hf_window != left + 1 or hf_layers != layers:
        return [f"its sliding window ({said} on layers {[i for i, on in enumerate(layers) if on]}) is not the "
                f"HF config's (sliding_window {hf_window}"
                + (f" on layers {[i for i, on in enumerate(hf_layers) if on]})" if hf_layers else ")")]
    return []


def hf_keys(arch: str, left: int, layers: tuple[bool, ...]) -> dict[str, Any]:
    """The config.json keys of a window of ``left + 1`` positions on ``layers`` (``hf_problems`` passed)."""
    out: dict[str, Any] = {"sliding_window": left + 1}
    if arch in WINDOW_ON_EVERY_LAYER:
        if arch == "qwen3_moe":
            out["use_sliding_window"] = True
        return out
    leading_full = next((i for i, on in enumerate(layers) if on), len(layers))
    out.update(use_sliding_window=True, max_window_layers=leading_full,
               layer_types=["sliding_attention" if on else "full_attention" for on in layers])
    return out
