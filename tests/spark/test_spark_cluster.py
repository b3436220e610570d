"""Spark beyond one machine (DESIGN §18): the `logkit` source reads a leader's shipped
object store on a Spark standalone cluster — a master and two workers, separate JVMs
from PySpark's own jars (tests/helpers/spark_cluster.py) — against moto's S3 server on
loopback (tests/helpers/s3server.py). The leader ships, is closed, and its directory is
removed before the job runs; the cluster's results must equal the source's on a copy of
that directory. The driver is its own process (the suite's local session owns this
one's SparkContext). Also here, on the local session: the pinned failure modes (no
manifest, a damaged object, a retired chunk re-planned).
"""

from __future__ import annotations

import json
import shutil

import pytest

import logkit
from tests.helpers import spark_cluster
from tests.helpers.s3server import s3_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.spark


def fill(broker, topic, partitions, n, *, start=0):
    try:
        broker.create_topic(topic, partitions, config={"segment.bytes": 16384})
    except logkit.TopicExistsError:
        pass
    with broker.producer(linger_ms=5) as producer:
        for i in range(start, start + n):
            producer.send(topic, b"value-%d" % i, key=None if i % 9 == 0 else b"k%d" % (i % 13),
                          headers=[("n", b"%d" % i)] if i % 2 else None)


def fs_options(server):
    return {"fs.endpoint_url": server.endpoint_url, "fs.key": "testing",
            "fs.secret": "testing"}


def rows(spark, **options):
    """The local session's rows, shaped as the cluster driver shapes them."""
    return spark_cluster._rows(spark.read.format("logkit").options(**options).load())


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    """The cluster (master and two workers) and its driver process, started first so
    the executors warm up while the test prepares its data."""
    reason = spark_cluster.skip_reason()
    if reason:
        pytest.skip(reason)
    cluster = spark_cluster.SparkCluster(str(tmp_path_factory.mktemp("cluster"))).start()
    try:
        process = spark_cluster.Driver(cluster, str(tmp_path_factory.mktemp("driver")))
        try:
            yield process
        finally:
            process.stop()
    finally:
        cluster.stop()


def test_cluster_reads_a_removed_leaders_store_batch_and_streaming(
        driver, s3_server, spark, tmp_path):  # noqa: F811 - fixture
    options = fs_options(s3_server)
    # Leader A: ships, closes, is copied, and its directory is removed.
    store_a = s3_server.bucket() + "/leader-a"
    with logkit.Broker(tmp_path / "a", config={"ship.interval.ms": 200}) as broker:
        ship = broker.ship(store_a, storage_options=s3_server.storage_options)
        fill(broker, "t", 2, 3000)
        fill(broker, "u", 1, 500)
        ship.flush()
    shutil.copytree(tmp_path / "a", tmp_path / "a-copy")
    shutil.rmtree(tmp_path / "a")
    # A damaged copy of A's store: one object of u-0 gets a flipped byte.
    fs = s3_server.filesystem()
    store_c = store_a.replace("/leader-a", "/damaged")
    fs.copy(store_a[len("s3://"):], store_c[len("s3://"):], recursive=True)
    damaged = [k for k in fs.find(store_c[len("s3://"):]) if "/u-" in k][0]
    data = bytearray(fs.cat_file(damaged))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(damaged, bytes(data))

    # Leader B: alive while the stream starts, ships more, then closes and is removed.
    store_b = store_a.replace("/leader-a", "/leader-b")
    broker_b = logkit.Broker(tmp_path / "b", config={"ship.interval.ms": 200})
    try:
        ship_b = broker_b.ship(store_b, storage_options=s3_server.storage_options)
        fill(broker_b, "s", 2, 400)
        ship_b.flush()
        driver.submit([
            {"kind": "batch", "options": {"path": store_a, "subscribe": "t,u", **options}},
            {"kind": "batch", "options": {"path": store_a, "subscribe": "t",
                                          "includeHeaders": "true", "minPartitions": "5",
                                          **options}},
            {"kind": "error", "options": {"path": store_c, "subscribe": "u", **options}},
            {"kind": "batch", "options": {"path": store_c, "subscribe": "t", **options}},
            {"kind": "stream", "options": {"path": store_b, "subscribe": "s",
                                           "startingOffsets": "earliest", **options},
             "expect": 1200, "timeout": 45, "checkpoint": str(tmp_path / "checkpoint")},
        ])
        copy_a = str(tmp_path / "a-copy")      # what the cluster must answer
        expected = [rows(spark, path=copy_a, subscribe="t,u"),
                    rows(spark, path=copy_a, subscribe="t", includeHeaders="true")]
        driver.wait_for("status")               # the stream runs
        fill(broker_b, "s", 2, 400, start=400)
        ship_b.flush()          # a writer makes its records visible with flush()
        fill(broker_b, "s", 2, 400, start=800)
    finally:
        broker_b.close()        # ships a last time
    shutil.copytree(tmp_path / "b", tmp_path / "b-copy")
    shutil.rmtree(tmp_path / "b")
    got = driver.results()

    assert len(got[0]) == 3500 and got[0] == expected[0]
    assert got[1] == expected[1]
    assert got[2] is not None and "corrupt" in got[2] and damaged.split("/", 1)[1] in got[2]
    assert got[3] == rows(spark, path=copy_a, subscribe="t")   # never touches u's objects
    assert len(got[4]) == 1200
    assert got[4] == rows(spark, path=str(tmp_path / "b-copy"), subscribe="s")


