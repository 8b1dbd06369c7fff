"""The footer keeps its keys while the bindings stay the same, and follows them when they change."""

from __future__ import annotations

from textual.widgets import Input
from textual.widgets._footer import FooterKey
from tui_helpers import settle, sync

from ckptscope.tui.app import make_app
from ckptscope.tui.widgets.key_footer import KeyFooter


def shown_actions(app) -> set[str]:
    return {key.action for key in app.screen.query_one(KeyFooter).query(FooterKey)}


def expected_actions(app) -> set[str]:
    """What Textual's footer lists: every shown binding of the focus chain, and the palette key."""
    actions = {binding.action for _, binding, _, _ in app.screen.active_bindings.values() if binding.show}
    return actions | {"command_palette"}


@sync
async def test_the_footer_is_not_rebuilt_for_the_same_keys_and_is_for_new_ones(in_repo):
    """Textual rebuilt every footer key on each "bindings may have changed" signal, four times while
    the browser opened with the same keys (~50 ms of row 9's start-up); now only a change rebuilds."""
    app = make_app("sample_ckpts/hf_llama_sharded", keymap={})
    async with app.run_test(size=(140, 45)) as pilot:
        await settle(pilot)
        footer = app.screen.query_one(KeyFooter)
        before = list(footer.query(FooterKey))
        assert before and shown_actions(app) == expected_actions(app)
        assert [key.action for key in before[:2]] == ["quit", "help"]

        footer.bindings_changed(app.screen)  # what Textual sends on focus and binding changes
        await settle(pilot)
        assert list(footer.query(FooterKey)) == before  # the very same widgets: nothing rebuilt

        await pilot.press("slash")  # focus to the filter input: other keys apply
        await settle(pilot)
        assert isinstance(app.focused, Input)
        assert shown_actions(app) == expected_actions(app)
        assert shown_actions(app) != {key.action for key in before}

        await pilot.press("escape")  # and back to the tree's keys
        await settle(pilot)
        assert shown_actions(app) == {key.action for key in before}
        assert [key.action for key in footer.query(FooterKey)][:2] == ["quit", "help"]


@sync
async def test_keys_are_not_restyled_as_they_mount_and_still_follow_compact(in_repo, monkeypatch):
    """Each key used to mount compact (Textual's default) and then switch to the footer's setting:
    two restyles per key, ~20 ms of the first frame. Now they start in the state they end in, and a
    footer switched to compact still takes its keys along."""
    toggles: list[tuple[str, bool]] = []
    original = FooterKey._watch_compact
    monkeypatch.setattr(FooterKey, "_watch_compact",
                        lambda self, compact: (toggles.append((self.key, compact)), original(self, compact)))
    app = make_app("sample_ckpts/hf_llama_single", keymap={})
    async with app.run_test(size=(140, 45)) as pilot:
        await settle(pilot)
        footer = app.screen.query_one(KeyFooter)
        keys = [key for key in footer.query(FooterKey) if not key.has_class("-command-palette")]
        palette = footer.query_one(".-command-palette", FooterKey)
        palette_key = palette.key
        assert not any(compact for key, compact in toggles if key != palette_key)  # never compact, never restyled
        assert keys and not any(key.compact or key.has_class("-compact") for key in keys)
        assert palette.compact and palette.has_class("-compact")  # as Textual leaves it: not bound
        footer.compact = True
        await settle(pilot)
        assert all(key.compact and key.has_class("-compact") for key in keys)
