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


def chain_to(root: TreeNode, name: str) -> list[TreeNode]:
    """The displayed ancestors of tensor ``name`` (root excluded), as deep as the tree shows it: a
    tensor inside a collapsed range other than its first member stops at the range row. Used to put
    the cursor back where it was when a filter is cleared."""
    chain: list[TreeNode] = []
    node = root
    while True:
        following = None
        for _label, target in node.folded_children():
            prefixes = target.members or (target.path,)
            if any(name == p or name.startswith(p + ".") for p in prefixes):
                following = target
                break
        if following is None:
            return chain
        chain.append(following)
        inside_first = name == following.path or name.startswith(following.path + ".")
        if not following.children or (following.is_range and not inside_first):
            return chain
        node = following
