"""One handler per Kafka API: a decoded request in, a response body out, through the
broker's public methods only (Broker, Topic, Partition, ConsumerGroup).

Owns: what each API means on an embedded broker — a cluster of one node, this listener;
produce by `Partition.append_batch` (length, CRC and records checked, offsets stamped);
fetch by `Partition.batches_since` (the stored bytes, whole batches, from the
one holding the fetch offset), long-polling on the broker's doorbell; committed offsets
in the broker's one LMDB offsets store; groups through `groups.GroupManager`.

Handlers know nothing of sockets: the server hands them a `Request` and a `Session`
(client host, a closing flag) and writes what they return. A handler returns None only
for produce with acks=0, which Kafka never answers.

Error policy: a broker exception maps to Kafka's code for the partition or topic it
concerns (`_code_for`); the request goes on for the others. An unexpected exception is
a bug: it propagates and the server closes that connection, logging it — except in
Produce, where it is logged and answered UNKNOWN_SERVER_ERROR for its partition alone
(closing would drop the answers of partitions already written, and the retry would
write them twice). A produced batch is checked whole before it is written, as Kafka's
broker checks it (`records.validate_batch`: CRC, records, codec, timestamps): a lie
is CORRUPT_MESSAGE, INVALID_RECORD or UNSUPPORTED_COMPRESSION_TYPE for its partition.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from typing import Any, Callable

from ..broker import MAX_REPLICATION_FACTOR
from ..config import resolve_broker_config, resolve_topic_config
from ..errors import (ClosedError, CodecUnavailableError, ConfigError, CorruptRecordError,
                      IllegalStateError, InvalidRecordError, InvalidTopicError, LogkitError,
                      LogkitTimeoutError,
                      NotEnoughReplicasError, NotLeaderError, OffsetOutOfRangeError,
                      RecordTooLargeError, StorageError, TopicExistsError, UnknownTopicError,
                      UnsupportedCompressionTypeError, CommitFailedError)
from ..group import (GroupCoordinator, OffsetAndMetadata, OffsetMetadataTooLargeError,
                     committed_offsets, validate_group_id, wire_members)
from ..topic import MAX_PARTITIONS, TopicPartition, validate_topic_name
from . import errors as E
from .frame import Request
from .groups import GroupManager, _join_error, encode_assignment
from .messages import APIS
from .producers import append_batch, new_producer_id
from .transactions import TxnHandlers, txn_code

__all__ = ["Handlers", "Session", "NODE_ID", "FETCH_MAX_BYTES"]

log = logging.getLogger(__name__)

NODE_ID = 1                                # a root that never followed (cluster.py)
MAX_FETCH_WAIT_MS = 30000                  # a client's max.wait.ms is capped here
FETCH_MAX_BYTES = 57671680                 # Kafka's broker fetch.max.bytes: one answer's
                                           # records at most (55 MiB)
MAX_ACKS_WAIT_MS = 120000                  # an acks=all produce waits at most this long
ACKS_RECHECK_S = 0.05                      # ... looking at the ISR at least this often
ISR_CHECK_MAX_AGE_MS = 10                  # leader.py's: the pre-append ISR view's age
_LAST_DELTA_AT = 23                        # lastOffsetDelta in a batch header
_NOT_LEADER = "this listener's broker does not lead: refresh the metadata"
RECHECK_S = 0.1                            # a long poll re-reads its partitions this often
BATCH_HEADER_BYTES = 61
_MAGIC_AT = 16
_LENGTH = struct.Struct(">i")              # batchLength at 8
_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_AT = 21
_CONTROL = 0x20                            # the control-batch attribute bit
_LOG_APPEND_TIME = 0x08
_LATEST, _EARLIEST, _MAX_TIMESTAMP, _EARLIEST_LOCAL = -1, -2, -3, -4
_GROUP_KEY, _TRANSACTION_KEY = 0, 1                # FindCoordinator's key types
_READ_COMMITTED = 1                                # Fetch's and ListOffsets' isolation
_RESOURCE_TOPIC, _RESOURCE_BROKER = 2, 4
_SOURCE_DYNAMIC_TOPIC, _SOURCE_STATIC_BROKER, _SOURCE_DEFAULT = 1, 4, 5
_TYPE_BOOLEAN, _TYPE_STRING, _TYPE_LONG, _TYPE_DOUBLE, _TYPE_LIST = 1, 2, 5, 6, 7
_SET, _DELETE, _APPEND, _SUBTRACT = 0, 1, 2, 3    # IncrementalAlterConfigs' operations
_LIST_CONFIGS = frozenset({"cleanup.policy"})     # Kafka's list-typed topic configs
_STATIC_BROKER = ("logkit's broker configs are static: they are given when the Broker "
                  "opens (Broker(path, config=...)), and none can change while it runs")


class Session:
    """What a handler may know about the connection it serves."""

    def __init__(self, host: str, closing: threading.Event) -> None:
        self.host = host
        self.closing = closing


def _code_for(exc: BaseException) -> int:
    """Kafka's error code for a broker exception met while serving one partition."""
    coded = txn_code(exc)              # the producer and transaction errors carry theirs
    if coded is not None:
        return coded
    for kinds, code in (
            ((UnknownTopicError,), E.UNKNOWN_TOPIC_OR_PARTITION),
            ((InvalidTopicError,), E.INVALID_TOPIC_EXCEPTION),
            ((OffsetOutOfRangeError,), E.OFFSET_OUT_OF_RANGE),
            ((UnsupportedCompressionTypeError, CodecUnavailableError),
             E.UNSUPPORTED_COMPRESSION_TYPE),
            ((InvalidRecordError,), E.INVALID_RECORD),
            ((CorruptRecordError,), E.CORRUPT_MESSAGE),
            ((RecordTooLargeError,), E.MESSAGE_TOO_LARGE),
            ((NotEnoughReplicasError,), E.NOT_ENOUGH_REPLICAS),
            ((LogkitTimeoutError,), E.REQUEST_TIMED_OUT),
            ((TopicExistsError,), E.TOPIC_ALREADY_EXISTS),
            ((OffsetMetadataTooLargeError,), E.OFFSET_METADATA_TOO_LARGE),
            ((ConfigError,), E.INVALID_CONFIG),
            ((ClosedError, NotLeaderError), E.NOT_LEADER_OR_FOLLOWER),
            ((StorageError,), E.KAFKA_STORAGE_ERROR)):
        if isinstance(exc, kinds):
            return code
    return E.UNKNOWN_SERVER_ERROR


def _config_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _config_type(key: str, value: Any) -> int:
    """DescribeConfigs' config_type (KIP-569) of a config: Kafka's LIST for its list
    configs, else by the value's type."""
    if key in _LIST_CONFIGS:
        return _TYPE_LIST
    if isinstance(value, bool):
        return _TYPE_BOOLEAN
    if isinstance(value, float):
        return _TYPE_DOUBLE
    return _TYPE_LONG if isinstance(value, int) else _TYPE_STRING


