"""The transaction APIs on the wire (KIP-98, KIP-447, KIP-890 part 1) over the broker's one
transaction coordinator (`broker.transaction_coordinator`, logkit/transactions.py), the
object embedded producers use too: one namespace of transactional ids, one state.

Owns: InitProducerId, AddPartitionsToTxn (v0-3 one transaction, v4 batched and
verify-only), AddOffsetsToTxn, EndTxn, TxnOffsetCommit (the KIP-447 generation and
member checks), ListTransactions, DescribeTransactions, DescribeProducers (KIP-664: a
partition's producers as its log's producer state holds them), the verification of a
transactional Produce (its partition must have been added), and Kafka's error code for
each coordinator error (`txn_code`). The coordinator decides; this module only reads
requests into its calls and its answers and errors into Kafka's fields.

Invariant: a request's answer has one entry per partition (or transactional id) it
named, in its order; a coordinator error answers every partition of its call alike,
as Kafka's coordinator does. Nothing here keeps state between requests.

Thread-safety: any connection thread may call; the coordinator serialises.
"""

from __future__ import annotations

import logging
import struct
import time
from typing import Any, Callable, Iterable

from ..errors import (CommitFailedError, ConcurrentTransactionsError,
                      InvalidProducerEpochError,
                      InvalidProducerIdMappingError, InvalidTransactionTimeoutError,
                      InvalidTxnStateError, LogkitError, NotLeaderError,
                      OutOfOrderSequenceError,
                      ProducerFencedError, TransactionalIdNotFoundError)
from ..records import (ATTR_TRANSACTIONAL, ATTRIBUTES_OFFSET, PRODUCER_ID_OFFSET,
                       RECORDS_OFFSET)
from ..topic import TopicPartition
from . import errors as E

__all__ = ["TxnHandlers", "txn_code", "STATES"]

log = logging.getLogger(__name__)

# Kafka's transaction state names (TransactionState.java), the ones ListTransactions
# filters on; any other filter is answered back in unknown_state_filters.
STATES = frozenset({"Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit",
                    "CompleteAbort", "PrepareEpochFence", "Dead"})
PRODUCER_FENCED_MIN_VERSION = {22: 4, 24: 2, 25: 2, 26: 2}   # older: INVALID_PRODUCER_EPOCH
_BY_PRODUCER = frozenset({0, 24, 25, 26, 28})     # the APIs a producer id calls
_BATCH_PRODUCER = struct.Struct(">qh")             # producerId, producerEpoch
_ATTRIBUTES = struct.Struct(">h")


def txn_code(exc: BaseException, api_key: int = -1, version: int = 1 << 15) -> int | None:
    """Kafka's error code for a coordinator or producer-state error: the `error_code`
    each transaction error of logkit/errors.py carries, except that a fenced producer
    is PRODUCER_FENCED only from the versions that know it (older ones get
    INVALID_PRODUCER_EPOCH, Kafka's rule); None for any other error."""
    if isinstance(exc, ProducerFencedError) \
            and version < PRODUCER_FENCED_MIN_VERSION.get(api_key, 0):
        return E.INVALID_PRODUCER_EPOCH
    if isinstance(exc, TransactionalIdNotFoundError) and api_key in _BY_PRODUCER:
        return E.INVALID_PRODUCER_ID_MAPPING   # Kafka's answer to an id it never saw
    if isinstance(exc, _CODED):
        return exc.error_code
    return None


_CODED = (ProducerFencedError, InvalidTxnStateError, InvalidProducerIdMappingError,
          InvalidTransactionTimeoutError, ConcurrentTransactionsError,
          TransactionalIdNotFoundError, OutOfOrderSequenceError, InvalidProducerEpochError)


