"""Kafka's default partitioner: murmur2 with seed 0x9747b28c, as in Kafka's Java client.

Owns: `murmur2(data) -> int` (signed 32-bit, equal to Kafka's `Utils.murmur2`) and
`partition_for_key(key, num_partitions)`. Invariant: Kafka's published vectors hold,
e.g. murmur2(b"21") == -973932308, so keyed records land where a Java producer puts them.
"""

from __future__ import annotations

import logging
from typing import Callable

from . import _native

__all__ = ["murmur2", "partition_for_key"]

log = logging.getLogger(__name__)

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2_py(data: bytes) -> int:
    """Return Kafka's murmur2 hash of `data` as a signed 32-bit int (pure Python)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    end4 = length & ~3
    # Body: four bytes at a time, little-endian, as Kafka reads them.
    for i in range(0, end4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    tail = length & 3
    if tail == 3:
        h ^= data[end4 + 2] << 16
    if tail >= 2:
        h ^= data[end4 + 1] << 8
    if tail >= 1:
        h ^= data[end4]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


# The compiled twin (logkit/_speedups.c) when `_native` chose it; tests check both agree.
murmur2: Callable[[bytes], int] = murmur2_py if _native.speedups is None \
    else _native.speedups.murmur2


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """Kafka's keyed choice: (murmur2(key) & 0x7fffffff) % num_partitions."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions
