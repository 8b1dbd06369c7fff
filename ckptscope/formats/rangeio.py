"""One byte range of a larger buffer, as a file of its own."""

from __future__ import annotations

import io
from typing import Any


class RangeIO(io.RawIOBase):
    """A read-only, seekable file over ``buffer[start:start+length]`` (no copy), so ``zipfile``
    can open a torch.save zip embedded in a larger file (a mmap of a ``.distcp``, of a ``.nemo``)."""

    def __init__(self, buffer: Any, start: int, length: int) -> None:
        super().__init__()
        self._view = memoryview(buffer)[start:start + length]
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        if base + offset < 0:
            raise OSError("seek before the start of the item")
        self._pos = base + offset
        return self._pos

    def readinto(self, target: Any) -> int:
        data = self._view[self._pos:self._pos + len(target)]
        n = len(data)
        target[:n] = data
        self._pos += n
        return n

    def close(self) -> None:
        self._view.release()
        super().close()
