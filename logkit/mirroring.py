"""The way out to a real Kafka cluster: copy a broker's topics and consumer-group offsets
to any Kafka-protocol cluster through confluent-kafka (`logkit.mirror`, `logkit mirror`),
and the way back in: a cluster's topics and offsets pulled into a broker
(`logkit.mirror_from`, `logkit mirror --from`; its own invariant in its docstring).

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

__all__ = ["mirror", "mirror_from", "STATE_TOPIC"]

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
                    _, high = _watermarks(ck, probe, name, partition.partition,
                                          timeout_s)
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
        low, high = _watermarks(ck, consumer, STATE_TOPIC, 0, timeout_s)
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
    _, high = _watermarks(ck, probe, partition.topic, partition.partition, timeout_s)
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


def _watermarks(ck: Any, consumer: Any, topic: str, partition: int,
                timeout_s: float) -> tuple[int, int]:
    """(low, high) of a partition of the Kafka cluster, asked again while the answer is
    a retriable error: a topic just created has no leader for a moment
    (NOT_LEADER_FOR_PARTITION, LEADER_NOT_AVAILABLE)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(ck.TopicPartition(topic, partition),
                                                       timeout=timeout_s)
            return low, high
        except ck.KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = isinstance(error, ck.KafkaError) and (
                error.retriable() or error.code() in (
                    ck.KafkaError.NOT_LEADER_FOR_PARTITION,
                    ck.KafkaError.LEADER_NOT_AVAILABLE,
                    ck.KafkaError.UNKNOWN_TOPIC_OR_PART))
            if not retriable or time.monotonic() > deadline:
                raise LogkitError(f"mirror: the watermarks of {topic}-{partition}: "
                                  f"{exc}") from None
            time.sleep(0.1)


def _raise_failures(failures: list[str]) -> None:
    if failures:
        raise LogkitError(f"mirror: the target refused {len(failures)} record(s): "
                          f"{failures[0]}")


def _source_id(broker: Any) -> str:
    import os
    import uuid
    return uuid.uuid5(uuid.NAMESPACE_URL, "logkit:" + os.path.realpath(broker.path)).hex


# ---- the other direction: a Kafka cluster's topics pulled into a logkit broker ----------

PULL_BATCH_BYTES = 512 * 1024          # key and value bytes per appended batch, at most


def mirror_from(bootstrap: str, broker: Any, *, topics: Iterable[str] | None = None,
                groups: bool | Iterable[str] = False,
                client_config: Mapping[str, Any] | None = None,
                config: Mapping[str, Any] | None = None, timeout_s: float = TIMEOUT_S,
                max_records: int | None = None) -> dict[str, Any]:
    """Copy `topics` (default: every topic not named `__*`) of the Kafka cluster at
    `bootstrap` into `broker`, the records each partition holds when the run starts, in
    order, to the same partition number (keys, values, headers, timestamps); then, when
    `groups` is true (or a list of group ids), the groups' committed offsets translated
    to the copy's offsets. For replaying production data in a local test.

    Resumable without duplicates: the progress lives in `broker`, in the topic
    `__logkit_mirror`, as checkpoints (next source offset, copy's end) written after
    each appended batch; a copy's end past its last checkpoint (a run killed between
    the two) is skipped over on the source, record for record, so source offsets may
    have gaps (compaction, transaction markers). Only committed records are copied
    (read_committed). `config`: topic config overrides for the topics it creates (say
    {"retention.ms": -1}: the records keep their timestamps, and time retention
    applies to them). Raises LogkitError when the source refuses or a local topic has
    fewer partitions than the source's; returns {"records": {topic: {partition:
    copied}}, "offsets": {group: count}}."""
    ck = _require_client()
    from confluent_kafka.admin import AdminClient
    conf = {"bootstrap.servers": bootstrap, **dict(client_config or {})}
    admin = AdminClient(conf)
    metadata = admin.list_topics(timeout=timeout_s)
    source_id = metadata.cluster_id or bootstrap
    names = sorted(topics) if topics is not None else sorted(
        t for t in metadata.topics if not t.startswith("__"))
    for name in names:
        _ensure_local_topic(broker, name, metadata, config)
    state_topic = broker.create_topic(STATE_TOPIC, 1, config={"retention.ms": -1},
                                      exist_ok=True)
    checkpoints = _load_checkpoints(state_topic.partition(0), f"{source_id}/")
    consumer = ck.Consumer({**conf, "group.id": "logkit-mirror-from",
                            "enable.auto.commit": False, "enable.partition.eof": True,
                            "isolation.level": "read_committed"})
    try:
        copied: dict[str, dict[int, int]] = {}
        budget = max_records
        for name in names:
            for partition in broker.topic(name).partitions:
                key = f"{name}/{partition.partition}"
                count = _pull_partition(ck, consumer, partition, state_topic.partition(0),
                                        f"{source_id}/{key}", checkpoints.setdefault(key, []),
                                        budget, timeout_s)
                copied.setdefault(name, {})[partition.partition] = count
                if budget is not None:
                    budget -= count
                    if budget <= 0:
                        break
            if budget is not None and budget <= 0:
                break
        offsets = {}
        if groups:
            wanted = _source_groups(admin, timeout_s) if groups is True else sorted(groups)
            for group in wanted:
                offsets[group] = _pull_offsets(ck, admin, consumer, broker, group, names,
                                               checkpoints, timeout_s)
        return {"records": copied, "offsets": offsets}
    finally:
        consumer.close()


