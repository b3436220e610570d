"""Idempotent producers on the wire: a produced batch through the log's producer state,
and the producer ids a listener hands out when its broker does not lead.

Owns: `append_batch` (one validated batch through `Partition.append_batch`, the log's
errors answered as Kafka's codes) and `new_producer_id`. The duplicate and sequence
checks are the log's own (logkit/producer_state.py, Kafka's ProducerStateManager): per
partition and producer id the epoch and the last BATCHES_KEPT batches, rebuilt from the
log and caught up on every process's appends under the append lock. So a retried batch
is answered with its original base offset and not written again whichever listener or
embedded producer wrote the first copy; a sequence gap is OUT_OF_ORDER_SEQUENCE_NUMBER,
an older epoch INVALID_PRODUCER_EPOCH. Nothing here keeps state.

Producer ids come from the broker's transaction coordinator (transactions.py), ids
counted up from 0 in LMDB. A listener whose broker does not lead cannot write that
store; it hands an idempotent producer (ms since 2020 << 20 | 20 random bits), a range
the counter never reaches, unique across processes as long as the clock does not step
back by more than a millisecond at the moment a random draw repeats.

Thread-safety: any connection thread may call.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from ..errors import InvalidProducerEpochError, OutOfOrderSequenceError
from ..producer_state import BATCHES_KEPT
from . import errors as E

__all__ = ["append_batch", "new_producer_id", "BATCHES_KEPT"]

log = logging.getLogger(__name__)

_EPOCH_2020_MS = 1577836800000


def new_producer_id() -> int:
    millis = int(time.time() * 1000) - _EPOCH_2020_MS
    return (millis << 20) | random.getrandbits(20)


def append_batch(partition: Any, batch: bytearray) -> tuple[int, int]:
    """Append one validated batch: (NONE, base offset) — a duplicate of one of its
    producer's last batches answered with the original's — or (error code, -1) for a
    batch the producer state refuses (nothing of it written). Other LogkitErrors
    propagate to the produce path."""
    try:
        return E.NONE, partition.append_batch(batch)
    except (OutOfOrderSequenceError, InvalidProducerEpochError) as exc:
        log.debug("produce to %s-%d refused by the producer state: %s", partition.topic,
                  partition.partition, exc)
        return exc.error_code, -1
