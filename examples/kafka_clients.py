"""Kafka clients on an embedded logkit broker: confluent-kafka and kafka-python produce
and consume through `broker.serve()`, and the embedded API sees the same records and the
same committed offsets.

    python examples/kafka_clients.py [DIR]

Needs confluent-kafka and kafka-python (`pip install logkit[test]`).
"""

from __future__ import annotations

import sys
import tempfile

import logkit


def run(directory: str) -> dict:
    from confluent_kafka import Consumer, Producer
    from kafka import KafkaProducer

    with logkit.Broker(directory) as broker, broker.serve() as server:
        print(f"listening at {server.bootstrap_servers}")
        broker.create_topic("orders", 2)

        # a librdkafka producer and a kafka-python producer, unchanged
        producer = Producer({"bootstrap.servers": server.bootstrap_servers,
                             "partitioner": "murmur2_random"})    # Kafka's partitioner
        for n in range(3):
            producer.produce("orders", f"order-{n}".encode(), f"customer-{n}".encode())
        producer.flush(10)
        other = KafkaProducer(bootstrap_servers=server.bootstrap_servers)
        other.send("orders", key=b"customer-9", value=b"order-9").get(timeout=10)
        other.close()

        # the embedded API reads what the wire wrote
        embedded = sorted(r.value for p in broker.topic("orders").partitions
                          for r in p.read(0))
        print("embedded read:", embedded)

        # a Kafka consumer group commits; the broker shows the offsets
        consumer = Consumer({"bootstrap.servers": server.bootstrap_servers,
                             "group.id": "billing", "auto.offset.reset": "earliest",
                             "enable.auto.commit": False})
        consumer.subscribe(["orders"])
        wire = []
        for _ in range(100):
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                wire.append(message.value())
            if len(wire) == 4:
                break
        consumer.commit(asynchronous=False)
        consumer.close()
        committed = broker.group("billing").committed()
        print("wire consumer read:", sorted(wire))
        print("committed offsets:", {f"{tp.topic}-{tp.partition}": o
                                     for tp, o in sorted(committed.items())})
        return {"embedded": embedded, "wire": sorted(wire),
                "committed": sum(committed.values())}


if __name__ == "__main__":
    run(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="logkit-"))