class Handlers:
    """The handlers of one listener over one broker; any connection thread may call."""

    def __init__(self, broker: Any, *, host: str, port: int, view: Any = None,
                 initial_rebalance_delay_ms: int = 0,
                 closing: threading.Event | None = None) -> None:
        from .cluster import LeaderView, Node, node_id_for
        self.broker = broker
        self.host = host
        self.port = port
        # who leads and replicates (cluster.py): this broker, unless a view is given
        self.view = view if view is not None else LeaderView(
            broker, Node(node_id_for(broker.path, broker.config), host, port))
        self.closing = closing or threading.Event()
        self.txn = TxnHandlers(self, _code_for)
        self.groups = GroupManager(persist=self._persist_group,
                                   embedded_live=self._embedded_live,
                                   initial_rebalance_delay_ms=initial_rebalance_delay_ms,
                                   closing=self.closing)
        self._topic_ids: dict[bytes, str] = {}
        # Produce and Fetch resolve topics here instead of Broker.topic(), which reads the
        # metadata store on every call. An entry goes as soon as using it raises
        # UnknownTopicError or ClosedError (the topic was deleted, or re-created, by any
        # process: its partitions are flagged deleted), and the client's retry resolves
        # the name afresh.
        self._hot: dict[str, Any] = {}
        self.sasl = False                  # the server answers SaslHandshake/Authenticate
        self._table: dict[int, Callable[[Request, Session], Any]] = {
            0: self.produce, 1: self.fetch, 2: self.list_offsets, 3: self.metadata,
            8: self.offset_commit, 9: self.offset_fetch, 10: self.find_coordinator,
            11: self.join_group, 12: self.heartbeat, 13: self.leave_group,
            14: self.sync_group, 15: self.describe_groups, 16: self.list_groups,
            18: self.api_versions, 19: self.create_topics, 20: self.delete_topics,
            21: self.delete_records, 22: self.init_producer_id,
            32: self.describe_configs, 33: self.alter_configs, 37: self.create_partitions,
            42: self.delete_groups, 44: self.incremental_alter_configs,
            24: self.txn.add_partitions_to_txn, 25: self.txn.add_offsets_to_txn,
            26: self.txn.end_txn, 28: self.txn.txn_offset_commit,
            61: self.txn.describe_producers,
            65: self.txn.describe_transactions, 66: self.txn.list_transactions}

    def handle(self, request: Request, session: Session) -> dict[str, Any] | None:
        key = request.api.key
        if key in _LEADER_ONLY and not self.view.leads():
            return _not_leading(request)
        return self._table[key](request, session)

    def lead(self, broker: Any, view: Any) -> None:
        """Answer as `view` over `broker` from now on (a serving follower promoted:
        its listener turns leader with the new epoch)."""
        old = self.view
        self.broker, self.view = broker, view
        self._hot.clear()
        self._topic_ids.clear()
        old.close()

    def close(self) -> None:
        self.view.close()

    def serves(self, api_key: int) -> bool:
        return api_key in self._table or (self.sasl and api_key in (17, 36))

    # ---- cluster -------------------------------------------------------------------

    def api_versions(self, request: Request, session: Session) -> dict[str, Any]:
        keys = [{"api_key": api.key, "min_version": api.min_version,
                 "max_version": api.max_version}
                for api in APIS.values() if self.serves(api.key)]
        if request.version > request.api.max_version:
            return {"error_code": E.UNSUPPORTED_VERSION, "api_keys": keys}
        return {"error_code": E.NONE, "api_keys": keys}

    @property
    def node_id(self) -> int:
        return self.view.node.node_id

    def _topic(self, name: str) -> Any:
        topic = self.broker.topic(name)
        self._hot[name] = topic
        return topic

    def _hot_topic(self, name: str) -> Any:
        topic = self._hot.get(name)
        return topic if topic is not None else self._topic(name)

    def _forget(self, name: str) -> None:
        self._hot.pop(name, None)

    def _wire_id(self, topic: Any) -> bytes:
        """The id clients know `topic` by: the first leader's, kept by every replica
        across promotions (cluster.py), else the topic's own."""
        return bytes.fromhex(self.view.wire_topic_id(topic))

    def _topic_by_id(self, topic_id: bytes) -> Any:
        name = self._topic_ids.get(topic_id)
        if name is None:
            for candidate in self.broker.topics():
                try:
                    topic = self.broker.topic(candidate)
                except LogkitError:
                    continue
                self._topic_ids[self._wire_id(topic)] = candidate
            name = self._topic_ids.get(topic_id)
        if name is None:
            raise UnknownTopicError(f"no topic has id {topic_id.hex()}")
        topic = self.broker.topic(name)
        if self._wire_id(topic) != topic_id:
            raise UnknownTopicError(f"no topic has id {topic_id.hex()}")
        return topic

    def metadata(self, request: Request, session: Session) -> dict[str, Any]:
        body, version = request.body, request.version
        wanted = body["topics"]
        if wanted is None or (version == 0 and not wanted):
            names = self.broker.topics()
            auto = False
        else:
            names = [t["name"] for t in wanted]
            auto = body["allow_auto_topic_creation"] \
                and self.broker.config["auto.create.topics.enable"] and self.view.leads()
        topics = []
        # auto.create.topics.max.per.request bounds what one request may create; past
        # it a missing topic answers UNKNOWN_TOPIC_OR_PARTITION, and the retry goes on
        budget = self.broker.config["auto.create.topics.max.per.request"] if auto else 0
        existing = set(self.broker.topics()) if auto else set()
        for name in names:
            create = budget > 0 and name not in existing
            topics.append(self._topic_metadata(name, create))
            if create and topics[-1]["error_code"] == E.NONE:
                budget -= 1
                existing.add(name)
        controller = self.view.controller()
        return {"brokers": [node.entry() for node in self.view.brokers()],
                "cluster_id": self.view.cluster_id(),
                "controller_id": controller.node_id if controller is not None else -1,
                "topics": topics}

    def _topic_metadata(self, name: str | None, auto: bool) -> dict[str, Any]:
        try:
            if name is None:
                raise UnknownTopicError("a topic id lookup without a name")
            topic = self.broker.get_or_create_topic(name) if auto else self._topic(name)
        except (UnknownTopicError, InvalidTopicError) as exc:
            return {"error_code": _code_for(exc), "name": name, "partitions": []}
        return {"error_code": E.NONE, "name": name,
                "topic_id": self._wire_id(topic), "is_internal": False,
                "partitions": [{"error_code": v.error_code, "partition_index": n,
                                "leader_id": v.leader_id, "leader_epoch": v.leader_epoch,
                                "replica_nodes": v.replicas, "isr_nodes": v.isr,
                                "offline_replicas": []}
                               for n, v in enumerate(self.view.partitions(topic))]}

    def find_coordinator(self, request: Request, session: Session) -> dict[str, Any]:
        body = request.body
        keys = body["coordinator_keys"] if request.version >= 4 else [body["key"]]
        code, message = E.NONE, None
        coordinator = self.view.coordinator()
        if body["key_type"] not in (_GROUP_KEY, _TRANSACTION_KEY):
            code = E.INVALID_REQUEST
            message = f"coordinator key type {body['key_type']} is not served"
        elif coordinator is None:
            code = E.COORDINATOR_NOT_AVAILABLE
            message = "the leader's listener is not known here yet"
        node = {} if code else {"node_id": coordinator.node_id, "host": coordinator.host,
                                "port": coordinator.port}
        coordinators = [{"key": key, "error_code": code, "error_message": message,
                         "node_id": node.get("node_id", -1), "host": node.get("host", ""),
                         "port": node.get("port", -1)} for key in keys]
        return {"error_code": code, "error_message": message,
                "node_id": node.get("node_id", -1), "host": node.get("host", ""),
                "port": node.get("port", -1), "coordinators": coordinators}

    # ---- produce -------------------------------------------------------------------

    def produce(self, request: Request, session: Session) -> dict[str, Any] | None:
        body = request.body
        acks = body["acks"]
        leads = self.view.leads()
        responses = []
        for topic_data in body["topic_data"]:
            name = topic_data["name"]
            results = []
            try:
                topic = self._topic_by_id(topic_data["topic_id"]) \
                    if request.version >= 13 else self._hot_topic(name)
                topic_error = E.NONE
            except (UnknownTopicError, InvalidTopicError) as exc:
                topic, topic_error = None, _code_for(exc)
            for part in topic_data["partition_data"]:
                if not leads:
                    results.append(_produce_result(part["index"], E.NOT_LEADER_OR_FOLLOWER,
                                                   _NOT_LEADER))
                elif topic_error:
                    results.append(_produce_result(part["index"], topic_error))
                elif body["transactional_id"] is not None and (unverified := (
                        self.txn.verify_produce(body["transactional_id"], part["records"],
                                                topic, part["index"], request.version))):
                    results.append(_produce_result(part["index"], unverified,
                                                   "the partition is not in the producer's "
                                                   "transaction: AddPartitionsToTxn first"))
                elif acks not in (-1, 0, 1):
                    results.append(_produce_result(part["index"], E.INVALID_REQUEST,
                                                   f"acks must be -1, 0 or 1, not {acks}"))
                else:
                    results.append(self._guarded_produce(topic, part, acks,
                                                         body["timeout_ms"], session))
            responses.append({"name": name, "topic_id": topic_data["topic_id"],
                              "partition_responses": results})
        if acks == 0:
            return None
        return {"responses": responses}

    def _guarded_produce(self, topic: Any, part: dict[str, Any], acks: int,
                         timeout_ms: int, session: Session) -> dict[str, Any]:
        """`_produce_partition`, with a bug met on one partition answered for that
        partition alone (UNKNOWN_SERVER_ERROR, logged), as Kafka's ReplicaManager does:
        a closed connection would lose the answers of the partitions already written,
        and the client's retry would write them twice."""
        try:
            return self._produce_partition(topic, part, acks, timeout_ms, session)
        except Exception:
            log.exception("produce to %s-%s failed unexpectedly", topic.name, part["index"])
            return _produce_result(part["index"], E.UNKNOWN_SERVER_ERROR,
                                   "the broker failed on this partition; see its log")

    def _produce_partition(self, topic: Any, part: dict[str, Any], acks: int,
                           timeout_ms: int, session: Session) -> dict[str, Any]:
        index, records = part["index"], part["records"]
        try:
            partition = topic.partition(index)
        except UnknownTopicError as exc:
            self._forget(topic.name)
            return _produce_result(index, _code_for(exc))
        problem = _check_batch(records)
        if problem:
            return _produce_result(index, problem[0], problem[1])
        min_isr = partition.config.get("min.insync.replicas", 1)   # altered: the log's
        replicated = acks == -1 and topic.replication_factor > 1
        if acks == -1 and not replicated and min_isr > 1:
            return _produce_result(index, E.NOT_ENOUGH_REPLICAS,
                                   "min.insync.replicas is above the one replica here")
        if replicated:
            # acks=all on a replicated topic: the leader's rules (docs/replication.md):
            # an ISR already below min.insync.replicas refuses before appending
            isr = partition.in_sync_replicas(max_age_ms=ISR_CHECK_MAX_AGE_MS)
            if len(isr) < min_isr:
                isr = partition.in_sync_replicas(relist=True)
            if len(isr) < min_isr:
                return _produce_result(index, E.NOT_ENOUGH_REPLICAS,
                                       f"the ISR {isr} is smaller than "
                                       f"min.insync.replicas={min_isr}")
        batch = bytearray(records)
        try:
            code, base = append_batch(partition, batch)
            log_start = partition.log_start_offset
        except LogkitError as exc:
            if isinstance(exc, (UnknownTopicError, ClosedError)):
                self._forget(topic.name)
            log.debug("produce to %s-%d refused: %s", topic.name, index, exc)
            return _produce_result(index, _code_for(exc), str(exc)[:500])
        if code:
            return _produce_result(index, code)
        if replicated:
            last = base + _LENGTH.unpack_from(records, _LAST_DELTA_AT)[0] + 1
            code, message = self._await_replicas(partition, last, min_isr, timeout_ms,
                                                 session)
            if code:
                return _produce_result(index, code, message)
        append_time = -1
        if topic.config.get("message.timestamp.type") == "LogAppendTime":
            headers = partition.batch_headers(base)
            append_time = headers[0].max_timestamp if headers else int(time.time() * 1000)
        return {"index": index, "error_code": E.NONE, "base_offset": base,
                "log_append_time_ms": append_time, "log_start_offset": log_start}

    def _await_replicas(self, partition: Any, last: int, min_isr: int, timeout_ms: int,
                        session: Session) -> tuple[int, str | None]:
        """Wait (the request's timeout_ms, at most MAX_ACKS_WAIT_MS) until the high
        watermark passes offset `last` - 1, woken by the followers' doorbell rings:
        (0, None); REQUEST_TIMED_OUT when it does not; NOT_ENOUGH_REPLICAS_AFTER_APPEND
        when the ISR shrank below min.insync.replicas meanwhile. The records stay in
        the log either way, as Kafka's do."""
        deadline = time.monotonic() + min(max(timeout_ms, 0), MAX_ACKS_WAIT_MS) / 1000
        doorbell = self.broker.doorbell
        while True:
            seen = doorbell.value() if doorbell is not None else 0
            if partition.high_watermark >= last:
                break
            now = time.monotonic()
            if now >= deadline or session.closing.is_set() or self.closing.is_set():
                return E.REQUEST_TIMED_OUT, (
                    f"the in-sync replicas did not acknowledge offset {last - 1} within "
                    f"{timeout_ms} ms (the records stay in the leader's log)")
            if doorbell is None:
                time.sleep(min(ACKS_RECHECK_S, deadline - now))
            else:
                doorbell.wait(seen, min(ACKS_RECHECK_S, deadline - now))
        isr = partition.in_sync_replicas(max_age_ms=ISR_CHECK_MAX_AGE_MS)
        if len(isr) < min_isr:
            return E.NOT_ENOUGH_REPLICAS_AFTER_APPEND, (
                f"the ISR {isr} shrank below min.insync.replicas={min_isr} after the append")
        return E.NONE, None

    def init_producer_id(self, request: Request, session: Session) -> dict[str, Any]:
        """Producer ids from the broker's transaction coordinator, the allocator
        embedded producers use (transactions.TxnHandlers.init_producer_id). An
        idempotent producer asking a listener whose broker does not lead (its
        metadata store is the leader's copy) gets one from the clock
        (producers.new_producer_id), whose range the coordinator's ids never reach."""
        if request.body["transactional_id"] is None and not self.view.leads():
            return {"error_code": E.NONE, "producer_id": new_producer_id(),
                    "producer_epoch": 0}
        return self.txn.init_producer_id(request, session)

    # ---- fetch ---------------------------------------------------------------------

    def fetch(self, request: Request, session: Session) -> dict[str, Any]:
        body = request.body
        if request.version >= 7 and body["session_id"] != 0:
            return {"error_code": E.FETCH_SESSION_ID_NOT_FOUND, "session_id": 0,
                    "responses": []}
        wait_s = min(max(body["max_wait_ms"], 0), MAX_FETCH_WAIT_MS) / 1000
        deadline = time.monotonic() + wait_s
        doorbell = self.broker.doorbell
        while True:
            seen = doorbell.value() if doorbell is not None else 0
            responses, size, failed = self._fetch_once(request)
            checked = time.monotonic()
            if size >= body["min_bytes"] or failed or checked >= deadline \
                    or session.closing.is_set() or self.closing.is_set() or doorbell is None:
                return {"error_code": E.NONE, "session_id": 0, "responses": responses}
            # Sleep until the doorbell rings; look at the partitions again only then (an
            # idle long poll over many partitions costs nothing per wake-up), or every
            # RECHECK_S, which bounds the rare ring two processes made at once and lost.
            while doorbell.value() == seen and not session.closing.is_set() \
                    and not self.closing.is_set():
                now = time.monotonic()
                if now >= deadline or now - checked >= RECHECK_S:
                    break
                doorbell.wait(seen, min(deadline, checked + RECHECK_S) - now)

    def _fetch_once(self, request: Request) -> tuple[list[dict[str, Any]], int, bool]:
        """One pass over the partitions a Fetch asks for: each (topic, partition) once
        (`_merged_fetch_topics`), their records together at most the request's
        max_bytes and never above FETCH_MAX_BYTES (a max_bytes of 0 or less, or above
        it, is FETCH_MAX_BYTES), each at most its partition_max_bytes — except that the
        first partition with data returns one whole batch even when it is bigger, as
        Kafka's broker does (KIP-74), so a consumer never stalls on a large batch."""
        body = request.body
        asked = body["max_bytes"]
        budget = asked if 0 < asked < FETCH_MAX_BYTES else FETCH_MAX_BYTES
        by_id = request.version >= 13
        leads = self.view.leads()
        committed = body["isolation_level"] == _READ_COMMITTED
        responses, total, failed = [], 0, False
        for fetch_topic, wanted_partitions in _merged_fetch_topics(body["topics"], by_id):
            try:
                topic = self._topic_by_id(fetch_topic["topic_id"]) if by_id \
                    else self._hot_topic(fetch_topic["topic"])
                topic_error = E.NONE
            except (UnknownTopicError, InvalidTopicError) as exc:
                topic = None
                topic_error = E.UNKNOWN_TOPIC_ID if by_id else _code_for(exc)
            partitions = []
            for wanted in wanted_partitions:
                code = E.NOT_LEADER_OR_FOLLOWER if not leads else topic_error
                if code:
                    partitions.append(_fetch_error(wanted["partition"], code))
                    failed = True
                    continue
                result = self._fetch_partition(topic, wanted, budget - total,
                                               first=total == 0, committed=committed)
                failed = failed or result["error_code"] != E.NONE
                total += len(result["records"] or b"")
                partitions.append(result)
            responses.append({"topic": fetch_topic["topic"],
                              "topic_id": fetch_topic["topic_id"],
                              "partitions": partitions})
        return responses, total, failed

    def _fetch_partition(self, topic: Any, wanted: dict[str, Any], budget: int,
                         first: bool, committed: bool = False) -> dict[str, Any]:
        """One partition's answer. Every answer carries the last stable offset, as
        Kafka's; with read_committed the records stop before it and the aborted
        transactions from the fetch offset up to it are listed (the client drops their
        batches by producer id), read_uncommitted lists none (null)."""
        index = wanted["partition"]
        try:
            partition = topic.partition(index)
            code = _epoch_check(wanted.get("current_leader_epoch", -1),
                                partition.leader_epoch)
            if code:
                return _fetch_error(index, code)
            high_watermark = partition.high_watermark
            stable = partition.last_stable_offset
            log_start = partition.log_start_offset
            offset = wanted["fetch_offset"]
            end = stable if committed else high_watermark
            limit = min(wanted["partition_max_bytes"], budget)
            if limit <= 0 and not first:
                records = b""
            elif offset == end and offset >= log_start:
                records = b""
            else:
                records = partition.batches_since(offset, stable if committed else None,
                                                  max_bytes=max(limit, 1))
            aborted = [{"producer_id": producer_id, "first_offset": first_offset}
                       for producer_id, first_offset
                       in partition.aborted_transactions(offset, stable)] \
                if committed else None
        except LogkitError as exc:
            if isinstance(exc, (UnknownTopicError, ClosedError)):
                self._forget(topic.name)
            return _fetch_error(index, _code_for(exc))
        return {"partition_index": index, "error_code": E.NONE,
                "high_watermark": high_watermark, "last_stable_offset": stable,
                "log_start_offset": log_start, "aborted_transactions": aborted,
                "records": records}

    def list_offsets(self, request: Request, session: Session) -> dict[str, Any]:
        topics = []
        for wanted in request.body["topics"]:
            partitions = []
            try:
                topic = self._topic(wanted["name"])
                topic_error = E.NONE if self.view.leads() else E.NOT_LEADER_OR_FOLLOWER
            except LogkitError as exc:
                topic, topic_error = None, _code_for(exc)
            for p in wanted["partitions"]:
                index = p["partition_index"]
                if topic_error:
                    partitions.append({"partition_index": index, "error_code": topic_error})
                    continue
                try:
                    partition = topic.partition(index)
                    code = _epoch_check(p.get("current_leader_epoch", -1),
                                        partition.leader_epoch)
                    if code:
                        partitions.append({"partition_index": index, "error_code": code})
                        continue
                    offset, timestamp = self._offset_for(
                        partition, p["timestamp"],
                        request.body["isolation_level"] == _READ_COMMITTED)
                except LogkitError as exc:
                    partitions.append({"partition_index": index,
                                       "error_code": _code_for(exc)})
                    continue
                partitions.append({"partition_index": index, "error_code": E.NONE,
                                   "timestamp": timestamp, "offset": offset,
                                   "old_style_offsets": [] if offset < 0 else [offset],
                                   "leader_epoch": partition.leader_epoch})
            topics.append({"name": wanted["name"], "partitions": partitions})
        return {"topics": topics}

    @staticmethod
    def _offset_for(partition: Any, timestamp: int,
                    committed: bool = False) -> tuple[int, int]:
        if timestamp == _LATEST:       # read_committed: the last stable offset (Kafka's)
            return (partition.last_stable_offset if committed
                    else partition.high_watermark), -1
        if timestamp in (_EARLIEST, _EARLIEST_LOCAL):
            return partition.log_start_offset, -1
        if timestamp == _MAX_TIMESTAMP:
            best = None
            for header in partition.batch_headers(partition.log_start_offset):
                # a batch a compacted topic's cleaner emptied holds no record to answer
                if header.records_count and header.base_offset < partition.high_watermark \
                        and (best is None or header.max_timestamp > best.max_timestamp):
                    best = header
            if best is None:
                return -1, -1
            for record in partition.read(best.base_offset, max_records=best.records_count
                                         + best.last_offset_delta + 1):
                if record.timestamp == best.max_timestamp:
                    return record.offset, record.timestamp
            return best.base_offset, best.max_timestamp
        if timestamp < 0:
            raise ConfigError(f"ListOffsets timestamp {timestamp} is not served")
        offset = partition.offset_for_timestamp(timestamp)
        if offset is None:
            return -1, -1
        # the record read is the first one left at or after that offset: compaction
        # may have removed the one the time index named
        found = partition.read(offset, max_records=1)
        return (found[0].offset, found[0].timestamp) if found else (-1, -1)

    # ---- admin ---------------------------------------------------------------------

    def create_topics(self, request: Request, session: Session) -> dict[str, Any]:
        body = request.body
        results = []
        for wanted in body["topics"]:
            results.append(self._create_topic(wanted, body["validate_only"]))
        return {"topics": results}

    def _create_topic(self, wanted: dict[str, Any], validate_only: bool) -> dict[str, Any]:
        name = wanted["name"]
        count = wanted["num_partitions"]
        if count == -1:
            count = self.broker.config["num.partitions"]
        factor = wanted["replication_factor"]
        me = self.node_id
        if wanted["assignments"]:
            # An assignment is valid when it places partitions 0..n-1, each on this node
            # (the leader) and the same number of distinct brokers; that number is the
            # replication factor (the count and factor, if given, must agree). Which
            # followers fill the other places is decided as for create_topic: the first
            # to report (docs/replication.md), not by the ids named here.
            assignments = wanted["assignments"]
            placed = sorted(a["partition_index"] for a in assignments)
            sizes = {len(a["broker_ids"]) for a in assignments}
            size = sizes.pop() if len(sizes) == 1 else 0
            if wanted["num_partitions"] not in (-1, len(placed)) \
                    or placed != list(range(len(placed))) or size < 1 \
                    or factor not in (-1, size) \
                    or any(me not in a["broker_ids"]
                           or len(set(a["broker_ids"])) != size for a in assignments):
                return _create_error(name, E.INVALID_REPLICA_ASSIGNMENT,
                                     f"an assignment must place partitions 0..n-1, each on "
                                     f"broker {me} (this listener's) and the same number "
                                     "of distinct brokers")
            count, factor = len(placed), size
        if factor == -1:
            factor = self.broker.config["default.replication.factor"]
        if not 1 <= factor <= MAX_REPLICATION_FACTOR:
            return _create_error(name, E.INVALID_REPLICATION_FACTOR,
                                 f"replication factor must be in 1..{MAX_REPLICATION_FACTOR},"
                                 f" got {factor}")
        config = {c["name"]: c["value"] for c in wanted["configs"]}
        try:
            validate_topic_name(name)
            if count < 1:
                return _create_error(name, E.INVALID_PARTITIONS,
                                     f"number of partitions must be at least 1, got {count}")
            refused = self._partition_policy(name, count)
            if refused is not None:
                return _create_error(name, *refused)
            if validate_only:
                if name in self.broker.topics():
                    raise TopicExistsError(f"topic {name!r} already exists")
                topic = None
            else:
                topic = self.broker.create_topic(name, count, config=config,
                                                 replication_factor=factor)
        except LogkitError as exc:
            return _create_error(name, _code_for(exc), str(exc)[:500])
        configs = None if topic is None else [
            {"name": key, "value": _config_text(value), "read_only": False,
             "config_source": source, "is_sensitive": False}
            for key, value, source in self._topic_configs(topic)]
        return {"name": name, "error_code": E.NONE, "error_message": None,
                "topic_id": self._wire_id(topic) if topic else bytes(16),
                "num_partitions": count, "replication_factor": factor, "configs": configs}

    def delete_topics(self, request: Request, session: Session) -> dict[str, Any]:
        body = request.body
        if request.version >= 6:
            wanted = [(t["name"], t["topic_id"]) for t in body["topics"]]
        else:
            wanted = [(name, bytes(16)) for name in body["topic_names"]]
        responses = []
        for name, topic_id in wanted:
            try:
                if name is None:
                    name = self._topic_by_id(topic_id).name
                self._forget(name)
                self.broker.delete_topic(name)
                responses.append({"name": name, "topic_id": topic_id,
                                  "error_code": E.NONE})
            except LogkitError as exc:
                code = _code_for(exc)
                if name is None and code == E.UNKNOWN_TOPIC_OR_PARTITION:
                    code = E.UNKNOWN_TOPIC_ID
                responses.append({"name": name, "topic_id": topic_id, "error_code": code,
                                  "error_message": str(exc)[:500]})
        return {"responses": responses}

    def create_partitions(self, request: Request, session: Session) -> dict[str, Any]:
        """Grow each topic to its new total (Broker.create_partitions); with
        validate_only, check exactly as a real growth would and change nothing. Clients
        learn the count from their next Metadata; a group's leader then re-joins, and
        its assignor hands out the new partitions (Kafka's own path)."""
        validate_only = request.body["validate_only"]
        results = []
        for wanted in request.body["topics"]:
            name = wanted["name"]
            code, message = self._grow_topic(name, wanted["count"], wanted["assignments"],
                                             validate_only)
            results.append({"name": name, "error_code": code, "error_message": message})
        return {"results": results}

    def _partition_policy(self, name: str, count: int) -> tuple[int, str] | None:
        """Kafka's create-topic policy, as one documented bound: a topic made or grown
        over the wire has at most create.topic.max.partitions partitions."""
        most = self.broker.config["create.topic.max.partitions"]
        if count <= most:
            return None
        return E.POLICY_VIOLATION, (f"topic {name!r}: {count} partitions is more than "
                                    f"create.topic.max.partitions ({most})")

    def _grow_topic(self, name: str, count: int, assignments: list[dict[str, Any]] | None,
                    validate_only: bool) -> tuple[int, str | None]:
        try:
            topic = self._topic(name)
        except LogkitError as exc:
            return _code_for(exc), str(exc)[:500]
        have = topic.num_partitions
        if not have < count <= MAX_PARTITIONS:
            return E.INVALID_PARTITIONS, (
                f"topic {name!r} has {have} partition(s); the new total must be larger "
                f"and at most {MAX_PARTITIONS}, got {count} (partitions are added, never "
                "removed)")
        # An assignment must place each new partition on this node (the leader) and
        # as many distinct brokers as the topic's replication factor.
        factor = topic.replication_factor
        if assignments is not None and (
                len(assignments) != count - have
                or any(self.node_id not in a["broker_ids"]
                       or len(set(a["broker_ids"])) != factor
                       or len(a["broker_ids"]) != factor for a in assignments)):
            return E.INVALID_REPLICA_ASSIGNMENT, (
                f"an assignment must place each of the {count - have} new partition(s) "
                f"on broker {self.node_id} and {factor - 1} other distinct broker(s)")
        refused = self._partition_policy(name, count)
        if refused is not None:
            return refused
        if validate_only:
            return E.NONE, None
        try:
            self.broker.create_partitions(name, count)
        except ConfigError as exc:          # a racing growth got there first
            return E.INVALID_PARTITIONS, str(exc)[:500]
        except LogkitError as exc:
            return _code_for(exc), str(exc)[:500]
        return E.NONE, None

    def _topic_configs(self, topic: Any) -> list[tuple[str, Any, int]]:
        """(key, value, source) of every config of `topic`, as Kafka's DescribeConfigs
        reports them: DYNAMIC_TOPIC_CONFIG for a key the topic sets (at creation or by
        an alter, even to the default's value), else STATIC_BROKER_CONFIG where this
        broker's config changes the default, else DEFAULT_CONFIG. The values are the
        stored ones (an alter shows at once, though an open log applies it when next
        opened)."""
        defaults = resolve_topic_config(None, self.broker.config)
        builtin = resolve_topic_config(None, resolve_broker_config(None))
        overrides = self._topic_overrides(topic.name)
        stored = self._stored_config(topic, overrides)
        out = []
        for key, value in sorted(stored.items()):
            if key in overrides or value != defaults.get(key, value):
                source = _SOURCE_DYNAMIC_TOPIC
            elif value != builtin.get(key, value):
                source = _SOURCE_STATIC_BROKER
            else:
                source = _SOURCE_DEFAULT
            out.append((key, value, source))
        return out

    def _stored_config(self, topic: Any, overrides: dict[str, Any] | None = None
                       ) -> dict[str, Any]:
        """`topic`'s config as stored now: its overrides over this broker's defaults
        (an open topic's `config` is the one it was opened with)."""
        if overrides is None:
            overrides = self._topic_overrides(topic.name)
        return resolve_topic_config(overrides, self.broker.config) if overrides \
            else dict(topic.config)

    def _topic_overrides(self, name: str) -> dict[str, Any]:
        """The configs topic `name` sets itself, as stored in its metadata record."""
        key = name.encode()
        for found, record in self.broker.meta.items("topics", key):
            if found == key:
                return dict(record.get("config") or {})
        return {}

    def describe_configs(self, request: Request, session: Session) -> dict[str, Any]:
        results = []
        for resource in request.body["resources"]:
            kind, name = resource["resource_type"], resource["resource_name"]
            keys = resource["configuration_keys"]
            try:
                if kind == _RESOURCE_TOPIC:
                    entries = self._topic_configs(self._topic(name))
                elif kind == _RESOURCE_BROKER:
                    builtin = resolve_broker_config(None)
                    entries = [(key, value, _SOURCE_STATIC_BROKER
                                if value != builtin.get(key) else _SOURCE_DEFAULT)
                               for key, value in sorted(self.broker.config.items())]
                else:
                    results.append({"error_code": E.INVALID_REQUEST,
                                    "error_message": f"resource type {kind} is not served",
                                    "resource_type": kind, "resource_name": name,
                                    "configs": []})
                    continue
            except LogkitError as exc:
                results.append({"error_code": _code_for(exc), "error_message": str(exc),
                                "resource_type": kind, "resource_name": name,
                                "configs": []})
                continue
            configs = [{"name": key, "value": _config_text(value), "read_only": False,
                        "config_source": source, "is_default": source == _SOURCE_DEFAULT,
                        "is_sensitive": False,
                        "synonyms": [{"name": key, "value": _config_text(value),
                                      "source": source}]
                        if request.body["include_synonyms"] else [],
                        "config_type": _config_type(key, value), "documentation": None}
                       for key, value, source in entries if keys is None or key in keys]
            results.append({"error_code": E.NONE, "error_message": None,
                            "resource_type": kind, "resource_name": name,
                            "configs": configs})
        return {"results": results}

    def incremental_alter_configs(self, request: Request,
                                  session: Session) -> dict[str, Any]:
        """Change the named topic configs alone (Broker.alter_topic_config): SET a value,
        DELETE back to the default, APPEND to / SUBTRACT from a list config."""
        return self._alter_configs(request, incremental=True)

    def alter_configs(self, request: Request, session: Session) -> dict[str, Any]:
        """Replace a topic's whole config: the keys given are set, every other goes
        back to its default (Kafka's legacy AlterConfigs)."""
        return self._alter_configs(request, incremental=False)

    def _alter_configs(self, request: Request, *, incremental: bool) -> dict[str, Any]:
        validate_only = request.body["validate_only"]
        responses = []
        for resource in request.body["resources"]:
            kind, name = resource["resource_type"], resource["resource_name"]
            if kind == _RESOURCE_TOPIC:
                code, message = self._alter_topic_config(name, resource["configs"],
                                                         incremental, validate_only)
            elif kind == _RESOURCE_BROKER:
                # Kafka answers a broker config change it cannot make INVALID_REQUEST
                # ("Invalid config value for resource ConfigResource(type=BROKER...)")
                code, message = E.INVALID_REQUEST, _STATIC_BROKER
            else:
                code, message = E.INVALID_REQUEST, f"resource type {kind} is not served"
            responses.append({"error_code": code, "error_message": message,
                              "resource_type": kind, "resource_name": name})
        return {"responses": responses}

    def _alter_topic_config(self, name: str, configs: list[dict[str, Any]],
                            incremental: bool, validate_only: bool) -> tuple[int, str | None]:
        try:
            topic = self._topic(name)
            current = self._stored_config(topic)
            if incremental:
                changes = _incremental_changes(current, configs)
            else:
                given = {c["name"]: c["value"] for c in configs}
                changes = {key: None for key in current if key not in given}
                changes.update(given)
            if validate_only:
                merged = {k: v for k, v in current.items() if changes.get(k, v) is not None}
                merged.update({k: v for k, v in changes.items() if v is not None})
                resolve_topic_config(merged, self.broker.config)
            else:
                self.broker.alter_topic_config(name, changes)
                self._forget(name)              # the next use reads the new config
        except LogkitError as exc:
            return _code_for(exc), str(exc)[:500]
        return E.NONE, None

    def delete_records(self, request: Request, session: Session) -> dict[str, Any]:
        """Move each partition's log start up to the offset asked (-1: the high
        watermark), retiring the segments wholly below it as retention does; answer
        the new log start as the low watermark."""
        topics = []
        for t in request.body["topics"]:
            try:
                topic, missing = self._topic(t["name"]), E.NONE
            except LogkitError as exc:
                topic, missing = None, _code_for(exc)
            partitions = []
            for p in t["partitions"]:
                index = p["partition_index"]
                low, code = -1, missing
                if topic is not None and not 0 <= index < topic.num_partitions:
                    code = E.UNKNOWN_TOPIC_OR_PARTITION
                elif topic is not None:
                    low, code = self._delete_records(topic.partition(index), p["offset"])
                partitions.append({"partition_index": index, "low_watermark": low,
                                   "error_code": code})
            topics.append({"name": t["name"], "partitions": partitions})
        return {"topics": topics}

    @staticmethod
    def _delete_records(partition: Any, offset: int) -> tuple[int, int]:
        try:
            high = partition.high_watermark
            if offset == -1:
                offset = high
            if not 0 <= offset <= high:
                return -1, E.OFFSET_OUT_OF_RANGE
            partition.increase_log_start_offset(offset)
            return partition.log_start_offset, E.NONE
        except LogkitError as exc:
            return -1, _code_for(exc)

    # ---- groups --------------------------------------------------------------------

    def _persist_group(self, group_id: str, snapshot: dict[str, Any] | None) -> None:
        meta = self.broker.meta
        key = group_id.encode()

        def write(txn: Any) -> None:
            if snapshot is None:
                txn.delete(key, db=meta.db("members"))
            else:
                meta.put(txn, "members", key, snapshot)
        meta.write(write, operation=f"store the wire members of group {group_id!r}")

    def _embedded_live(self, group_id: str) -> bool:
        """Whether logkit.Consumer members (not wire ones) are live in the group."""
        try:
            wire = {m.member_id for m in wire_members(self.broker.meta, group_id)}
            return any(m.member_id not in wire for m in self.broker.group(group_id).members())
        except LogkitError:
            return False

    def _check_group_id(self, group_id: str) -> int:
        try:
            validate_group_id(group_id)
        except ConfigError:
            return E.INVALID_GROUP_ID
        return E.NONE

    def join_group(self, request: Request, session: Session) -> dict[str, Any]:
        body = request.body
        code = self._check_group_id(body["group_id"])
        if code:
            return {"error_code": code, "member_id": body["member_id"], "leader": "",
                    "protocol_name": "", "members": []}
        return self.groups.join(
            body["group_id"], body["member_id"], request.client_id or "", session.host,
            body["session_timeout_ms"], body["rebalance_timeout_ms"], body["protocol_type"],
            [(p["name"], p["metadata"]) for p in body["protocols"]],
            body.get("group_instance_id"))

    def sync_group(self, request: Request, session: Session) -> dict[str, Any]:
        body = request.body
        return self.groups.sync(body["group_id"], body["generation_id"], body["member_id"],
                                body["assignments"], body.get("group_instance_id"))

    def heartbeat(self, request: Request, session: Session) -> dict[str, Any]:
        body = request.body
        return {"error_code": self.groups.heartbeat(body["group_id"], body["generation_id"],
                                                    body["member_id"],
                                                    body.get("group_instance_id"))}

    def leave_group(self, request: Request, session: Session) -> dict[str, Any]:
        body = request.body
        if request.version >= 3:
            ids = [(m["member_id"], m["group_instance_id"]) for m in body["members"]]
        else:
            ids = [(body["member_id"], None)]
        codes = self.groups.leave(body["group_id"], ids)
        top = codes[0] if request.version < 3 and codes else E.NONE
        return {"error_code": top,
                "members": [{"member_id": m, "group_instance_id": i, "error_code": c}
                            for (m, i), c in zip(ids, codes)]}

    def offset_commit(self, request: Request, session: Session) -> dict[str, Any]:
        body = request.body
        group_id = body["group_id"]
        code = self._check_group_id(group_id) or self.groups.check_commit(
            group_id, body["generation_id"], body["member_id"], body.get("group_instance_id"))
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        errors: dict[tuple[str, int], int] = {}
        if not code:
            for t in body["topics"]:
                try:
                    count = self._topic(t["name"]).num_partitions
                except LogkitError as exc:
                    count, missing = 0, _code_for(exc)
                else:
                    missing = E.UNKNOWN_TOPIC_OR_PARTITION
                for p in t["partitions"]:
                    index = p["partition_index"]
                    if not 0 <= index < count:
                        errors[(t["name"], index)] = missing
                    else:
                        offsets[TopicPartition(t["name"], index)] = OffsetAndMetadata(
                            p["committed_offset"], p["committed_metadata"] or "")
            if offsets:
                try:
                    self._committer(group_id).commit(offsets, member_id=None)
                except CommitFailedError:
                    code = E.ILLEGAL_GENERATION
                except LogkitError as exc:
                    code = _code_for(exc)
        return {"topics": [{"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"],
             "error_code": code or errors.get((t["name"], p["partition_index"]), E.NONE)}
            for p in t["partitions"]]} for t in body["topics"]]}

    def _committer(self, group_id: str) -> GroupCoordinator:
        return GroupCoordinator(self.broker, group_id, strategy="range",
                                session_timeout_ms=0, max_poll_interval_ms=0,
                                client_id="kafka-listener")

    def offset_fetch(self, request: Request, session: Session) -> dict[str, Any]:
        body = request.body
        stable = body["require_stable"]
        if request.version >= 8:
            groups = [{"group_id": g["group_id"], **self._fetch_offsets(
                g["group_id"], g["topics"], flexible_names=True, require_stable=stable)}
                for g in body["groups"]]
            return {"groups": groups}
        result = self._fetch_offsets(body["group_id"], body["topics"], flexible_names=False,
                                     require_stable=stable)
        return {"topics": result["topics"], "error_code": result["error_code"]}

    def _fetch_offsets(self, group_id: str, wanted: list[dict[str, Any]] | None,
                       flexible_names: bool, require_stable: bool = False) -> dict[str, Any]:
        """The group's committed offsets; with `require_stable` (KIP-447) a partition
        with offsets pending in an open transaction answers UNSTABLE_OFFSET_COMMIT and
        offset -1 until the transaction ends (the client retries)."""
        code = self._check_group_id(group_id)
        if code:
            return {"error_code": code, "topics": []}
        try:
            stored = committed_offsets(self.broker.meta, group_id)
            pending = self.broker.transaction_coordinator.pending_offset_partitions(
                group_id) if require_stable else set()
        except LogkitError as exc:
            return {"error_code": _code_for(exc), "topics": []}
        if wanted is None:
            by_topic: dict[str, list[int]] = {}
            for tp in sorted(stored):
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            wanted = [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()]
        topics = []
        for t in wanted:
            partitions = []
            for index in t["partition_indexes"]:
                tp = TopicPartition(t["name"], index)
                om = None if tp in pending else stored.get(tp)
                partitions.append({"partition_index": index,
                                   "committed_offset": -1 if om is None else om.offset,
                                   "committed_leader_epoch": -1,
                                   "metadata": "" if om is None else om.metadata,
                                   "error_code": E.UNSTABLE_OFFSET_COMMIT if tp in pending
                                   else E.NONE})
            topics.append({"name": t["name"], "partitions": partitions})
        return {"error_code": E.NONE, "topics": topics}

    def list_groups(self, request: Request, session: Session) -> dict[str, Any]:
        states = set(request.body["states_filter"])
        wire = {gid: (ptype, state) for gid, ptype, state in self.groups.groups()}
        names = set(wire)
        lister = getattr(self.broker, "groups", None)
        if lister is not None:
            names |= set(lister())
        groups = []
        for gid in sorted(names):
            if gid in wire and wire[gid][1] != "Empty":
                ptype, state = wire[gid]
            else:
                ptype = "consumer"
                state = "Stable" if self.broker.group(gid).members() else "Empty"
            if states and state not in states:
                continue
            groups.append({"group_id": gid, "protocol_type": ptype, "group_state": state,
                           "group_type": "classic"})
        return {"error_code": E.NONE, "groups": groups}

    def delete_groups(self, request: Request, session: Session) -> dict[str, Any]:
        """Delete each group and its committed offsets (ConsumerGroup.delete):
        NON_EMPTY_GROUP while it has live members, wire or embedded;
        GROUP_ID_NOT_FOUND when the broker knows no such group."""
        results = []
        for group_id in request.body["groups_names"]:
            code = self._check_group_id(group_id) or self.groups.delete(
                group_id, lambda gid=group_id: self._delete_group(gid))
            results.append({"group_id": group_id, "error_code": code})
        return {"results": results}

    def _delete_group(self, group_id: str) -> int:
        """Called by the group manager with the wire group known empty and locked."""
        try:
            if group_id not in self.broker.groups():
                return E.GROUP_ID_NOT_FOUND
            self.broker.group(group_id).delete()
        except IllegalStateError:
            return E.NON_EMPTY_GROUP
        except LogkitError as exc:
            return _code_for(exc)
        return E.NONE

    def describe_groups(self, request: Request, session: Session) -> dict[str, Any]:
        out = []
        for group_id in request.body["groups"]:
            code = self._check_group_id(group_id)
            if code:
                out.append({"error_code": code, "group_id": group_id, "group_state": "",
                            "protocol_type": "", "protocol_data": "", "members": []})
                continue
            wire = self.groups.describe(group_id)
            if wire is not None and wire["members"]:
                out.append({"error_code": E.NONE, "group_id": group_id, **wire})
                continue
            members = self.broker.group(group_id).members()
            known = members or group_id in (getattr(self.broker, "groups", list)() or [])
            out.append({
                "error_code": E.NONE, "group_id": group_id,
                "group_state": "Stable" if members else ("Empty" if known else "Dead"),
                "protocol_type": "consumer" if known else "",
                "protocol_data": "",
                "members": [{"member_id": m.member_id, "client_id": m.client_id,
                             "client_host": m.host, "member_metadata": b"",
                             "member_assignment": encode_assignment(
                                 [tuple(tp) for tp in m.assignment])}
                            for m in members]})
        return {"groups": out}


