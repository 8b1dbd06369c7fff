"""Ordering and matching tensor names the way people read them."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

_DIGITS = re.compile(r"(\d+)")


@lru_cache(maxsize=65536)
def natural_key(name: str) -> tuple[object, ...]:
    """Sort ``layers.10`` after ``layers.9``: digit runs compare as numbers. Cached: the same
    segments (``weight``, ``mlp``) come back thousands of times."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(name))


def natural_sorted(names: Iterable[str]) -> list[str]:
    return sorted(names, key=natural_key)


def glob_match(name: str, pattern: str) -> bool:
    """Shell-style match where ``*`` also crosses dots (``**`` is accepted as a synonym).

    A pattern without wildcards names a tensor or a module: it matches that exact name and
    everything below it (``model.layers.1`` matches ``model.layers.1.mlp.up_proj.weight`` but
    not ``model.layers.10...``).
    """
    if not any(ch in pattern for ch in "*?["):
        return name == pattern or name.startswith(pattern.rstrip(".") + ".")
    return fnmatch.fnmatchcase(name, pattern.replace("**", "*"))


def select(names: Iterable[str], include: Sequence[str] = (), exclude: Sequence[str] = ()) -> list[str]:
    """Names kept by ``--include`` (any pattern matches, default all) minus ``--exclude``."""
    if not include and not exclude:
        return list(names)
    kept = []
    for name in names:
        if include and not any(glob_match(name, p) for p in include):
            continue
        if any(glob_match(name, p) for p in exclude):
            continue
        kept.append(name)
    return kept
