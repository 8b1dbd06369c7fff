"""What ``/`` matches: a glob when the pattern has wildcards, else a case-insensitive substring.

Kept as plain functions (no widgets) so they run in the filter worker and in tests.
"""

from __future__ import annotations

from collections.abc import Iterable

from ckptscope.core.names import glob_match
from ckptscope.core.tensor import TensorMeta
from ckptscope.ops.tree import TreeNode


def matches(name: str, pattern: str) -> bool:
    if any(ch in pattern for ch in "*?["):
        return glob_match(name, pattern)
    return pattern.lower() in name.lower()


def filter_tensors(tensors: Iterable[TensorMeta], pattern: str) -> list[TensorMeta]:
    pattern = pattern.strip()
    if not pattern:
        return list(tensors)
    return [t for t in tensors if matches(t.name, pattern)]


def leaf_chains(root: TreeNode) -> list[list[TreeNode]]:
    """Every displayed leaf (after folding) as its chain of displayed ancestors, in tree order."""
    out: list[list[TreeNode]] = []

    def walk(node: TreeNode, chain: list[TreeNode]) -> None:
        for _label, target in node.folded_children():
            here = chain + [target]
            if target.children:
                walk(target, here)
            else:
                out.append(here)

    walk(root, [])
    return out