_GROUP_KEYS = (8, 9, 11, 12, 13, 14, 42)      # answered by the group coordinator
_ADMIN_KEYS = (19, 20, 33, 37, 44)             # answered by the controller
_LEADER_ONLY = frozenset(_GROUP_KEYS + _ADMIN_KEYS + (21,))   # 21: by partition leaders


def _not_leading(request: Request) -> dict[str, Any]:
    """The answer of a listener whose broker does not lead (a follower, a fenced old
    leader) to a group or admin request: NOT_COORDINATOR / NOT_CONTROLLER, so the
    client asks FindCoordinator / Metadata again and goes to the leader."""
    key, body, code = request.api.key, request.body, E.NOT_COORDINATOR
    message = "this listener's broker does not lead: ask FindCoordinator again"
    if key == 11:
        return _join_error(code, body["member_id"])
    if key == 14:
        return {"error_code": code, "assignment": b""}
    if key == 12:
        return {"error_code": code}
    if key == 13:
        return {"error_code": code, "members": []}
    if key == 8:
        return {"topics": [{"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"], "error_code": code}
            for p in t["partitions"]]} for t in body["topics"]]}
    if key == 42:
        return {"results": [{"group_id": g, "error_code": code}
                             for g in body["groups_names"]]}
    if key == 21:
        return {"topics": [{"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"], "low_watermark": -1,
             "error_code": E.NOT_LEADER_OR_FOLLOWER} for p in t["partitions"]]}
            for t in body["topics"]]}
    if key == 9:
        if request.version >= 8:
            return {"groups": [{"group_id": g["group_id"], "error_code": code,
                                "topics": []} for g in body["groups"]]}
        return {"topics": [], "error_code": code}
    code, message = E.NOT_CONTROLLER, "this listener's broker does not lead: refresh " \
        "the metadata and ask the controller"
    if key == 19:
        return {"topics": [_create_error(t["name"], code, message) for t in body["topics"]]}
    if key in (33, 44):
        return {"responses": [{"error_code": code, "error_message": message,
                               "resource_type": r["resource_type"],
                               "resource_name": r["resource_name"]}
                              for r in body["resources"]]}
    if key == 20:
        names = [(t["name"], t["topic_id"]) for t in body["topics"]] \
            if request.version >= 6 else [(n, bytes(16)) for n in body["topic_names"]]
        return {"responses": [{"name": n, "topic_id": i, "error_code": code,
                               "error_message": message} for n, i in names]}
    assert key == 37
    return {"results": [{"name": t["name"], "error_code": code, "error_message": message}
                        for t in body["topics"]]}


def _epoch_check(asked: int, ours: int) -> int:
    """Kafka's check of a request's current_leader_epoch (KIP-320): an older one is
    FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH, -1 (not sent) passes."""
    if asked is None or asked < 0 or asked == ours:
        return E.NONE
    return E.FENCED_LEADER_EPOCH if asked < ours else E.UNKNOWN_LEADER_EPOCH


def _produce_result(index: int, code: int, message: str | None = None) -> dict[str, Any]:
    return {"index": index, "error_code": code, "base_offset": -1,
            "log_append_time_ms": -1, "log_start_offset": -1, "error_message": message}


def _merged_fetch_topics(topics: list[dict[str, Any]], by_id: bool
                         ) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """A Fetch's topics with each (topic, partition) once, as Kafka's broker reads the
    request (FetchRequest.fetchData, a LinkedHashMap keyed by topic partition): in the
    order first listed, with the fields of its last listing. A partition listed 72
    times is answered once (docs/kafka-protocol.md)."""
    merged: dict[Any, tuple[dict[str, Any], dict[int, dict[str, Any]]]] = {}
    for fetch_topic in topics:
        key = fetch_topic["topic_id"] if by_id else fetch_topic["topic"]
        entry = merged.get(key)
        if entry is None:
            entry = merged[key] = (fetch_topic, {})
        for wanted in fetch_topic["partitions"]:
            entry[1][wanted["partition"]] = wanted        # a repeat replaces, in place
    return [(fetch_topic, list(wanted.values())) for fetch_topic, wanted in merged.values()]


