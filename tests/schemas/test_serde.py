"""Serdes through real producers and consumers on a real broker: Confluent's framing,
Kafka's plain layouts, errors with field paths, and schema evolution end to end."""

from __future__ import annotations

import json
import uuid

import pytest

import logkit
from logkit.serde import (AvroSerde, FloatSerde, IntSerde, JsonSchemaSerde, JsonSerde,
                          ProtobufSerde, SerializationError, StringSerde, UUIDSerde)
from logkit.serde import wire

pytest.importorskip("fastavro")

ORDER_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "note", "type": "string", "default": ""},
    {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
        {"name": "name", "type": "string"},
        {"name": "age", "type": "int"}]}}]}
# v2: "currency" added with a default, "note" removed (it had a default: FULL-compatible)
ORDER_V2 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "currency", "type": "string", "default": "EUR"},
    {"name": "customer", "type": "shop.Customer"}]}
ORDER_V2["fields"][2]["type"] = ORDER_V1["fields"][2]["type"]
# v3: "id" becomes a string: no reader of v1/v2 can read it, nor it theirs
ORDER_V3 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "string"}]}


def order(i, **extra):
    return {"id": i, "customer": {"name": f"c{i}", "age": 30 + i}, **extra}


def read_all(broker, topic, deserializer, count):
    consumer = broker.consumer(topic, group_id=None, auto_offset_reset="earliest",
                               enable_auto_commit=False, value_deserializer=deserializer)
    out = []
    for _ in range(50):
        out += consumer.poll(timeout_ms=100)
        if len(out) >= count:
            break
    consumer.close()
    return out


# ---- the wire format ---------------------------------------------------------------------

def test_wire_format_is_confluents():
    """Magic 0, big-endian id, Protobuf's zig-zag message indexes ([0] as one byte)."""
    assert wire.frame(1, b"p") == b"\x00\x00\x00\x00\x01p"
    assert wire.frame(0x01020304, b"") == b"\x00\x01\x02\x03\x04"
    assert wire.encode_indexes([0]) == b"\x00"
    assert wire.encode_indexes([1]) == b"\x02\x02"
    assert wire.encode_indexes([0, 2]) == b"\x04\x00\x04"
    for indexes in ([0], [3], [1, 0, 70]):
        assert wire.unframe(wire.frame(9, b"xy", indexes), indexes=True) == (9, indexes, b"xy")


@pytest.mark.parametrize("data,why", [
    (b"", "shorter"), (b"\x00\x00\x01", "shorter"), (b"\x01\x00\x00\x00\x01x", "magic"),
])
def test_unframe_refuses_what_is_not_a_frame(data, why):
    with pytest.raises(SerializationError, match=why):
        wire.unframe(data)


def test_unframe_refuses_bad_message_indexes():
    with pytest.raises(SerializationError):
        wire.unframe(b"\x00\x00\x00\x00\x01\x02", indexes=True)           # count, no index
    with pytest.raises(SerializationError):
        wire.unframe(b"\x00\x00\x00\x00\x01" + b"\xff" * 11, indexes=True)


# ---- plain serdes ------------------------------------------------------------------------

def test_plain_serdes_write_kafkas_layouts():
    assert IntSerde()(5) == b"\x00\x00\x00\x05"
    assert IntSerde(64)(-1) == b"\xff" * 8
    assert IntSerde(16)(b"\x01\x00") == 256
    assert FloatSerde()(1.5) == b"\x3f\xf8" + b"\x00" * 6
    assert FloatSerde(32)(FloatSerde(32)(0.5)) == 0.5
    assert StringSerde()("héllo") == "héllo".encode()
    assert StringSerde("latin-1")(b"\xe9") == "é"
    value = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert UUIDSerde()(value) == b"12345678-1234-5678-1234-567812345678"
    assert UUIDSerde(binary=True)(value) == value.bytes
    assert UUIDSerde()(UUIDSerde()(str(value))) == value
    assert JsonSerde()(JsonSerde()({"a": [1, 2.5, None, "é"], "big": 2 ** 70})) == \
        {"a": [1, 2.5, None, "é"], "big": 2 ** 70}
    assert all(serde(None) is None for serde in (IntSerde(), StringSerde(), JsonSerde()))


@pytest.mark.parametrize("serde,value", [
    (IntSerde(), 2 ** 31), (IntSerde(), "5"), (IntSerde(), b"\x00\x01"), (FloatSerde(), "x"),
    (FloatSerde(), b"\x00"), (StringSerde(), 5), (StringSerde(), b"\xff"),
    (UUIDSerde(), "not-a-uuid"), (UUIDSerde(), b"short"), (JsonSerde(), {1, 2}),
    (JsonSerde(), b"{not json"),
])
def test_plain_serdes_raise_serialization_error(serde, value):
    with pytest.raises(SerializationError):
        serde(value)


