"""The exception tree: every operating error logkit raises is a `LogkitError`.

Owns: the names users catch. Invariant: library code raises one of these for bad input,
bad bytes and bad states; `assert` is kept for programmer errors inside logkit.
"""

from __future__ import annotations

__all__ = [
    "LogkitError", "ConfigError", "InvalidTopicError", "TopicExistsError",
    "UnknownTopicError", "OffsetOutOfRangeError", "CorruptRecordError",
    "RecordTooLargeError", "CommitFailedError", "NotEnoughReplicasError",
    "LogkitTimeoutError", "ClosedError", "CodecUnavailableError",
    "IncompatibleFormatError", "NoOffsetForPartitionError", "IllegalStateError",
    "StorageError", "DiskFullError", "MetadataStoreError", "ForkedProcessError",
    "ReadOnlyError", "SerializationError", "storage_error", "ArgumentTypeError",
    "ResourceError", "InvalidRecordError", "UnsupportedCompressionTypeError",
    "ProducerFencedError", "InvalidTxnStateError", "InvalidProducerIdMappingError",
    "InvalidTransactionTimeoutError", "ConcurrentTransactionsError",
    "TransactionalIdNotFoundError", "TransactionAbortedError",
]

import errno as _errno


class LogkitError(Exception):
    """Base of every error logkit raises on purpose."""


class ConfigError(LogkitError, ValueError):
    """An unknown config key, or a value of the wrong type or out of range."""


class ArgumentTypeError(ConfigError, TypeError):
    """A client call's argument of the wrong type (`poll(timeout_ms="100")`): a
    `ConfigError` that is also the `TypeError` Python raises for one."""


class InvalidTopicError(LogkitError, ValueError):
    """A topic name outside Kafka's rule: [a-zA-Z0-9._-], 1-249 chars, not '.' or '..'."""


class TopicExistsError(LogkitError):
    """create_topic() on a name that already exists."""


class UnknownTopicError(LogkitError):
    """A topic (or partition) that does not exist."""


class OffsetOutOfRangeError(LogkitError):
    """A read or seek outside [log_start_offset, log_end_offset]."""


class CorruptRecordError(LogkitError):
    """Stored bytes failed validation. Carries the file path and byte position."""

    def __init__(self, message: str, *, path: str = "", position: int = -1,
                 expected: object = None, actual: object = None) -> None:
        detail = message
        if path:
            detail += f" (file {path}, position {position}"
            if expected is not None or actual is not None:
                detail += f", expected {expected!r}, actual {actual!r}"
            detail += ")"
        super().__init__(detail)
        self.path = path
        self.position = position
        self.expected = expected
        self.actual = actual


class InvalidRecordError(CorruptRecordError):
    """A batch whose CRC is right but whose contents lie (Kafka's InvalidRecordException,
    INVALID_RECORD on the wire): a records count or lastOffsetDelta that disagrees with
    the records, a record's framing, offset deltas out of order, impossible timestamps,
    a control batch from a client. Refused before anything is written. A
    `CorruptRecordError`, so code that catches bad batches catches these too."""


class UnsupportedCompressionTypeError(InvalidRecordError):
    """A batch whose attributes name a codec Kafka does not define (5, 6 or 7):
    UNSUPPORTED_COMPRESSION_TYPE on the wire."""


class RecordTooLargeError(LogkitError):
    """A record or batch bigger than max.message.bytes (or the producer's limit)."""


class CommitFailedError(LogkitError):
    """An offset commit from a stale generation or for a partition not assigned."""


class NotEnoughReplicasError(LogkitError):
    """acks='all' with fewer in-sync replicas than min.insync.replicas."""


class LogkitTimeoutError(LogkitError, TimeoutError):
    """A bounded wait ran out (Kafka's KafkaTimeoutError)."""


class ClosedError(LogkitError):
    """An operation on a closed broker, producer or consumer."""


class CodecUnavailableError(LogkitError):
    """A compression codec whose Python package is not installed; names the package."""


class IncompatibleFormatError(LogkitError):
    """logkit.json names a format major version this build cannot read."""


class NoOffsetForPartitionError(LogkitError):
    """auto_offset_reset='none' and the group has no committed offset for a partition."""


class IllegalStateError(LogkitError):
    """A client call that the client's current state does not allow."""


class StorageError(LogkitError):
    """An I/O operation on the broker's files failed. Names the operation and the path;
    the `OSError` (or LMDB error) that caused it is kept as `__cause__`. What was
    acknowledged before stays acknowledged; a failed append or commit stored nothing.
    (A `delete_topic` that fails after its first step is finished at the next open:
    deletions are completed, never undone.)"""

    def __init__(self, message: str, *, operation: str = "", path: str = "",
                 errno: int | None = None) -> None:
        super().__init__(message)
        self.operation = operation
        self.path = path
        self.errno = errno


