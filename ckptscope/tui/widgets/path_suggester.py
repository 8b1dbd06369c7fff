"""Shell-like completion of a path in an ``Input`` (the diff-with, convert and rename-apply forms)."""

from __future__ import annotations

import os

from textual.suggester import Suggester


class PathSuggester(Suggester):
    """Completes the last path component from the directory listing (→ accepts, as in a shell)."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        if not value:
            return None
        folder, stem = os.path.split(value)
        try:
            names = sorted(os.listdir(os.path.expanduser(folder) or "."))
        except OSError:
            return None
        for name in names:
            if name.startswith(stem) and name != stem and not (name.startswith(".") and not stem.startswith(".")):
                full = os.path.join(folder, name)
                return full + os.sep if os.path.isdir(os.path.expanduser(full)) else full
        return None
