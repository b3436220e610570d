"""Topics and partitions as users see them.

Owns: topic name validation (Kafka's rule), the `Topic` handle (its partitions, its
resolved config, Kafka's keyed partitioner) and the public `Partition` handle over one
`PartitionLog`. Invariant: a name that passes `validate_topic_name` cannot reach outside
the broker root: it has no path separator and is neither '.' nor '..'.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from .compression import codec_id, require
from .errors import InvalidTopicError, UnknownTopicError
from .log import PartitionLog, RecoveryReport
from .murmur2 import partition_for_key
from .records import Record

__all__ = ["Topic", "Partition", "TopicPartition", "validate_topic_name",
           "MAX_PARTITIONS"]

_LEGAL = re.compile(r"[a-zA-Z0-9._-]{1,249}")
MAX_PARTITIONS = 10000


class TopicPartition(NamedTuple):
    topic: str
    partition: int


def validate_topic_name(name: Any) -> str:
    if not isinstance(name, str) or not _LEGAL.fullmatch(name) or name in (".", ".."):
        raise InvalidTopicError(
            f"invalid topic name {name!r}: use 1-249 characters from [a-zA-Z0-9._-], "
            "not '.' or '..'")
    return name


class Partition:
    """One partition of a topic: offsets, reads, time lookups and raw appends.

    Its log is opened on first use (a topic of thousands of partitions costs no
    descriptor for the ones a process never touches); `_opener` makes it."""

    def __init__(self, topic: str, partition: int,
                 opener: Callable[[int], PartitionLog]) -> None:
        self.topic = topic
        self.partition = partition
        self._opener = opener

    def __getattr__(self, name: str) -> Any:
        # Called only while `_log` is not yet set: open the log once, then the
        # attribute is an ordinary one and costs nothing more.
        if name != "_log":
            raise AttributeError(name)
        log = self._opener(self.partition)
        self._log = log
        return log

    @property
    def opened(self) -> bool:
        return "_log" in self.__dict__

    def __repr__(self) -> str:
        return f"Partition({self.topic!r}, {self.partition})"

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def log_start_offset(self) -> int:
        return self._log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log.log_end_offset

    @property
    def high_watermark(self) -> int:
        return self._log.high_watermark

    @property
    def directory(self) -> str:
        return self._log.directory

    def read(self, offset: int, max_records: int = 500, *,
             max_bytes: int = 52428800) -> list[Record]:
        """Records from `offset` (inclusive) below the high watermark."""
        return self._log.read(offset, max_records=max_records, max_bytes=max_bytes)

    def offset_for_timestamp(self, ts_ms: int) -> int | None:
        return self._log.offset_for_timestamp(ts_ms)

    def append(self, records: Iterable[Sequence[Any]], *,
               compression_type: str | None = None) -> int:
        """Append (key, value, headers, timestamp_ms) tuples as one batch, atomically;
        returns the first offset. For bulk loaders; applications use the producer."""
        rows = [tuple(r) for r in records]
        if not rows:
            raise ValueError("append needs at least one record")
        codec = codec_id(compression_type)
        require(codec)
        return self._log.append_records(rows, codec=codec)

    def size_bytes(self) -> int:
        return self._log.size_bytes()

    def flush(self) -> None:
        self._log.flush()

    def recover(self) -> RecoveryReport:
        return self._log.recover()

    def check(self) -> None:
        self._log.check()


class Topic:
    """A topic: its partitions and resolved config."""

    def __init__(self, name: str, partitions: int, opener: Callable[[int], PartitionLog],
                 config: Mapping[str, Any], topic_id: str) -> None:
        self.name = name
        self.config = dict(config)
        self.topic_id = topic_id
        self._partitions = [Partition(name, n, opener) for n in range(partitions)]

    def __repr__(self) -> str:
        return f"Topic({self.name!r}, partitions={self.num_partitions})"

    @property
    def num_partitions(self) -> int:
        return len(self._partitions)

    @property
    def partitions(self) -> list[Partition]:
        return list(self._partitions)

    def partition(self, number: int) -> Partition:
        if isinstance(number, bool) or not isinstance(number, int) \
                or not 0 <= number < len(self._partitions):
            raise UnknownTopicError(f"topic {self.name!r} has no partition {number!r} "
                                    f"(it has {len(self._partitions)})")
        return self._partitions[number]

    def partition_for(self, key: bytes) -> int:
        """Kafka's default keyed partitioner: murmur2(key) mod partitions."""
        return partition_for_key(key, len(self._partitions))

    def close(self) -> None:
        """Close every partition, even when one fails; the first error is raised."""
        first: BaseException | None = None
        for partition in self._partitions:
            if not partition.opened:
                continue
            try:
                partition._log.close()
            except Exception as exc:      # go on: the other partitions' files too
                first = first or exc
        if first is not None:
            raise first
