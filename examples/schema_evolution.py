"""Schema evolution, end to end: two producer versions, two consumer versions, one topic.

A v1 producer and a v2 producer (v2 adds `currency` with a default and drops `note`,
which had one) write Avro records to one topic through the embedded schema registry.
An old consumer (v1 reader schema) and a new one (v2) each read every record in their
own shape: Avro's resolution fills what a writer did not send from the reader's
defaults. A v3 that turns `id` into a string is refused by the registry, both when it is
registered and when a producer tries to send with it. The registry's REST API is served
on a loopback port, where confluent-kafka's SchemaRegistryClient could point.

Run: .venv/bin/python examples/schema_evolution.py      (needs: pip install 'logkit[schemas]')
"""

from __future__ import annotations

import json
import shutil
import tempfile
from typing import Any

import logkit
from logkit.serde import AvroSerde, IncompatibleSchemaError

CUSTOMER = {"type": "record", "name": "Customer", "fields": [
    {"name": "name", "type": "string"}, {"name": "age", "type": "int"}]}
V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "note", "type": "string", "default": ""},
    {"name": "customer", "type": CUSTOMER}]}
V2 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "currency", "type": "string", "default": "EUR"},
    {"name": "customer", "type": CUSTOMER}]}
V3 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "string"},
    {"name": "customer", "type": CUSTOMER}]}


def read_all(broker: logkit.Broker, serde: AvroSerde, count: int) -> list[dict[str, Any]]:
    """Every record of "orders", decoded into the serde's schema."""
    with broker.consumer("orders", auto_offset_reset="earliest",
                         value_deserializer=serde) as consumer:
        values: list[dict[str, Any]] = []
        for _ in range(100):                      # bounded: 100 polls of up to 100 ms
            values += [record.value for record in consumer.poll(timeout_ms=100)]
            if len(values) >= count:
                break
        return values


def run(root: str) -> dict[str, Any]:
    with logkit.Broker(root) as broker:
        registry = broker.schema_registry()
        # FULL_TRANSITIVE: every version reads every other's data, both ways.
        registry.set_compatibility("FULL_TRANSITIVE", "orders-value")
        customer = {"name": "Ada", "age": 36}
        v1 = broker.producer(value_serializer=AvroSerde(broker, "orders", V1))
        v2 = broker.producer(value_serializer=AvroSerde(broker, "orders", V2))
        v1.send("orders", {"id": 1, "note": "gift wrap", "customer": customer}).result()
        v2.send("orders", {"id": 2, "currency": "USD", "customer": customer}).result()
        v1.send("orders", {"id": 3, "note": "", "customer": customer}).result()

        old = read_all(broker, AvroSerde(broker, "orders", V1), 3)
        new = read_all(broker, AvroSerde(broker, "orders", V2), 3)

        refusals = []
        try:
            registry.register("orders-value", json.dumps(V3))
        except IncompatibleSchemaError as exc:
            refusals.append(("register", str(exc)))
        v3 = broker.producer(value_serializer=AvroSerde(broker, "orders", V3))
        try:
            v3.send("orders", {"id": "4", "customer": customer})
        except logkit.SerializationError as exc:
            refusals.append(("send", str(exc)))
        with broker.serve_schema_registry() as server:
            url = server.url
        return {"old": old, "new": new, "refusals": refusals,
                "versions": registry.versions("orders-value"), "url": url,
                "records": broker.topic("orders").partition(0).log_end_offset}


def main() -> None:
    root = tempfile.mkdtemp(prefix="logkit-schemas-")
    try:
        result = run(root)
    finally:
        shutil.rmtree(root)
    print(f"subject orders-value has versions {result['versions']}; the topic holds "
          f"{result['records']} records")
    print("old consumer (v1 schema) reads:")
    for value in result["old"]:
        print(f"  id={value['id']} note={value['note']!r}")
    print("new consumer (v2 schema) reads:")
    for value in result["new"]:
        print(f"  id={value['id']} currency={value['currency']!r}")
    for where, message in result["refusals"]:
        print(f"v3 refused at {where}: {message}")
    print(f"(the REST API was served at {result['url']})")


if __name__ == "__main__":
    main()
