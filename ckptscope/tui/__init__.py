"""The Textual browser (``ckptscope open PATH``). Imported only by the ``open`` command.

Only this package imports textual; the back-end (core, formats, ops) never does. Importing
this package itself does not import textual either, so ``ckptscope --help`` stays fast.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ckptscope.ops.diff.engine import DiffOptions
    from ckptscope.tui.app import CkptScopeApp

__all__ = ["make_app", "run_diff_tui", "run_tui"]


def make_app(path: str | os.PathLike[str], **kwargs: Any) -> CkptScopeApp:
    """The app for ``path`` (see ``ckptscope.tui.app.make_app`` for the options).

    Textual and the screens are ~300 modules of objects that are never garbage; loading them with the
    cyclic collector on let it walk everything loaded so far again and again (~7 % of the import,
    row 9 of bench/run_all.py). So they load, and the app is built, with it paused, as the process
    entry loads a command (``ckptscope.__main__``); ``CkptScopeApp`` freezes them."""
    from ckptscope.core.collector import collector_paused

    with collector_paused():
        from ckptscope.tui.app import make_app as _make

        return _make(path, **kwargs)


def run_tui(path: str | os.PathLike[str], *, trust_pickle: bool = False, theme: str | None = None,
            iterations_root: str | None = None) -> int:
    """Run the app in the terminal; returns the exit code (2 when the path could not be opened).
    ``iterations_root``: the save root ``path`` was picked from (``open --iteration``), for ``i``."""
    app = make_app(path, trust_pickle=trust_pickle, theme=theme, iterations_root=iterations_root)
    app.run()
    if app.error_reason:
        import sys

        print(f"ckptscope: error: {app.error_reason}", file=sys.stderr)
        return 2
    return app.return_code or 0


def run_diff_tui(a: str | os.PathLike[str], b: str | os.PathLike[str], *, mapping: str = "auto",
                 include: tuple[str, ...] = (), exclude: tuple[str, ...] = (), options: DiffOptions | None = None,
                 arch: str | None = None, trust_pickle: bool = False, theme: str | None = None,
                 training_state: bool = False, hf_config: str | None = None) -> int:
    """The diff screen in the terminal; returns diff(1)'s exit code: 0 identical, 1 different, 2 trouble
    (the checkpoints could not be opened or read, or the user quit before any difference was seen)."""
    from ckptscope.core.collector import collector_paused

    with collector_paused():  # as in make_app
        from ckptscope.tui.diff_app import make_diff_app

    app = make_diff_app(str(a), str(b), mapping=mapping, include=include, exclude=exclude, options=options, arch=arch,
                        trust_pickle=trust_pickle, theme=theme, training_state=training_state, hf_config=hf_config)
    app.run()
    if app.error_reason:
        import sys

        print(f"ckptscope: error: {app.error_reason}", file=sys.stderr)
        return 2
    return 2 if app.diff_code is None else app.diff_code  # None: it crashed (Textual printed why)
