"""Compiled parts (C extensions built by ``pip install``, optional) and the switch that turns them off.

A compiled module does one hot loop of issue 15 (today one: the safetensors header scan) and gives
exactly what the Python code beside it gives; where the install had no C compiler it is absent and the
Python code runs. ``CKPTSCOPE_PURE_PYTHON=1`` turns them off: the tests compare both paths, and the
bench times one against the other.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

PURE_ENV = "CKPTSCOPE_PURE_PYTHON"


def _pure_python() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def compiled_module(name: str) -> ModuleType | None:
    """The extension module ``name`` (dotted), or None when it was not built or ``CKPTSCOPE_PURE_PYTHON`` is set."""
    if _pure_python():
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


COMPILED_PARTS = {"ckptscope.formats.safetensors._scan": "safetensors header scan"}
"""Every compiled module, by what it does for a user (``ckptscope --version`` lists them)."""


def compiled_status() -> list[tuple[str, str]]:
    """(what, state) of each compiled part: ``compiled``, or why the Python code runs instead. A user who
    finds ``inspect`` slow on a huge header can see whether the install built the scan."""
    out = []
    for name, what in COMPILED_PARTS.items():
        if compiled_module(name) is not None:
            state = "compiled"
        elif _pure_python():
            state = f"Python ({PURE_ENV} is set)"
        else:
            state = "Python (not built: the install found no C compiler or Python headers; reinstall where it can)"
        out.append((what, state))
    return out
