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