# ---- the pinned failure modes, on the local session -------------------------------------

def test_a_store_without_a_manifest_is_a_config_error_naming_it(spark, s3_server):  # noqa: F811
    url = s3_server.bucket() + "/nothing-yet"
    with pytest.raises(Exception) as caught:
        spark.read.format("logkit").options(path=url, subscribe="t",
                                            **fs_options(s3_server)).load().collect()
    assert "ConfigError" in str(caught.value) and url in str(caught.value)


def test_fs_options_are_case_insensitive_strings_with_json_for_nested_values():
    from pyspark_logkit.objectstore import storage_options
    got = storage_options({"FS.Endpoint_URL": "http://127.0.0.1:1", "fs.anon": "false",
                           "fs.client_kwargs": '{"region_name": "eu-west-1"}',
                           "subscribe": "t"})
    assert got == {"endpoint_url": "http://127.0.0.1:1", "anon": "false",
                   "client_kwargs": {"region_name": "eu-west-1"}}


def test_fs_options_with_a_directory_path_are_refused(spark, tmp_path):
    with logkit.Broker(tmp_path / "d") as broker:
        broker.create_topic("t", 1)
    with pytest.raises(Exception, match="fs.key"):
        spark.read.format("logkit").options(path=str(tmp_path / "d"), subscribe="t",
                                            **{"fs.key": "x"}).load().collect()


def test_a_retired_chunk_is_replanned_from_the_newer_manifest(s3_server, tmp_path):  # noqa: F811
    from pyspark_logkit.objectstore import StoreBatchReader, read_store_range
    from pyspark_logkit.options import SourceOptions
    url = s3_server.bucket() + "/retire"
    options = {"path": url, "subscribe": "t", **fs_options(s3_server)}
    with logkit.Broker(tmp_path / "lead", config={"ship.interval.ms": 60_000}) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 4096})
        ship = broker.ship(url, storage_options=s3_server.storage_options)
        fill(broker, "t", 1, 20)
        ship.flush()                             # a tail chunk of the active segment
        planned = StoreBatchReader(SourceOptions(options, streaming=False)).partitions()
        chunk = planned[0].objects[-1]["key"]
        assert ".log." in chunk
        fill(broker, "t", 1, 400, start=20)      # the segment rolls: shipped whole
        ship.flush()
    fs = s3_server.filesystem()
    newer = json.loads(fs.cat_file(url[len("s3://"):] + "/manifest.json"))
    keys = {o["key"] for e in newer["partitions"] for o in e["objects"]}
    if chunk in keys:
        pytest.fail(f"the shipper kept {chunk} in its manifest: nothing was retired")
    fs.rm(f"{url[len('s3://'):]}/{chunk}")      # past its grace: deleted
    got = [batch for batch in read_store_range(planned[0])]
    offsets = [o for b in got for o in b.column("offset").to_pylist()]
    assert offsets == list(range(planned[0].start, planned[0].end))



def test_a_task_reading_part_of_an_object_fetches_only_its_batches(s3_server, tmp_path):  # noqa: F811
    """Counted at the S3 server (a TCP proxy in front of it): a range in the middle of one
    object costs its batches plus one small GET per batch header walked, not the object."""
    from pyspark_logkit.objectstore import StoreBatchReader, read_store_range
    from pyspark_logkit.options import SourceOptions
    url = s3_server.bucket() + "/ranges"
    with logkit.Broker(tmp_path / "lead") as broker:
        broker.create_topic("t", 1)
        with broker.ship(url, storage_options=s3_server.storage_options) as ship:
            with broker.producer(linger_ms=50) as producer:
                for i in range(8000):
                    producer.send("t", b"%0200d" % i, key=b"k%d" % i)
            ship.flush()
    proxy = spark_cluster.CountingProxy(int(s3_server.endpoint_url.rsplit(":", 1)[1]))
    try:
        options = {"path": url, "subscribe": "t", "minPartitions": "4",
                   **fs_options(s3_server),
                   "fs.endpoint_url": f"http://127.0.0.1:{proxy.port}"}
        parts = StoreBatchReader(SourceOptions(options, streaming=False)).partitions()
        assert len(parts) == 4 and len(parts[1].objects) == 1
        size = parts[1].objects[0]["size"]
        proxy.served = 0
        offsets = [o for batch in read_store_range(parts[1])
                   for o in batch.column("offset").to_pylist()]
        served = proxy.served
    finally:
        proxy.close()
    assert offsets == list(range(parts[1].start, parts[1].end))
    # a quarter of the records (and a batch at each edge), plus headers walked
    assert served < size * 0.45, f"served {served} of an object of {size} bytes"
