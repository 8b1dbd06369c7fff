"""The module tree of a checkpoint, populated lazily as the user expands it.

The tree data is ``ops.tree.build_tree`` (built once, in a worker); this widget only turns
``TreeNode``s into Textual tree nodes, and only for the levels the user opens, so a
20,000-tensor checkpoint costs a few dozen widget nodes at start (the DirectoryTree / harlequin
catalog pattern: populate on expand). Repeated layers arrive already collapsed into ranges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rich.style import Style
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Tree
from textual.widgets.tree import TreeNode as WidgetNode

from ckptscope.core.roles import training_kind
from ckptscope.core.tensor import TensorMeta
from ckptscope.core.units import human_bytes, human_count, shape_str
from ckptscope.ops.tree import TreeNode
from ckptscope.tui.colors import DTYPE_ICON, dtype_color
from ckptscope.tui.widgets.row_fit import Row
from ckptscope.tui.widgets.vim_keys import KeysFollowFocus, VimTree, tree_keys

if TYPE_CHECKING:  # pragma: no cover
    from textual.geometry import Region
    from textual.strip import Strip

    from ckptscope.tui.renaming import PendingView


@dataclass(frozen=True, slots=True)
class Entry:
    """What a widget node stands for."""

    node: TreeNode
    """The ops tree node whose children come next (after folding single-child chains)."""
    label: str
    repeat: int
    """How many identical copies this node stands for (product of enclosing ranges)."""
    range_path: str = ""
    """Dotted label of the innermost enclosing range (``model.layers.[0-31]``), if any."""
    more_from: int = -1
    """For a "… N more" placeholder: index of the next child of ``node`` to show; else -1."""

    @property
    def tensor(self) -> TensorMeta | None:
        if self.more_from >= 0:
            return None
        return self.node.tensor if not self.node.children else None


PAGE = 200
"""Children built per level at a time; a level with thousands (unrolled experts) gets a
"… N more" row that builds the next page when selected."""


def _relative(old: str, new: str, label: str) -> str:
    """``new`` without the module path it shares with ``old`` (what the row's label leaves out)."""
    parent = ".".join(old.split(".")[: -(label.count(".") + 1)])
    return new[len(parent) + 1:] if parent and new.startswith(parent + ".") else new


def _template(names: list[str]) -> str | None:
    """One name for several copies: ``model.blocks.[0-3].w`` for ``model.blocks.0.w`` … ``.3.w``."""
    parts = [n.split(".") for n in names]
    if len({len(p) for p in parts}) != 1:
        return None
    out = []
    for column in zip(*parts):
        values = set(column)
        if len(values) == 1:
            out.append(column[0])
        elif all(v.isdigit() for v in values):
            out.append(f"[{min(map(int, values))}-{max(map(int, values))}]")
        else:
            out.append("*")
    return ".".join(out)


def pending_note(entry: Entry, pending: PendingView, copies: list[str]) -> tuple[Text | None, bool]:
    """What a pending rename adds to a row, and whether the row's own name is dimmed.

    ``copies`` are the stored names (tensor) or prefixes (module) the row stands for.
    """
    if entry.tensor is None:
        count = pending.count(copies)
        return (Text(f"  ✎ {count} pending", style="bold yellow"), False) if count else (None, False)
    news = [pending.new_name(c) for c in copies]
    changed = [(old, new) for old, new in zip(copies, news) if new != old]
    if not changed:
        return None, False
    if all(new is None for _, new in changed) and len(changed) == len(copies):
        return Text("  ✗ dropped" + (f" ×{len(copies)}" if len(copies) > 1 else ""), style="bold red"), True
    if len(changed) == len(copies) and all(new is not None for _, new in changed):
        olds, news = _template([o for o, _ in changed]), _template([n for _, n in changed if n is not None])
        if olds is not None and news is not None:
            return Text(f"  → {_relative(olds, news, entry.label)}", style="bold yellow"), True
    return Text(f"  → {len(changed)} of {len(copies)} renamed", style="bold yellow"), False


def node_label(entry: Entry, pending: PendingView | None = None, copies: list[str] | None = None) -> Text:
    """``● q_proj.weight  bf16 [64, 64]  4.1K  8.0 KiB``, or a module with its totals.

    With pending renames, a renamed tensor shows ``dim old name  → new name`` (a dropped one
    ``✗ dropped``) and a module the number of pending changes below it.
    """
    node = entry.node
    text = Row(no_wrap=True, overflow="ellipsis")
    if entry.more_from >= 0:
        rest = len(node.children) - entry.more_from
        return Text(f"… {rest:,} more (enter to show {min(rest, PAGE)})", style="italic dim")
    note, dim = pending_note(entry, pending, copies) if pending is not None and copies else (None, False)
    meta = entry.tensor
    if meta is not None:
        text.append(f"{DTYPE_ICON} ", style=dtype_color(meta.dtype))
        text.append_name(entry.label, style="dim strike" if note is not None and "dropped" in note.plain else
                         "dim" if dim else "")
        if note is not None:
            text.append_text(note)
        if node.is_range:
            text.append(f" ×{node.repeat}", style="bold magenta")
        text.start_detail()
        text.append(f"  {shape_str(meta.shape)}", style="dim")
        text.start_detail()
        text.append(f"  {human_bytes(node.nbytes)}", style="dim italic")
        return text
    if node.is_range:
        head, _, rng = entry.label.rpartition(".")
        if head:
            text.append_name(head, style="bold")
            text.append(" ")
        text.append(rng, style="bold magenta")
        text.append(f" ×{node.repeat}", style="magenta")
    else:
        text.append_name(entry.label, style="bold")
    if note is not None:
        text.append_text(note)
    kind = training_kind(node.path) if node.path else None
    if kind is not None and entry.label == node.path:  # a top-level training-state module
        text.start_detail()
        text.append(f"  training state: {kind}", style="yellow")
    # optimizer moments, rng ... are elements, not model parameters, at every depth
    text.start_detail()
    text.append(f"  {human_count(node.num_params)} {'params' if kind is None else 'elements'}", style="dim")
    text.start_detail()
    text.append(f"  {human_bytes(node.nbytes)}", style="dim italic")
    return text


class TensorTree(KeysFollowFocus, VimTree, Tree[Entry]):
    """Lazy module tree. Posts ``TensorTree.TensorHighlighted`` when the cursor lands on a tensor."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("right,l", "expand_node", "expand", show=False, id="tree.expand",
                tooltip="Expand the node under the cursor"),
        Binding("left,h", "collapse_node", "collapse", show=False, id="tree.collapse",
                tooltip="Collapse the node, or go to its parent"),
        *tree_keys("tree"),
    ]

    class TensorHighlighted(Message):
        """The cursor is on a tensor leaf (or left tensors: ``entry`` is a module)."""

        def __init__(self, entry: Entry) -> None:
            self.entry = entry
            super().__init__()

    class ContentPainted(Message):
        """The tree drew the rows of a newly shown checkpoint for the first time. The browser mounts
        its tabs then: mounted earlier, they delayed that first paint by ~40 ms (row 9 of
        bench/run_all.py), since ``call_after_refresh`` ran before the frame that drew the rows."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("checkpoint", id=id)
        self.show_root = False
        self.guide_depth = 3
        self.auto_expand = False
        self._populated: set[int] = set()
        self._by_node: dict[int, WidgetNode[Entry]] = {}
        """Widget node for an ops node id, for the levels populated so far (reveal, jump)."""
        self.pending: PendingView | None = None
        """Pending renames shown on the rows (None: none pending)."""
        self._announce_paint = False

    # --- data in ------------------------------------------------------------------------------

    def show_tree(self, root: TreeNode) -> None:
        """Replace the content with ``root``'s children (only the first level is built)."""
        self.clear()
        self._populated.clear()
        self._by_node.clear()
        self.root.data = Entry(root, "", 1)
        self._populate(self.root)
        self.root.expand()
        self.cursor_to_top()
        self.call_after_refresh(self._announce_cursor)
        self._announce_paint = True

    def render_lines(self, crop: Region) -> list[Strip]:
        lines = super().render_lines(crop)
        if self._announce_paint and not self.loading:
            self._announce_paint = False
            self.post_message(self.ContentPainted())
        return lines

    def cursor_to_top(self) -> None:
        """Cursor on the first line, if there is one (an empty or filtered-out tree has none)."""
        if self.root.children:
            self.move_cursor(self.root.children[0])

    def _announce_cursor(self) -> None:
        """Say what is under the cursor even when the line number did not change (new content)."""
        node = self.cursor_node
        if node is not None and node.data is not None:
            self.post_message(self.TensorHighlighted(node.data))

    def _populate(self, widget_node: WidgetNode[Entry], start: int = 0) -> None:
        entry = widget_node.data
        if entry is None or (start == 0 and id(widget_node) in self._populated):
            return
        self._populated.add(id(widget_node))
        children = entry.node.folded_children()
        chain = self.chain(widget_node) if self.pending is not None else []
        for label, target in children[start: start + PAGE]:
            repeat = entry.repeat * target.repeat
            range_path = entry.range_path
            if target.is_range:
                prefix = target.path.rpartition(".")[0]
                range_path = f"{prefix}.{target.label}" if prefix else target.label
            child = Entry(target, label, repeat, range_path)
            leaf = not target.children
            added = widget_node.add(self._label(child, [*chain, target]), child, allow_expand=not leaf)
            self._by_node[id(target)] = added
        if start + PAGE < len(children):
            more = Entry(entry.node, "", entry.repeat, entry.range_path, more_from=start + PAGE)
            widget_node.add_leaf(node_label(more), more)

    # --- pending renames -----------------------------------------------------------------------

    def chain(self, widget_node: WidgetNode[Entry]) -> list[TreeNode]:
        """The ops nodes from the first level down to ``widget_node`` (the root excluded)."""
        out: list[TreeNode] = []
        node: WidgetNode[Entry] | None = widget_node
        while node is not None and not node.is_root:
            if node.data is not None:
                out.append(node.data.node)
            node = node.parent
        return out[::-1]

    def _label(self, entry: Entry, chain: list[TreeNode]) -> Text:
        if self.pending is None or entry.more_from >= 0 or not chain:
            return node_label(entry)
        from ckptscope.tui.renaming import selection_of

        copies = selection_of(chain, tensor=entry.tensor is not None).paths()
        return node_label(entry, self.pending, copies)

    def set_pending(self, pending: PendingView | None) -> None:
        """Show ``pending`` renames on every row built so far (and on rows built later)."""
        if pending is None and self.pending is None:
            return
        self.pending = pending
        for widget_node in list(self._by_node.values()):
            if widget_node.data is not None:
                widget_node.set_label(self._label(widget_node.data, self.chain(widget_node)))

    def _show_more(self, placeholder: WidgetNode[Entry]) -> bool:
        """Replace a "… N more" row by the next page of its parent's children."""
        entry = placeholder.data
        parent = placeholder.parent
        if entry is None or entry.more_from < 0 or parent is None:
            return False
        placeholder.remove()
        self._populate(parent, entry.more_from)
        return True

    def on_tree_node_selected(self, event: Tree.NodeSelected[Entry]) -> None:
        """Enter (or a click) on "… N more" shows the next page; on a module it opens or closes it,
        as the help says (auto_expand is off so that a click only selects)."""
        if self._show_more(event.node):
            event.stop()
        elif event.node.allow_expand:
            event.node.toggle()

    # --- rows that fit ----------------------------------------------------------------------

    def _room(self, node: WidgetNode[Entry]) -> int:
        """Cells the label of ``node`` has: the tree's width less the scrollbar (its gutter is kept,
        see app.tcss, so rows need no refit when it appears), the guides and the ▶ icon."""
        depth, parent = 0, node.parent
        while parent is not None and not parent.is_root:
            depth, parent = depth + 1, parent.parent
        icon = len(self.ICON_NODE) if node.allow_expand else 0
        return self.scrollable_content_region.width - depth * self.guide_depth - icon

    def process_label(self, label: str | Text) -> Text:
        """A ``Row`` is kept as built (one line already): ``Tree`` would copy it into a plain
        ``Text`` and lose the parts ``render_label`` fits by."""
        return label if isinstance(label, Row) else super().process_label(label)

    def render_label(self, node: WidgetNode[Entry], base_style: Style, style: Style) -> Text:
        """The row fitted to the tree's width (``Row.fit``): a cut row shows ``…``; the tooltip
        and the detail pane have it whole. Before the first layout (width 0) it stays whole."""
        full = super().render_label(node, base_style, style)
        label = node.label
        if not isinstance(label, Row) or self.size.width <= 0:
            return full
        fitted = label.fit(self._room(node))
        if fitted is label:
            return full
        fitted = fitted.copy()
        fitted.stylize(style)
        return Text.assemble(full[: len(full) - len(label)], fitted)  # the ▶/▼ prefix, then the row

    def watch_hover_line(self, previous_hover_line: int, hover_line: int) -> None:
        """A row cut to fit shows whole (name, shape, size, full path) in a tooltip under the mouse."""
        super().watch_hover_line(previous_hover_line, hover_line)
        node = self.get_node_at_line(hover_line)
        label = node.label if node is not None else None
        tooltip = None
        if node is not None and isinstance(label, Row) and self.size.width > 0 \
                and label.fit(self._room(node)) is not label and node.data is not None:
            path = node.data.node.path
            tooltip = label.plain + (f"\n{path}" if path and path != node.data.label else "")
        self.tooltip = tooltip

    def on_tree_node_expanded(self, event: Tree.NodeExpanded[Entry]) -> None:
        self._populate(event.node)

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[Entry]) -> None:
        if event.node.data is not None:
            self.post_message(self.TensorHighlighted(event.node.data))

    # --- navigation ---------------------------------------------------------------------------

    def reveal(self, chain: list[TreeNode]) -> None:
        """Expand the ancestors in ``chain`` (root first, excluded) and put the cursor on the last."""
        current = self.root
        for target in chain:
            self._populate(current)
            found = self._by_node.get(id(target))
            while found is None and current.children and self._show_more(current.children[-1]):
                found = self._by_node.get(id(target))
            if found is None:
                return
            if target is not chain[-1]:
                self._populate(found)
                found.expand()
            current = found
        self.move_cursor(current)
        self.scroll_to_node(current, animate=False)
        if current.data is not None:
            self.post_message(self.TensorHighlighted(current.data))

    def expand_to_depth(self, depth: int, limit: int = 400) -> None:
        """Open every node down to ``depth`` levels, building at most ``limit`` widget nodes."""
        budget = [limit]

        def visit(node: WidgetNode[Entry], level: int) -> None:
            if level >= depth or budget[0] <= 0:
                return
            for child in list(node.children):
                if child.allow_expand and budget[0] > 0:
                    self._populate(child)
                    budget[0] -= len(child.children)
                    child.expand()
                    visit(child, level + 1)

        visit(self.root, 0)

    # --- ranges ---------------------------------------------------------------------------

    def range_at_cursor(self) -> WidgetNode[Entry] | None:
        """The collapsed range the cursor is on or inside (the innermost), or None."""
        node = self.cursor_node
        while node is not None and not node.is_root:
            if node.data is not None and node.data.more_from < 0 and node.data.node.is_range:
                return node
            node = node.parent
        return None

    def open_member(self, range_node: WidgetNode[Entry], key: str) -> None:
        """Show member ``key`` of a range as its own row, first under the range, with the cursor
        on it: layer 7 of ``layers.[0-31]`` with its real tensor names (values, stats, rename)."""
        entry = range_node.data
        assert entry is not None
        for child in range_node.children:
            if child.data is not None and child.data.node.path == f"{entry.node.path.rpartition('.')[0]}.{key}".lstrip("."):
                self._land(child)
                return
        member = entry.node.member(key)
        outer = range_node.parent.data if range_node.parent is not None and range_node.parent.data else None
        child_entry = Entry(member, f"{key}", max(1, entry.repeat // entry.node.repeat),
                            outer.range_path if outer is not None else "")
        self._populate(range_node)
        range_node.expand()
        added = range_node.add(self._label(child_entry, [*self.chain(range_node), member]), child_entry, before=0)
        self._by_node[id(member)] = added
        self._populate(added)
        added.expand()
        self.call_after_refresh(self._land, added)  # the new row has a line number once laid out

    def _land(self, node: WidgetNode[Entry]) -> None:
        self.move_cursor(node)
        self.scroll_to_node(node, animate=False)
        if node.data is not None:
            self.post_message(self.TensorHighlighted(node.data))

    def action_expand_node(self) -> None:
        node = self.cursor_node
        if node is None:
            return
        if self._show_more(node):
            return
        if node.allow_expand and not node.is_expanded:
            self._populate(node)
            node.expand()
        elif node.children:
            self.move_cursor(node.children[0])

    def action_collapse_node(self) -> None:
        node = self.cursor_node
        if node is None:
            return
        if node.is_expanded and node.allow_expand:
            node.collapse()
        elif node.parent is not None and not node.parent.is_root:
            self.move_cursor(node.parent)
