"""The Kafka APIs the listener speaks: one table row per API key, with the versions we
accept and the request and response schemas in Kafka's own version notation.

Owns: `APIS` (api key -> `Api`), the request and response header schemas, and which
header version each (api, version) uses. Field names are Kafka's, in snake_case; the
schemas follow Kafka's message definitions field for field (tests/protocol/test_protocol_codec.py
checks each one against kafka-python's independent implementation, every version).

Version policy (docs/kafka-protocol.md): minimums as low as Kafka 3.x accepts, so a client
that picks min(its maximum, ours) without reading our minimum still lands in range;
maximums high enough that aiokafka, kafka-python 3 and librdkafka 2 each negotiate their
own newest version. Produce is advertised from v0 (librdkafka keeps compression on only
when it sees v0-2 offered) but v0-2 bodies carry pre-v2 message sets, which are refused
per partition. Fetch starts at v4, the first that returns magic-2 batches unconverted.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from .schema import Array, Struct, field as f, versions

__all__ = ["Api", "APIS", "REQUEST_HEADER", "RESPONSE_HEADER", "API_VERSIONS_KEY"]

log = logging.getLogger(__name__)


class Api(NamedTuple):
    key: int
    name: str
    min_version: int
    max_version: int
    flexible: tuple[int, int] | None     # versions with compact encodings and tags
    request: Struct
    response: Struct

    def is_flexible(self, version: int) -> bool:
        return self.flexible is not None and self.flexible[0] <= version <= self.flexible[1]


# Request header v1 (v0 lacks client_id, which no client we serve sends); v2 adds tagged
# fields. The client id stays a classic nullable string even in v2.
REQUEST_HEADER = Struct(
    f("request_api_key", "int16"),
    f("request_api_version", "int16"),
    f("correlation_id", "int32"),
    f("client_id", "string", null="0+"),
)
RESPONSE_HEADER = Struct(f("correlation_id", "int32"))
API_VERSIONS_KEY = 18

_BROKER = Struct(f("node_id", "int32"), f("host", "string"), f("port", "int32"),
                 f("rack", "string", null="0+"))
_LEADER = Struct(f("leader_id", "int32", default=-1), f("leader_epoch", "int32", default=-1))

PRODUCE = (
    Struct(
        f("transactional_id", "string", "3+", null="3+"),
        f("acks", "int16"),
        f("timeout_ms", "int32"),
        f("topic_data", Array(Struct(
            f("name", "string", "0-12"),
            f("topic_id", "uuid", "13+"),
            f("partition_data", Array(Struct(
                f("index", "int32"),
                f("records", "records", null="0+"))))))),
    ),
    Struct(
        f("responses", Array(Struct(
            f("name", "string", "0-12"),
            f("topic_id", "uuid", "13+"),
            f("partition_responses", Array(Struct(
                f("index", "int32"),
                f("error_code", "int16"),
                f("base_offset", "int64"),
                f("log_append_time_ms", "int64", "2+", default=-1),
                f("log_start_offset", "int64", "5+", default=-1),
                f("record_errors", Array(Struct(
                    f("batch_index", "int32", "8+"),
                    f("batch_index_error_message", "string", "8+", null="8+"))), "8+"),
                f("error_message", "string", "8+", null="8+"),
                f("current_leader", _LEADER, "10+", tag=0))))))),
        f("throttle_time_ms", "int32", "1+"),
        f("node_endpoints", Array(_BROKER), "10+", tag=0),
    ))

FETCH = (
    Struct(
        f("cluster_id", "string", "12+", null="12+", tag=0),
        f("replica_id", "int32", "0-14", default=-1),
        f("replica_state", Struct(f("replica_id", "int32", default=-1),
                                  f("replica_epoch", "int64", default=-1)), "15+", tag=1),
        f("max_wait_ms", "int32"),
        f("min_bytes", "int32"),
        f("max_bytes", "int32", "3+", default=0x7FFFFFFF),
        f("isolation_level", "int8", "4+"),
        f("session_id", "int32", "7+"),
        f("session_epoch", "int32", "7+", default=-1),
        f("topics", Array(Struct(
            f("topic", "string", "0-12"),
            f("topic_id", "uuid", "13+"),
            f("partitions", Array(Struct(
                f("partition", "int32"),
                f("current_leader_epoch", "int32", "9+", default=-1),
                f("fetch_offset", "int64"),
                f("last_fetched_epoch", "int32", "12+", default=-1),
                f("log_start_offset", "int64", "5+", default=-1),
                f("partition_max_bytes", "int32"),
                f("replica_directory_id", "uuid", "17+", tag=0))))))),
        f("forgotten_topics_data", Array(Struct(
            f("topic", "string", "7-12"),
            f("topic_id", "uuid", "13+"),
            f("partitions", Array("int32"), "7+"))), "7+"),
        f("rack_id", "string", "11+"),
    ),
    Struct(
        f("throttle_time_ms", "int32", "1+"),
        f("error_code", "int16", "7+"),
        f("session_id", "int32", "7+"),
        f("responses", Array(Struct(
            f("topic", "string", "0-12"),
            f("topic_id", "uuid", "13+"),
            f("partitions", Array(Struct(
                f("partition_index", "int32"),
                f("error_code", "int16"),
                f("high_watermark", "int64"),
                f("last_stable_offset", "int64", "4+", default=-1),
                f("log_start_offset", "int64", "5+", default=-1),
                f("diverging_epoch", Struct(f("epoch", "int32", default=-1),
                                            f("end_offset", "int64", default=-1)),
                  "12+", tag=0),
                f("current_leader", _LEADER, "12+", tag=1),
                f("snapshot_id", Struct(f("end_offset", "int64", default=-1),
                                        f("epoch", "int32", default=-1)), "12+", tag=2),
                f("aborted_transactions", Array(Struct(
                    f("producer_id", "int64"), f("first_offset", "int64"))),
                  "4+", null="4+"),
                f("preferred_read_replica", "int32", "11+", default=-1),
                f("records", "records", null="0+"))))))),
        f("node_endpoints", Array(_BROKER), "16+", tag=0),
    ))

LIST_OFFSETS = (
    Struct(
        f("replica_id", "int32"),
        f("isolation_level", "int8", "2+"),
        f("topics", Array(Struct(
            f("name", "string"),
            f("partitions", Array(Struct(
                f("partition_index", "int32"),
                f("current_leader_epoch", "int32", "4+", default=-1),
                f("timestamp", "int64"),
                f("max_num_offsets", "int32", "0", default=1))))))),
        f("timeout_ms", "int32", "10+"),
    ),
    Struct(
        f("throttle_time_ms", "int32", "2+"),
        f("topics", Array(Struct(
            f("name", "string"),
            f("partitions", Array(Struct(
                f("partition_index", "int32"),
                f("error_code", "int16"),
                f("old_style_offsets", Array("int64"), "0"),
                f("timestamp", "int64", "1+", default=-1),
                f("offset", "int64", "1+", default=-1),
                f("leader_epoch", "int32", "4+", default=-1))))))),
    ))

METADATA = (
    Struct(
        f("topics", Array(Struct(
            f("topic_id", "uuid", "10+"),
            f("name", "string", null="10+"))), null="1+"),
        f("allow_auto_topic_creation", "bool", "4+", default=True),
        f("include_cluster_authorized_operations", "bool", "8-10"),
        f("include_topic_authorized_operations", "bool", "8+"),
    ),
    Struct(
        f("throttle_time_ms", "int32", "3+"),
        f("brokers", Array(Struct(
            f("node_id", "int32"), f("host", "string"), f("port", "int32"),
            f("rack", "string", "1+", null="1+")))),
        f("cluster_id", "string", "2+", null="2+"),
        f("controller_id", "int32", "1+", default=-1),
        f("topics", Array(Struct(
            f("error_code", "int16"),
            f("name", "string", null="12+"),
            f("topic_id", "uuid", "10+"),
            f("is_internal", "bool", "1+"),
            f("partitions", Array(Struct(
                f("error_code", "int16"),
                f("partition_index", "int32"),
                f("leader_id", "int32"),
                f("leader_epoch", "int32", "7+", default=-1),
                f("replica_nodes", Array("int32")),
                f("isr_nodes", Array("int32")),
                f("offline_replicas", Array("int32"), "5+")))),
            f("topic_authorized_operations", "int32", "8+", default=-2147483648)))),
        f("cluster_authorized_operations", "int32", "8-10", default=-2147483648),
        f("error_code", "int16", "13+"),
    ))

OFFSET_COMMIT = (
    Struct(
        f("group_id", "string"),
        f("generation_id", "int32", "1+", default=-1),
        f("member_id", "string", "1+"),
        f("group_instance_id", "string", "7+", null="7+"),
        f("retention_time_ms", "int64", "2-4", default=-1),
        f("topics", Array(Struct(
            f("name", "string"),
            f("partitions", Array(Struct(
                f("partition_index", "int32"),
                f("committed_offset", "int64"),
                f("committed_leader_epoch", "int32", "6+", default=-1),
                f("commit_timestamp", "int64", "1", default=-1),
                f("committed_metadata", "string", null="0+"))))))),
    ),
    Struct(
        f("throttle_time_ms", "int32", "3+"),
        f("topics", Array(Struct(
            f("name", "string"),
            f("partitions", Array(Struct(
                f("partition_index", "int32"), f("error_code", "int16"))))))),
    ))

OFFSET_FETCH = (
    Struct(
        f("group_id", "string", "0-7"),
        f("topics", Array(Struct(
            f("name", "string", "0-7"),
            f("partition_indexes", Array("int32"), "0-7"))), "0-7", null="2-7"),
        f("groups", Array(Struct(
            f("group_id", "string", "8+"),
            f("member_id", "string", "9+", null="9+"),
            f("member_epoch", "int32", "9+", default=-1),
            f("topics", Array(Struct(
                f("name", "string", "8+"),
                f("partition_indexes", Array("int32"), "8+"))), "8+", null="8+"))), "8+"),
        f("require_stable", "bool", "7+"),
    ),
    Struct(
        f("throttle_time_ms", "int32", "3+"),
        f("topics", Array(Struct(
            f("name", "string", "0-7"),
            f("partitions", Array(Struct(
                f("partition_index", "int32", "0-7"),
                f("committed_offset", "int64", "0-7"),
                f("committed_leader_epoch", "int32", "5-7", default=-1),
                f("metadata", "string", "0-7", null="0-7"),
                f("error_code", "int16", "0-7"))), "0-7"))), "0-7"),
        f("error_code", "int16", "2-7"),
        f("groups", Array(Struct(
            f("group_id", "string", "8+"),
            f("topics", Array(Struct(
                f("name", "string", "8+"),
                f("partitions", Array(Struct(
                    f("partition_index", "int32", "8+"),
                    f("committed_offset", "int64", "8+"),
                    f("committed_leader_epoch", "int32", "8+", default=-1),
                    f("metadata", "string", "8+", null="8+"),
                    f("error_code", "int16", "8+"))), "8+"))), "8+"),
            f("error_code", "int16", "8+"))), "8+"),
    ))

FIND_COORDINATOR = (
    Struct(
        f("key", "string", "0-3"),
        f("key_type", "int8", "1+"),
        f("coordinator_keys", Array("string"), "4+"),
    ),
    Struct(
        f("throttle_time_ms", "int32", "1+"),
        f("error_code", "int16", "0-3"),
        f("error_message", "string", "1-3", null="1-3"),
        f("node_id", "int32", "0-3"),
        f("host", "string", "0-3"),
        f("port", "int32", "0-3"),
        f("coordinators", Array(Struct(
            f("key", "string", "4+"),
            f("node_id", "int32", "4+"),
            f("host", "string", "4+"),
            f("port", "int32", "4+"),
            f("error_code", "int16", "4+"),
            f("error_message", "string", "4+", null="4+"))), "4+"),
    ))

JOIN_GROUP = (
    Struct(
        f("group_id", "string"),
        f("session_timeout_ms", "int32"),
        f("rebalance_timeout_ms", "int32", "1+", default=-1),
        f("member_id", "string"),
        f("group_instance_id", "string", "5+", null="5+"),
        f("protocol_type", "string"),
        f("protocols", Array(Struct(f("name", "string"), f("metadata", "bytes")))),
        f("reason", "string", "8+", null="8+"),
    ),
    Struct(
        f("throttle_time_ms", "int32", "2+"),
        f("error_code", "int16"),
        f("generation_id", "int32", default=-1),
        f("protocol_type", "string", "7+", null="7+"),
        f("protocol_name", "string", null="7+"),
        f("leader", "string"),
        f("skip_assignment", "bool", "9+"),
        f("member_id", "string"),
        f("members", Array(Struct(
            f("member_id", "string"),
            f("group_instance_id", "string", "5+", null="5+"),
            f("metadata", "bytes")))),
    ))

HEARTBEAT = (
    Struct(
        f("group_id", "string"),
        f("generation_id", "int32"),
        f("member_id", "string"),
        f("group_instance_id", "string", "3+", null="3+"),
    ),
    Struct(f("throttle_time_ms", "int32", "1+"), f("error_code", "int16")))

LEAVE_GROUP = (
    Struct(
        f("group_id", "string"),
        f("member_id", "string", "0-2"),
        f("members", Array(Struct(
            f("member_id", "string", "3+"),
            f("group_instance_id", "string", "3+", null="3+"),
            f("reason", "string", "5+", null="5+"))), "3+"),
    ),
    Struct(
        f("throttle_time_ms", "int32", "1+"),
        f("error_code", "int16"),
        f("members", Array(Struct(
            f("member_id", "string", "3+"),
            f("group_instance_id", "string", "3+", null="3+"),
            f("error_code", "int16", "3+"))), "3+"),
    ))

SYNC_GROUP = (
    Struct(
        f("group_id", "string"),
        f("generation_id", "int32"),
        f("member_id", "string"),
        f("group_instance_id", "string", "3+", null="3+"),
        f("protocol_type", "string", "5+", null="5+"),
        f("protocol_name", "string", "5+", null="5+"),
        f("assignments", Array(Struct(f("member_id", "string"),
                                      f("assignment", "bytes")))),
    ),
    Struct(
        f("throttle_time_ms", "int32", "1+"),
        f("error_code", "int16"),
        f("protocol_type", "string", "5+", null="5+"),
        f("protocol_name", "string", "5+", null="5+"),
        f("assignment", "bytes"),
    ))

DESCRIBE_GROUPS = (
    Struct(
        f("groups", Array("string")),
        f("include_authorized_operations", "bool", "3+"),
    ),
    Struct(
        f("throttle_time_ms", "int32", "1+"),
        f("groups", Array(Struct(
            f("error_code", "int16"),
            f("error_message", "string", "6+", null="6+"),
            f("group_id", "string"),
            f("group_state", "string"),
            f("protocol_type", "string"),
            f("protocol_data", "string"),
            f("members", Array(Struct(
                f("member_id", "string"),
                f("group_instance_id", "string", "4+", null="4+"),
                f("client_id", "string"),
                f("client_host", "string"),
                f("member_metadata", "bytes"),
                f("member_assignment", "bytes")))),
            f("authorized_operations", "int32", "3+", default=-2147483648)))),
    ))

LIST_GROUPS = (
    Struct(
        f("states_filter", Array("string"), "4+"),
        f("types_filter", Array("string"), "5+"),
    ),
    Struct(
        f("throttle_time_ms", "int32", "1+"),
        f("error_code", "int16"),
        f("groups", Array(Struct(
            f("group_id", "string"),
            f("protocol_type", "string"),
            f("group_state", "string", "4+"),
            f("group_type", "string", "5+")))),
    ))

SASL_HANDSHAKE = (
    Struct(f("mechanism", "string")),
    Struct(f("error_code", "int16"), f("mechanisms", Array("string"))))

API_VERSIONS = (
    Struct(
        f("client_software_name", "string", "3+"),
        f("client_software_version", "string", "3+"),
    ),
    Struct(
        f("error_code", "int16"),
        f("api_keys", Array(Struct(f("api_key", "int16"), f("min_version", "int16"),
                                   f("max_version", "int16")))),
        f("throttle_time_ms", "int32", "1+"),
        # Tagged fields 0-3 (features) are left out on purpose: older librdkafka
        # releases mis-read them, and no client we serve needs them (docs/design.md §10).
    ))

CREATE_TOPICS = (
    Struct(
        f("topics", Array(Struct(
            f("name", "string"),
            f("num_partitions", "int32"),
            f("replication_factor", "int16"),
            f("assignments", Array(Struct(f("partition_index", "int32"),
                                          f("broker_ids", Array("int32"))))),
            f("configs", Array(Struct(f("name", "string"),
                                      f("value", "string", null="0+"))))))),
        f("timeout_ms", "int32", default=60000),
        f("validate_only", "bool", "1+"),
    ),
    Struct(
        f("throttle_time_ms", "int32", "2+"),
        f("topics", Array(Struct(
            f("name", "string"),
            f("topic_id", "uuid", "7+"),
            f("error_code", "int16"),
            f("error_message", "string", "1+", null="0+"),
            f("topic_config_error_code", "int16", "5+", tag=0),
            f("num_partitions", "int32", "5+", default=-1),
            f("replication_factor", "int16", "5+", default=-1),
            f("configs", Array(Struct(
                f("name", "string", "5+"),
                f("value", "string", "5+", null="5+"),
                f("read_only", "bool", "5+"),
                f("config_source", "int8", "5+", default=-1),
                f("is_sensitive", "bool", "5+"))), "5+", null="5+")))),
    ))

DELETE_TOPICS = (
    Struct(
        f("topics", Array(Struct(f("name", "string", "6+", null="6+"),
                                 f("topic_id", "uuid", "6+"))), "6+"),
        f("topic_names", Array("string"), "0-5"),
        f("timeout_ms", "int32"),
    ),
    Struct(
        f("throttle_time_ms", "int32", "1+"),
        f("responses", Array(Struct(
            f("name", "string", null="6+"),
            f("topic_id", "uuid", "6+"),
            f("error_code", "int16"),
            f("error_message", "string", "5+", null="5+")))),
    ))

INIT_PRODUCER_ID = (
    Struct(
        f("transactional_id", "string", null="0+"),
        f("transaction_timeout_ms", "int32"),
        f("producer_id", "int64", "3+", default=-1),
        f("producer_epoch", "int16", "3+", default=-1),
    ),
    Struct(
        f("throttle_time_ms", "int32"),
        f("error_code", "int16"),
        f("producer_id", "int64", default=-1),
        f("producer_epoch", "int16"),
    ))

DESCRIBE_CONFIGS = (
    Struct(
        f("resources", Array(Struct(
            f("resource_type", "int8"),
            f("resource_name", "string"),
            f("configuration_keys", Array("string"), null="0+")))),
        f("include_synonyms", "bool", "1+"),
        f("include_documentation", "bool", "3+"),
    ),
    Struct(
        f("throttle_time_ms", "int32"),
        f("results", Array(Struct(
            f("error_code", "int16"),
            f("error_message", "string", null="0+"),
            f("resource_type", "int8"),
            f("resource_name", "string"),
            f("configs", Array(Struct(
                f("name", "string"),
                f("value", "string", null="0+"),
                f("read_only", "bool"),
                f("config_source", "int8", "1+", default=-1),
                f("is_default", "bool", "0"),
                f("is_sensitive", "bool"),
                f("synonyms", Array(Struct(
                    f("name", "string", "1+"),
                    f("value", "string", "1+", null="0+"),
                    f("source", "int8", "1+"))), "1+"),
                f("config_type", "int8", "3+"),
                f("documentation", "string", "3+", null="0+"))))))),
    ))

SASL_AUTHENTICATE = (
    Struct(f("auth_bytes", "bytes")),
    Struct(
        f("error_code", "int16"),
        f("error_message", "string", null="0+"),
        f("auth_bytes", "bytes"),
        f("session_lifetime_ms", "int64", "1+"),
    ))

CREATE_PARTITIONS = (
    Struct(
        f("topics", Array(Struct(
            f("name", "string"),
            f("count", "int32"),
            f("assignments", Array(Struct(f("broker_ids", Array("int32")))),
              null="0+")))),
        f("timeout_ms", "int32"),
        f("validate_only", "bool"),
    ),
    Struct(
        f("throttle_time_ms", "int32"),
        f("results", Array(Struct(
            f("name", "string"),
            f("error_code", "int16"),
            f("error_message", "string", null="0+")))),
    ))


DELETE_RECORDS = (
    Struct(
        f("topics", Array(Struct(
            f("name", "string"),
            f("partitions", Array(Struct(f("partition_index", "int32"),
                                         f("offset", "int64"))))))),
        f("timeout_ms", "int32"),
    ),
    Struct(
        f("throttle_time_ms", "int32"),
        f("topics", Array(Struct(
            f("name", "string"),
            f("partitions", Array(Struct(
                f("partition_index", "int32"),
                f("low_watermark", "int64"),
                f("error_code", "int16"))))))),
    ))

_ALTER_CONFIGS_RESPONSE = Struct(
    f("throttle_time_ms", "int32"),
    f("responses", Array(Struct(
        f("error_code", "int16"),
        f("error_message", "string", null="0+"),
        f("resource_type", "int8"),
        f("resource_name", "string")))),
)

ALTER_CONFIGS = (
    Struct(
        f("resources", Array(Struct(
            f("resource_type", "int8"),
            f("resource_name", "string"),
            f("configs", Array(Struct(f("name", "string"),
                                      f("value", "string", null="0+"))))))),
        f("validate_only", "bool"),
    ),
    _ALTER_CONFIGS_RESPONSE)

DELETE_GROUPS = (
    Struct(f("groups_names", Array("string"))),
    Struct(
        f("throttle_time_ms", "int32"),
        f("results", Array(Struct(f("group_id", "string"), f("error_code", "int16")))),
    ))

INCREMENTAL_ALTER_CONFIGS = (
    Struct(
        f("resources", Array(Struct(
            f("resource_type", "int8"),
            f("resource_name", "string"),
            f("configs", Array(Struct(f("name", "string"),
                                      f("config_operation", "int8"),
                                      f("value", "string", null="0+"))))))),
        f("validate_only", "bool"),
    ),
    _ALTER_CONFIGS_RESPONSE)


_TXN_TOPIC = Struct(f("name", "string"), f("partitions", Array("int32")))
_TXN_TOPIC_RESULT = Struct(
    f("name", "string"),
    f("results_by_partition", Array(Struct(f("partition_index", "int32"),
                                           f("partition_error_code", "int16")))))

ADD_PARTITIONS_TO_TXN = (
    Struct(
        f("transactions", Array(Struct(
            f("transactional_id", "string"),
            f("producer_id", "int64"),
            f("producer_epoch", "int16"),
            f("verify_only", "bool"),
            f("topics", Array(_TXN_TOPIC)))), "4+"),
        f("v3_and_below_transactional_id", "string", "0-3"),
        f("v3_and_below_producer_id", "int64", "0-3"),
        f("v3_and_below_producer_epoch", "int16", "0-3"),
        f("v3_and_below_topics", Array(_TXN_TOPIC), "0-3"),
    ),
    Struct(
        f("throttle_time_ms", "int32"),
        f("error_code", "int16", "4+"),
        f("results_by_transaction", Array(Struct(
            f("transactional_id", "string"),
            f("topic_results", Array(_TXN_TOPIC_RESULT)))), "4+"),
        f("results_by_topic_v3_and_below", Array(_TXN_TOPIC_RESULT), "0-3"),
    ))

ADD_OFFSETS_TO_TXN = (
    Struct(
        f("transactional_id", "string"),
        f("producer_id", "int64"),
        f("producer_epoch", "int16"),
        f("group_id", "string"),
    ),
    Struct(f("throttle_time_ms", "int32"), f("error_code", "int16")))

END_TXN = (
    Struct(
        f("transactional_id", "string"),
        f("producer_id", "int64"),
        f("producer_epoch", "int16"),
        f("committed", "bool"),
    ),
    Struct(
        f("throttle_time_ms", "int32"),
        f("error_code", "int16"),
        f("producer_id", "int64", "5+", default=-1),
        f("producer_epoch", "int16", "5+", default=-1),
    ))

TXN_OFFSET_COMMIT = (
    Struct(
        f("transactional_id", "string"),
        f("group_id", "string"),
        f("producer_id", "int64"),
        f("producer_epoch", "int16"),
        f("generation_id", "int32", "3+", default=-1),
        f("member_id", "string", "3+", default=""),
        f("group_instance_id", "string", "3+", null="3+"),
        f("topics", Array(Struct(
            f("name", "string"),
            f("partitions", Array(Struct(
                f("partition_index", "int32"),
                f("committed_offset", "int64"),
                f("committed_leader_epoch", "int32", "2+", default=-1),
                f("committed_metadata", "string", null="0+"))))))),
    ),
    Struct(
        f("throttle_time_ms", "int32"),
        f("topics", Array(Struct(
            f("name", "string"),
            f("partitions", Array(Struct(
                f("partition_index", "int32"), f("error_code", "int16"))))))),
    ))

DESCRIBE_TRANSACTIONS = (
    Struct(f("transactional_ids", Array("string"))),
    Struct(
        f("throttle_time_ms", "int32"),
        f("transaction_states", Array(Struct(
            f("error_code", "int16"),
            f("transactional_id", "string"),
            f("transaction_state", "string"),
            f("transaction_timeout_ms", "int32"),
            f("transaction_start_time_ms", "int64"),
            f("producer_id", "int64"),
            f("producer_epoch", "int16"),
            f("topics", Array(Struct(f("topic", "string"),
                                     f("partitions", Array("int32")))))))),
    ))

DESCRIBE_PRODUCERS = (
    Struct(f("topics", Array(Struct(f("name", "string"),
                                    f("partition_indexes", Array("int32")))))),
    Struct(
        f("throttle_time_ms", "int32"),
        f("topics", Array(Struct(
            f("name", "string"),
            f("partitions", Array(Struct(
                f("partition_index", "int32"),
                f("error_code", "int16"),
                f("error_message", "string", null="0+"),
                f("active_producers", Array(Struct(
                    f("producer_id", "int64"),
                    f("producer_epoch", "int32"),
                    f("last_sequence", "int32", default=-1),
                    f("last_timestamp", "int64", default=-1),
                    f("coordinator_epoch", "int32"),
                    f("current_txn_start_offset", "int64", default=-1)))))))))),
    ))

LIST_TRANSACTIONS = (
    Struct(
        f("state_filters", Array("string")),
        f("producer_id_filters", Array("int64")),
        f("duration_filter", "int64", "1+", default=-1),
        f("transactional_id_pattern", "string", "2+", null="2+"),
    ),
    Struct(
        f("throttle_time_ms", "int32"),
        f("error_code", "int16"),
        f("unknown_state_filters", Array("string")),
        f("transaction_states", Array(Struct(
            f("transactional_id", "string"),
            f("producer_id", "int64"),
            f("transaction_state", "string")))),
    ))


def _api(key: int, name: str, span: str, flexible: str,
         schemas: tuple[Struct, Struct]) -> Api:
    low, high = versions(span)
    return Api(key, name, low, high, versions(flexible), schemas[0], schemas[1])


APIS: dict[int, Api] = {api.key: api for api in (
    _api(0, "Produce", "0-11", "9+", PRODUCE),
    _api(1, "Fetch", "4-16", "12+", FETCH),
    _api(2, "ListOffsets", "0-8", "6+", LIST_OFFSETS),
    _api(3, "Metadata", "0-12", "9+", METADATA),
    _api(8, "OffsetCommit", "0-9", "8+", OFFSET_COMMIT),
    _api(9, "OffsetFetch", "0-9", "6+", OFFSET_FETCH),
    _api(10, "FindCoordinator", "0-4", "3+", FIND_COORDINATOR),
    _api(11, "JoinGroup", "0-9", "6+", JOIN_GROUP),
    _api(12, "Heartbeat", "0-4", "4+", HEARTBEAT),
    _api(13, "LeaveGroup", "0-5", "4+", LEAVE_GROUP),
    _api(14, "SyncGroup", "0-5", "4+", SYNC_GROUP),
    _api(15, "DescribeGroups", "0-5", "5+", DESCRIBE_GROUPS),
    _api(16, "ListGroups", "0-5", "3+", LIST_GROUPS),
    _api(17, "SaslHandshake", "0-1", "none", SASL_HANDSHAKE),
    _api(18, "ApiVersions", "0-4", "3+", API_VERSIONS),
    _api(19, "CreateTopics", "0-7", "5+", CREATE_TOPICS),
    _api(20, "DeleteTopics", "0-6", "4+", DELETE_TOPICS),
    _api(21, "DeleteRecords", "0-2", "2+", DELETE_RECORDS),
    _api(22, "InitProducerId", "0-5", "2+", INIT_PRODUCER_ID),
    _api(24, "AddPartitionsToTxn", "0-4", "3+", ADD_PARTITIONS_TO_TXN),
    _api(25, "AddOffsetsToTxn", "0-4", "3+", ADD_OFFSETS_TO_TXN),
    _api(26, "EndTxn", "0-4", "3+", END_TXN),
    _api(28, "TxnOffsetCommit", "0-4", "3+", TXN_OFFSET_COMMIT),
    _api(32, "DescribeConfigs", "0-4", "4+", DESCRIBE_CONFIGS),
    _api(33, "AlterConfigs", "0-2", "2+", ALTER_CONFIGS),
    _api(36, "SaslAuthenticate", "0-2", "2+", SASL_AUTHENTICATE),
    _api(37, "CreatePartitions", "0-3", "2+", CREATE_PARTITIONS),
    _api(42, "DeleteGroups", "0-2", "2+", DELETE_GROUPS),
    _api(44, "IncrementalAlterConfigs", "0-1", "1+", INCREMENTAL_ALTER_CONFIGS),
    _api(61, "DescribeProducers", "0", "0+", DESCRIBE_PRODUCERS),
    _api(65, "DescribeTransactions", "0", "0+", DESCRIBE_TRANSACTIONS),
    _api(66, "ListTransactions", "0-1", "0+", LIST_TRANSACTIONS),
)}


def request_header_flexible(api: Api, version: int) -> bool:
    """Header v2 (tagged fields) for flexible request versions."""
    return api.is_flexible(version)


def response_header_flexible(api: Api, version: int) -> bool:
    """Header v1 for flexible response versions, except ApiVersions, whose response
    header stays v0 so a client can read it before it knows our versions."""
    return api.key != API_VERSIONS_KEY and api.is_flexible(version)
