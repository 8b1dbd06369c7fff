"""DCP storage transforms: the items torch's ``FileSystemWriter(_extensions=[ZStandard()])`` compresses.

With ``_extensions`` each item is written through the extensions' streams
(``torch/distributed/checkpoint/_extension.py``: ``ZStandard`` compresses with the ``zstandard`` package,
registry name ``stream.zstd``) and ``.metadata`` records, per item, the compressed bytes' offset and length
and the chain as ``transform_descriptors`` (``stream.zstd/1``: name and version). Undone here, the item is
the same self-contained ``torch.save`` container an uncompressed item is. Only that chain is decoded; any
other is named and refused. Decoding needs the ``zstandard`` package (``pip install 'ckptscope[zstd]'``), as
writing it did.
"""

from __future__ import annotations

import importlib.util
import io
from collections.abc import Iterable
from pathlib import Path

from ckptscope.core.errors import CkptError

ZSTD = "stream.zstd/1"
"""The one chain decoded: torch's ZStandard extension, version 1."""
OVERHEAD = 1 << 20
"""Bytes a ``torch.save`` container adds to its tensor's data (zip headers, pickle): far less than this."""


def decode_item(data: bytes, transforms: str, expected: int, name: str, path: Path) -> bytes:
    """The bytes of one item before ``transforms`` (as ``.metadata`` names the chain) were applied. The
    output may not exceed ``expected`` bytes (the container of the chunk's data: ``expected`` is its data
    size plus ``OVERHEAD``): a frame that says more is damage, and is not inflated into memory."""
    if transforms != ZSTD:
        raise CkptError(f"{name}: written through DCP storage transforms ({transforms}) ckptscope does not decode "
                        f"(it decodes torch's ZStandard extension, {ZSTD})", path)
    try:
        import zstandard
    except ImportError:
        raise CkptError(f"{name}: compressed with zstd (DCP's ZStandard extension); reading it needs the zstandard "
                        f"package: pip install 'ckptscope[zstd]'", path) from None
    try:  # read at most one byte past the bound: a stream that says more is never inflated whole
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as stream:
            out = stream.read(expected + 1)
    except zstandard.ZstdError as exc:
        raise CkptError(f"{name}: its zstd stream is damaged ({exc})", path) from None
    if len(out) > expected:
        raise CkptError(f"{name}: its zstd stream inflates to more than the {expected:,} bytes its chunk can take; "
                        f"the item is damaged", path)
    return out


def transform_warnings(chains: Iterable[str]) -> list[str]:
    """What ``inspect`` says of a save's transform chains: nothing when every item decodes here; the chains
    it cannot decode, or the missing ``zstandard`` package, otherwise."""
    others = sorted(set(chains) - {ZSTD})
    if others:
        return [f"some items were written through storage transforms ckptscope does not decode "
                f"({', '.join(others)}); their chunks cannot be read"]
    if importlib.util.find_spec("zstandard") is None:
        return ["items are compressed with zstd (DCP's ZStandard extension); reading them needs the zstandard "
                "package: pip install 'ckptscope[zstd]'"]
    return []