def _ensure_local_topic(broker: Any, name: str, metadata: Any,
                        config: Mapping[str, Any] | None) -> None:
    source = metadata.topics.get(name)
    if source is None or source.error is not None:
        raise LogkitError(f"mirror: the source has no topic {name!r}"
                          + (f" ({source.error})" if source is not None else ""))
    wanted = len(source.partitions)
    if name not in broker.topics():
        broker.create_topic(name, wanted, config=dict(config or {}))
        return
    have = broker.topic(name).num_partitions
    if have < wanted:
        raise LogkitError(f"mirror: the local topic {name!r} has {have} partition(s), "
                          f"fewer than the source's {wanted}")


def _load_checkpoints(state: Any, prefix: str) -> dict[str, list[tuple[int, int]]]:
    """Per "topic/partition" of this source: its checkpoints (next source offset, the
    copy's end), oldest first."""
    found: dict[str, list[tuple[int, int]]] = {}
    position = state.log_start_offset
    while position < state.high_watermark:
        records = state.read(position, max_records=READ_RECORDS)
        if not records:
            break
        for record in records:
            key = (record.key or b"").decode()
            if key.startswith(prefix):
                source_next, target_end = json.loads(record.value)
                found.setdefault(key[len(prefix):], []).append((source_next, target_end))
        position = records[-1].offset + 1
    return found


