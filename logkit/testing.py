"""Helpers for tests of streaming jobs: `logkit.testing`, a public submodule.

Owns: the four calls a test of a stream job needs around the job itself — put records
in (`produce`), take everything out (`read_all`), wait for a consumer group to catch up
(`wait_for_no_lag`) and compare a topic with what it should hold (`assert_topic`) —
plus `lag_table`, the kafka-consumer-groups style table their failures print. The
pytest fixtures that hand a test a broker live in `logkit.pytest_plugin`; docs/testing.md
is the guide.

Invariant: nothing here waits without a bound. `produce` returns once every record is
acknowledged (or raises the send's error); `read_all` reads up to the high watermark each
partition had when it was called, so a job still writing cannot keep it going;
`wait_for_no_lag` gives up after `timeout` seconds with an AssertionError. Failures of
the assertions are `AssertionError`s (pytest shows their message); bad arguments are
`TypeError`/`ValueError` (`ConfigError`) that say what was expected.

Uses only the public API of `logkit`, like any test would.
"""

from __future__ import annotations

import difflib
import logging
import time
from typing import Any, Iterable, Mapping, Sequence

from . import Broker, ConfigError, Record, RecordMetadata

__all__ = ["produce", "read_all", "wait_for_no_lag", "assert_topic", "lag_table"]

log = logging.getLogger(__name__)

SEND_FIELDS = ("key", "value", "headers", "partition", "timestamp_ms")
WAIT_STEP_S = 0.01                 # how often wait_for_no_lag looks again


def produce(broker: Broker, topic: str, records: Iterable[Any], *,
            timeout: float = 30.0) -> list[RecordMetadata]:
    """Send `records` to `topic` and wait for every acknowledgement; returns their
    RecordMetadata in the order given.

    Each record is a value (`b"v"` or `"v"`: str is sent as UTF-8), a `(key, value)`
    pair, or a dict with any of `key`, `value`, `headers`, `partition`,
    `timestamp_ms`. The topic is created as the producer would create it
    (`auto.create.topics.enable`), so create it first for a partition count of your
    own. `timeout` (seconds) bounds the wait for the acknowledgements."""
    producer = broker.producer(linger_ms=0)
    try:
        futures = [producer.send(topic, **_send_arguments(record, i))
                   for i, record in enumerate(records)]
        producer.flush(timeout=timeout)
        return [future.result(timeout=timeout) for future in futures]
    finally:
        producer.close()


def _send_arguments(record: Any, index: int) -> dict[str, Any]:
    if isinstance(record, Mapping):
        unknown = set(record) - set(SEND_FIELDS)
        if unknown:
            raise ConfigError(f"produce: record {index} has unknown field(s) "
                              f"{sorted(unknown)}; a dict record takes {list(SEND_FIELDS)}")
        fields = dict(record)
    elif isinstance(record, tuple):
        if len(record) != 2:
            raise ConfigError(f"produce: record {index} is a tuple of {len(record)}; a "
                              "tuple record is (key, value) — use a dict for more fields")
        fields = {"key": record[0], "value": record[1]}
    else:
        fields = {"value": record}
    for name in ("key", "value"):
        if isinstance(fields.get(name), str):
            fields[name] = fields[name].encode()
    return fields


def read_all(broker: Broker, topic: str, *,
             partitions: Iterable[int] | None = None,
             isolation_level: str = "read_uncommitted") -> list[Record]:
    """Every record now in `topic` (or in the given partitions), partition by
    partition in offset order: from each partition's log start up to the high
    watermark it had when this was called. Never blocks; a topic that does not exist
    raises UnknownTopicError. Offsets with no record (removed by a compacted topic's
    cleaner, control batches) are stepped over. `isolation_level="read_committed"`
    reads up to the last stable offset and leaves out aborted transactions' records
    (docs/design.md §15)."""
    committed = isolation_level == "read_committed"
    if not committed and isolation_level != "read_uncommitted":
        raise ConfigError(f"isolation_level must be 'read_uncommitted' or "
                          f"'read_committed', got {isolation_level!r}")
    handle = broker.topic(topic)
    numbers = range(handle.num_partitions) if partitions is None else sorted(partitions)
    out: list[Record] = []
    for number in numbers:
        partition = handle.partition(number)
        offset = partition.log_start_offset
        stop = partition.last_stable_offset if committed else partition.high_watermark
        while offset < stop:
            fetched = partition.fetch_records(offset, 10_000, stop_offset=stop,
                                              isolation_level=isolation_level)
            if fetched.next_offset <= offset:         # nothing more below stop
                break
            out += fetched.records
            offset = fetched.next_offset
    return out


