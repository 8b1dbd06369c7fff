"""The module tree of a checkpoint, with repeated layers collapsed into ranges.

``model.layers.0`` ... ``model.layers.31`` with identical contents become one node
``layers.[0-31]`` (32 members); a layer that differs (a dense first layer in a MoE model, a
different shape) breaks the run, so nothing is hidden. Used by ``inspect`` and by the TUI.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ckptscope.core.names import natural_key
from ckptscope.core.tensor import TensorMeta


@dataclass(slots=True)
class TreeNode:
    label: str
    """What this node shows: a name segment, a range like ``[0-31]``, or a tensor's last segment."""
    path: str
    """Dotted prefix of this node; for a range node, the prefix of its first member."""
    children: list["TreeNode"] = field(default_factory=list)
    tensor: TensorMeta | None = None
    """Set on leaves (for range nodes: the first member's tensor)."""
    members: tuple[str, ...] = ()
    """For range nodes: the dotted prefixes of every member (``model.layers.0`` ...)."""
    num_params: int = 0
    """Parameters in this subtree, all members counted."""
    nbytes: int = 0
    num_tensors: int = 0

    @property
    def is_range(self) -> bool:
        return len(self.members) > 1

    @property
    def repeat(self) -> int:
        return max(1, len(self.members))

    def folded_children(self) -> list[tuple[str, "TreeNode"]]:
        """Children for display, with single-child chains folded into one dotted label.

        ``embed_tokens`` -> ``weight`` shows as ``embed_tokens.weight``; ``layers`` -> ``[0-31]``
        as ``layers.[0-31]``. Returns ``(label, node whose children come next)`` pairs.
        """
        out = []
        for child in self.children:
            label, target = child.label, child
            while target.tensor is None and not target.is_range and len(target.children) == 1:
                target = target.children[0]
                label = f"{label}.{target.label}"
            out.append((label, target))
        return out

    def walk(self) -> Iterable["TreeNode"]:
        yield self
        for child in self.children:
            yield from child.walk()


@dataclass(slots=True)
class _Trie:
    children: dict[str, "_Trie"] = field(default_factory=dict)
    tensor: TensorMeta | None = None


def build_tree(tensors: Iterable[TensorMeta], *, collapse: bool = True, root_label: str = "") -> TreeNode:
    """Build the module tree of ``tensors`` (names split on dots)."""
    root = _Trie()
    for meta in tensors:
        node = root
        for part in meta.name.split("."):
            node = node.children.setdefault(part, _Trie())
        node.tensor = meta
    return _convert(root, root_label, "", collapse)


def _convert(trie: _Trie, label: str, path: str, collapse: bool) -> TreeNode:
    node = TreeNode(label=label, path=path, tensor=trie.tensor)
    keys = sorted(trie.children, key=natural_key)
    numeric = [k for k in keys if k.isdigit()]
    others = [k for k in keys if not k.isdigit()]
    for key in others:
        node.children.append(_convert(trie.children[key], key, _join(path, key), collapse))
    if numeric:
        node.children[0:0] = _numeric_children(trie, numeric, path, collapse)
    _total(node)
    return node


def _numeric_children(trie: _Trie, keys: list[str], path: str, collapse: bool) -> list[TreeNode]:
    if not collapse:
        return [_convert(trie.children[k], k, _join(path, k), collapse) for k in keys]
    runs: list[list[str]] = []
    last_sig: tuple | None = None
    for key in sorted(keys, key=int):
        sig = _signature(trie.children[key])
        if runs and sig == last_sig and int(key) == int(runs[-1][-1]) + 1:
            runs[-1].append(key)
        else:
            runs.append([key])
        last_sig = sig
    out = []
    for run in runs:
        first = _convert(trie.children[run[0]], run[0], _join(path, run[0]), collapse)
        if len(run) == 1:
            out.append(first)
            continue
        node = TreeNode(label=f"[{run[0]}-{run[-1]}]", path=first.path, children=first.children,
                        tensor=first.tensor, members=tuple(_join(path, k) for k in run))
        node.num_params = first.num_params * len(run)
        node.nbytes = first.nbytes * len(run)
        node.num_tensors = first.num_tensors * len(run)
        out.append(node)
    return out


def _signature(trie: _Trie, prefix: str = "") -> tuple:
    """What must match for two layers to share a range: relative names, dtypes and shapes."""
    items: list[tuple] = []
    if trie.tensor is not None:
        items.append((prefix, trie.tensor.dtype, trie.tensor.shape))
    for key, child in trie.children.items():
        items.extend(_signature(child, _join(prefix, key)))
    return tuple(sorted(items))


def _total(node: TreeNode) -> None:
    params = nbytes = count = 0
    if node.tensor is not None:
        params, nbytes, count = node.tensor.numel, node.tensor.nbytes, 1
    for child in node.children:
        params += child.num_params
        nbytes += child.nbytes
        count += child.num_tensors
    node.num_params, node.nbytes, node.num_tensors = params, nbytes, count


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key
