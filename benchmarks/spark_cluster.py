"""Spark beyond one machine (DESIGN §18, issue 35): the `logkit` source reading a
leader's shipped object store on a Spark standalone cluster (a master and two 1-core
workers as separate JVMs from PySpark's jars, tests/helpers/spark_cluster.py) against
moto's S3 server on 127.0.0.1, beside the same read of the leader's directory in
local[2]. Three numbers, one run:

  scan      a full batch read (sum(length(value)), count(*)) of N records (10-byte keys,
            100-byte values, 2 partitions): cluster from the store vs local[2] from the
            directory (through the JVM reader, and through the Python source); medians.
            Target: cluster <= 2x local[2].
  fetched   bytes the S3 server sent during the cluster's scans (counted by a TCP proxy
            in front of it: HTTP headers and the driver's manifest reads included) over
            the bytes of the batches read (the objects' sizes the manifest records).
            Target: <= 1.1x.
  lag       a streaming query on the cluster following a live leader's store (default
            ship.interval.ms, 1000): each record's produce time (its CreateTime) to its
            row reaching the sink (foreachBatch on the driver). Target: <= 2 x
            ship.interval.ms.

Run from the checkout's root:
    .venv/bin/python -m benchmarks.spark_cluster [--records 1000000] [--repeats 3]
writes benchmarks/spark_cluster.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import logkit  # noqa: E402

from tests.helpers import s3server, spark_cluster  # noqa: E402

PARTITIONS = 2
INTERVAL_MS = 1000
LAG_SECONDS = 15.0
LAG_RECORDS_PER_TICK, LAG_TICK_S = 20, 0.05


def fill(root: str, records: int) -> None:
    with logkit.Broker(root) as broker:
        broker.create_topic("bench", PARTITIONS)
        producer = broker.producer(linger_ms=5)
        value = b"v" * 100
        for i in range(records):
            producer.send("bench", value, key=b"%010d" % i, partition=i % PARTITIONS)
        producer.close()


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__),
                                                      "spark_cluster.json"))
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="logkit-bench-cluster-")
    server = s3server.start()
    proxy = spark_cluster.CountingProxy(int(server.endpoint_url.rsplit(":", 1)[1]))
    cluster = spark_cluster.SparkCluster(os.path.join(work, "cluster")).start()
    driver = spark_cluster.Driver(cluster, os.path.join(work, "driver"))
    try:
        leader = os.path.join(work, "leader")
        fill(leader, args.records)
        bucket = server.bucket()
        store = bucket + "/scan"
        with logkit.Broker(leader) as broker:
            with broker.ship(store, storage_options=server.storage_options) as ship:
                ship.flush()
        manifest = json.loads(server.filesystem().cat_file(
            store[len("s3://"):] + "/manifest.json"))
        batch_bytes = sum(int(o["size"]) for e in manifest["partitions"]
                          for o in e["objects"])
        via_proxy = {"fs.endpoint_url": f"http://127.0.0.1:{proxy.port}",
                     "fs.key": "testing", "fs.secret": "testing"}
        direct = {"fs.endpoint_url": server.endpoint_url, "fs.key": "testing",
                  "fs.secret": "testing"}
        live = bucket + "/live"
        broker_b = logkit.Broker(os.path.join(work, "live"),
                                 config={"ship.interval.ms": INTERVAL_MS})
        broker_b.create_topic("live", PARTITIONS)
        ship_b = broker_b.ship(live, storage_options=server.storage_options)
        ship_b.flush()
        lag_records = int(LAG_SECONDS / LAG_TICK_S) * LAG_RECORDS_PER_TICK
        driver.wait_for("ready")
        proxy.served = 0
        driver.submit([
            {"kind": "scan", "repeats": args.repeats,
             "options": {"path": store, "subscribe": "bench", **via_proxy}},
            {"kind": "lag", "options": {"path": live, "subscribe": "live", **direct},
             "expect": lag_records, "timeout": LAG_SECONDS + 30,
             "checkpoint": os.path.join(work, "checkpoint")}])
        driver.wait_for("status", timeout=600)
        served = proxy.served
        time.sleep(2.0)               # the stream's first trigger: records after it count
        with broker_b.producer(linger_ms=0) as producer:
            for _ in range(int(LAG_SECONDS / LAG_TICK_S)):
                for i in range(LAG_RECORDS_PER_TICK):
                    producer.send("live", b"x" * 100, partition=i % PARTITIONS)
                producer.flush()
                time.sleep(LAG_TICK_S)
        scans, lags = driver.results(timeout=600)
        broker_b.close()
    finally:
        driver.stop()
        cluster.stop()
        proxy.close()
        s3server.stop(server)

    from pyspark_logkit import local_session
    spark = local_session("bench-local", **{"spark.driver.memory": "2g"})
    local: dict[str, list[float]] = {"jvm": [], "python": []}
    try:
        for _ in range(args.repeats):
            for reader in ("jvm", "python"):
                spark.conf.set("spark.logkit.jvm.enabled", str(reader == "jvm").lower())
                began = time.perf_counter()
                spark.read.format("logkit").options(path=leader, subscribe="bench").load() \
                    .selectExpr("sum(length(value))", "count(*)").collect()
                local[reader].append(time.perf_counter() - began)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    lags.sort()
    cluster_s = median(scans)
    document = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "records": args.records, "partitions": PARTITIONS, "repeats": args.repeats,
        "load_average": list(os.getloadavg()),
        "scan": {"cluster_store_s": scans, "local2_directory_jvm_s": local["jvm"],
                 "local2_directory_python_s": local["python"],
                 "cluster_over_local_jvm": cluster_s / median(local["jvm"]),
                 "cluster_over_local_python": cluster_s / median(local["python"]),
                 "target": 2.0},
        "fetched": {"bytes_served": served, "batch_bytes_read": batch_bytes * args.repeats,
                    "ratio": served / (batch_bytes * args.repeats), "target": 1.1},
        "lag": {"ship_interval_ms": INTERVAL_MS, "records": lag_records,
                "seen": len(lags),
                "p50_ms": lags[len(lags) // 2] if lags else None,
                "p99_ms": lags[int(len(lags) * 0.99)] if lags else None,
                "max_ms": lags[-1] if lags else None, "target_ms": 2 * INTERVAL_MS},
    }
    with open(args.out, "w") as f:
        json.dump(document, f, indent=1)
    print(json.dumps(document, indent=1))
    return document


if __name__ == "__main__":
    main()