def lag_table(broker: Broker, group: str) -> str:
    """The group's lag as kafka-consumer-groups --describe prints it: one line per
    partition with TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG; `-` where the
    group has no commit (its lag then counts from the log start)."""
    handle = broker.group(group)
    lag = handle.lag()
    committed = handle.committed()
    rows = [("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG")]
    for tp in sorted(lag):
        end = broker.topic(tp.topic).partition(tp.partition).high_watermark
        current = committed.get(tp)
        rows.append((tp.topic, str(tp.partition), "-" if current is None else str(current),
                     str(end), str(lag[tp])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths))
                     .rstrip() for row in rows)


def wait_for_no_lag(broker: Broker, group: str, timeout: float = 30.0) -> None:
    """Wait until consumer group `group` has committed up to the high watermark of
    every partition it subscribes to or has committed on (`group.lag()` all zero).

    A group with neither live members nor commits has not started: it is waited for,
    not taken as caught up. After `timeout` seconds raises AssertionError whose message
    is the lag table (kafka-consumer-groups' columns)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ConfigError(f"wait_for_no_lag: timeout is in seconds (a number >= 0), "
                          f"got {timeout!r}")
    handle = broker.group(group)
    deadline = time.monotonic() + timeout
    while True:
        lag = handle.lag()
        if lag and not any(lag.values()):
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(WAIT_STEP_S)
    if not lag:
        raise AssertionError(
            f"consumer group {group!r} has no live members and no committed offsets after "
            f"{timeout} s (state {handle.state}; known groups: {broker.groups() or 'none'})")
    behind = sum(lag.values())
    raise AssertionError(f"consumer group {group!r} is still {behind} record(s) behind "
                         f"after {timeout} s:\n{lag_table(broker, group)}")


def assert_topic(broker: Broker, topic: str,
                 expected: Sequence[Any] | Mapping[int, Sequence[Any]], *,
                 isolation_level: str = "read_uncommitted") -> None:
    """Assert that `topic` holds exactly the `expected` records, in order.

    `expected` is a list of `(key, value)` pairs for a one-partition topic, or
    `{partition: [(key, value), ...]}`; partitions left out of the dict must be empty.
    str keys and values compare as their UTF-8 bytes. `isolation_level` as `read_all`'s:
    `"read_committed"` compares what a read_committed consumer sees (up to the last
    stable offset, aborted transactions left out). On a mismatch raises AssertionError
    with a diff per partition that differs."""
    handle = broker.topic(topic)
    if isinstance(expected, Mapping):
        wanted = {int(p): list(rows) for p, rows in expected.items()}
        extra = [p for p in wanted if not 0 <= p < handle.num_partitions]
        if extra:
            raise AssertionError(f"topic {topic!r} has {handle.num_partitions} "
                                 f"partition(s); expected names partition(s) {extra}")
    elif isinstance(expected, (str, bytes)) or not isinstance(expected, Sequence):
        raise TypeError(f"assert_topic: expected is a list of (key, value) pairs or "
                        f"{{partition: [...]}}, got {type(expected).__name__}")
    elif handle.num_partitions != 1:
        raise AssertionError(f"topic {topic!r} has {handle.num_partitions} partitions; "
                             "give expected as {partition: [(key, value), ...]}")
    else:
        wanted = {0: list(expected)}
    diffs = []
    for number in range(handle.num_partitions):
        want = [_as_pair(row, topic, number) for row in wanted.get(number, [])]
        got = [(r.key, r.value) for r in read_all(broker, topic, partitions=[number],
                                                  isolation_level=isolation_level)]
        if want != got:
            diffs.append(f"partition {number}: expected {len(want)} record(s), found "
                         f"{len(got)}\n" + "\n".join(difflib.unified_diff(
                             [repr(p) for p in want], [repr(p) for p in got],
                             "expected", "actual", lineterm="", n=2)))
    if diffs:
        raise AssertionError(f"topic {topic!r} does not hold the expected records:\n"
                             + "\n".join(diffs))


def _as_pair(row: Any, topic: str, partition: int) -> tuple[bytes | None, bytes | None]:
    if not isinstance(row, tuple) or len(row) != 2:
        raise TypeError(f"assert_topic: expected records of {topic}-{partition} are "
                        f"(key, value) pairs, got {row!r}")
    return _as_bytes(row[0]), _as_bytes(row[1])


def _as_bytes(data: Any) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        return data.encode()
    raise TypeError(f"assert_topic: keys and values are bytes, str or None, got "
                    f"{type(data).__name__} {data!r:.60}")

