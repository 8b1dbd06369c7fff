"""The main screen: header, lazy module tree on the left, tabs for the selected tensor on the right.

The screen owns the reader and every worker that touches it (index load, filter, stats, value
peek). Workers post past-tense messages; the handlers here update widgets. Nothing blocking
runs on the UI thread, so the window appears at once and stays responsive on 20k tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Input, Static, TabbedContent, TabPane
from textual.worker import Worker, WorkerState, get_current_worker

from ckptscope.core.errors import CkptError
from ckptscope.core.tensor import TensorMeta
from ckptscope.tui.filtering import chain_to, filter_tensors, leaf_chains
from ckptscope.tui.messages import (
    FilterApplied,
    IndexLoaded,
    IterationsDiscovered,
    LayersCompared,
    OpenFailed,
    StatsComputed,
    ValuesPaged,
)
from ckptscope.tui.screens.rename_actions import RENAME_BINDINGS, RenameActions
from ckptscope.tui.widgets.files_table import FilesTable
from ckptscope.tui.widgets.filter_bar import FilterBar
from ckptscope.tui.widgets.key_footer import KeyFooter
from ckptscope.tui.widgets.objects_table import ObjectDetail, ObjectsTable
from ckptscope.tui.widgets.shard_map import ShardMap
from ckptscope.tui.widgets.stats_view import StatsView
from ckptscope.tui.widgets.summary_header import SummaryHeader
from ckptscope.tui.widgets.tensor_detail import TensorDetail
from ckptscope.tui.widgets.tensor_tree import Entry, TensorTree
from ckptscope.tui.widgets.values_view import ValuesPager

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.core.index import CheckpointIndex
    from ckptscope.ops.opening import Reader
    from ckptscope.ops.stats import TensorStats
    from ckptscope.ops.values import Selection
    from ckptscope.ops.tree import TreeNode

SPINNER_AFTER = 0.3
"""Seconds of reading before the tree shows its loading indicator. A faster open shows none: a spinner
that flashes for a fraction of a second tells nothing, and animating it took ~20 ms of the UI thread
from the reading worker while 20k tensors opened (row 9 of bench/run_all.py)."""
PANES_AT_THE_LATEST = 0.5
"""Seconds after the index arrived when the tabs are mounted even if the tree drew nothing (no room)."""
FILTER_DELAY = 0.12
"""Seconds of typing pause before the filter runs (live narrowing without a rebuild per key)."""
CACHE_SIZE = 512
"""Stats and value peeks kept per screen (bounded, as toolong bounds its caches)."""
REVEAL_ALL_UNDER = 60
UNCOLLAPSED_MATCHES = 2000
"""Filter results up to this many tensors are not collapsed into ranges, so n / N visit every match."""
"""Filter results with at most this many leaves are expanded fully."""


class DetailTabs(Vertical):
    """The right-hand tabs. The screen mounts them once the tree is usable, not at start:
    mounting and styling them costs about as much as painting the tree (row 9 of bench/run_all.py
    measured ~0.2 s on 20k tensors), and the user looks at the tree first."""

    def compose(self) -> ComposeResult:
        with TabbedContent(id="tabs", initial="tensor"):
            with TabPane("Tensor", id="tensor"):
                yield TensorDetail(id="detail")
            with TabPane("Stats", id="stats"), VerticalScroll():
                yield StatsView(id="stats-view")
            with TabPane("Values", id="values"):
                yield ValuesPager(id="values-view")
            with TabPane("Objects", id="objects"):
                yield ObjectsTable(id="objects-table")
                yield ObjectDetail(id="object-detail")
            with TabPane("Files", id="files"):
                yield FilesTable(id="files-table")


class BrowseScreen(RenameActions, Screen[None]):
    """Browse one checkpoint (or offer the iterations of a save root first)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "open_filter", "filter", id="browse.filter", tooltip="Filter tensors by substring or glob"),
        Binding("escape", "close_filter", "clear filter", show=False, id="browse.clear_filter",
                tooltip="Clear the filter and show every tensor"),
        Binding("n", "next_match", "next match", id="browse.next_match", tooltip="Jump to the next filter match"),
        Binding("N", "prev_match", "prev match", show=False, id="browse.prev_match",
                tooltip="Jump to the previous filter match"),
        Binding("s", "stats", "stats", id="browse.stats",
                tooltip="Compute min/max/mean/std/NaN/Inf and a histogram of the tensor (cached)"),
        Binding("v", "values", "values", id="browse.values",
                tooltip="Page through the tensor's values (slice box, exact stored bits)"),
        Binding("t", "show_tab('tensor')", "tensor", id="browse.tensor",
                tooltip="Tensor details and shard layout"),
        Binding("o", "show_tab('objects')", "objects", id="browse.objects",
                tooltip="Args, iteration, rng, optimizer groups, metadata"),
        Binding("f", "show_tab('files')", "files", show=False, id="browse.files", tooltip="Files of the checkpoint"),
        Binding("e", "expand_all", "expand all", show=False, id="browse.expand_all",
                tooltip="Expand the tree a few levels"),
        Binding("c", "collapse_all", "collapse all", show=False, id="browse.collapse_all",
                tooltip="Collapse the whole tree"),
        Binding("left_square_bracket", "panel(-1)", "prev panel", show=False, id="browse.prev_panel",
                tooltip="Shard map: previous block of the leading axes"),
        Binding("right_square_bracket", "panel(1)", "next panel", show=False, id="browse.next_panel",
                tooltip="Shard map: next block of the leading axes"),
        Binding("i", "iterations", "iterations", show=False, id="browse.iterations",
                tooltip="Pick another iteration of this save directory"),
        Binding("backspace", "back", "back", id="browse.back",
                tooltip="Back to where this checkpoint was opened from: the checkpoint this copy was written "
                        "from, as you left it, or the save directory's list of iterations"),
        Binding("p", "pick_layer", "pick layer", id="browse.pick_layer",
                tooltip="In a collapsed range: open one layer, or compare two layers"),
        Binding("y", "copy_name", "copy name", show=False, id="browse.copy_name",
                tooltip="Copy the tensor name to the clipboard"),
        # Room for the ops screens; each op's issue adds its screen behind these ids.
        Binding("D", "op('diff')", "diff with…", show=False, id="ops.diff",
                tooltip="Compare this checkpoint with another"),
        Binding("C", "op('convert')", "convert/merge…", show=False, id="ops.convert",
                tooltip="Convert or merge: form, live plan, verify"),
        Binding("R", "op('rename')", "rename…", show=False, id="ops.rename",
                tooltip="Pending rename rules: review, undo, remove, apply"),
        *RENAME_BINDINGS,  # r rename, x drop, u undo, A apply (screens/rename_actions.py); R lists the rules
    ]

    def __init__(self, path: str, *, trust_pickle: bool = False, discover: bool = True,
                 iterations_root: str | None = None, opened_from: str | None = None) -> None:
        super().__init__()
        self.path = path
        self.opened_from = opened_from
        """The checkpoint whose browser this one was opened over (a converted or renamed copy);
        ``backspace`` goes back to it, as it was left."""
        self.trust_pickle = trust_pickle
        self.discover = discover
        """Look for iterations first (a save root); off once the user picked one."""
        self.reader: Reader | None = None
        self.index: CheckpointIndex | None = None
        self.module_tree: TreeNode | None = None
        self.iterations_root: str | None = iterations_root
        """The save root this checkpoint was picked from (``i`` goes back to its picker)."""
        self.current: TensorMeta | None = None
        self.load_seconds: float | None = None
        self._stats: LRUCache[str, TensorStats] = LRUCache(CACHE_SIZE)
        self._leaves: list[list[TreeNode]] = []
        self._match = -1
        self._filter_timer: Timer | None = None
        self._pattern = ""
        self._panes_ready = False
        self._panes_mounting = False
        self._spinner_timer: Timer | None = None
        self._highlighted: Entry | None = None

    # --- layout ------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield SummaryHeader(self.path, id="summary")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield TensorTree(id="tree")
                yield Static("", id="filter-status")
                yield FilterBar(id="filter")
            with Vertical(id="right"):
                yield Static(Text("reading metadata…", style="dim italic"), id="panes-waiting")
        yield KeyFooter()

    @property
    def panes_ready(self) -> bool:
        """Whether the right-hand tabs are mounted (they come just after the tree)."""
        return self._panes_ready

    async def _mount_panes(self) -> None:
        if self._panes_ready or self._panes_mounting:
            return
        self._panes_mounting = True
        right = self.query_one("#right")
        await right.query("#panes-waiting").remove()
        await right.mount(DetailTabs(id="detail-tabs"))
        if not self.query(StatsView):  # the app is closing (q pressed as the tree appeared): nothing to fill
            return
        self._panes_ready = True
        self._fill_panes()

    def _fill_panes(self) -> None:
        """Show the loaded index and the highlighted row in the tabs."""
        if not self._panes_ready:
            return
        index = self.index
        self.query_one(StatsView).show_hint(None)
        self.query_one(ValuesPager).show_hint(None)
        if index is None:
            return
        self.query_one(ObjectsTable).show(index)
        self.query_one(FilesTable).show(index)
        self.query_one(TabbedContent).get_tab("objects").label = f"Objects ({len(index.objects)})"
        if not index.tensors:
            self.query_one(TensorDetail).show(None)
        elif self._highlighted is not None:
            self._show_entry(self._highlighted)

    def on_mount(self) -> None:
        self._reading(True)
        # Start reading after the first frame is painted: the worker then shares the GIL with an
        # idle UI instead of the first layout, and the window appears sooner.
        self.call_after_refresh(self._open, self.path, self.discover)

    def on_unmount(self) -> None:
        if self.reader is not None:
            self.reader.close()

    # --- loading -----------------------------------------------------------------------------

    def load(self, path: str) -> None:
        """Open another path (an iteration picked from the save root) in this screen."""
        if self.reader is not None:
            self.reader.close()
        self.path, self.reader, self.index, self.module_tree, self.current = path, None, None, None, None
        self._highlighted = None
        self._stats.clear()
        self.query_one(SummaryHeader).show(None, path=path)
        self._reading(True)
        self._open(path, False)

    def _reading(self, reading: bool) -> None:
        """The tree's loading indicator: shown once reading has taken ``SPINNER_AFTER`` seconds."""
        if self._spinner_timer is not None:
            self._spinner_timer.stop()
            self._spinner_timer = None
        tree = self.query_one(TensorTree)
        if reading:
            self._spinner_timer = self.set_timer(SPINNER_AFTER, lambda: setattr(tree, "loading", True))
        else:
            tree.loading = False

    @work(thread=True, exclusive=True, group="index", exit_on_error=False, description="reading the index")
    def _open(self, path: str, discover: bool) -> None:
        from ckptscope.tui.opening import open_path

        try:
            opened = open_path(path, trust_pickle=self.trust_pickle, discover=discover)
        except CkptError as exc:
            self.post_message(OpenFailed(path, str(exc)))
            return
        if get_current_worker().is_cancelled:
            return
        if opened.iterations is not None:
            self.post_message(IterationsDiscovered(path, opened.iterations))
        else:
            assert opened.reader is not None and opened.index is not None and opened.tree is not None
            self.post_message(IndexLoaded(opened.reader, opened.index, opened.tree, opened.header, opened.seconds))

    @on(IndexLoaded)
    def _index_loaded(self, message: IndexLoaded) -> None:
        self.reader, self.index, self.module_tree = message.reader, message.index, message.tree
        self.load_seconds = message.seconds
        self.query_one(SummaryHeader).show(message.index, message.header)
        tree = self.query_one(TensorTree)
        tree.show_tree(message.tree)
        if len(message.tree.folded_children()) <= 3:
            tree.expand_to_depth(1)
        self._reading(False)
        pending = self.query_one(FilterBar).value
        if pending.strip():  # typed while the index was loading
            self._apply_filter(pending)
        else:
            tree.focus()
        if self._panes_ready:
            self._fill_panes()
        else:  # once the tree has drawn these rows (``_tree_painted``), at the latest after PANES_AT_THE_LATEST
            self.set_timer(PANES_AT_THE_LATEST, self._mount_panes)
        if not message.index.tensors:
            self.notify("This checkpoint holds no tensors.", severity="warning")

    @on(TensorTree.ContentPainted)
    async def _tree_painted(self) -> None:
        await self._mount_panes()

    @on(IterationsDiscovered)
    def _iterations_discovered(self, message: IterationsDiscovered) -> None:
        from ckptscope.tui.screens.iterations import IterationPickerScreen

        self.iterations_root = message.root

        def picked(path: str | None) -> None:
            if path is not None and path != self.path:  # the one already open: nothing to reload or lose
                self.confirm_discard(lambda: self.load(path), f"open {path}")

        self.app.push_screen(IterationPickerScreen(message.root, message.iterations,
                                                   can_go_back=self.index is not None), picked)

    @on(OpenFailed)
    def _open_failed(self, message: OpenFailed) -> None:
        self._reading(False)
        self.app.show_error(message.path, message.reason)  # type: ignore[attr-defined]

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        """The one error path for workers: a bug in a worker becomes a message, not a traceback."""
        if event.state is not WorkerState.ERROR:
            return
        error = event.worker.error
        reason = str(error) if isinstance(error, CkptError) else f"internal error: {type(error).__name__}: {error}"
        if event.worker.group == "index":
            self.app.show_error(self.path, reason)  # type: ignore[attr-defined]
        elif not self._panes_ready:
            self.notify(reason, severity="error")
        elif self.current is not None and event.worker.group == "stats":
            self.query_one(StatsView).show_error(self.current.name, reason)
        elif self.current is not None and event.worker.group == "peek":
            self.query_one(ValuesPager).show_error(self.current.name, reason)
        else:
            self.notify(reason, severity="error")

    # --- selection ---------------------------------------------------------------------------

    @on(ObjectsTable.RowHighlighted, "#objects-table")
    def _object_highlighted(self, event: ObjectsTable.RowHighlighted) -> None:
        table = self.query_one(ObjectsTable)
        self.query_one(ObjectDetail).show(table.full_row(event.cursor_row))

    @on(TensorTree.TensorHighlighted)
    def _tensor_highlighted(self, message: TensorTree.TensorHighlighted) -> None:
        self._highlighted = message.entry
        self.refresh_bindings()  # "p pick layer" shows only inside a range
        self.current = message.entry.tensor
        if self._panes_ready:
            self._show_entry(message.entry)

    def _show_entry(self, entry: Entry) -> None:
        meta = entry.tensor
        self.query_one(TensorDetail).show(meta, entry)
        name = meta.name if meta is not None else None
        stats_view = self.query_one(StatsView)
        if name is not None and name in self._stats:
            stats_view.show_stats(self._stats[name])
        else:
            stats_view.show_hint(name)
        pager = self.query_one(ValuesPager)
        if name is not None and meta is not None and self.query_one(TabbedContent).active == "values":
            pager.start(name, meta.shape)  # the open Values tab follows the cursor
        else:
            pager.show_hint(name)

    # --- stats and values --------------------------------------------------------------------

    def action_stats(self) -> None:
        if not self._panes_ready:
            return
        self.query_one(TabbedContent).active = "stats"
        meta = self.current
        if meta is None or self.reader is None:
            self.notify("Put the cursor on a tensor first.", severity="warning")
            return
        if meta.name in self._stats:
            self.query_one(StatsView).show_stats(self._stats[meta.name])
            return
        self.query_one(StatsView).show_progress(meta.name)
        self._compute_stats(meta.name)

    @work(thread=True, exclusive=True, group="stats", exit_on_error=False, description="tensor statistics")
    def _compute_stats(self, name: str) -> None:
        from ckptscope.ops.stats import tensor_stats

        worker = get_current_worker()
        assert self.reader is not None
        try:
            stats = tensor_stats(self.reader, name, should_stop=lambda: worker.is_cancelled)
        except CkptError as exc:
            self.post_message(StatsComputed(name, None, str(exc)))
            return
        if stats is not None and not worker.is_cancelled:
            self.post_message(StatsComputed(name, stats))

    @on(StatsComputed)
    def _stats_computed(self, message: StatsComputed) -> None:
        if message.stats is not None:
            self._stats[message.name] = message.stats
        if not self._panes_ready or self.current is None or self.current.name != message.name:
            return
        view = self.query_one(StatsView)
        if message.stats is None:
            view.show_error(message.name, message.error)
        else:
            view.show_stats(message.stats)

    def action_values(self) -> None:
        if not self._panes_ready:
            return
        self.query_one(TabbedContent).active = "values"
        meta = self.current
        if meta is None or self.reader is None:
            self.notify("Put the cursor on a tensor first.", severity="warning")
            return
        pager = self.query_one(ValuesPager)
        pager.start(meta.name, meta.shape)
        pager.query_one("#values-table").focus()  # paging keys act at once; esc goes back to the tree

    @on(ValuesPager.PageWanted)
    def _page_wanted(self, event: ValuesPager.PageWanted) -> None:
        self._read_page(event.name, event.selection, event.row, event.col, event.rows, event.cols)

    @work(thread=True, exclusive=True, group="peek", exit_on_error=False, description="reading values")
    def _read_page(self, name: str, selection: Selection, row: int, col: int, rows: int, cols: int) -> None:
        from ckptscope.ops.values import read_page

        assert self.reader is not None
        try:
            page = read_page(self.reader, name, selection, row=row, col=col, rows=rows, cols=cols)
        except CkptError as exc:
            self.post_message(ValuesPaged(name, None, str(exc)))
            return
        self.post_message(ValuesPaged(name, page))

    @on(ValuesPaged)
    def _values_paged(self, message: ValuesPaged) -> None:
        if not self._panes_ready:
            return
        pager = self.query_one(ValuesPager)
        if message.page is None:
            pager.show_error(message.name, message.error)
        else:
            pager.show_page(message.page)

    # --- filter ------------------------------------------------------------------------------

    def action_open_filter(self) -> None:
        self.add_class("-filtering")
        bar = self.query_one(FilterBar)
        # Shown and focused now, not after the next refresh: keys typed right after "/" (a paste,
        # a fast typist) must reach the bar, not the tree, where r renames and x drops.
        bar.display = True
        self.set_focus(bar)  # the screen's own, synchronous (Widget.focus waits for the queue)

    def action_close_filter(self) -> None:
        self.remove_class("-filtering")
        self.query_one(FilterBar).styles.clear_rule("display")  # the stylesheet hides it again
        if self._pattern:
            self._pattern = ""
            self._leaves, self._match = [], -1
            if self.module_tree is not None:
                tree = self.query_one(TensorTree)
                here = self.current.name if self.current is not None else None
                tree.show_tree(self.module_tree)
                if len(self.module_tree.folded_children()) <= 3:
                    tree.expand_to_depth(1)
                chain = chain_to(self.module_tree, here) if here is not None else []
                if chain:  # the cursor stays on the tensor the filter led to
                    tree.call_after_refresh(tree.reveal, chain)
        self.query_one("#filter-status", Static).update("")
        self.query_one(TensorTree).focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        if self._filter_timer is not None:
            self._filter_timer.stop()
        pattern = event.value
        self._filter_timer = self.set_timer(FILTER_DELAY, lambda: self._start_filter(pattern))

    def _start_filter(self, pattern: str) -> None:
        if self.index is None or self.module_tree is None:
            return
        self._apply_filter(pattern)

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        if self._filter_timer is not None:
            self._filter_timer.stop()
        self.query_one(TensorTree).focus()  # at once, so keys typed next go to the tree
        if event.value.strip() != self._pattern:
            self._apply_filter(event.value, jump=True)
        else:
            self.action_next_match()

    @work(thread=True, exclusive=True, group="filter", exit_on_error=False, description="filtering tensors")
    def _apply_filter(self, pattern: str, jump: bool = False) -> None:
        from ckptscope.ops.tree import build_tree

        assert self.index is not None
        kept = filter_tensors(self.index.tensors.values(), pattern)
        if get_current_worker().is_cancelled:
            return
        tree = build_tree(kept, collapse=len(kept) > UNCOLLAPSED_MATCHES)  # every match its own row: n reaches it
        self.post_message(FilterApplied(pattern, tree, len(kept), leaf_chains(tree), jump))

    @on(FilterApplied)
    def _filter_applied(self, message: FilterApplied) -> None:
        self._pattern = message.pattern.strip()
        self._leaves, self._match = message.leaves, -1
        tree = self.query_one(TensorTree)
        tree.show_tree(message.tree)
        if self._pattern:
            if len(message.leaves) <= REVEAL_ALL_UNDER:
                for chain in message.leaves:
                    tree.reveal(chain)
                tree.cursor_to_top()
            else:
                tree.expand_to_depth(2)
        status = self.query_one("#filter-status", Static)
        if not self._pattern:
            status.update("")
        elif message.matched:
            rows = len(message.leaves)
            status.update(f"{message.matched:,} tensors match · {rows} row{'s' if rows != 1 else ''} · n / N to jump")
        else:
            status.update("no tensor matches")
            self._show_no_tensor()
        if message.jump:
            tree.focus()
            self.action_next_match()

    def _show_no_tensor(self) -> None:
        """The tree is empty (a filter matched nothing): the panes stop showing the tensor the cursor left
        (a probe saw the previous tensor's facts beside "no tensor matches")."""
        self._highlighted, self.current = None, None
        self.refresh_bindings()
        if self._panes_ready:
            self.query_one(TensorDetail).show(None)
            self.query_one(StatsView).show_hint(None)
            self.query_one(ValuesPager).show_hint(None)

    def _jump(self, step: int) -> None:
        if not self._leaves:
            # a filter that matches nothing is not "no filter" (the same line was shown for both: a person testing)
            message = (f"The filter {self._pattern!r} matches no tensor: press / to change it." if self._pattern.strip()
                       else "No filter matches: press / to filter.")
            self.notify(message, severity="information")
            return
        self._match = (self._match + step) % len(self._leaves)
        tree = self.query_one(TensorTree)
        tree.reveal(self._leaves[self._match])
        tree.focus()
        self.query_one("#filter-status", Static).update(
            f"match {self._match + 1} of {len(self._leaves)} · n / N to jump")

    def action_next_match(self) -> None:
        self._jump(1)

    def action_prev_match(self) -> None:
        self._jump(-1)

    # --- view --------------------------------------------------------------------------------

    def action_show_tab(self, tab: str) -> None:
        """Show a tab; its table takes the keys (j/k, / to search it), esc comes back to the tree."""
        if self._panes_ready:
            self.query_one(TabbedContent).active = tab
            table = {"objects": ObjectsTable, "files": FilesTable}.get(tab)
            if table is not None:
                self.query_one(table).focus()

    def action_expand_all(self) -> None:
        self.query_one(TensorTree).expand_to_depth(3)

    def action_collapse_all(self) -> None:
        tree = self.query_one(TensorTree)
        for child in tree.root.children:
            child.collapse_all()
        tree.cursor_to_top()

    def action_panel(self, step: int) -> None:
        if not self._panes_ready:
            return
        shard_map = self.query_one(ShardMap)
        pages = shard_map.page_count()
        if pages <= 1:
            self.notify("This tensor has no leading axes to page through.", severity="information")
            return
        shard_map.panel_offset = max(0, min(pages - 1, shard_map.panel_offset + step))

    def action_iterations(self) -> None:
        if self.iterations_root is None:
            self.notify("Not opened from a save directory with several iterations.", severity="information")
            return
        self.discover = True
        self._open(self.iterations_root, True)

    # --- layers inside a range ---------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "pick_layer":  # in the footer only where it applies
            return self._panes_ready and self.query_one(TensorTree).range_at_cursor() is not None
        if action == "back":
            return self.opened_from is not None or self.iterations_root is not None
        return True

    def action_back(self) -> None:
        """To the source a conversion or rename was written from, else to the iteration list this
        checkpoint was picked from (backspace did nothing there; a person testing)."""
        if self.opened_from is not None:
            self.app.pop_screen()
        elif self.iterations_root is not None:
            self.action_iterations()

    def action_pick_layer(self) -> None:
        from ckptscope.tui.screens.layers import LayerPickScreen

        tree = self.query_one(TensorTree)
        range_node = tree.range_at_cursor()
        if range_node is None or range_node.data is None:
            self.notify("Put the cursor on a collapsed range such as layers.[0-31] first.", severity="warning")
            return
        node = range_node.data.node

        def picked(keys: tuple[str, ...] | None) -> None:
            if not keys:
                return
            if len(keys) == 1:
                tree.open_member(range_node, keys[0])
            else:
                self._compare_layers(node, keys[0], keys[1])

        self.app.push_screen(LayerPickScreen(range_node.data.range_path or node.label, node.member_keys), picked)

    @work(thread=True, exclusive=True, group="layers", exit_on_error=False, description="comparing layers")
    def _compare_layers(self, node: TreeNode, a: str, b: str) -> None:
        from ckptscope.ops.layers import compare_members

        worker = get_current_worker()
        assert self.reader is not None
        try:
            pairs = compare_members(self.reader, node, a, b, should_stop=lambda: worker.is_cancelled)
        except CkptError as exc:
            self.post_message(LayersCompared(node.label, a, b, [], str(exc)))
            return
        if not worker.is_cancelled:
            self.post_message(LayersCompared(node.path.rpartition(".")[0] + "." + node.label, a, b, pairs))

    @on(LayersCompared)
    def _layers_compared(self, message: LayersCompared) -> None:
        from ckptscope.tui.screens.layers import LayerCompareScreen

        if message.error:
            self.notify(message.error, severity="error")
        else:
            self.app.push_screen(LayerCompareScreen(message.label, message.a, message.b, message.pairs))

    def action_copy_name(self) -> None:
        if self.current is not None:
            self.app.copy_to_clipboard(self.current.name)
            self.notify(f"copied {self.current.name}")

    def action_op(self, op: str) -> None:
        if op == "rename":
            self.action_rename_pending()
            return
        if op in ("convert", "merge"):
            self._open_convert(merge=op == "merge")
            return
        if op == "diff":
            self._ask_diff_with()
            return
        self.notify(f"'{op}' opens here once the {op} operation lands (see the ops issues).",
                    title="not available yet", severity="information")

    def _open_convert(self, *, merge: bool) -> None:
        """Push the form over the browser; "open result" browses the written checkpoint in its place."""
        from ckptscope.core.units import human_bytes
        from ckptscope.tui.converting import default_target
        from ckptscope.tui.screens.convert import ConvertScreen

        index = self.index
        if index is None:
            self.notify("The checkpoint is still loading.", severity="warning")
            return
        target = "hf" if merge else default_target(index)
        about = f"{index.format} · {len(index.tensors):,} tensors · {human_bytes(index.total_bytes)}"
        pending = self.pending_rule_count()
        if pending:  # the form reads the checkpoint as stored: say so rather than drop the rules silently
            rules = f"{pending} pending rename rule{'s' if pending != 1 else ''}"
            self.notify(f"The conversion reads the checkpoint as stored: {rules} not applied "
                        "(A writes the renamed copy, which can then be converted).", severity="warning", timeout=6)

        def finished(path: str | None) -> None:
            if path is not None:
                self.open_renamed(path, applied=False)

        self.app.push_screen(ConvertScreen(self.path, target=target, merge=merge, about=about,
                                           trust_pickle=self.trust_pickle), finished)

    def _ask_diff_with(self) -> None:
        """Ask for B, then push the diff screen over the browser (esc there comes back)."""
        from ckptscope.tui.screens.diff_with import DiffWithDialog

        if self.index is None:
            self.notify("The checkpoint is still loading.", severity="warning")
            return
        a = self.path

        def chosen(b: str | None) -> None:
            if b is None:
                return
            from ckptscope.tui.screens.diff import DiffScreen

            self.app.push_screen(DiffScreen(a, b, trust_pickle=self.trust_pickle, standalone=False))

        self.app.push_screen(DiffWithDialog(a), chosen)
