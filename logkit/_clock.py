"""Wall-clock milliseconds, as Kafka's timestamps count them.

Owns: `now_ms()`, the one reading of the wall clock that the storage uses for record
timestamps, roll and retention ages and flush deadlines. Invariant: milliseconds since
the epoch as an int (Kafka's `System.currentTimeMillis`).
"""

from __future__ import annotations

import time

__all__ = ["now_ms"]


def now_ms() -> int:
    return int(time.time() * 1000)
