"""Human-readable numbers shared by the CLI and the TUI."""

from __future__ import annotations

import re


def human_bytes(n: int) -> str:
    """``1536`` -> ``1.5 KiB`` (binary units, as ``du -h`` and most users' dashboards)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_count(n: int) -> str:
    """``7_241_732_096`` -> ``7.24B``; parameter counts are decimal."""
    for div, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}" if n / div < 100 else f"{n / div:.1f}{suffix}"
    return str(n)


def shape_str(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``1 tensor``, ``2 tensors``, ``1 iteration``: a count with its noun in the right number."""
    return f"{count:,} {noun if count == 1 else (many or noun + 's')}"


def middle_ellipsis(text: str, width: int, head: float = 0.5) -> str:
    """``model.layers.1…attn.q_proj.weight``: the start and the end kept, the middle cut so the text
    fits ``width`` characters; ``head`` is the share of the room given to the start. Names that
    differ at either end stay distinguishable, and nothing is cut when the text fits."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    room = width - 1
    start = max(0, min(room, round(room * head)))
    return text[:start] + "…" + (text[len(text) - (room - start):] if room > start else "")


_INDEXED = re.compile(r"(?:^|\.)([A-Za-z_]+\.\d+\.)")


def index_ellipsis(text: str, width: int) -> str:
    """``…layers.1.self_attention.linear_qkv.layer_norm_weight``: like a tail cut, but the first
    indexed component (``layers.1.``) stays, since in a list of per-layer names it is what tells the
    rows apart; the middle after it is cut too when the end still does not fit. Names without an
    index, or columns too narrow for one, get the tail cut."""
    if len(text) <= width:
        return text
    found = _INDEXED.search(text)
    if found is None:
        return middle_ellipsis(text, width, head=0.0)
    rest = text[found.end():]
    index = found.group(1).split(".")[-2]
    for anchor in ("…" + found.group(1), "…" + index + "."):  # then the index alone: …1.…norm_weight
        if len(anchor) + len(rest) <= width:
            return anchor + rest
        room = width - len(anchor) - 1
        if room >= 6:
            return anchor + "…" + rest[len(rest) - room:]
    return middle_ellipsis(text, width, head=0.0)


def human_time(epoch: float | None) -> str:
    """``2026-11-25 10:42`` in local time (when a save was written), or ``-`` when unknown."""
    if epoch is None:
        return "-"
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def rate_eta(done: int, total: int, seconds: float) -> str:
    """``45.2 MiB/s · ETA 0:12`` for a byte transfer ``done`` of ``total`` after ``seconds``
    (``…`` while there is no rate yet): the same words the CLI bar shows."""
    if seconds <= 0 or done <= 0:
        return "… MiB/s · ETA …"
    rate = done / seconds
    left = max(0, total - done) / rate
    minutes, secs = divmod(int(round(left)), 60)
    hours, minutes = divmod(minutes, 60)
    eta = f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
    return f"{human_bytes(int(rate))}/s · ETA {eta}"
