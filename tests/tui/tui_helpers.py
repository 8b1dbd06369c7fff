"""Helpers shared by the TUI tests (imported as a module; fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from textual.pilot import Pilot


async def settle(pilot: Pilot, rounds: int = 3) -> None:
    """Wait for every worker the app started (index load, stats, filter), then for repaints."""
    for _ in range(rounds):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()


def sync(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test body with asyncio.run (no pytest-asyncio needed); fixtures still inject."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


def text_of(widget: Any, width: int = 200) -> str:
    """Plain text of what a Static shows (its Rich renderable printed without colour)."""
    from rich.console import Console
    from textual.widgets import Static

    content = widget.content if isinstance(widget, Static) else widget.render()
    import io

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(content)
    return console.export_text()


async def wheel(pilot: Pilot, widget: Any, *, down: bool = True, times: int = 1) -> None:
    """Turn the mouse wheel over ``widget`` as a terminal reports it: the event goes to the app,
    which hands it to the widget under the pointer (Pilot has clicks and hovers, no wheel)."""
    from textual.events import MouseScrollDown, MouseScrollUp

    x, y = widget.region.x + 1, widget.region.y + 1
    event = MouseScrollDown if down else MouseScrollUp
    for _ in range(times):
        pilot.app.post_message(event(None, x, y, 0, 1 if down else -1, 0, False, False, False, screen_x=x, screen_y=y))
        await pilot.pause()
