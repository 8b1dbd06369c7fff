"""Split units of work (output files, diff pairs) between ranks by bytes, deterministically."""

from __future__ import annotations

from collections.abc import Hashable, Mapping


def assign(sizes: Mapping[Hashable, int], world: int) -> list[list]:
    """``sizes`` (unit -> bytes) into ``world`` lists: largest first, each to the least loaded rank
    (lowest rank on a tie), equal sizes in the order of their names. Every rank computes the same
    split from the same plan; each list keeps the units' original order (the write order)."""
    if world < 1:
        raise ValueError("world must be at least 1")
    load = [0] * world
    owner: dict = {}
    for unit in sorted(sizes, key=lambda u: (-sizes[u], str(u))):
        rank = min(range(world), key=lambda r: load[r])
        owner[unit] = rank
        load[rank] += sizes[unit]
    return [[u for u in sizes if owner[u] == r] for r in range(world)]
