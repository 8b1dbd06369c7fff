"""Write a ``torch.save`` file back from the safely-parsed object tree, storages copied byte for byte.

This is how a torch file is renamed without trusting it: the tree from the stub unpickler is
pickled again (``pickles/repickle.py``) and every storage record is copied verbatim from the source. Zip files are written with torch's own zip writer so the
result loads with ``torch.load`` (including ``mmap=True``); legacy files get the legacy stream.
Writing imports torch; reading never does.
"""

from __future__ import annotations

import os
import pickle
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ckptscope.core.errors import CkptError
from ckptscope.formats.pickles.repickle import repickle
from ckptscope.formats.pickles.safe import TensorRef
from ckptscope.formats.pickles.torch_file import StoragePlacement


def write_torch_zip(obj: Any, src: Path, placements: dict[str, StoragePlacement], dst: Path,
                    blank: dict[str, list[tuple[int, int]]] | None = None) -> int:
    """Write ``obj`` as a torch.save zip; storage bytes come verbatim from ``src``, except the byte
    ranges ``blank`` names per storage (within it), written as zeros. Returns bytes copied."""
    import numpy as np
    import torch

    data, storages = repickle(obj)
    writer = torch._C.PyTorchFileWriter(str(dst))
    copied = 0
    with open(src, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        # Copy-on-write map: writable for torch.frombuffer, yet the source file can never change.
        source = np.memmap(handle, dtype=np.uint8, mode="c", shape=(size,)) if size else None
        writer.write_record("data.pkl", data, len(data))
        writer.write_record(".format_version", "1", 1)
        writer.write_record(".storage_alignment", "64", 2)
        writer.write_record("byteorder", "little", len("little"))
        for key in sorted(storages, key=lambda k: (len(k), k)):
            placement = placements.get(key)
            if placement is None:
                raise CkptError(f"storage {key} is referenced but not stored", src)
            if placement.length and source is not None:
                view = source[placement.offset:placement.offset + placement.length]
                for start, end in (blank or {}).get(key, ()):
                    view[start:end] = 0  # the private copy-on-write page, never the source
                storage = torch.frombuffer(view, dtype=torch.uint8).untyped_storage()
                writer.write_record(f"data/{key}", storage, placement.length)
            else:
                writer.write_record(f"data/{key}", b"", 0)
            copied += placement.length
        writer.write_end_of_file()
        del source
    return copied


MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001


def write_torch_legacy(obj: Any, src: Path, placements: dict[str, StoragePlacement], dst: Path,
                       sys_info: Any, copy_range: Any) -> int:
    """Write the pre-1.6 stream: magic, protocol, sys info, object, keys, then each storage record."""
    data, storages = repickle(obj, legacy=True)
    keys = sorted(storages)
    copied = 0
    with open(dst, "wb", buffering=0) as out:
        for value in (MAGIC_NUMBER, PROTOCOL_VERSION, sys_info):
            out.write(pickle.dumps(value, protocol=2))
        out.write(data)
        out.write(pickle.dumps(keys, protocol=2))
        for key in keys:
            placement = placements[key]
            out.write(struct.pack("<q", storages[key].numel))
            copy_range(src, out, placement.offset, placement.length)
            copied += placement.length
    return copied


def referenced_storages(refs: Iterable[TensorRef]) -> set[str]:
    return {r.storage.key for r in refs if r.storage is not None}
