"""The command palette: scoped commands (``view: …``, ``tensor: …``, ``ops: …``), as in Posting.

Each command runs an action on the current screen, so the palette and the keys share one
implementation. ``ops:`` entries are the hooks the diff / convert / rename screens plug into.
"""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from ckptscope.tui.screens.browse import BrowseScreen

COMMANDS: tuple[tuple[str, str, str], ...] = (
    # (title, action on the browse screen, help)
    ("view: tensor details and shard layout", "show_tab('tensor')", "The selected tensor's facts and storage map"),
    ("view: statistics", "show_tab('stats')", "Statistics tab"),
    ("view: values", "show_tab('values')", "Values tab"),
    ("view: objects (args, iteration, optimizer)", "show_tab('objects')", "Non-tensor items and metadata"),
    ("view: files", "show_tab('files')", "Files of the checkpoint"),
    ("view: expand all", "expand_all", "Open the tree a few levels"),
    ("view: collapse all", "collapse_all", "Close the whole tree"),
    ("view: filter tensors", "open_filter", "Filter by substring or glob"),
    ("view: iterations of this save directory", "iterations", "Pick another iteration"),
    ("tensor: compute statistics", "stats", "min, max, mean, std, zeros, NaN/Inf, histogram"),
    ("tensor: page through values", "values", "Value pager: a NumPy slice box, layers, exact stored bits"),
    ("tensor: pick a layer of the range", "pick_layer", "Open one layer of a collapsed range, or compare two"),
    ("tensor: next filter match", "next_match", "Jump to the next match"),
    ("tensor: previous filter match", "prev_match", "Jump to the previous match"),
    ("tensor: copy name", "copy_name", "Copy the tensor name to the clipboard"),
    ("tensor: next layout panel", "panel(1)", "Next block of the leading axes in the shard map"),
    ("tensor: previous layout panel", "panel(-1)", "Previous block of the leading axes"),
    ("ops: diff with…", "op('diff')", "Compare with another checkpoint"),
    ("ops: convert / merge…", "op('convert')", "Convert to HF or Megatron-Core: live plan, write, verify"),
    ("ops: merge to HF…", "op('merge')", "Merge sharded training checkpoints into one HF checkpoint"),
    ("ops: rename…", "op('rename')", "Rename tensors by rules"),
    ("rename: tensor or module under the cursor…", "rename_selection", "New name, new prefix or regex, with a preview"),
    ("rename: drop the tensor or module under the cursor", "rename_drop", "Leave it out of the renamed copy"),
    ("rename: pending rules", "rename_pending", "Review, undo or remove the pending rename rules"),
    ("rename: undo the last rule", "rename_undo", "Remove the most recent pending rule"),
    ("rename: apply (write a renamed copy)…", "rename_apply", "Asks for the destination, shows the plan, writes"),
)
APP_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("view: toggle light / dark theme", "toggle_dark", "Switch between the light and the dark theme"),
    ("view: help (keys)", "help", "Every key and its id"),
    ("view: supported architectures", "archs", "Every architecture convert and diff map, tensor by tensor"),
    ("app: quit", "quit", "Quit ckptscope"),
)


class CkptCommands(Provider):
    """Commands for the current screen; browse-only ones appear only on the browse screen."""

    def _commands(self) -> list[tuple[str, object, str]]:
        screen = self.screen
        out: list[tuple[str, object, str]] = []
        if isinstance(screen, BrowseScreen):
            out.extend((title, partial(screen.run_action, action), help_) for title, action, help_ in COMMANDS)
        # Other screens (the diff screen) list their own commands in PALETTE_COMMANDS.
        for title, action, help_ in getattr(screen, "PALETTE_COMMANDS", ()):
            out.append((title, partial(screen.run_action, action), help_))
        out.extend((title, partial(self.app.run_action, action), help_) for title, action, help_ in APP_COMMANDS)
        return out

    async def discover(self) -> Hits:
        for title, callback, help_ in self._commands():
            yield DiscoveryHit(title, callback, help=help_)  # type: ignore[arg-type]

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, callback, help_ in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_)  # type: ignore[arg-type]