def test_plain_serdes_through_a_producer_and_consumer(broker):
    producer = broker.producer(key_serializer=StringSerde(), value_serializer=JsonSerde())
    producer.send("plain", {"n": 1}, key="k").result()
    producer.close()
    consumer = broker.consumer("plain", auto_offset_reset="earliest",
                               key_deserializer=StringSerde(), value_deserializer=JsonSerde())
    records = consumer.poll(timeout_ms=1000)
    consumer.close()
    assert [(r.key, r.value) for r in records] == [("k", {"n": 1})]


# ---- schema'd serdes ---------------------------------------------------------------------

def test_avro_records_round_trip_through_a_topic(broker):
    serde = AvroSerde(broker, "orders", ORDER_V1)
    producer = broker.producer(value_serializer=serde)
    for i in range(5):
        producer.send("orders", order(i, note=f"n{i}"))
    producer.flush()
    raw = broker.topic("orders").partition(0).read(0)[0].value
    assert raw[:5] == b"\x00" + serde.schema_id.to_bytes(4, "big")
    records = read_all(broker, "orders", serde, 5)
    assert [r.value for r in records] == [order(i, note=f"n{i}") for i in range(5)]
    assert broker.schema_registry().subjects() == ["orders-value"]


def test_a_value_that_does_not_match_is_refused_at_send_with_its_field_path(broker):
    """send() raises SerializationError naming customer.age; nothing is written."""
    producer = broker.producer(value_serializer=AvroSerde(broker, "orders", ORDER_V1))
    producer.send("orders", order(1)).result()
    bad = order(2)
    bad["customer"]["age"] = "thirty"
    with pytest.raises(SerializationError) as raised:
        producer.send("orders", bad)
    assert raised.value.field == "customer.age" and "customer.age" in str(raised.value)
    assert raised.value.topic == "orders"
    with pytest.raises(SerializationError) as raised:
        producer.send("orders", {"id": 3})
    assert raised.value.field == "customer"
    producer.flush()
    assert broker.topic("orders").partition(0).log_end_offset == 1


def test_keys_use_the_key_subject(broker):
    key_serde = AvroSerde(broker, "orders", "string", is_key=True)
    producer = broker.producer(key_serializer=key_serde,
                               value_serializer=AvroSerde(broker, "orders", ORDER_V1))
    producer.send("orders", order(1), key="k1").result()
    producer.close()
    assert broker.schema_registry().subjects() == ["orders-key", "orders-value"]
    consumer = broker.consumer("orders", auto_offset_reset="earliest",
                               key_deserializer=AvroSerde(broker, "orders", is_key=True))
    assert consumer.poll(timeout_ms=1000)[0].key == "k1"
    consumer.close()


def test_subject_name_strategies(broker):
    record_named = AvroSerde(broker, "orders", ORDER_V1, subject_name_strategy="record")
    topic_record = AvroSerde(broker, "orders", ORDER_V1,
                             subject_name_strategy="TopicRecordNameStrategy")
    custom = AvroSerde(broker, "orders", ORDER_V1,
                       subject_name_strategy=lambda topic, is_key, name: f"x.{topic}")
    for serde in (record_named, topic_record, custom):
        serde.serialize(order(1))
    assert broker.schema_registry().subjects() == ["orders-shop.Order", "shop.Order",
                                                   "x.orders"]
    with pytest.raises(logkit.ConfigError):
        AvroSerde(broker, "orders", ORDER_V1, subject_name_strategy="bogus")


def test_undecodable_bytes_raise_serialization_error_with_the_topic(broker):
    serde = AvroSerde(broker, "orders", ORDER_V1)
    good = serde.serialize(order(1))
    for data, why in ((b"\x07" + good[1:], "magic byte"),
                      (b"\x00\x00\x00\x03\xe7" + good[5:], "unknown schema id 999"),
                      (good + b"\x00", "after the value"),
                      (good[:7], "does not decode")):
        with pytest.raises(SerializationError, match=why) as raised:
            serde.deserialize(data)
        assert raised.value.topic == "orders"


def test_auto_register_off_and_use_latest_version(broker):
    lookup_only = AvroSerde(broker, "orders", ORDER_V1, auto_register=False)
    with pytest.raises(SerializationError, match="orders-value"):
        lookup_only.serialize(order(1))
    registered = AvroSerde(broker, "orders", ORDER_V1).schema_id
    assert lookup_only.schema_id == registered
    latest = AvroSerde(broker, "orders", use_latest_version=True)
    assert latest.deserialize(latest.serialize(order(2))) == order(2, note="")


def test_json_schema_serde_validates_both_ways(broker):
    schema = {"type": "object", "title": "Event", "properties": {
        "customer": {"type": "object", "properties": {"age": {"type": "integer"}},
                     "required": ["age"]}}, "required": ["customer"]}
    serde = JsonSchemaSerde(broker, "events", schema)
    producer = broker.producer(value_serializer=serde)
    producer.send("events", {"customer": {"age": 5}}).result()
    with pytest.raises(SerializationError) as raised:
        producer.send("events", {"customer": {"age": "five"}})
    assert raised.value.field == "customer.age"
    with pytest.raises(SerializationError) as raised:
        producer.send("events", {"customer": {}})
    assert raised.value.field == "customer.age"
    producer.close()
    assert [r.value for r in read_all(broker, "events", serde, 1)] == \
        [{"customer": {"age": 5}}]
    stored = wire.frame(serde.schema_id, b'{"customer": {"age": "x"}}')
    with pytest.raises(SerializationError, match="customer.age"):
        serde.deserialize(stored)


