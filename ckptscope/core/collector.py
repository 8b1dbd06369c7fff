"""A counted pause of the cyclic garbage collector, for building large object graphs.

Building a checkpoint index (formats) and the tree the views show (ops, tui) allocates hundreds of
thousands of long-lived objects; pausing the collector meanwhile is what keeps a 20k-tensor open
linear. It lives in core because every layer above uses it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator


class _CollectorPause:
    """Keep the cyclic garbage collector off while an index is built.

    An index is tens of thousands of small objects that all stay alive, and every allocation
    burst triggers collections that walk every live object: on a 20k-tensor header that was a
    third of the time. Nothing cyclic is dropped while indexing, so nothing is lost by waiting.
    Pauses are counted, so nested and concurrent ones (two readers indexed by two threads)
    re-enable the collector only when the last ends, and only if it was on before.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._was_enabled = True

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0 and self._was_enabled:
                    gc.enable()


collector_paused = _CollectorPause()
