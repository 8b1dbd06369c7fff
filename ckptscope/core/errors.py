"""Errors a user can act on. The CLI turns each into one line on stderr and exit code 2."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class CkptError(Exception):
    """A problem with the user's input (a file, a path, an argument), never a bug in ckptscope.

    ``str(err)`` is the complete one-line message: it names the file when there is one.
    """

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        self.path = str(path) if path is not None else None
        self.problem = message
        super().__init__(f"{self.path}: {message}" if self.path else message)


class UnknownFormat(CkptError):
    """No registered reader recognised the path."""

    def __init__(self, path: str | Path, tried: Sequence[str], detail: str = "") -> None:
        self.tried = list(tried)
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"not a checkpoint ckptscope can read{extra}; tried: {', '.join(self.tried)}", path
        )


class MissingTensor(CkptError):
    """A tensor name that the checkpoint does not contain."""
