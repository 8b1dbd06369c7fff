"""Shell-like completion of a path in an ``Input`` (the diff-with, convert and rename-apply forms)."""

from __future__ import annotations

import os

from textual.suggester import Suggester


class PathSuggester(Suggester):
    """Completes the last path component from the directory listing (→ accepts), as a shell's tab does:
    the whole name when one matches (a folder with its ``/``), else the longest prefix the matches share.
    The first match alone was suggested before, so ``iter_00`` became ``iter_0000100/`` beside
    ``iter_0000200`` (a person testing the diff dialog)."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        if not value:
            return None
        folder, stem = os.path.split(value)
        try:
            names = os.listdir(os.path.expanduser(folder) or ".")
        except OSError:
            return None
        matches = [name for name in names if name.startswith(stem) and name != stem
                   and not (name.startswith(".") and not stem.startswith("."))]
        if len(matches) == 1:
            full = os.path.join(folder, matches[0])
            return full + os.sep if os.path.isdir(os.path.expanduser(full)) else full
        shared = os.path.commonprefix(matches) if matches else ""
        return os.path.join(folder, shared) if len(shared) > len(stem) else None
