"""CRC-32 (the zip polynomial, as ``zlib.crc32``), from zlib-ng when it is installed.

Every ``torch.save`` container ckptscope writes carries a CRC-32 per record, so a convert to
torch_dist or to per-rank Megatron files checksums every byte it copies. CPython's zlib does that
at about 3-6 GiB/s here, zlib-ng's SIMD version at about 27 GiB/s: with it the checksum stops being
the slowest part of a conversion. Same values (the standard polynomial), same signature.
"""

from __future__ import annotations

try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - zlib-ng is a dependency; a platform without a wheel still works
    from zlib import crc32

__all__ = ["crc32"]