class TxnHandlers:
    """The transaction APIs of one listener; `broker` is read anew on every call (a
    promoted follower's listener swaps it, handlers.Handlers.lead)."""

    def __init__(self, handlers: Any, code_for: Callable[[BaseException], int]) -> None:
        self._handlers = handlers
        self._code_for = code_for          # handlers._code_for: every other broker error

    def code(self, exc: BaseException, api_key: int, version: int) -> int:
        if isinstance(exc, NotLeaderError):
            return E.NOT_COORDINATOR      # the client asks FindCoordinator again
        if isinstance(exc, CommitFailedError):
            return E.ILLEGAL_GENERATION   # KIP-447's check of an embedded group's member
        code = txn_code(exc, api_key, version)
        return self._code_for(exc) if code is None else code

    @property
    def coordinator(self) -> Any:
        """The broker's transaction coordinator; NotLeaderError on a listener whose
        broker does not lead (a follower's metadata store is the leader's copy)."""
        if not self._handlers.view.leads():
            raise NotLeaderError("this listener's broker does not lead: ask "
                                 "FindCoordinator again")
        return self._handlers.broker.transaction_coordinator

    # ---- InitProducerId --------------------------------------------------------------

    def init_producer_id(self, request: Any, session: Any) -> dict[str, Any]:
        body = request.body
        txn_id = body["transactional_id"]
        if txn_id == "":
            return _init_answer(E.INVALID_REQUEST)
        try:
            producer_id, epoch = self.coordinator.init_producer_id(
                txn_id, body["transaction_timeout_ms"], producer_id=body["producer_id"],
                producer_epoch=body["producer_epoch"])
        except LogkitError as exc:
            log.debug("InitProducerId %r refused: %s", txn_id, exc)
            return _init_answer(self.code(exc, 22, request.version))
        return {"error_code": E.NONE, "producer_id": producer_id, "producer_epoch": epoch}

    # ---- AddPartitionsToTxn ----------------------------------------------------------

    def add_partitions_to_txn(self, request: Any, session: Any) -> dict[str, Any]:
        body, version = request.body, request.version
        if version >= 4:
            return {"error_code": E.NONE, "results_by_transaction": [
                {"transactional_id": t["transactional_id"],
                 "topic_results": self._add_partitions(
                     t["transactional_id"], t["producer_id"], t["producer_epoch"],
                     t["topics"], t["verify_only"], version)}
                for t in body["transactions"]]}
        return {"results_by_topic_v3_and_below": self._add_partitions(
            body["v3_and_below_transactional_id"], body["v3_and_below_producer_id"],
            body["v3_and_below_producer_epoch"], body["v3_and_below_topics"], False, version)}

    def _add_partitions(self, txn_id: str, producer_id: int, epoch: int,
                        topics: list[dict[str, Any]], verify_only: bool,
                        version: int) -> list[dict[str, Any]]:
        """Kafka's order: partitions of unknown topics are UNKNOWN_TOPIC_OR_PARTITION and
        then the others OPERATION_NOT_ATTEMPTED (nothing is added); else the coordinator
        adds them all or none. verify_only answers each partition on its own: NONE when
        it is in the producer's open transaction, INVALID_TXN_STATE when not."""
        wanted = [(t["name"], p) for t in topics for p in t["partitions"]]
        codes = {tp: self._partition_exists(*tp) for tp in wanted}
        if any(codes.values()):
            codes = {tp: c or E.OPERATION_NOT_ATTEMPTED for tp, c in codes.items()}
        elif verify_only:
            codes = {tp: self._verify(txn_id, producer_id, epoch, TopicPartition(*tp),
                                      24, version) for tp in wanted}
        else:
            code = E.NONE
            try:
                self.coordinator.add_partitions(
                    txn_id, producer_id, epoch, [TopicPartition(*tp) for tp in wanted])
            except LogkitError as exc:
                log.debug("AddPartitionsToTxn %r refused: %s", txn_id, exc)
                code = self.code(exc, 24, version)
            codes = dict.fromkeys(wanted, code)
        return _topic_results(topics, lambda name, p: codes[(name, p)])

    def _verify(self, txn_id: str, producer_id: int, epoch: int, tp: TopicPartition,
                api_key: int, version: int) -> int:
        """NONE when `tp` is in the open transaction of (producer_id, epoch); else
        INVALID_PRODUCER_EPOCH for an older epoch of the id's producer (a zombie),
        PRODUCER_FENCED / INVALID_PRODUCER_EPOCH by version for Kafka's fencing
        rule, INVALID_TXN_STATE otherwise (no open transaction, or not added)."""
        try:
            coordinator = self.coordinator
            if not coordinator.add_partitions(txn_id, producer_id, epoch, [tp],
                                              verify_only=True):
                return E.NONE
            held = coordinator.describe_transactions([txn_id])[0]
        except LogkitError as exc:
            return self.code(exc, api_key, version)
        if held.producer_id == producer_id and epoch < held.producer_epoch:
            return E.INVALID_PRODUCER_EPOCH if api_key == 0 else self.code(
                ProducerFencedError(txn_id), api_key, version)
        return E.INVALID_TXN_STATE

    def _partition_exists(self, topic: str, partition: int) -> int:
        try:
            count = self._handlers.broker.topic(topic).num_partitions
        except LogkitError:
            return E.UNKNOWN_TOPIC_OR_PARTITION
        return E.NONE if 0 <= partition < count else E.UNKNOWN_TOPIC_OR_PARTITION

    def verify_produce(self, txn_id: str, batch: bytes | None, topic: Any, index: int,
                       version: int) -> int:
        """Kafka's produce-side verification (KIP-890 part 1): a transactional batch is
        written only into a partition its producer added to its open transaction, with
        the transaction's producer id and epoch; else INVALID_TXN_STATE (or the fencing
        error), and nothing is written. A partition whose log already holds an open
        transaction of the producer passes without asking the coordinator, as Kafka's
        verification guard lets the rest of a verified transaction through: its first
        batch was verified, and the transaction's end (a marker, which every fencing
        abort writes with a bumped epoch) closes it in the log before anything else
        may begin there. A transaction whose EndTxn was answered but whose markers are
        still queued is asked about (it is Prepare*: INVALID_TXN_STATE)."""
        if batch is None or len(batch) < RECORDS_OFFSET:
            return E.NONE                  # refused whole by the produce path's checks
        producer_id, epoch = _BATCH_PRODUCER.unpack_from(batch, PRODUCER_ID_OFFSET)
        attributes = _ATTRIBUTES.unpack_from(batch, ATTRIBUTES_OFFSET)[0]
        if not attributes & ATTR_TRANSACTIONAL:
            return E.NONE                  # an idempotent batch: no transaction to check
        try:
            open_here = producer_id in topic.partition(index).open_transactions()
        except LogkitError:
            return E.NONE                  # answered by the produce path, which meets it too
        if open_here and not self._handlers.broker.transaction_coordinator.completing(
                producer_id):
            return E.NONE
        return self._verify(txn_id, producer_id, epoch, TopicPartition(topic.name, index),
                            0, version)

    # ---- AddOffsetsToTxn / EndTxn ----------------------------------------------------

    def add_offsets_to_txn(self, request: Any, session: Any) -> dict[str, Any]:
        body = request.body
        code = self._call(25, request.version, lambda: self.coordinator.add_offsets(
            body["transactional_id"], body["producer_id"], body["producer_epoch"],
            body["group_id"]))
        return {"error_code": code}

    def end_txn(self, request: Any, session: Any) -> dict[str, Any]:
        """Answered once PrepareCommit/PrepareAbort is durable, as Kafka answers; the
        markers, offsets and CompleteX follow on the coordinator's completion thread,
        and the id's next call completes or waits for them (logkit/transactions.py)."""
        body = request.body
        code = self._call(26, request.version, lambda: self.coordinator.end_txn(
            body["transactional_id"], body["producer_id"], body["producer_epoch"],
            body["committed"], wait=False))
        return {"error_code": code}

    def _call(self, api_key: int, version: int, call: Callable[[], Any]) -> int:
        """NONE when `call()` (the coordinator met inside it, so a listener that does
        not lead answers NOT_COORDINATOR) returns, else Kafka's code for its error."""
        try:
            call()
        except LogkitError as exc:
            log.debug("api %d refused: %s", api_key, exc)
            return self.code(exc, api_key, version)
        return E.NONE

    # ---- TxnOffsetCommit -------------------------------------------------------------

    def txn_offset_commit(self, request: Any, session: Any) -> dict[str, Any]:
        """The offsets wait in the transaction until its commit (then they are the
        group's committed offsets) or its abort (dropped). KIP-447: a member id or a
        generation given is checked against the group as Kafka's group coordinator
        checks it (groups.GroupManager.check_txn_commit)."""
        body = request.body
        group_id = body["group_id"]
        code = self._handlers._check_group_id(group_id) or \
            self._handlers.groups.check_txn_commit(group_id, body["generation_id"],
                                                    body["member_id"],
                                                    body["group_instance_id"])
        most = self._handlers.broker.config["offset.metadata.max.bytes"]
        codes: dict[tuple[str, int], int] = {}
        offsets: dict[TopicPartition, tuple[int, str | None]] = {}
        for t in body["topics"]:
            for p in t["partitions"]:
                tp = (t["name"], p["partition_index"])
                metadata = (p["committed_metadata"] or "").encode("utf-8", "surrogatepass")
                codes[tp] = code or self._partition_exists(*tp) or (
                    E.OFFSET_METADATA_TOO_LARGE if len(metadata) > most else E.NONE)
                if not codes[tp]:
                    offsets[TopicPartition(*tp)] = (p["committed_offset"],
                                                    p["committed_metadata"])
        if offsets:
            found = self._call(28, request.version,
                               lambda: self._commit_offsets(body, offsets))
            if found:
                codes = {tp: c or found for tp, c in codes.items()}
        return {"topics": _offset_results(body["topics"],
                                          lambda name, p: codes[(name, p)])}

    def _commit_offsets(self, body: dict[str, Any],
                        offsets: dict[TopicPartition, tuple[int, str | None]]) -> None:
        self.coordinator.txn_offset_commit(
            body["transactional_id"], body["producer_id"], body["producer_epoch"],
            body["group_id"], offsets, generation_id=body["generation_id"],
            member_id=body["member_id"], group_instance_id=body["group_instance_id"])

    # ---- ListTransactions / DescribeTransactions -------------------------------------

    def list_transactions(self, request: Any, session: Any) -> dict[str, Any]:
        try:
            return self._list_transactions(request.body)
        except LogkitError as exc:
            return {"error_code": self.code(exc, 66, request.version),
                    "unknown_state_filters": [], "transaction_states": []}

    def _list_transactions(self, body: dict[str, Any]) -> dict[str, Any]:
        filters = body["state_filters"]
        unknown = [s for s in filters if s not in STATES]
        known = tuple(s for s in filters if s in STATES)
        if filters and not known:
            listings = []              # only unknown states asked: nothing matches
        else:
            listings = self.coordinator.list_transactions(
                states=known, producer_ids=tuple(body["producer_id_filters"]))
        duration_ms = body["duration_filter"]
        if duration_ms >= 0 and listings:
            oldest = int(time.time() * 1000) - duration_ms
            started = {x.transactional_id: self._started_ms(x.transactional_id)
                       for x in listings}
            listings = [x for x in listings
                        if 0 <= started.get(x.transactional_id, -1) <= oldest]
        return {"error_code": E.NONE, "unknown_state_filters": unknown,
                "transaction_states": [
                    {"transactional_id": x.transactional_id, "producer_id": x.producer_id,
                     "transaction_state": x.state} for x in listings]}

    def _started_ms(self, txn_id: str) -> int:
        try:
            return self.coordinator.describe_transactions([txn_id])[0].transaction_start_ms
        except TransactionalIdNotFoundError:
            return -1                      # gone meanwhile

    def describe_transactions(self, request: Any, session: Any) -> dict[str, Any]:
        """Each id on its own: an unknown one is TRANSACTIONAL_ID_NOT_FOUND, the others
        are described (Kafka's answer, one entry per id asked)."""
        out = []
        for txn_id in request.body["transactional_ids"]:
            try:
                found = self.coordinator.describe_transactions([txn_id])[0]
            except LogkitError as exc:
                out.append(_description(txn_id, None, self.code(exc, 65, request.version)))
            else:
                out.append(_description(txn_id, found))
        return {"transaction_states": out}

    # ---- DescribeProducers -----------------------------------------------------------

    def describe_producers(self, request: Any, session: Any) -> dict[str, Any]:
        """Each partition asked, in order: its producers from the local log's producer
        state (any listener answers, as any Kafka replica with the log does), or the
        partition's error code (UNKNOWN_TOPIC_OR_PARTITION for a topic or partition this
        broker lacks, INVALID_TOPIC_EXCEPTION for a bad name)."""
        return {"topics": [
            {"name": t["name"], "partitions": [self._producers_of(t["name"], index)
                                               for index in t["partition_indexes"]]}
            for t in request.body["topics"]]}

    def _producers_of(self, name: str, index: int) -> dict[str, Any]:
        try:
            active = self._handlers.broker.topic(name).partition(index).active_producers()
        except LogkitError as exc:
            return {"partition_index": index, "error_code": self._code_for(exc),
                    "error_message": None, "active_producers": []}
        # ActiveProducer's fields are the response's, in its order and with its names
        return {"partition_index": index, "error_code": E.NONE, "error_message": None,
                "active_producers": [p._asdict() for p in active]}


