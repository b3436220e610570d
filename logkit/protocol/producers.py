"""Idempotent producers on the wire: producer ids, and the last batches of each producer
on each partition, so a retried batch is answered, not written twice.

Owns: producer id allocation (InitProducerId) and `ProducerStates`, the per-partition
memory of each producer's last `BATCHES_KEPT` batches (epoch, first and last sequence,
base offset). Kept in memory, rebuilt lazily after a restart: the first idempotent batch
a listener process sees for a partition makes it read the headers of the partition's
recent batches (`Partition.batch_headers`, no record decoding), so a client that retries
across a listener restart is still de-duplicated.

Producer ids are (milliseconds since 2020 << 20 | 20 random bits): unique across
processes and restarts without a shared counter, as long as the clock does not step back
by more than a millisecond at the same moment a random draw repeats.

Invariant: for one partition, the duplicate check and the append it guards run under
one lock, so two connections retrying the same batch append it once.

Thread-safety: every public method may be called from any connection thread.
"""

from __future__ import annotations

import logging
import random
import struct
import threading
import time
from collections import deque
from typing import Any, Callable, NamedTuple

from . import errors as E

__all__ = ["ProducerStates", "new_producer_id", "BATCHES_KEPT"]

log = logging.getLogger(__name__)

BATCHES_KEPT = 5                          # Kafka keeps the last five batches per producer
RECOVERY_WINDOW_OFFSETS = 10000           # how far back a restarted listener looks
_EPOCH_2020_MS = 1577836800000
_PRODUCER_FIELDS = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence at 43
_PRODUCER_OFFSET = 43
_LAST_OFFSET_DELTA = struct.Struct(">i")  # at 23
_NO_PRODUCER = -1
_SEQUENCE_WRAP = 1 << 31


def new_producer_id() -> int:
    millis = int(time.time() * 1000) - _EPOCH_2020_MS
    return (millis << 20) | random.getrandbits(20)


class _Batch(NamedTuple):
    epoch: int
    first_sequence: int
    last_sequence: int
    base_offset: int


class _PartitionState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.recovered = False
        self.producers: dict[int, deque[_Batch]] = {}

    def remember(self, producer_id: int, batch: _Batch) -> None:
        kept = self.producers.get(producer_id)
        if kept is None or (kept and kept[-1].epoch != batch.epoch):
            kept = self.producers[producer_id] = deque(maxlen=BATCHES_KEPT)
        kept.append(batch)


class ProducerStates:
    """Producer memory for every partition this listener has seen idempotent batches on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partitions: dict[tuple[str, int], _PartitionState] = {}

    def _state(self, key: tuple[str, int]) -> _PartitionState:
        with self._lock:
            state = self._partitions.get(key)
            if state is None:
                state = self._partitions[key] = _PartitionState()
            return state

    def forget_topic(self, topic: str) -> None:
        with self._lock:
            for key in [k for k in self._partitions if k[0] == topic]:
                del self._partitions[key]

    def append(self, partition: Any, batch: bytearray,
               append: Callable[[bytearray], int]) -> tuple[int, int]:
        """Append one validated batch through `append`, unless it repeats one of its
        producer's last batches. Returns (error code, base offset)."""
        producer_id, epoch, first = _PRODUCER_FIELDS.unpack_from(batch, _PRODUCER_OFFSET)
        if producer_id == _NO_PRODUCER:
            return E.NONE, append(batch)
        count = _LAST_OFFSET_DELTA.unpack_from(batch, 23)[0] + 1
        last = (first + count - 1) % _SEQUENCE_WRAP
        state = self._state((partition.topic, partition.partition))
        with state.lock:
            if not state.recovered:
                self._recover(partition, state)
            kept = state.producers.get(producer_id)
            if kept:
                newest = kept[-1]
                if epoch < newest.epoch:
                    return E.INVALID_PRODUCER_EPOCH, -1
                if epoch == newest.epoch:
                    for old in kept:
                        if old.first_sequence == first and old.last_sequence == last:
                            log.debug("duplicate batch of producer %d (epoch %d, sequence "
                                      "%d) on %s-%d answered with offset %d", producer_id,
                                      epoch, first, partition.topic, partition.partition,
                                      old.base_offset)
                            return E.NONE, old.base_offset
                    if first != (newest.last_sequence + 1) % _SEQUENCE_WRAP:
                        return E.OUT_OF_ORDER_SEQUENCE_NUMBER, -1
            base = append(batch)
            state.remember(producer_id, _Batch(epoch, first, last, base))
            return E.NONE, base

    @staticmethod
    def _recover(partition: Any, state: _PartitionState) -> None:
        start = max(partition.log_start_offset,
                    partition.log_end_offset - RECOVERY_WINDOW_OFFSETS)
        for header in partition.batch_headers(start):
            if header.producer_id != _NO_PRODUCER and header.base_sequence >= 0:
                last = (header.base_sequence + header.last_offset_delta) % _SEQUENCE_WRAP
                state.remember(header.producer_id, _Batch(
                    header.producer_epoch, header.base_sequence, last, header.base_offset))
        state.recovered = True