def _fetch_error(index: int, code: int) -> dict[str, Any]:
    # empty records, not null: Kafka sends empty ones, and librdkafka refuses a null
    # record set as a parse failure
    return {"partition_index": index, "error_code": code, "high_watermark": -1,
            "last_stable_offset": -1, "log_start_offset": -1,
            "aborted_transactions": None, "records": b""}


def _incremental_changes(current: dict[str, Any],
                         configs: list[dict[str, Any]]) -> dict[str, Any]:
    """IncrementalAlterConfigs' operations as Broker.alter_topic_config's changes
    ({key: value, or None for the default}); ConfigError for an operation Kafka refuses
    (APPEND / SUBTRACT on a config that is not a list, an unknown operation)."""
    changes: dict[str, Any] = {}
    for c in configs:
        key, op, value = c["name"], c["config_operation"], c["value"]
        if op == _SET:
            changes[key] = value
        elif op == _DELETE:
            changes[key] = None
        elif op in (_APPEND, _SUBTRACT) and key in _LIST_CONFIGS:
            have = [v for v in str(changes.get(key) or current.get(key) or "").split(",") if v]
            items = [v.strip() for v in (value or "").split(",") if v.strip()]
            kept = [v for v in have if v not in items] if op == _SUBTRACT \
                else have + [v for v in items if v not in have]
            changes[key] = ",".join(kept)
        elif op in (_APPEND, _SUBTRACT):
            raise ConfigError(f"config {key!r} is not a list: APPEND and SUBTRACT apply to "
                              f"list configs only ({', '.join(sorted(_LIST_CONFIGS))})")
        else:
            raise ConfigError(f"unknown config operation {op} for {key!r}")
    return changes


