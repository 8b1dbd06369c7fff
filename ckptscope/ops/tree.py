"""The module tree of a checkpoint, with repeated layers collapsed into ranges.

``model.layers.0`` ... ``model.layers.31`` with identical contents become one node
``layers.[0-31]`` (32 members); a layer that differs (a dense first layer in a MoE model, a
different shape) breaks the run, so nothing is hidden. Used by ``inspect`` and by the TUI.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ckptscope.core.index import storage_aliases
from ckptscope.core.names import natural_key
from ckptscope.core.tensor import TensorMeta


class TreeNode:
    """One node of the module tree. Children are built on first access, so opening a checkpoint
    with tens of thousands of tensors only pays for the levels a user actually looks at."""

    __slots__ = ("label", "path", "tensor", "members", "num_params", "nbytes", "num_tensors", "_trie",
                 "_collapse", "_children", "_siblings")

    def __init__(self, label: str, path: str, children: list["TreeNode"] | None = None,
                 tensor: TensorMeta | None = None, members: tuple[str, ...] = (), num_params: int = 0,
                 nbytes: int = 0, num_tensors: int = 0) -> None:
        self.label = label
        """What this node shows: a name segment, a range like ``[0-31]``, or a tensor's last segment."""
        self.path = path
        """Dotted prefix of this node; for a range node, the prefix of its first member."""
        self.tensor = tensor
        """Set on leaves (for range nodes: the first member's tensor)."""
        self.members = members
        """For range nodes: the dotted prefixes of every member (``model.layers.0`` ...)."""
        self.num_params = num_params
        """Parameters in this subtree, all members counted."""
        self.nbytes = nbytes
        self.num_tensors = num_tensors
        self._trie: _Trie | None = None
        self._collapse = True
        self._children = children
        self._siblings: dict[str, _Trie] | None = None
        """For range nodes: the parent's children by key, to build one member on demand."""

    @property
    def children(self) -> list["TreeNode"]:
        if self._children is None:
            self._children = _children_of(self._trie, self.path, self._collapse) if self._trie else []
        return self._children

    @property
    def is_range(self) -> bool:
        return len(self.members) > 1

    @property
    def repeat(self) -> int:
        return max(1, len(self.members))

    @property
    def member_keys(self) -> list[str]:
        """The layer numbers a range stands for (``["0", ..., "31"]``); empty for other nodes."""
        return [m.rpartition(".")[2] for m in self.members] if self.is_range else []

    def member(self, key: str) -> "TreeNode":
        """Member ``key`` of a range as its own node (every layer inside, nothing collapsed away),
        so a user can open layer 7 of ``layers.[0-31]``. Raises KeyError for a key not in the range."""
        if key not in self.member_keys or self._siblings is None:
            raise KeyError(key)
        prefix = self.path.rpartition(".")[0]
        return _node(self._siblings[key], key, _join(prefix, key), self._collapse)

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

    def __repr__(self) -> str:
        return f"TreeNode({self.path or '<root>'!r}, label={self.label!r}, params={self.num_params})"


class _Trie:
    """A module: its children by name segment. A tensor with nothing below it is stored in its parent's
    ``children`` as its ``TensorMeta`` itself, not wrapped in a node of its own (most names are leaves:
    100,000 tensors made 100,000 more objects, issue 15); a name that is a tensor and a module (``a.b``
    and ``a.b.c``) is a ``_Trie`` with ``tensor`` set."""

    __slots__ = ("children", "tensor", "params", "nbytes", "count", "signature", "shapes")

    def __init__(self, shapes: dict[tuple, int]) -> None:
        self.children: dict[str, _Trie | TensorMeta] = {}
        self.tensor: TensorMeta | None = None
        self.params = self.nbytes = self.count = 0
        self.signature: int | None = None
        self.shapes = shapes
        """Shared by the whole trie: each distinct subtree structure -> a small id."""