def _pull_partition(ck: Any, consumer: Any, partition: Any, state: Any, state_key: str,
                    checkpoints: list[tuple[int, int]], budget: int | None,
                    timeout_s: float) -> int:
    """Copy one source partition's records up to its end at this moment; returns how
    many were appended."""
    low, high = _watermarks(ck, consumer, partition.topic, partition.partition, timeout_s)
    if not checkpoints:
        checkpoints.append((low, partition.high_watermark))
        _checkpoint(state, state_key, checkpoints[-1])
    source_next, target_end = checkpoints[-1]
    skip = partition.high_watermark - target_end   # appended after the last checkpoint
    if source_next < low:
        raise LogkitError(f"mirror: {partition.topic}-{partition.partition}: the source's "
                          f"retention removed offsets {source_next}..{low - 1} before "
                          "they were copied")
    if source_next >= high and skip == 0:
        return 0
    # half the copy's max.message.bytes: the batch's framing fits beside the payloads
    batch_bytes = min(int(partition.config["max.message.bytes"]) // 2, PULL_BATCH_BYTES)
    consumer.assign([ck.TopicPartition(partition.topic, partition.partition, source_next)])
    copied = 0
    rows: list[tuple[Any, ...]] = []
    size = 0
    position = source_next
    deadline = time.monotonic() + timeout_s
    done = False
    while not done:
        if time.monotonic() > deadline:
            raise LogkitTimeoutError(f"mirror: {partition.topic}-{partition.partition}: no "
                                     f"progress from the source within {timeout_s} s")
        for message in consumer.consume(1000, 0.5):
            error = message.error()
            if error is not None:
                if error.code() == ck.KafkaError._PARTITION_EOF:
                    done = True
                    break
                raise LogkitError(f"mirror: reading {partition.topic}-"
                                  f"{partition.partition} from the source: {error}")
            deadline = time.monotonic() + timeout_s
            position = message.offset() + 1
            if skip:
                skip -= 1
                continue
            stamp_type, stamp = message.timestamp()
            rows.append((message.key(), message.value(), message.headers() or None,
                         stamp if stamp_type != ck.TIMESTAMP_NOT_AVAILABLE else None))
            size += len(message.key() or b"") + len(message.value() or b"")
            limited = budget is not None and copied + len(rows) >= budget
            if size >= batch_bytes or limited or position >= high:
                copied += _append_step(partition, state, state_key, checkpoints, rows,
                                       position)
                rows, size = [], 0
            if limited or position >= high:
                done = True
                break
    if rows:
        copied += _append_step(partition, state, state_key, checkpoints, rows, position)
    elif skip == 0 and position > checkpoints[-1][0]:
        # skipped records, or transaction markers past the last record: move on
        checkpoints.append((position, partition.high_watermark))
        _checkpoint(state, state_key, checkpoints[-1])
    consumer.unassign()
    return copied


def _append_step(partition: Any, state: Any, state_key: str,
                 checkpoints: list[tuple[int, int]], rows: list[tuple[Any, ...]],
                 source_next: int) -> int:
    """One batch into the copy, then its checkpoint (a kill between the two is what
    the skip in _pull_partition repairs)."""
    partition.append(rows)
    checkpoints.append((source_next, partition.high_watermark))
    _checkpoint(state, state_key, checkpoints[-1])
    return len(rows)


def _checkpoint(state: Any, key: str, point: tuple[int, int]) -> None:
    state.append([(key.encode(), json.dumps(list(point)).encode(), None, None)])


def _source_groups(admin: Any, timeout_s: float) -> list[str]:
    result = admin.list_consumer_groups(request_timeout=timeout_s).result(timeout=timeout_s)
    return sorted(g.group_id for g in result.valid)


def _pull_offsets(ck: Any, admin: Any, consumer: Any, broker: Any, group: str,
                  names: list[str], checkpoints: Mapping[str, list[tuple[int, int]]],
                  timeout_s: float) -> int:
    """Commit `group`'s source offsets on the copy: offset c becomes the copy's offset
    of the first record at or after c (counted on the source from the checkpoint
    before c), or the copy's end past what was copied."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                request_timeout=timeout_s)
    committed = futures[group].result(timeout=timeout_s).topic_partitions or []
    target = {}
    for tp in committed:
        points = checkpoints.get(f"{tp.topic}/{tp.partition}")
        if tp.topic not in names or not points or tp.offset < 0:
            continue
        target[(tp.topic, tp.partition)] = _translate(ck, consumer, tp, points, timeout_s)
    if target:
        broker.group(group).reset_offsets(target)
    return len(target)


def _translate(ck: Any, consumer: Any, tp: Any, points: list[tuple[int, int]],
               timeout_s: float) -> int:
    before = [p for p in points if p[0] <= tp.offset]
    if not before:
        return points[0][1]
    source_next, target_end = before[-1]
    last_copied = points[-1]
    if tp.offset >= last_copied[0]:
        return last_copied[1]
    # c lies inside one appended step: count the source's records in [source_next, c)
    consumer.assign([ck.TopicPartition(tp.topic, tp.partition, source_next)])
    counted = 0
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                if message.error() is not None:
                    return target_end + counted
                if message.offset() >= tp.offset:
                    return target_end + counted
                counted += 1
        raise LogkitTimeoutError(f"mirror: translating {tp.topic}-{tp.partition} offset "
                                 f"{tp.offset}: the source did not answer in {timeout_s} s")
    finally:
        consumer.unassign()
