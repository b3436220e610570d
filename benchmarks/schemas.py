"""Schema'd serialization rates: logkit's serdes beside confluent-kafka's, same run.

Owns: the `schemas` figures in docs/schemas.md. Measures, on one order record (an Avro
record of about 60 bytes encoded; the same value as JSON):
- Avro serialize / deserialize: `logkit.serde.AvroSerde` against confluent-kafka's
  `AvroSerializer` / `AvroDeserializer` on its `mock://` registry;
- JSON Schema serialize / deserialize: `JsonSchemaSerde` against `JSONSerializer` /
  `JSONDeserializer` (both validate every value);
- plain JSON: `JsonSerde` (orjson when installed) against `json.dumps` / `json.loads`;
- produce overhead: `producer.send` with an `AvroSerde` against `send` of the same
  records already encoded (raw bytes), into one topic.

Invariant: every loop is bounded by the record count given; every system encodes the
same values; each produce run works in its own temporary directory, removed after.
Self-contained (it does not use the suite's `_common`), so it runs on its own:
`python -m benchmarks.schemas [--records N] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

import logkit
from logkit.serde import AvroSerde, JsonSchemaSerde, JsonSerde

ORDER_SCHEMA = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"},
    {"name": "sku", "type": "string"},
    {"name": "quantity", "type": "int"},
    {"name": "price", "type": "double"},
    {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
        {"name": "name", "type": "string"}, {"name": "age", "type": "int"}]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}}]}
ORDER_JSON_SCHEMA = {"type": "object", "title": "Order", "properties": {
    "id": {"type": "integer"}, "sku": {"type": "string"},
    "quantity": {"type": "integer", "minimum": 0}, "price": {"type": "number"},
    "customer": {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"]},
    "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["id", "sku", "quantity", "price", "customer"]}
MAX_RECORDS = 10_000_000
TOPIC = "orders"


def order(i: int) -> dict[str, Any]:
    return {"id": i, "sku": f"SKU-{i % 1000:04d}", "quantity": i % 7, "price": 9.99,
            "customer": {"name": "Ada Lovelace", "age": 36}, "tags": ["gift", "express"]}


def rate(count: int, fn: Callable[[], None]) -> float:
    """Records per second of `fn`, which handles `count` records (best of two runs)."""
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return count / best


def serde_rows(count: int, broker: logkit.Broker) -> list[dict[str, Any]]:
    values = [order(i) for i in range(count)]
    rows: list[dict[str, Any]] = []

    def pair(name: str, fmt: str, serialize: Callable[[Any], bytes],
             deserialize: Callable[[bytes], Any]) -> None:
        encoded = [serialize(v) for v in values]
        assert deserialize(encoded[0]) == values[0], name
        rows.append({"benchmark": f"{fmt} serialize", "system": name,
                     "records_per_s": rate(count, lambda: [serialize(v) for v in values]),
                     "bytes_per_record": sum(map(len, encoded)) / count})
        rows.append({"benchmark": f"{fmt} deserialize", "system": name,
                     "records_per_s": rate(count, lambda: [deserialize(b) for b in encoded])})

    avro = AvroSerde(broker, TOPIC, ORDER_SCHEMA)
    pair("logkit AvroSerde", "avro", avro.serialize, avro.deserialize)
    json_schema = JsonSchemaSerde(broker, "events", ORDER_JSON_SCHEMA)
    pair("logkit JsonSchemaSerde", "json-schema", json_schema.serialize,
         json_schema.deserialize)
    plain = JsonSerde()
    pair("logkit JsonSerde", "json", plain.serialize, plain.deserialize)
    pair("json.dumps / json.loads", "json", lambda v: json.dumps(v).encode(), json.loads)
    rows += confluent_rows(count, values)
    return rows


def confluent_rows(count: int, values: list[dict[str, Any]]) -> list[dict[str, Any]]:
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
        from confluent_kafka.schema_registry.json_schema import (JSONDeserializer,
                                                                 JSONSerializer)
        from confluent_kafka.serialization import MessageField, SerializationContext
    except ImportError:
        return [{"benchmark": "avro serialize", "system": "confluent-kafka",
                 "note": "not installed (pip install 'confluent-kafka[schemaregistry,avro,"
                         "json]')"}]
    rows: list[dict[str, Any]] = []
    client = SchemaRegistryClient.new_client({"url": "mock://logkit-bench"})
    context = SerializationContext(TOPIC, MessageField.VALUE)
    for fmt, serializer, deserializer in (
            ("avro", AvroSerializer(client, json.dumps(ORDER_SCHEMA)),
             AvroDeserializer(client)),
            ("json-schema", JSONSerializer(json.dumps(ORDER_JSON_SCHEMA), client),
             JSONDeserializer(json.dumps(ORDER_JSON_SCHEMA)))):
        encoded = [serializer(v, context) for v in values]
        assert deserializer(encoded[0], context) == values[0], fmt
        name = f"confluent-kafka {type(serializer).__name__} (mock://)"
        rows.append({"benchmark": f"{fmt} serialize", "system": name,
                     "records_per_s": rate(count, lambda: [serializer(v, context)
                                                           for v in values]),
                     "bytes_per_record": sum(map(len, encoded)) / count})
        rows.append({"benchmark": f"{fmt} deserialize",
                     "system": f"confluent-kafka {type(deserializer).__name__} (mock://)",
                     "records_per_s": rate(count, lambda: [deserializer(b, context)
                                                           for b in encoded])})
    return rows


def produce_rows(count: int) -> list[dict[str, Any]]:
    """send() with an AvroSerde against send() of the same records pre-encoded."""
    values = [order(i) for i in range(count)]
    rows = []
    for system in ("raw bytes (pre-encoded)", "AvroSerde value_serializer"):
        root = tempfile.mkdtemp(prefix="logkit-bench-schemas-")
        try:
            with logkit.Broker(root) as broker:
                broker.create_topic(TOPIC, partitions=3)
                serde = AvroSerde(broker, TOPIC, ORDER_SCHEMA)
                if system.startswith("raw"):
                    payloads = [serde.serialize(v) for v in values]
                    producer = broker.producer(linger_ms=5)
                else:
                    payloads = values
                    producer = broker.producer(linger_ms=5, value_serializer=serde)
                send = producer.send
                start = time.perf_counter()
                for i, payload in enumerate(payloads):
                    send(TOPIC, payload, key=b"k%d" % (i % 1000))
                producer.flush()
                seconds = time.perf_counter() - start
                producer.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)
        rows.append({"benchmark": "produce (keyed, 3 partitions)", "system": system,
                     "records_per_s": count / seconds})
    return rows


def run(records: int = 50_000) -> list[dict[str, Any]]:
    if not 0 < records <= MAX_RECORDS:
        raise ValueError(f"records must be 1..{MAX_RECORDS}")
    root = tempfile.mkdtemp(prefix="logkit-bench-schemas-")
    try:
        with logkit.Broker(root) as broker:
            rows = serde_rows(records, broker)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows + produce_rows(records * 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = run(args.records)
    print(f"{'benchmark':32} {'system':48} {'rec/s':>12} {'bytes':>6}")
    for row in rows:
        figure = f"{row['records_per_s']:12,.0f}" if "records_per_s" in row else \
            f"{row.get('note', ''):>12}"
        size = f"{row['bytes_per_record']:6.1f}" if "bytes_per_record" in row else ""
        print(f"{row['benchmark']:32} {row['system']:48} {figure} {size}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"records": args.records, "python": sys.version.split()[0],
                       "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