def build_tree(tensors: Iterable[TensorMeta], *, collapse: bool = True, root_label: str = "") -> TreeNode:
    """Build the module tree of ``tensors`` (names split on dots). Subtree totals are summed
    while inserting; everything below the root is materialised lazily."""
    shapes: dict[tuple, int] = {}
    root = _Trie(shapes)
    parents: dict[str, _Trie] = {}
    """Module path -> its node: a tensor finds its parent with one look-up instead of walking every
    level from the root (100,000 tensors of eight levels, issue 15)."""
    tensors = list(tensors)
    for meta in tensors:
        parent_path, dot, part = meta.name.rpartition(".")
        parent = (parents.get(parent_path) or _node_at(parent_path, root, parents)) if dot else root
        node = parent.children.get(part)
        if type(node) is _Trie:  # a module of that name came first
            node.tensor = meta
        else:
            parent.children[part] = meta
    _sum_totals(root, {})
    aliases = storage_aliases(tensors)
    if aliases:
        _count_shared_once(root, tensors, aliases, storage_aliases(tensors, ties=False))
    return _node(root, root_label, "", collapse)


def _count_shared_once(root: _Trie, tensors: list[TensorMeta], aliases: dict[str, str],
                       shared_bytes: dict[str, str]) -> None:
    """A tensor stored on another's storage (tied embeddings in a ``torch.save`` file), or the copy of one the
    config ties, counts once in every module holding both, as ``inspect``'s parameter count does
    (``storage_aliases``): the later of the two is taken off the totals of their common ancestors; its bytes
    only where it shares the storage (``shared_bytes``). Each leaf still shows its own size."""
    for meta in tensors:
        earlier = aliases.get(meta.name)
        if earlier is None:
            continue
        mine, theirs = meta.name.split(".")[:-1], earlier.split(".")[:-1]
        common = 0
        while common < min(len(mine), len(theirs)) and mine[common] == theirs[common]:
            common += 1
        node = root
        for depth in range(common + 1):
            if depth:
                node = node.children[mine[depth - 1]]  # type: ignore[assignment]  # a module: it has children
            node.params -= meta.numel
            if meta.name in shared_bytes:
                node.nbytes -= meta.nbytes


def _node_at(path: str, root: _Trie, parents: dict[str, _Trie]) -> _Trie:
    """The node of module ``path``, made (with the nodes above it) if new, and remembered in ``parents``.
    A module function, not a closure: a recursive closure is a reference cycle that would keep the
    whole trie alive until the cyclic collector runs."""
    above_path, dot, part = path.rpartition(".")
    above = (parents.get(above_path) or _node_at(above_path, root, parents)) if dot else root
    found = above.children.get(part)
    if type(found) is _Trie:
        node = found
    else:  # new, or a tensor of that name came first: it becomes this module's own tensor
        node = above.children[part] = _Trie(root.shapes)
        node.tensor = found  # type: ignore[assignment]
    parents[path] = node
    return node


