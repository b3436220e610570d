"""logkit: Apache Kafka's log semantics as an embeddable Python library.

The public API is exactly what this module exports (docs/design.md §6). Everything else in the
package is private and may change.
"""

from .batches import BatchBuilder, SegmentBatch, iter_segment_batches, stamp_producer
from . import broker as _broker
from .broker import Broker
from .config import resolve_config
from .columns import Columns
from .consumer import Consumer, ConsumerGroupMetadata, OffsetAndTimestamp
from .group import ConsumerGroup, MemberInfo, OffsetAndMetadata
from .producer import FutureRecordMetadata, Producer
from .errors import (ClosedError, CodecUnavailableError, CommitFailedError, ConfigError,
                     CorruptRecordError, IllegalStateError, IncompatibleFormatError,
                     InvalidTopicError, LogkitError, LogkitTimeoutError,
                     NoOffsetForPartitionError, NotEnoughReplicasError,
                     OffsetOutOfRangeError, RecordTooLargeError, TopicExistsError,
                     UnknownTopicError, StorageError, DiskFullError, MetadataStoreError,
                     ForkedProcessError, ReadOnlyError, SerializationError,
                     ArgumentTypeError, NotLeaderError, ResourceError, InvalidRecordError,
                     UnsupportedCompressionTypeError, ProducerFencedError,
                     InvalidTxnStateError, InvalidProducerIdMappingError,
                     InvalidTransactionTimeoutError, ConcurrentTransactionsError,
                     TransactionalIdNotFoundError, TransactionAbortedError,
                     OutOfOrderSequenceError, InvalidProducerEpochError)
from .transactions import TransactionCoordinator, TxnDescription, TxnListing
from .mirroring import mirror, mirror_from
from .murmur2 import murmur2
from .log import RecoveryReport
from .cleaner import CleanReport
from .log_read import Fetched
from .records import BatchHeader, Record, RecordMetadata
from .topic import Partition, Topic, TopicPartition
from .replication import DirectorySource, Follower, ReplicaSource, TcpSource
from .replication.objectstore import ObjectStoreSource
from . import shipped
import typing as _typing

# How a broker starts the servers that live above it (broker.py's table): this module is
# the top of the package, so it may name every part; each server module is imported only
# when a broker first starts one.
def _start_kafka(broker: Broker, **options: object) -> object:
    from .protocol import serve
    return serve(broker, **options)


def _start_replication(broker: Broker, *args: object, **options: object) -> object:
    from .replication.tcp_server import ReplicationServer
    return ReplicationServer(broker, *args, **options)


def _start_schema_registry(registry: object, **options: object) -> object:
    from .registry_http import serve
    return serve(registry, **options)


def _start_shipper(broker: Broker, url: str, **options: object) -> object:
    from .replication.objectstore import Shipper
    return Shipper(broker, url, **options)


def _start_rest(broker: Broker, **options: object) -> object:
    from .rest import serve
    return serve(broker, **options)


_broker.register_server("kafka", _start_kafka)
_broker.register_server("replication", _start_replication)
_broker.register_server("schema-registry", _start_schema_registry)
_broker.register_server("shipper", _start_shipper)
_broker.register_server("rest", _start_rest)

# The public submodules DESIGN names as `logkit.aio`, `logkit.testing`, `logkit.serde`:
# loaded on first use (PEP 562), so `import logkit` alone loads none of them (nor asyncio)
# and `logkit.aio.AIOProducer` works after it whatever else was imported.
_LAZY_SUBMODULES = frozenset({"aio", "testing", "serde"})


def __getattr__(name: str) -> _typing.Any:
    if name in _LAZY_SUBMODULES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "Broker", "Topic", "Partition", "TopicPartition", "Record", "RecordMetadata",
    "CleanReport", "Fetched", "shipped",
    "Producer", "FutureRecordMetadata", "Consumer", "OffsetAndTimestamp", "ConsumerGroup",
    "ConsumerGroupMetadata",
    "MemberInfo", "OffsetAndMetadata", "murmur2", "resolve_config", "mirror", "mirror_from",
    "Columns", "BatchHeader", "RecoveryReport", "BatchBuilder", "stamp_producer",
    "SegmentBatch", "iter_segment_batches", "Follower", "ReplicaSource", "DirectorySource",
    "TcpSource", "ObjectStoreSource",
    "LogkitError", "ConfigError", "InvalidTopicError", "TopicExistsError",
    "UnknownTopicError", "OffsetOutOfRangeError", "CorruptRecordError",
    "RecordTooLargeError", "CommitFailedError", "NotEnoughReplicasError",
    "LogkitTimeoutError", "ClosedError", "CodecUnavailableError",
    "IncompatibleFormatError", "NoOffsetForPartitionError", "IllegalStateError",
    "StorageError", "DiskFullError", "MetadataStoreError", "ForkedProcessError",
    "ReadOnlyError", "SerializationError", "ArgumentTypeError", "NotLeaderError",
    "InvalidRecordError", "UnsupportedCompressionTypeError",
    "ProducerFencedError", "InvalidTxnStateError", "InvalidProducerIdMappingError",
    "InvalidTransactionTimeoutError", "ConcurrentTransactionsError",
    "TransactionalIdNotFoundError", "TransactionAbortedError",
    "OutOfOrderSequenceError", "InvalidProducerEpochError",
    "TransactionCoordinator", "TxnDescription", "TxnListing",
    "ResourceError",
]