class DiskFullError(StorageError):
    """ENOSPC or EDQUOT: the filesystem (or the quota) is full. Free space and retry."""


class MetadataStoreError(StorageError):
    """The LMDB metadata store under `<root>/meta` failed or is unusable."""


class ForkedProcessError(LogkitError):
    """A Broker (or a client, topic or partition from it) used in a process forked after
    it was opened. Open a new `logkit.Broker(path)` in the child instead."""


class ResourceError(LogkitError, RuntimeError):
    """The process could not get something logkit needs that is not disk space: a
    thread could not be started (the process is at its thread limit, RLIMIT_NPROC, or
    out of memory). Nothing was stored by the call that raised it. Also a RuntimeError,
    what Python itself raises there."""


class ReadOnlyError(LogkitError):
    """A write through a Broker opened with `read_only=True`."""


class NotLeaderError(LogkitError):
    """A write to a broker that is not the leader of its replica set: another replica
    holds the lease in a newer epoch, its own lease was not renewed in time, or a
    promotion found another holder's lease still valid (docs/replication.md)."""


class SerializationError(LogkitError, ValueError):
    """A value that does not match its schema (`field`: the dotted path), or stored bytes
    that do not decode (unknown magic byte or schema id). `topic`, `partition` and
    `offset` say where, when known (a consumer fills partition and offset)."""

    def __init__(self, message: str, *, topic: str | None = None,
                 partition: int | None = None, offset: int | None = None,
                 field: str | None = None) -> None:
        where = [f"{name} {value}" for name, value in (("topic", topic),
                 ("partition", partition), ("offset", offset)) if value is not None]
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.message = message
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.field = field

    def at(self, topic: str, partition: int, offset: int) -> "SerializationError":
        """The same error naming where the bytes were read (the consumer raises this,
        `from` the original)."""
        return SerializationError(self.message, topic=topic, partition=partition,
                                  offset=offset, field=self.field)


# ---- transactions (docs/design.md §15): each carries Kafka's wire error code ---------------

class ProducerFencedError(LogkitError):
    """A transactional producer whose epoch is older than its transactional id's: another
    producer called `init_transactions()` with the same id, or the coordinator aborted
    its transaction at `transaction.timeout.ms` (Kafka's ProducerFencedException). The
    producer cannot go on; close it and make a new one."""

    error_code = 90                      # PRODUCER_FENCED


class InvalidTxnStateError(LogkitError):
    """A transactional call out of order: `send` on a transactional producer outside a
    transaction, `commit_transaction()` without `begin_transaction()`, a transaction
    API for a transactional id in a state that does not allow it (Kafka's
    INVALID_TXN_STATE)."""

    error_code = 48


class InvalidProducerIdMappingError(LogkitError):
    """A transactional call whose producer id is not the one the transactional id holds
    (Kafka's INVALID_PRODUCER_ID_MAPPING)."""

    error_code = 49


class InvalidTransactionTimeoutError(ConfigError):
    """`transaction_timeout_ms` outside 1..transaction.max.timeout.ms (Kafka's
    INVALID_TRANSACTION_TIMEOUT)."""

    error_code = 50


class ConcurrentTransactionsError(LogkitError):
    """The transactional id's previous transaction is still being completed (Kafka's
    retriable CONCURRENT_TRANSACTIONS)."""

    error_code = 51


class TransactionalIdNotFoundError(LogkitError):
    """No transaction state is stored for this transactional id (Kafka's
    TRANSACTIONAL_ID_NOT_FOUND)."""

    error_code = 105


TransactionalIdNotFound = TransactionalIdNotFoundError     # the name eos-api.md uses


class TransactionAbortedError(LogkitError):
    """`commit_transaction()` of a transaction one of whose sends failed (Kafka's
    abortable error): nothing of it is committed; call `abort_transaction()`, then
    begin again. The failed send's error is the cause."""


class OutOfOrderSequenceError(LogkitError):
    """An idempotent producer's batch whose sequence number does not follow the last
    batch the partition stored for that producer id and epoch (a gap, or a new epoch not
    starting at 0): Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER. Nothing of it is stored."""

    error_code = 45


class InvalidProducerEpochError(LogkitError):
    """A batch or transaction marker whose producer epoch is below the latest the
    partition has seen for that producer id (a zombie): Kafka's INVALID_PRODUCER_EPOCH."""

    error_code = 47


def storage_error(exc: OSError, operation: str, path: str = "") -> StorageError:
    """The named error for an OSError raised by `operation` on `path`; raise it `from`
    the OSError so the cause is kept."""
    path = path or (exc.filename if isinstance(exc.filename, str) else "")
    code = exc.errno
    cls = DiskFullError if code in (_errno.ENOSPC, _errno.EDQUOT) else StorageError
    reason = exc.strerror or str(exc)
    return cls(f"{operation} failed on {path or '?'}: {reason}", operation=operation,
               path=path, errno=code)