def _sum_totals(trie: _Trie, leaves: dict[tuple, tuple[int, int, int]]) -> int:
    """Fill params/bytes/count and the structure signature (``_signature``) bottom-up, in one walk:
    once per trie node, instead of once per tensor per level while inserting, and without a second
    recursion for the signatures that collapsing layers needs (issue 15). Recursion depth is the
    name depth (a dozen levels). ``leaves`` caches, per ``(dtype, shape)`` of a plain leaf, its
    (elements, bytes, signature): a model repeats a few dozen shapes thousands of times, so most
    leaves cost one look-up. Returns the node's signature."""
    tensor = trie.tensor
    if tensor is not None:
        params, nbytes, count = tensor.numel, tensor.nbytes, 1
        own: tuple | None = (tensor.dtype, tensor.shape)
    else:
        params = nbytes = count = 0
        own = None
    shapes = trie.shapes
    below = []
    for key, child in trie.children.items():
        if type(child) is _Trie:
            sig = _sum_totals(child, leaves)
            params += child.params
            nbytes += child.nbytes
            count += child.count
        else:  # a leaf: one tensor (most nodes; skip the call)
            if child.attrs:  # type: ignore[union-attr]  # quantised sizes live in attrs
                params += child.numel  # type: ignore[union-attr]
                nbytes += child.nbytes  # type: ignore[union-attr]
                sig = shapes.setdefault(((child.dtype, child.shape), ()), len(shapes))  # type: ignore[union-attr]
            else:
                facts = (child.dtype, child.shape)  # type: ignore[union-attr]
                known = leaves.get(facts)
                if known is None:
                    numel = math.prod(child.shape)  # type: ignore[union-attr]
                    known = leaves[facts] = (numel, (numel * child.dtype_info.bits + 7) // 8,  # type: ignore[union-attr]
                                             shapes.setdefault((facts, ()), len(shapes)))
                params += known[0]
                nbytes += known[1]
                sig = known[2]
            count += 1
        below.append((key, sig))
    trie.params, trie.nbytes, trie.count = params, nbytes, count
    below.sort()
    trie.signature = sig = shapes.setdefault((own, tuple(below)), len(shapes))
    return sig


def _node(trie: _Trie | TensorMeta, label: str, path: str, collapse: bool, members: tuple[str, ...] = ()) -> TreeNode:
    repeat = max(1, len(members))
    if type(trie) is not _Trie:  # a leaf tensor
        return TreeNode(label=label, path=path, tensor=trie, members=members, num_params=trie.numel * repeat,
                        nbytes=trie.nbytes * repeat, num_tensors=repeat)
    node = TreeNode(label=label, path=path, tensor=trie.tensor, members=members,
                    num_params=trie.params * repeat, nbytes=trie.nbytes * repeat, num_tensors=trie.count * repeat)
    node._trie = trie
    node._collapse = collapse
    return node


def _children_of(trie: _Trie, path: str, collapse: bool) -> list[TreeNode]:
    numeric = sorted((k for k in trie.children if k.isdigit()), key=int)
    others = sorted((k for k in trie.children if not k.isdigit()), key=natural_key)
    out = _numeric_children(trie, numeric, path, collapse) if numeric else []
    out.extend(_node(trie.children[k], k, _join(path, k), collapse) for k in others)
    return out


def _numeric_children(trie: _Trie, keys: list[str], path: str, collapse: bool) -> list[TreeNode]:
    if not collapse:
        return [_node(trie.children[k], k, _join(path, k), collapse) for k in keys]
    runs: list[list[str]] = []
    last_sig: int | None = None
    for key in keys:
        sig = _signature(trie.children[key], trie.shapes)
        if runs and sig == last_sig and int(key) == int(runs[-1][-1]) + 1:
            runs[-1].append(key)
        else:
            runs.append([key])
        last_sig = sig
    out = []
    for run in runs:
        first = trie.children[run[0]]
        if len(run) == 1:
            out.append(_node(first, run[0], _join(path, run[0]), collapse))
        else:
            node = _node(first, f"[{run[0]}-{run[-1]}]", _join(path, run[0]), collapse,
                         members=tuple(_join(path, k) for k in run))
            node._siblings = trie.children
            out.append(node)
    return out


def _signature(trie: _Trie | TensorMeta, shapes: dict[tuple, int]) -> int:
    """What must match for two layers to share a range: names, dtypes and shapes below.

    Structures are interned bottom-up by ``_sum_totals`` (each distinct one gets an id from ``shapes``,
    compared by full equality), so equal ids mean exactly equal subtrees and each node is hashed once;
    a leaf tensor's id is looked up the same way."""
    if type(trie) is _Trie:
        assert trie.signature is not None
        return trie.signature
    return shapes.setdefault(((trie.dtype, trie.shape), ()), len(shapes))  # type: ignore[union-attr]


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key
