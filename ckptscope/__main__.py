"""``python -m ckptscope`` and the ``ckptscope`` console script (both run ``main``).

Starting a command loads a few hundred modules (click, then the command's ops and formats), and
every few hundred allocations of that triggers a cyclic collection that walks everything loaded
so far, none of which is ever garbage. So the process entry pauses the collector until the
command's module is loaded, then freezes what is loaded (``gc.freeze``: kept out of every later
collection, as modules live as long as the process) and turns the collector back on before any
work starts (issue 15: a command's fixed cost is what ``convert``/``rename`` lose to ``cp``).
Only the process entry does this: importing ``ckptscope.cli`` (tests, other tools) changes nothing.
"""

from __future__ import annotations

import gc
import sys


def load(argv: list[str]) -> None:
    """Load the CLI and the module of the command ``argv`` names, collector paused, then freeze them."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        from ckptscope import cli

        try:
            cli.load_command(argv)
        except Exception:  # noqa: BLE001 - it fails again inside cli.main, which reports it in one line
            pass
        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()


def main() -> None:
    load(sys.argv[1:])
    from ckptscope import cli

    cli.main()


if __name__ == "__main__":
    main()
