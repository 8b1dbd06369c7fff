"""``OutTensor``s over a state dict that check the Megatron writers stream (shared by their tests)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

from ckptscope.formats.megatron.dist_writer import OutTensor


class Producer:
    """Counts ``produce`` calls (each tensor exactly once) and records any tensor produced while an
    earlier array is still alive (the writer must drop each array before asking for the next).

    ``collect``: run ``gc.collect()`` before each check, so an array kept only by a reference cycle
    does not count as alive (0.3 s apiece once megatron-core and transformers are loaded; without it
    the check is stricter)."""

    def __init__(self, state: dict, rename: Callable[[str], str], *, collect: bool = False) -> None:
        self.calls: dict[str, int] = {}
        self.overlaps: list[str] = []
        self._alive: list[weakref.ref] = []
        self._collect = collect
        self.tensors = []
        for name, value in state.items():
            if value is None or name.endswith("._extra_state"):
                continue
            new = rename(name)
            dtype = str(value.dtype).removeprefix("torch.")
            self.tensors.append(OutTensor(new, tuple(value.shape), dtype,
                                          lambda new=new, value=value: self._produce(new, value)))

    def _produce(self, name: str, value):
        if self._collect:
            gc.collect()
        if any(ref() is not None for ref in self._alive):
            self.overlaps.append(name)
        self.calls[name] = self.calls.get(name, 0) + 1
        array = value.numpy().copy()
        self._alive.append(weakref.ref(array))
        return array

    def check_streamed(self) -> None:
        assert self.calls == {t.name: 1 for t in self.tensors}
        assert self.overlaps == [], f"arrays still alive when these were produced: {self.overlaps}"