def _description(txn_id: str, d: Any,
                 code: int = E.TRANSACTIONAL_ID_NOT_FOUND) -> dict[str, Any]:
    if d is None:
        return {"error_code": code or E.TRANSACTIONAL_ID_NOT_FOUND, "transactional_id": txn_id,
                "transaction_state": "", "transaction_timeout_ms": 0,
                "transaction_start_time_ms": -1, "producer_id": -1, "producer_epoch": -1,
                "topics": []}
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(d.partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return {"error_code": E.NONE, "transactional_id": txn_id,
            "transaction_state": d.state,
            "transaction_timeout_ms": d.transaction_timeout_ms,
            "transaction_start_time_ms": d.transaction_start_ms,
            "producer_id": d.producer_id, "producer_epoch": d.producer_epoch,
            "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]}


def _init_answer(code: int) -> dict[str, Any]:
    return {"error_code": code, "producer_id": -1, "producer_epoch": -1}


def _topic_results(topics: Iterable[dict[str, Any]],
                   code: Callable[[str, int], int]) -> list[dict[str, Any]]:
    return [{"name": t["name"], "results_by_partition": [
        {"partition_index": p, "partition_error_code": code(t["name"], p)}
        for p in t["partitions"]]} for t in topics]


def _offset_results(topics: Iterable[dict[str, Any]],
                    code: Callable[[str, int], int]) -> list[dict[str, Any]]:
    return [{"name": t["name"], "partitions": [
        {"partition_index": p["partition_index"],
         "error_code": code(t["name"], p["partition_index"])}
        for p in t["partitions"]]} for t in topics]

