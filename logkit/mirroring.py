"""The way out to a real Kafka cluster: copy a broker's topics and consumer-group offsets
to any Kafka-protocol cluster through confluent-kafka (`logkit.mirror`, `logkit mirror`).

Owns: the copy of each partition (keys, values, headers, timestamps, the same partition
number), the translation of committed offsets to the target's offsets, and the mirror's
progress, which lives in the target cluster itself: a topic `__logkit_mirror` holding,
per source partition, the pair (source offset, target offset) at which its copy began.

Invariant (resumable without duplicates): the target partition holds a prefix of the
source partition's records from its `source_base` on, and nothing else (one idempotent
producer per run, ordered per partition, so a run killed at any instant leaves a prefix).
So the next record to copy is `source_base + (target end - target_base)`: a resumed run
neither skips nor repeats a record. This needs the target partitions written by nobody
but the mirror, and source offsets without gaps (logkit's are contiguous; retention may
only remove records already copied, else `LogkitError`).

Offsets: a group's committed offset `c` on the source maps to
`target_base + (c - source_base)` (records the mirror never copied map to the start), and
is committed on the target with the same group id; re-running commits the same values.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Iterable, Mapping

from .errors import ConfigError, LogkitError, LogkitTimeoutError

__all__ = ["mirror", "STATE_TOPIC"]

log = logging.getLogger(__name__)

STATE_TOPIC = "__logkit_mirror"
READ_RECORDS = 5000                    # records read from the source per step
TIMEOUT_S = 60.0


def _require_client() -> Any:
    try:
        import confluent_kafka
    except ImportError:
        raise ConfigError("logkit mirror needs confluent-kafka (pip install "
                          "confluent-kafka)") from None
    return confluent_kafka


def mirror(broker: Any, to: str, *, topics: Iterable[str] | None = None,
           groups: bool | Iterable[str] = False,
           client_config: Mapping[str, Any] | None = None,
           replication_factor: int = -1, timeout_s: float = TIMEOUT_S,
           max_records: int | None = None) -> dict[str, Any]:
    """Copy `topics` (default: all) of `broker` to the cluster at bootstrap address `to`,
    then, when `groups` is true (or a list of group ids), the groups' committed offsets
    translated to the target's offsets. Resumable: run it again after an interruption
    and it goes on where the target ends, without duplicates (module docstring).

    `client_config`: extra confluent-kafka settings for the target (security, ...).
    `max_records`: stop after copying this many records (a bounded step; run again to go
    on). Returns {"records": {topic: {partition: copied}}, "offsets": {group: count}}.
    Raises LogkitError when the target refuses, a target topic has fewer partitions, or
    retention removed source records not yet copied."""
    ck = _require_client()
    from confluent_kafka.admin import AdminClient, NewTopic
    conf = {"bootstrap.servers": to, **dict(client_config or {})}
    names = sorted(topics) if topics is not None else [
        t for t in broker.topics() if t != STATE_TOPIC]
    source_id = _source_id(broker)
    admin = AdminClient(conf)
    _ensure_topics(admin, NewTopic, broker, names, replication_factor, timeout_s)
    probe = ck.Consumer({**conf, "group.id": "logkit-mirror", "enable.auto.commit": False})
    failures: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    producer = ck.Producer({**conf, "enable.idempotence": True, "acks": "all",
                            "linger.ms": 5, "partitioner": "murmur2_random"})
    try:
        state = _load_state(ck, conf, source_id, timeout_s)
        copied: dict[str, dict[int, int]] = {}
        budget = max_records
        for name in names:
            for partition in broker.topic(name).partitions:
                key = f"{name}/{partition.partition}"
                if key not in state:
                    _, high = probe.get_watermark_offsets(
                        ck.TopicPartition(name, partition.partition), timeout=timeout_s)
                    state[key] = [partition.log_start_offset, high]
                    producer.produce(STATE_TOPIC, json.dumps(state[key]).encode(),
                                     f"{source_id}/{key}".encode(), on_delivery=delivered)
                    producer.flush(timeout_s)
                    _raise_failures(failures)
                count = _copy_partition(ck, producer, probe, partition, state[key],
                                        budget, timeout_s, delivered)
                copied.setdefault(name, {})[partition.partition] = count
                if budget is not None:
                    budget -= count
                    if budget <= 0:
                        break
            if budget is not None and budget <= 0:
                break
        left = producer.flush(timeout_s)
        _raise_failures(failures)
        if left:
            raise LogkitTimeoutError(f"mirror: {left} record(s) not acknowledged by {to} "
                                     f"within {timeout_s} s")
        offsets = {}
        if groups:
            wanted = broker.groups() if groups is True else sorted(groups)
            for group in wanted:
                offsets[group] = _mirror_offsets(ck, conf, broker, group, names, state,
                                                 timeout_s)
        return {"records": copied, "offsets": offsets}
    finally:
        probe.close()


def _ensure_topics(admin: Any, new_topic: Any, broker: Any, names: list[str],
                   replication_factor: int, timeout_s: float) -> None:
    existing = admin.list_topics(timeout=timeout_s).topics
    wanted = {STATE_TOPIC: 1, **{n: broker.topic(n).num_partitions for n in names}}
    missing = [n for n in wanted if n not in existing]
    for name in names:
        if name in existing and len(existing[name].partitions) < wanted[name]:
            raise LogkitError(f"mirror: the target's topic {name!r} has "
                              f"{len(existing[name].partitions)} partition(s), fewer than "
                              f"the source's {wanted[name]}")
    if not missing:
        return
    futures = admin.create_topics([new_topic(n, wanted[n], replication_factor)
                                   for n in missing], operation_timeout=timeout_s)
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise LogkitError(f"mirror: cannot create topic {name!r} on the target: "
                                  f"{exc}") from None


def _load_state(ck: Any, conf: dict[str, Any], source_id: str,
                timeout_s: float) -> dict[str, list[int]]:
    """Every (source base, target base) this source recorded in the target."""
    consumer = ck.Consumer({**conf, "group.id": f"logkit-mirror-state-{time.time_ns()}",
                            "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        partition = ck.TopicPartition(STATE_TOPIC, 0)
        low, high = consumer.get_watermark_offsets(partition, timeout=timeout_s)
        state: dict[str, list[int]] = {}
        if high <= low:
            return state
        consumer.assign([ck.TopicPartition(STATE_TOPIC, 0, low)])
        prefix = f"{source_id}/"
        position = low
        deadline = time.monotonic() + timeout_s
        while position < high:
            if time.monotonic() > deadline:
                raise LogkitTimeoutError(f"mirror: could not read {STATE_TOPIC} within "
                                         f"{timeout_s} s")
            for message in consumer.consume(1000, 1.0):
                if message.error() is not None:
                    continue
                position = message.offset() + 1
                key = (message.key() or b"").decode()
                if key.startswith(prefix):
                    state[key[len(prefix):]] = json.loads(message.value())
        return state
    finally:
        consumer.close()


def _copy_partition(ck: Any, producer: Any, probe: Any, partition: Any, bases: list[int],
                    budget: int | None, timeout_s: float, delivered: Any) -> int:
    source_base, target_base = bases
    _, high = probe.get_watermark_offsets(
        ck.TopicPartition(partition.topic, partition.partition), timeout=timeout_s)
    position = source_base + (high - target_base)
    if position < partition.log_start_offset:
        raise LogkitError(f"mirror: {partition.topic}-{partition.partition}: retention "
                          f"removed offsets {position}..{partition.log_start_offset - 1} "
                          "before they were copied")
    stop = partition.high_watermark
    if budget is not None:
        stop = min(stop, position + budget)
    copied = 0
    while position < stop:
        records = partition.read(position, max_records=min(READ_RECORDS, stop - position),
                                 stop_offset=stop)
        if not records:
            break
        for record in records:
            while True:
                try:
                    producer.produce(partition.topic, record.value, record.key,
                                     partition=partition.partition,
                                     timestamp=record.timestamp,
                                     headers=list(record.headers) or None,
                                     on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
        copied += len(records)
        position = records[-1].offset + 1
        producer.poll(0)
    return copied


def _mirror_offsets(ck: Any, conf: dict[str, Any], broker: Any, group: str,
                    names: list[str], state: Mapping[str, list[int]],
                    timeout_s: float) -> int:
    committed = broker.group(group).committed()
    offsets = []
    for tp, offset in sorted(committed.items()):
        bases = state.get(f"{tp.topic}/{tp.partition}")
        if tp.topic not in names or bases is None:
            continue
        source_base, target_base = bases
        offsets.append(ck.TopicPartition(tp.topic, tp.partition,
                                         target_base + max(0, offset - source_base)))
    if not offsets:
        return 0
    consumer = ck.Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    try:
        for result in consumer.commit(offsets=offsets, asynchronous=False):
            if result.error is not None:
                raise LogkitError(f"mirror: committing {group!r} offsets for "
                                  f"{result.topic}-{result.partition}: {result.error}")
    finally:
        consumer.close()
    return len(offsets)


def _raise_failures(failures: list[str]) -> None:
    if failures:
        raise LogkitError(f"mirror: the target refused {len(failures)} record(s): "
                          f"{failures[0]}")


def _source_id(broker: Any) -> str:
    import os
    import uuid
    return uuid.uuid5(uuid.NAMESPACE_URL, "logkit:" + os.path.realpath(broker.path)).hex
