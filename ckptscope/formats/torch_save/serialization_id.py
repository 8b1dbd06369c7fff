"""``.data/serialization_id``, the last record of every ``torch.save`` zip, computed as torch does.

It is not random. torch's ``PyTorchStreamWriter::writeSerializationId`` (caffe2/serialize/
inline_container.cc) derives it from the content when it finishes a file: a hash of the record
names it wrote and a hash of the CRC-32s of their data, "fixed-length, unique and deterministic".
Writers here that build a container without torch (``zip_container``) or patch data into one
torch wrote with placeholders (``megatron.legacy_writer``) compute the same value, so their files
equal ``torch.save``'s byte for byte and the same content always gives the same id.

The name part depends on details of torch's Linux build: libstdc++'s ``std::hash<std::string>``
and the iteration order of its ``std::unordered_set``, both reproduced below; tests check the
result against ``torch.save`` itself.
"""

from __future__ import annotations

import struct

SERIALIZATION_ID = ".data/serialization_id"
_U64 = (1 << 64) - 1
_MUL = 0xC6A4A7935BD1E995
_STD_HASH_SEED = 0xC70F6907
_DESCRIPTOR_TAG = b"PK\x07\x08"  # a zip data descriptor's signature


def _shift_mix(value: int) -> int:
    return value ^ (value >> 47)


def std_string_hash(data: bytes) -> int:
    """``std::hash<std::string>`` of libstdc++ on 64-bit Linux (``_Hash_bytes`` with its fixed
    seed): the hash ``c10::hash`` uses for record names in torch's Linux builds."""
    value = (_STD_HASH_SEED ^ (len(data) * _MUL)) & _U64
    whole = len(data) & ~7
    for start in range(0, whole, 8):
        word = int.from_bytes(data[start:start + 8], "little")
        value = ((value ^ ((_shift_mix((word * _MUL) & _U64) * _MUL) & _U64)) * _MUL) & _U64
    if len(data) & 7:
        value = ((value ^ int.from_bytes(data[whole:], "little")) * _MUL) & _U64
    return _shift_mix((_shift_mix(value) * _MUL) & _U64)


def hash_combine(seed: int, value: int) -> int:
    """``c10::hash_combine`` on 64-bit ``size_t``."""
    return (seed ^ ((value + 0x9E3779B9 + (seed << 6) + (seed >> 2)) & _U64)) & _U64


def _bucket_counts():
    """The bucket counts a default ``std::unordered_set`` of libstdc++ grows through (max load 1):
    13 at the first insert, then the first prime of its list >= twice the count. The counts up to
    20753 are libstdc++'s (equal ids checked against torch 2.13's ``torch.save`` with up to 10,300
    storages, the tests go to 2,400); past them the next prime is computed, which may not be
    libstdc++'s choice: the id is then still derived from the content, only no longer torch's."""
    yield from (13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753)
    count = 20753
    while True:
        count *= 2
        while any(count % d == 0 for d in range(2, int(count ** 0.5) + 1)):
            count += 1
        yield count


def _unordered_set_order(names: list[bytes]) -> list[bytes]:
    """Iteration order of a libstdc++ ``std::unordered_set<std::string>`` after inserting
    ``names`` in this order (torch's ``files_written_``). Its nodes form one list in which each
    bucket's nodes are contiguous: a node goes in first of its bucket, or first of the whole list
    when its bucket is empty, and a rehash re-inserts every node that way in list order. So the
    list is the buckets, last opened first, each with its nodes last inserted first."""
    codes = [std_string_hash(name) for name in names]
    sizes = _bucket_counts()
    count = next(sizes)
    buckets: dict[int, list[int]] = {}  # opening order; node indexes in insertion order

    def listed() -> list[int]:
        return [node for nodes in reversed(buckets.values()) for node in reversed(nodes)]

    for index in range(len(names)):
        if index + 1 > count:
            count = next(sizes)
            previous, buckets = listed(), {}
            for node in previous:
                buckets.setdefault(codes[node] % count, []).append(node)
        buckets.setdefault(codes[index] % count, []).append(index)
    return [names[node] for node in listed()]


def serialization_id(names: list[str], crcs: list[int]) -> str:
    """``.data/serialization_id`` as torch computes it when it finishes a file: 20 digits of the
    ``hash_combine`` of every written record name's hash (in the iteration order of its
    ``unordered_set`` of names), then 20 digits of the ``hash_combine`` of the CRC-32 values its
    stream writer saw in data descriptors, in write order (see ``descriptor_values``). Unique per
    content as far as names and CRC-32s tell contents apart, and the same for the same records."""
    name_hash = 0
    for name in _unordered_set_order([n.encode() for n in names]):
        name_hash = hash_combine(name_hash, std_string_hash(name))
    crc_hash = 0
    for value in crcs:
        crc_hash = hash_combine(crc_hash, value)
    return f"{name_hash:020d}{crc_hash:020d}"


def descriptor_values(head: bytes, size: int, crc: int) -> list[int]:
    """The values torch's writer folds into the id for one record: it watches each buffer its
    zip library writes and takes bytes 4..8 of any that starts with the data-descriptor signature,
    so the descriptor gives the record's CRC-32, and record data that itself starts with that
    signature (``head``: its first 8 bytes) gives one more value, first."""
    values = []
    if size >= 8 and head[:4] == _DESCRIPTOR_TAG:
        values.append(struct.unpack_from("<I", head, 4)[0])
    values.append(crc)
    return values
