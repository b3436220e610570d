"""Cross-library: confluent-kafka's own serializers, pointed at logkit's REST registry,
write bytes logkit's serdes read, and the reverse; Avro and Protobuf byte for byte."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("confluent_kafka.schema_registry")
pytest.importorskip("fastavro")

from confluent_kafka.schema_registry import SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import (AvroDeserializer,  # noqa: E402
                                                  AvroSerializer)
from confluent_kafka.schema_registry.json_schema import (JSONDeserializer,  # noqa: E402
                                                         JSONSerializer)
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402

from logkit.serde import AvroSerde, JsonSchemaSerde, ProtobufSerde  # noqa: E402

from test_serde import ORDER_PROTO, ORDER_V1, ORDER_V2, order, proto_class, read_all  # noqa: E402,E501

CONTEXT = SerializationContext("orders", MessageField.VALUE)


@pytest.fixture
def client(broker):
    server = broker.serve_schema_registry()
    yield SchemaRegistryClient({"url": server.url, "max.retries": 0})
    server.close()


def test_avro_confluent_to_logkit_and_back_byte_for_byte(broker, client):
    theirs = AvroSerializer(client, json.dumps(ORDER_V1))
    ours = AvroSerde(broker, "orders", ORDER_V1)
    written = theirs(order(1, note="n"), CONTEXT)
    assert ours.serialize(order(1, note="n")) == written           # same id, same bytes
    producer = broker.producer()
    producer.send("orders", written).result()                         # raw bytes
    producer.close()
    assert [r.value for r in read_all(broker, "orders", ours, 1)] == [order(1, note="n")]
    assert AvroDeserializer(client)(ours.serialize(order(2)), CONTEXT) == order(2, note="")


def test_avro_evolution_across_libraries(broker, client):
    """confluent-kafka writes v2 records; logkit's v1 reader reads them, and
    confluent-kafka's v1 reader reads logkit's v2 records."""
    broker.schema_registry().set_compatibility("FULL")
    AvroSerde(broker, "orders", ORDER_V1).serialize(order(0))
    v2_theirs = AvroSerializer(client, json.dumps(ORDER_V2))(order(1, currency="USD"),
                                                             CONTEXT)
    assert AvroSerde(broker, "orders", ORDER_V1).deserialize(v2_theirs) == \
        order(1, note="")
    v2_ours = AvroSerde(broker, "orders", ORDER_V2).serialize(order(2, currency="NOK"))
    old_reader = AvroDeserializer(client, json.dumps(ORDER_V1))
    assert old_reader(v2_ours, CONTEXT) == order(2, note="")
    assert broker.schema_registry().versions("orders-value") == [1, 2]


def test_json_schema_confluent_to_logkit_and_back(broker, client):
    schema = json.dumps({"type": "object", "title": "Event", "properties": {
        "n": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["n"]})
    written = JSONSerializer(schema, client)({"n": 1, "tags": ["a"]}, CONTEXT)
    ours = JsonSchemaSerde(broker, "orders", schema)
    assert written[:5] == ours.serialize({"n": 2})[:5]                # one subject, one id
    assert ours.deserialize(written) == {"n": 1, "tags": ["a"]}
    reader = JSONDeserializer(schema, schema_registry_client=client)
    assert reader(ours.serialize({"n": 2}), CONTEXT) == {"n": 2}
    assert JSONDeserializer(None, schema_registry_client=client)(
        ours.serialize({"n": 3}), CONTEXT) == {"n": 3}


def test_protobuf_confluent_to_logkit_and_back_byte_for_byte(broker, client):
    pytest.importorskip("google.protobuf")
    from confluent_kafka.schema_registry.protobuf import (ProtobufDeserializer,
                                                          ProtobufSerializer)
    order_class = proto_class(ORDER_PROTO, "shop.Order")
    address_class = proto_class(ORDER_PROTO, "shop.Customer.Address")
    conf = {"use.deprecated.format": False}
    message = order_class(id=7, tags=["x"])
    message.customer.name = "c"
    written = ProtobufSerializer(order_class, client, conf)(message, CONTEXT)
    ours = ProtobufSerde(broker, "orders", order_class)
    assert ours.serialize(message) == written
    assert ours.deserialize(written) == message
    assert ProtobufDeserializer(order_class, conf)(ours.serialize(message), CONTEXT) == \
        message
    nested_context = SerializationContext("addresses", MessageField.VALUE)
    nested = ProtobufSerializer(address_class, client, conf)(address_class(city="Oslo"),
                                                              nested_context)
    assert ProtobufSerde(broker, "addresses", address_class).deserialize(nested).city == \
        "Oslo"
    assert ProtobufSerde(broker, "addresses").deserialize(nested).city == "Oslo"
