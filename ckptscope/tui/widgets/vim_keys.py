"""vim and less keys for every list: j/k move, g/G jump to the first and last row, ctrl+d/ctrl+u
page. One table of keys, so the tree, the diff table and the other tables agree; each owner gets
its own binding ids (``tree.down``, ``objects.down``), so a keymap can rebind them one by one."""

from __future__ import annotations

from textual.binding import Binding

_TABLE = (("j", "cursor_down", "down", "Next row"), ("k", "cursor_up", "up", "Previous row"),
          ("g", "scroll_top", "first", "First row"), ("G", "scroll_bottom", "last", "Last row"),
          ("ctrl+d", "page_down", "page down", "One page down"), ("ctrl+u", "page_up", "page up", "One page up"))
_TREE = (("j", "cursor_down", "down", "Next line"), ("k", "cursor_up", "up", "Previous line"),
         ("g", "first_line", "first", "First line"), ("G", "last_line", "last", "Last line"))


def _bindings(keys, prefix: str) -> list[Binding]:
    return [Binding(key, action, description, show=False, id=f"{prefix}.{description.replace(' ', '_')}",
                    tooltip=tooltip) for key, action, description, tooltip in keys]


def table_keys(prefix: str) -> list[Binding]:
    """For a ``DataTable`` (its own actions); ids ``<prefix>.down`` ..."""
    return _bindings(_TABLE, prefix)


def tree_keys(prefix: str) -> list[Binding]:
    """For a ``Tree`` mixing in ``VimTree`` (``first_line`` / ``last_line``)."""
    return _bindings(_TREE, prefix)


class VimTree:
    """Mixin for a ``Tree``: the cursor to the first or the last visible line."""

    def action_first_line(self) -> None:
        self.move_cursor_to_line(0)  # type: ignore[attr-defined]

    def action_last_line(self) -> None:
        self.move_cursor_to_line(self.last_line)  # type: ignore[attr-defined]


class KeysFollowFocus:
    """Mixin for a list with a "/" filter on its screen: keys that arrive in a burst with the "/".

    textual hands each key to the widget focused when the key *arrives*, and runs a binding only
    when the key comes back up to the app. A burst ("/k_proj" pasted, or typed fast) is therefore
    all queued on the list, and by the time "k" comes back up the "/" has moved the focus to the
    filter: the app would look up "k" there and drop it. Each key that leaves the list is marked with
    the list (``came_from``); the app (``tui.app``) hands a marked key to the filter that now has
    the focus instead, so none is lost and none runs one of the list's commands (in the tree, r
    renames and x drops)."""

    async def _on_key(self, event) -> None:
        event.came_from = self  # then textual runs the base classes' own key handlers, as ever
