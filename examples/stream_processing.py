"""Stream processing, the second application in Kafka's design notes: events go into
logkit, a Spark Structured Streaming job aggregates them and writes the results back
into a logkit topic, and a consumer group reads the results.

    events --producer--> [page-views] --Spark (logkit source)--> count per page
           --Spark (logkit sink, exactly-once)--> [page-counts] --consumer group--> dashboard

Run: .venv/bin/python examples/stream_processing.py [directory]
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
from typing import Any

import logkit

PAGES = ["/", "/pricing", "/docs", "/blog", "/signup", "/login", "/about", "/careers"]


def spark_session() -> Any:
    from pyspark_logkit import local_session
    return local_session("logkit-stream-processing", log4j_config=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "log4j2.properties"))


def produce_page_views(root: str, count: int, *, seed: int = 7) -> dict[str, int]:
    """Produce `count` page-view events keyed by user; returns the true counts."""
    rng = random.Random(seed)
    truth: dict[str, int] = {}
    with logkit.Broker(root) as broker:
        if "page-views" not in broker.topics():
            broker.create_topic("page-views", partitions=3)
        producer = broker.producer(linger_ms=5)
        for i in range(count):
            page = rng.choices(PAGES, weights=[8, 3, 5, 2, 1, 2, 1, 1])[0]
            truth[page] = truth.get(page, 0) + 1
            event = {"user": f"user-{rng.randrange(1000)}", "page": page, "n": i}
            producer.send("page-views", json.dumps(event).encode(),
                          key=event["user"].encode())
        producer.close()
    return truth


def aggregate_with_spark(spark: Any, root: str, checkpoint: str) -> int:
    """The streaming job: read page-views, count per page, write page-counts."""
    from pyspark.sql import functions as F
    views = (spark.readStream.format("logkit").option("path", root)
             .option("subscribe", "page-views").option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", 20000).load())
    counts = (views.select(F.get_json_object(F.col("value").cast("string"), "$.page")
                           .alias("page"))
              .groupBy("page").count()
              .select(F.col("page").alias("key"),
                      F.to_json(F.struct("page", "count")).alias("value")))
    query = (counts.writeStream.format("logkit").outputMode("complete")
             .option("path", root).option("topic", "page-counts")
             .option("sinkId", "page-counts-job")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination(600)
    if query.exception() is not None:
        raise RuntimeError(f"streaming job failed: {query.exception()}")
    return sum(p["numInputRows"] for p in query.recentProgress)


def read_dashboard(root: str) -> dict[str, int]:
    """A consumer group reads the results; the latest count per page wins."""
    latest: dict[str, int] = {}
    with logkit.Broker(root) as broker:
        consumer = broker.consumer("page-counts", group_id="dashboard",
                                   auto_offset_reset="earliest", enable_auto_commit=False)
        while True:
            records = consumer.poll(timeout_ms=500)
            if not records:
                break
            for record in records:
                row = json.loads(record.value)
                latest[row["page"]] = row["count"]
            consumer.commit()
    return latest


def run(root: str, events: int = 20000, spark: Any = None) -> dict[str, Any]:
    started = time.perf_counter()
    own_session = spark is None
    spark = spark or spark_session()
    try:
        produce_started = time.perf_counter()
        truth = produce_page_views(root, events)
        produced_s = time.perf_counter() - produce_started
        rows_in = aggregate_with_spark(spark, root, os.path.join(root, "_checkpoint"))
        dashboard = read_dashboard(root)
    finally:
        if own_session:
            spark.stop()
    return {"events": events, "spark_rows_in": rows_in, "truth": truth,
            "dashboard": dashboard, "produce_seconds": produced_s,
            "total_seconds": time.perf_counter() - started}


def report(result: dict[str, Any]) -> None:
    print(f"produced {result['events']:,} page views in {result['produce_seconds']:.2f} s")
    print(f"Spark streamed {result['spark_rows_in']:,} records from logkit and wrote "
          f"{len(result['dashboard'])} page counts back to logkit")
    top = sorted(result["dashboard"].items(), key=lambda kv: -kv[1])[:3]
    print("top pages (read by consumer group 'dashboard'): " +
          ", ".join(f"{page} {count:,}" for page, count in top))
    ok = result["dashboard"] == result["truth"]
    print(f"counts match the events produced: {'yes' if ok else 'NO'}; "
          f"total {result['total_seconds']:.1f} s")


if __name__ == "__main__":
    directory = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="logkit-sp-")
    try:
        report(run(directory))
    finally:
        if len(sys.argv) <= 1:
            shutil.rmtree(directory)