def proto_class(text, name, file_name="shop/order.proto"):
    """A message class built from .proto text at test time (no protoc)."""
    from google.protobuf import descriptor_pool, message_factory, timestamp_pb2
    from logkit.compat.proto_text import parse_proto
    fd = parse_proto(text)
    fd.name = file_name
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


ORDER_PROTO = """
syntax = "proto3";
package shop;
message Order { int64 id = 1; Customer customer = 2; repeated string tags = 3; }
message Customer { string name = 1; int32 age = 2;
                   message Address { string city = 1; } Address address = 3; }
"""


def test_protobuf_serde_through_a_topic(broker):
    pytest.importorskip("google.protobuf")
    order_class = proto_class(ORDER_PROTO, "shop.Order")
    address_class = proto_class(ORDER_PROTO, "shop.Customer.Address")
    serde = ProtobufSerde(broker, "orders", order_class)
    producer = broker.producer(value_serializer=serde)
    producer.send("orders", order_class(id=1, tags=["a"])).result()
    producer.send("orders", {"id": "2", "customer": {"name": "c", "age": 3}}).result()
    with pytest.raises(SerializationError):
        producer.send("orders", {"id": 3, "nosuchfield": 1})
    with pytest.raises(SerializationError):
        producer.send("orders", address_class(city="x"))
    producer.close()
    records = read_all(broker, "orders", serde, 2)
    assert [r.value.id for r in records] == [1, 2]
    assert records[1].value.customer.age == 3
    generic = read_all(broker, "orders", ProtobufSerde(broker, "orders"), 2)
    assert [r.value.id for r in generic] == [1, 2]
    nested = ProtobufSerde(broker, "addresses", address_class)
    data = nested.serialize(address_class(city="Oslo"))
    assert data[5:7] == b"\x04\x02"                   # indexes [1, 0]... as zig-zag
    assert nested.deserialize(data).city == "Oslo"
    with pytest.raises(SerializationError, match="not a shop.Order"):
        serde.deserialize(data)


# ---- schema evolution, end to end (issue 12, deliverable 3) ------------------------------

def test_schema_evolution_old_and_new_consumers_read_every_record(broker):
    """A v1 and a v2 producer write to one topic; an old and a new consumer read every
    record in their own schema; an incompatible v3 is refused at registration and at
    produce time."""
    registry = broker.schema_registry()
    registry.set_compatibility("FULL_TRANSITIVE", "orders-value")
    v1 = broker.producer(value_serializer=AvroSerde(broker, "orders", ORDER_V1))
    v2 = broker.producer(value_serializer=AvroSerde(broker, "orders", ORDER_V2))
    v1.send("orders", order(1, note="first")).result()
    v2.send("orders", order(2, currency="USD")).result()
    v1.send("orders", order(3, note="third")).result()
    assert registry.versions("orders-value") == [1, 2]

    old = read_all(broker, "orders", AvroSerde(broker, "orders", ORDER_V1), 3)
    new = read_all(broker, "orders", AvroSerde(broker, "orders", ORDER_V2), 3)
    assert [r.value for r in old] == [order(1, note="first"), order(2, note=""),
                                      order(3, note="third")]
    assert [r.value for r in new] == [order(1, currency="EUR"), order(2, currency="USD"),
                                      order(3, currency="EUR")]

    with pytest.raises(logkit.serde.IncompatibleSchemaError) as raised:
        registry.register("orders-value", json.dumps(ORDER_V3))
    assert "id" in str(raised.value) and "TYPE_MISMATCH" in str(raised.value)
    v3 = broker.producer(value_serializer=AvroSerde(broker, "orders", ORDER_V3))
    with pytest.raises(SerializationError, match="TYPE_MISMATCH"):
        v3.send("orders", {"id": "x"})
    v3.flush()
    assert broker.topic("orders").partition(0).log_end_offset == 3


def test_poll_returns_records_before_an_undecodable_one_then_raises(broker):
    serde = AvroSerde(broker, "orders", ORDER_V1)
    producer = broker.producer()
    producer.send("orders", serde.serialize(order(1))).result()
    producer.send("orders", b"\x01garbage").result()
    producer.send("orders", serde.serialize(order(3))).result()
    producer.close()
    tp = logkit.TopicPartition("orders", 0)
    consumer = broker.consumer("orders", auto_offset_reset="earliest",
                               value_deserializer=serde)
    assert [r.offset for r in consumer.poll(timeout_ms=1000)] == [0]
    with pytest.raises(SerializationError) as raised:
        consumer.poll(timeout_ms=100)
    assert (raised.value.topic, raised.value.partition, raised.value.offset) == \
        ("orders", 0, 1)
    assert consumer.position(tp) == 1
    consumer.seek(tp, 2)
    assert [r.offset for r in consumer.poll(timeout_ms=1000)] == [2]
    consumer.close()