def _create_error(name: str, code: int, message: str) -> dict[str, Any]:
    return {"name": name, "error_code": code, "error_message": message,
            "topic_config_error_code": E.NONE, "num_partitions": -1,
            "replication_factor": -1, "configs": None}


def _check_batch(records: bytes | None) -> tuple[int, str] | None:
    """(error code, message) when a produce payload is not exactly one magic-2 data
    batch whose length field matches; None when it is (its CRC and records are checked
    by the append: `Partition.append_batch`'s verify, `records.validate_batch`)."""
    if records is None or len(records) < BATCH_HEADER_BYTES:
        return E.CORRUPT_MESSAGE, "the records are shorter than a record batch header"
    if records[_MAGIC_AT] != 2:
        return (E.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                f"record batch magic {records[_MAGIC_AT]}: only magic 2 is stored")
    size = _LENGTH.unpack_from(records, 8)[0] + 12
    if size < len(records):
        return E.INVALID_RECORD, "a produce request carries one record batch per partition"
    if size > len(records):
        return E.CORRUPT_MESSAGE, "the batch length field points past the records"
    if _ATTRIBUTES.unpack_from(records, _ATTRIBUTES_AT)[0] & _CONTROL:
        return E.INVALID_RECORD, "clients may not write control batches"
    return None
