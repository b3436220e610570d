"""Replication through an object store: `broker.ship(url)`, `logkit.ObjectStoreSource`
and `logkit restore`, against the local filesystem (file:// URLs) and a real S3 API
server (moto's server mode on 127.0.0.1, its own process; tests/helpers/s3server.py).

Damage is done to the real objects: truncated, bit-flipped, deleted, a stray object
the manifest does not name, and a manifest naming a half-uploaded object."""

from __future__ import annotations

import filecmp
import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

import logkit
from logkit.cli import main as cli_main
from logkit.replication import objectstore
from logkit.leader.lease import replica_id
from logkit.replication.objectstore import MANIFEST_KEY
from tests.helpers.s3server import s3_server  # noqa: F401  (a session fixture)

TOPIC_CONFIG = {"segment.bytes": 4096, "retention.ms": 86400000}


def make_store(request, tmp_path, kind):
    """(url, storage_options, fsspec filesystem, root path) of an empty store."""
    if kind == "file":
        import fsspec
        root = str(tmp_path / "bucket")
        return f"file://{root}", None, fsspec.filesystem("file"), root
    server = request.getfixturevalue("s3_server")
    url = server.bucket() + "/shipped"
    return url, server.storage_options, server.filesystem(), url[len("s3://"):]


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    return make_store(request, tmp_path, request.param)


@pytest.fixture
def local_store(tmp_path):
    import fsspec
    root = str(tmp_path / "bucket")
    return f"file://{root}", None, fsspec.filesystem("file"), root


def fill(broker, records=300, partitions=2):
    """A topic with rolled segments and an active one, and a group's commit."""
    broker.create_topic("orders", partitions, config=TOPIC_CONFIG)
    with broker.producer() as producer:
        for i in range(records):
            producer.send("orders", key=f"k{i}".encode(), value=b"v" * 60 + str(i).encode())
            if i % 10 == 9:
                producer.flush()                # small batches: several segments
    consumer = broker.consumer("orders", group_id="billing", auto_offset_reset="earliest",
                               enable_auto_commit=False)
    got = 0
    while got < records // 3:
        got += len(consumer.poll(timeout_ms=200))
    consumer.commit()
    consumer.close()
    return broker.group("billing").committed()


def manifest(fs, root):
    return json.loads(fs.cat_file(f"{root}/{MANIFEST_KEY}"))


def log_files(root, name):
    return sorted(f for f in os.listdir(os.path.join(root, name)) if f.endswith(".log"))


def assert_same_logs(leader_root, copy_root, partitions=("orders-0", "orders-1")):
    for name in partitions:
        assert log_files(leader_root, name) == log_files(copy_root, name)
        for f in log_files(leader_root, name):
            assert filecmp.cmp(os.path.join(leader_root, name, f),
                               os.path.join(copy_root, name, f), shallow=False), (name, f)


def shipped_object(fs, root, *, rolled=True):
    """The record of one shipped object of orders-0: a rolled segment or a chunk of the
    active one."""
    entry = next(e for e in manifest(fs, root)["partitions"] if e["partition"] == 0)
    objects = [o for o in entry["objects"] if o["key"].endswith(".log") == rolled]
    return objects[0]


# ---- the layout and the shipper ----------------------------------------------------------

def test_the_manifest_names_whole_segments_and_chunks_with_their_size_and_sha256(
        tmp_path, store):
    url, options, fs, root = store
    with logkit.Broker(tmp_path / "leader") as broker:
        committed = fill(broker)
        with broker.ship(url, storage_options=options) as shipper:
            shipper.flush()
            assert shipper.url == url
        body = manifest(fs, root)
        topic_id = broker.topic("orders").topic_id
        for entry in body["partitions"]:
            p = broker.topic("orders").partition(entry["partition"])
            assert entry["log_end_offset"] == p.log_end_offset
            assert entry["segment_base_offsets"] == p.segment_base_offsets()
            assert entry["epochs"] == [[0, 0]]
            rolled = [o for o in entry["objects"] if o["key"].endswith(".log")]
            chunks = [o for o in entry["objects"] if not o["key"].endswith(".log")]
            assert len(rolled) == len(p.segment_base_offsets()) - 1 >= 2
            assert len(chunks) == 1
            active = p.segment_base_offsets()[-1]
            assert chunks[0]["key"].endswith(
                f"/{active:020d}.log.{active:020d}-{p.log_end_offset:020d}")
            for obj in entry["objects"]:
                assert obj["key"].startswith(f"orders-{topic_id}/{entry['partition']}/")
                data = fs.cat_file(f"{root}/{obj['key']}")
                assert len(data) == obj["size"]
                import hashlib
                assert hashlib.sha256(data).hexdigest() == obj["sha256"]
            for obj in rolled:                    # whole objects named like their files
                name = obj["key"].rsplit("/", 1)[1]
                with open(os.path.join(p.directory, name), "rb") as f:
                    assert f.read() == fs.cat_file(f"{root}/{obj['key']}")
        assert not [k for k in fs.find(root) if k.endswith(".index")]
        assert body["topics"]["orders"]["config"]["segment.bytes"] == 4096
        assert {(t, p): o for t, p, o in body["groups"]["billing"]} == \
            {(tp.topic, tp.partition): o for tp, o in committed.items()}


def chunk_keys(fs, root, partition=0):
    entry = next(e for e in manifest(fs, root)["partitions"] if e["partition"] == partition)
    return [o["key"].rsplit("/", 1)[1] for o in entry["objects"]]


def test_each_pass_uploads_only_the_new_batches_and_a_roll_folds_the_chunks(
        tmp_path, local_store, monkeypatch):
    """The active segment ships as chunks of the batches appended since the pass
    before; when it rolls, the whole segment is uploaded once and the chunks retire
    (deleted after the grace, none here)."""
    url, options, fs, root = local_store
    monkeypatch.setattr(objectstore, "RETIRE_GRACE_MIN_S", 0.0)   # no grace at all
    monkeypatch.setattr(objectstore, "RETIRE_GRACE_INTERVALS", 0)
    with logkit.Broker(tmp_path / "leader", config={"ship.interval.ms": 3600000}) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 4096})
        p = broker.topic("t").partition(0)
        shipper = broker.ship(url)
        sizes = []
        for n in range(3):
            before, end_before = shipper.uploaded_bytes, p.log_end_offset
            p.append([(None, b"x" * 100, [], None)] * (n + 1))
            shipper.flush()
            appended = len(p.batches_since(end_before))
            sizes.append(shipper.uploaded_bytes - before)
            assert sizes[-1] == appended                  # the new batch, nothing more
        assert chunk_keys(fs, root) == [f"{0:020d}.log.{0:020d}-{1:020d}",
                                        f"{0:020d}.log.{1:020d}-{3:020d}",
                                        f"{0:020d}.log.{3:020d}-{6:020d}"]
        old_chunks = chunk_keys(fs, root)
        shipper.flush()                                   # nothing new: nothing uploaded
        assert shipper.uploaded_bytes - before == sizes[-1]
        while len(p.segment_base_offsets()) < 2:          # roll the segment
            p.append([(None, b"y" * 400, [], None)])
        shipper.flush()
        keys = chunk_keys(fs, root)
        assert keys[0] == f"{0:020d}.log"
        with open(os.path.join(p.directory, keys[0]), "rb") as f:
            assert f.read() == fs.cat_file(f"{root}/{next(iter(_objects(fs, root)))}")
        prefix = _objects(fs, root)[0].rsplit("/", 1)[0]
        for key in old_chunks:                            # retired and deleted
            assert not fs.exists(f"{root}/{prefix}/{key}")
        shipper.close()
        shipper.close()                                   # safe twice
    logkit.ObjectStoreSource(url).restore(tmp_path / "restored")
    assert_same_logs(str(tmp_path / "leader"), str(tmp_path / "restored"), ("t-0",))


def _objects(fs, root, partition=0):
    entry = next(e for e in manifest(fs, root)["partitions"] if e["partition"] == partition)
    return [o["key"] for o in entry["objects"]]


def test_the_newest_chunks_merge_by_size_tiers(tmp_path, local_store, monkeypatch):
    """Fan-out 2, equal appends: the chunks of the active segment merge like a binary
    counter (1, 2, 2+1, 4, ...), one merge upload per pass at most; past the merge
    limit they stay as they are. The copy is byte-identical either way."""
    url, options, fs, root = local_store
    monkeypatch.setattr(objectstore, "TAIL_MERGE_FANOUT", 2)
    with logkit.Broker(tmp_path / "leader", config={"ship.interval.ms": 3600000}) as broker:
        broker.create_topic("t", 1)
        p = broker.topic("t").partition(0)
        with broker.ship(url) as shipper:
            counts, uploads = [], []
            for n in range(8):
                before = shipper.uploaded_objects
                p.append([(None, b"z" * 50, [], None)])
                shipper.flush()
                counts.append(len(chunk_keys(fs, root)))
                uploads.append(shipper.uploaded_objects - before)
                entry = manifest(fs, root)["partitions"][0]
                assert entry["objects"][0]["first_offset"] == 0
                assert entry["objects"][-1]["end_offset"] == n + 1
            assert counts == [1, 1, 2, 1, 2, 2, 3, 1]            # bits of n + 1
            assert max(uploads) == 2                               # the new one, a merge
            assert chunk_keys(fs, root) == [f"{0:020d}.log.{0:020d}-{8:020d}"]
            one = manifest(fs, root)["partitions"][0]["objects"][0]["size"] // 8
            monkeypatch.setattr(objectstore, "TAIL_MERGE_MAX_BYTES", one)
            for n in range(3):
                p.append([(None, b"z" * 50, [], None)])
                shipper.flush()
            assert len(chunk_keys(fs, root)) == 4        # 8 | 1 1 1: no merge fits
    logkit.ObjectStoreSource(url).restore(tmp_path / "restored")
    assert_same_logs(str(tmp_path / "leader"), str(tmp_path / "restored"), ("t-0",))


def test_a_truncated_and_rewritten_tail_is_shipped_again(tmp_path, local_store, caplog):
    """The log is truncated below what was shipped and grows back past it in a new
    leader epoch: the shipper notices (each object records its last batch's epoch and
    CRC), ships those offsets again, and a source still holding the older manifest
    reads the new bytes, not a checksum error."""
    url, options, fs, root = local_store
    caplog.set_level(logging.WARNING, logger="logkit.replication.objectstore")
    with logkit.Broker(tmp_path / "leader", config={"ship.interval.ms": 3600000}) as broker:
        broker.create_topic("t", 1)
        p = broker.topic("t").partition(0)
        with broker.ship(url) as shipper, logkit.ObjectStoreSource(url) as source:
            for n in range(3):
                p.append([(None, b"old%d" % n, [], None)] * (n + 1))
                shipper.flush()
            assert source.partition("t", 0).log_end_offset == 6     # reads the manifest
            p.truncate_to(3)
            p.set_leader_epoch(1)
            p.append([(None, b"new", [], None)] * 3)
            shipper.flush()
            assert source.fetch("t", 0, 3, max_bytes=1 << 20) == p.batches_since(3)
        assert manifest(fs, root)["partitions"][0]["epochs"] == [[0, 0], [1, 3]]
    assert any("differ from the log" in r.getMessage() for r in caplog.records)
    logkit.ObjectStoreSource(url).restore(tmp_path / "restored")
    assert_same_logs(str(tmp_path / "leader"), str(tmp_path / "restored"), ("t-0",))


def test_a_manifest_of_whole_tail_objects_still_restores_and_ships_on(tmp_path,
                                                                      local_store):
    """The first layout shipped the active segment as one `<base>.log.tail.<end>`
    object: such a manifest is still read, and a shipper goes on from it with chunks."""
    url, options, fs, root = local_store
    leader = tmp_path / "leader"
    with logkit.Broker(leader) as broker:
        broker.create_topic("t", 1)
        p = broker.topic("t").partition(0)
        p.append([(None, b"a", [], None), (None, b"b", [], None)])
        with broker.ship(url) as shipper:
            shipper.flush()
    body = manifest(fs, root)
    obj = body["partitions"][0]["objects"][0]
    old_key = obj["key"].rsplit(".", 1)[0] + f".tail.{2:020d}"     # <base>.log.tail.<end>
    fs.mv(f"{root}/{obj['key']}", f"{root}/{old_key}")
    obj["key"] = old_key
    fs.pipe_file(f"{root}/{MANIFEST_KEY}", json.dumps(body).encode())
    logkit.ObjectStoreSource(url).restore(tmp_path / "restored")
    assert_same_logs(str(leader), str(tmp_path / "restored"), ("t-0",))
    with logkit.Broker(leader) as broker:
        broker.topic("t").partition(0).append([(None, b"c", [], None)])
        with broker.ship(url) as shipper:
            shipper.flush()
            assert shipper.uploaded_objects == 1          # the new batch only
    assert chunk_keys(fs, root) == [old_key.rsplit("/", 1)[1],
                                    f"{0:020d}.log.{2:020d}-{3:020d}"]
    logkit.ObjectStoreSource(url).restore(tmp_path / "restored-2")
    assert_same_logs(str(leader), str(tmp_path / "restored-2"), ("t-0",))


def test_close_ships_a_last_time_and_the_broker_closes_its_shipper(tmp_path, local_store):
    url, _, fs, root = local_store
    with logkit.Broker(tmp_path / "leader", config={"ship.interval.ms": 60000}) as broker:
        broker.create_topic("t", 1)
        shipper = broker.ship(url)
        shipper.flush()
        broker.topic("t").partition(0).append([(None, b"late", [], None)])
    assert shipper.closed
    assert manifest(fs, root)["partitions"][0]["log_end_offset"] == 1


def test_the_broker_closes_its_shipper_last_so_its_last_pass_ships_everything(
        tmp_path, local_store):
    """Made before the shipper, a producer with a batch lingering and a consumer that
    commits as it closes are closed before it all the same; a topic created and an
    offset committed after the last timed pass ship too."""
    url, _, fs, root = local_store
    broker = logkit.Broker(tmp_path / "leader", config={"ship.interval.ms": 3600000})
    broker.create_topic("t", 1)
    broker.topic("t").partition(0).append([(None, b"%d" % i, [], None) for i in range(5)])
    producer = broker.producer(linger_ms=3600000)
    consumer = broker.consumer("t", group_id="on-close", auto_offset_reset="earliest")
    shipper = broker.ship(url)
    shipper.flush()
    assert manifest(fs, root)["groups"] == {"on-close": []}      # joined, no commit yet
    broker.create_topic("late", 2, config={"retention.bytes": 7654321})
    producer.send("t", value=b"lingering")
    got = 0
    while got < 5:
        got += len(consumer.poll(timeout_ms=200))
    manual = broker.consumer(group_id="explicit")
    manual.assign([logkit.TopicPartition("t", 0)])
    manual.commit({logkit.TopicPartition("t", 0): 3})
    broker.close()
    assert shipper.closed
    body = manifest(fs, root)
    assert body["topics"]["late"]["partitions"] == 2
    assert body["partitions"][-1]["log_end_offset"] == 6          # t-0, with the lingerer
    summary = logkit.ObjectStoreSource(url).restore(tmp_path / "restored")
    assert summary["groups"] == 2
    with logkit.Broker(tmp_path / "restored") as copy:
        assert copy.topic("late").config["retention.bytes"] == 7654321
        assert copy.group("explicit").committed() == {logkit.TopicPartition("t", 0): 3}
        assert copy.group("on-close").committed() == {logkit.TopicPartition("t", 0): 5}
        assert copy.topic("t").partition(0).read(5)[0].value == b"lingering"


def test_shipping_survives_a_store_that_fails_and_logs_a_warning(request, tmp_path,
                                                                  caplog):
    """The bucket does not exist at first (every upload fails); once it is created the
    shipper's retries succeed."""
    server = request.getfixturevalue("s3_server")
    bucket = f"logkit-late-{os.getpid()}"
    url = f"s3://{bucket}/x"
    caplog.set_level(logging.WARNING, logger="logkit.replication.objectstore")
    with logkit.Broker(tmp_path / "leader", config={"ship.interval.ms": 20}) as broker:
        broker.create_topic("t", 1)
        broker.topic("t").partition(0).append([(None, b"a", [], None)])
        shipper = broker.ship(url, storage_options=server.storage_options)
        source = logkit.ObjectStoreSource(url, storage_options=server.storage_options)
        with pytest.raises((logkit.StorageError, OSError)):
            shipper.flush()
        server.filesystem().mkdir(bucket)
        with logkit.Follower(tmp_path / "follower", source) as follower:
            follower.catch_up(timeout=30)               # the shipper's own retries
        assert follower.log_end_offsets()[logkit.TopicPartition("t", 0)] == 1
        shipper.close()
    assert any("shipping failed, retrying" in r.getMessage() for r in caplog.records)


# ---- the source --------------------------------------------------------------------------

def test_a_follower_through_the_object_store_is_byte_identical(tmp_path, store):
    url, options, fs, root = store
    leader_root = str(tmp_path / "leader")
    with logkit.Broker(leader_root, config={"ship.interval.ms": 20}) as broker:
        committed = fill(broker)
        shipper = broker.ship(url, storage_options=options)
        source = logkit.ObjectStoreSource(url, storage_options=options)
        with logkit.Follower(tmp_path / "follower", source) as follower:
            follower.catch_up(timeout=30)
            with broker.producer() as producer:         # more, shipped by the thread
                for i in range(200):
                    producer.send("orders", value=b"w" * 80)
            shipper.flush()
            follower.catch_up(timeout=30)
        shipper.close()
        broker.flush()
        assert_same_logs(leader_root, str(tmp_path / "follower"))
    with logkit.Broker(tmp_path / "follower", read_only=True) as copy:
        assert copy.group("billing").committed() == committed
        assert copy.topic("orders").config["segment.bytes"] == 4096


def test_the_source_reports_what_the_manifest_holds(tmp_path, local_store):
    url, _, fs, root = local_store
    with logkit.Broker(tmp_path / "leader") as broker:
        fill(broker, records=100, partitions=1)
        with broker.ship(url) as shipper:
            shipper.flush()
        p = broker.topic("orders").partition(0)
        with logkit.ObjectStoreSource(url) as source:
            info = source.partition("orders", 0)
            assert (info.log_start_offset, info.log_end_offset) == (0, p.log_end_offset)
            assert info.segment_base_offsets == tuple(p.segment_base_offsets())
            assert source.fetch("orders", 0, p.log_end_offset, max_bytes=1) == b""
            assert source.fetch("orders", 0, 0, max_bytes=1 << 20) == \
                p.batches_since(0, upto=p.segment_base_offsets()[1])
            with pytest.raises(logkit.UnknownTopicError):
                source.partition("nope", 0)
            with pytest.raises(logkit.OffsetOutOfRangeError):
                source.fetch("orders", 0, p.log_end_offset + 1, max_bytes=1)
            source.report_progress("f1", {})           # a no-op: nothing to assert on
            assert not [k for k in fs.find(root) if "replicas" in k]


def test_a_url_with_nothing_shipped_is_a_storage_error(tmp_path):
    with logkit.ObjectStoreSource(f"file://{tmp_path}/empty") as source:
        with pytest.raises(logkit.StorageError, match="no manifest.json"):
            source.topics()


# ---- damage: nothing damaged is taken as data ------------------------------------------

def shipped(tmp_path, store_tuple):
    url, options, fs, root = store_tuple
    with logkit.Broker(tmp_path / "leader") as broker:
        fill(broker, records=200)
        with broker.ship(url, storage_options=options) as shipper:
            shipper.flush()
    return url, options, fs, root


def truncate(fs, root, key):
    data = fs.cat_file(f"{root}/{key}")
    fs.pipe_file(f"{root}/{key}", data[: len(data) // 2])


def flip(fs, root, key):
    data = bytearray(fs.cat_file(f"{root}/{key}"))
    data[len(data) // 3] ^= 0x10
    fs.pipe_file(f"{root}/{key}", bytes(data))


def delete(fs, root, key):
    fs.rm_file(f"{root}/{key}")


@pytest.mark.parametrize("damage, message", [
    (truncate, "size differs"),
    (flip, "SHA-256 differs"),
    (delete, "missing"),
])
@pytest.mark.parametrize("kind, rolled", [("file", True), ("file", False), ("s3", True)],
                         ids=["file-rolled", "file-tail", "s3-rolled"])
def test_restore_refuses_a_damaged_object_and_writes_nothing(request, tmp_path, kind,
                                                             rolled, damage, message):
    url, options, fs, root = shipped(tmp_path, make_store(request, tmp_path, kind))
    key = shipped_object(fs, root, rolled=rolled)["key"]
    damage(fs, root, key)
    target = tmp_path / "restored"
    with pytest.raises(logkit.CorruptRecordError, match=message) as caught:
        logkit.ObjectStoreSource(url, storage_options=options).restore(target)
    assert key in str(caught.value)
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir() if "restore" in p.name] == []


def test_a_follower_refuses_a_bit_flipped_object_and_stops_with_the_error(tmp_path,
                                                                          local_store):
    url, options, fs, root = shipped(tmp_path, local_store)
    flip(fs, root, shipped_object(fs, root)["key"])
    follower = logkit.Follower(tmp_path / "follower", logkit.ObjectStoreSource(url),
                               config={"replica.fetch.backoff.ms": 10})
    with pytest.raises(logkit.CorruptRecordError, match="SHA-256"):
        follower.catch_up(timeout=30)
    with logkit.Broker(tmp_path / "follower", read_only=True) as copy:
        assert copy.topic("orders").partition(0).log_end_offset == 0


def test_a_manifest_naming_a_half_uploaded_object_is_refused(tmp_path, local_store):
    """An upload cut short: the manifest (written by hand here, as a shipper that did not
    wait for the upload would) names the full size, the object holds half."""
    url, options, fs, root = shipped(tmp_path, local_store)
    body = manifest(fs, root)
    entry = next(e for e in body["partitions"] if e["partition"] == 0)
    obj = entry["objects"][-1]
    assert not obj["key"].endswith(".log")                      # a chunk
    full = fs.cat_file(f"{root}/{obj['key']}")
    obj["key"] = obj["key"][:-20] + f"{obj['end_offset'] + 1:020d}"   # a new name
    fs.pipe_file(f"{root}/{obj['key']}", full[: len(full) // 2])
    fs.pipe_file(f"{root}/{MANIFEST_KEY}", json.dumps(body).encode())
    with pytest.raises(logkit.CorruptRecordError, match="size differs"):
        logkit.ObjectStoreSource(url).restore(tmp_path / "restored")
    assert not (tmp_path / "restored").exists()


def test_an_object_the_manifest_does_not_name_is_not_data(tmp_path, local_store):
    """A stray segment (uploaded by a shipper killed before its manifest) beside the
    shipped ones: restore and followers never see it."""
    url, options, fs, root = shipped(tmp_path, local_store)
    key = shipped_object(fs, root)["key"]
    stray = key.rsplit("/", 1)[0] + "/00000000000000099999.log"
    fs.pipe_file(f"{root}/{stray}", fs.cat_file(f"{root}/{key}"))
    summary = logkit.ObjectStoreSource(url).restore(tmp_path / "restored")
    assert summary["offsets"] == 200
    assert_same_logs(str(tmp_path / "leader"), str(tmp_path / "restored"))


def test_a_malformed_manifest_is_refused(tmp_path, local_store):
    url, options, fs, root = shipped(tmp_path, local_store)
    body = manifest(fs, root)
    body["partitions"][0]["objects"][0]["key"] = "../../etc/passwd"
    fs.pipe_file(f"{root}/{MANIFEST_KEY}", json.dumps(body).encode())
    with pytest.raises(logkit.CorruptRecordError, match="outside the layout"):
        logkit.ObjectStoreSource(url).restore(tmp_path / "restored")


# ---- restore -----------------------------------------------------------------------------

def test_restore_round_trip_topics_configs_offsets(tmp_path, store):
    url, options, fs, root = store
    leader_root = str(tmp_path / "leader")
    with logkit.Broker(leader_root) as broker:
        committed = fill(broker)
        broker.create_topic("audit", 1, config={"retention.bytes": 123456789})
        broker.topic("audit").partition(0).append([(b"k", b"v", [], None)])
        with broker.ship(url, storage_options=options) as shipper:
            shipper.flush()
    target = str(tmp_path / "restored")
    summary = logkit.ObjectStoreSource(url, storage_options=options).restore(target)
    assert summary["topics"] == 2 and summary["groups"] == 1
    assert_same_logs(leader_root, target)
    with logkit.Broker(target) as copy:
        assert copy.topics() == ["audit", "orders"]
        assert copy.topic("audit").config["retention.bytes"] == 123456789
        assert copy.group("billing").committed() == committed
        for name in copy.topics():
            for p in copy.topic(name).partitions:
                p.check()
                assert p.leader_epoch == 1            # restored as the next leader
        for p in copy.topic("orders").partitions:     # the copy takes writes
            p.append([(None, b"after restore", [], None)])
        consumer = copy.consumer("orders", group_id="billing", enable_auto_commit=False)
        first = {}
        while len(first) < 2:
            for record in consumer.poll(timeout_ms=200):
                first.setdefault(logkit.TopicPartition(record.topic, record.partition),
                                 record.offset)
        consumer.close()
        assert first == committed                      # goes on from the commit


def test_the_replication_factor_is_shipped_and_kept_by_followers_and_restore(
        tmp_path, local_store):
    url, options, fs, root = local_store
    with logkit.Broker(tmp_path / "leader") as broker:
        broker.create_topic("replicated", 1, replication_factor=2)
        broker.create_topic("single", 1)
        broker.topic("replicated").partition(0).append([(None, b"x", [], None)])
        with broker.ship(url) as shipper:
            shipper.flush()
    assert {name: t["replication_factor"] for name, t in
            manifest(fs, root)["topics"].items()} == {"replicated": 2, "single": 1}
    with logkit.ObjectStoreSource(url) as source:
        assert source.topics()["replicated"].replication_factor == 2
        # Not about promotion: a stalled machine (the lease is judged by wall clock)
        # must not promote this follower in the middle of its catch-up.
        with logkit.Follower(tmp_path / "follower", source, auto_promote=False) as follower:
            follower.catch_up(timeout=30)
    with logkit.Broker(tmp_path / "follower", read_only=True) as copy:
        assert copy.topic("replicated").replication_factor == 2
        assert copy.topic("single").replication_factor == 1
    logkit.ObjectStoreSource(url).restore(tmp_path / "restored")
    with logkit.Broker(tmp_path / "restored") as copy:
        assert copy.topic("replicated").replication_factor == 2
        assert copy.topic("single").replication_factor == 1


def test_a_manifest_without_replication_factors_reads_as_factor_1(tmp_path, local_store):
    """Manifests shipped before the factor was recorded still restore."""
    url, options, fs, root = shipped(tmp_path, local_store)
    body = manifest(fs, root)
    for topic in body["topics"].values():
        del topic["replication_factor"]
    fs.pipe_file(f"{root}/{MANIFEST_KEY}", json.dumps(body).encode())
    with logkit.ObjectStoreSource(url) as source:
        assert source.topics()["orders"].replication_factor == 1


def test_restore_refuses_a_non_empty_directory(tmp_path, local_store):
    url, options, fs, root = shipped(tmp_path, local_store)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    with pytest.raises(logkit.ConfigError, match="not an empty directory"):
        logkit.ObjectStoreSource(url).restore(tmp_path / "full")
    assert (tmp_path / "full" / "x").read_text() == "mine"


def test_the_restore_command_exits_0_and_1(tmp_path, local_store, capsys):
    url, options, fs, root = shipped(tmp_path, local_store)
    assert cli_main(["restore", url, str(tmp_path / "ok")]) == 0
    assert "restored 1 topic(s), 2 partition(s), 1 group(s)" in capsys.readouterr().out
    flip(fs, root, shipped_object(fs, root)["key"])
    assert cli_main(["restore", url, str(tmp_path / "bad")]) == 1
    assert "SHA-256 differs" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert cli_main(["restore", url, str(tmp_path / "x"), "--storage-option", "nokv"]) == 2


# ---- the lease in the store: promotion with fencing ------------------------------------

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = {"broker.session.timeout.ms": 1000}

# A leader in its own process: ships to URL every 50 ms with a 1 s lease TTL.
LEADER = """
import json, sys, logkit
root, url, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
config = {"broker.session.timeout.ms": 1000, "ship.interval.ms": 50}
with logkit.Broker(root, config=config) as broker:
    broker.create_topic("t", 1)
    broker.topic("t").partition(0).append([(None, b"%d" % i, [], None) for i in range(20)])
    broker.ship(url, storage_options=options).flush()
    print("ready", flush=True)
    sys.stdin.read()
"""

# For each round name on stdin: promote a fresh follower of URL/<round>; "won" or
# "lost <error class>".
RACER = """
import json, os, sys, logkit
url, options, directory = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
print("ready", flush=True)
for line in sys.stdin:
    name = line.strip()
    source = logkit.ObjectStoreSource(f"{url}/{name}", storage_options=options)
    follower = logkit.Follower(os.path.join(directory, name), source)
    try:
        follower.promote()
    except logkit.LogkitError as exc:
        print("lost", type(exc).__name__, flush=True)
    else:
        print("won", flush=True)
"""
RACE_ROUNDS = {"file": 12, "s3": 6}    # on moto about 2 in 3 rounds meet at the PUT


def python(code, *args):
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT_DIR})
    assert proc.stdout.readline().strip() == "ready"
    return proc


def store_lease(url, options):
    fs, root = objectstore._filesystem(url, options)
    return objectstore._StoreLease(fs, root, url)


def test_the_shipper_holds_the_lease_in_the_store_and_releases_it_on_close(tmp_path,
                                                                           store):
    url, options, fs, root = store
    leader = tmp_path / "leader"
    with logkit.Broker(leader, config=FAST) as broker:
        broker.create_topic("t", 1)
        with broker.ship(url, storage_options=options) as shipper:
            shipper.flush()
            lease = logkit.ObjectStoreSource(url, storage_options=options).lease()
            assert (lease.holder, lease.epoch, lease.ttl_ms) == \
                (replica_id(leader), 0, 1000)
            assert lease.valid()
        lease = store_lease(url, options).read()
        assert lease.holder == replica_id(leader) and not lease.valid()   # released


def test_a_second_broker_shipping_to_the_same_url_is_fenced(tmp_path, store):
    """One leader per URL: a broker of another replica finds the lease taken (even
    lapsed: only a promotion moves it), stops shipping and refuses writes."""
    url, options, fs, root = store
    with logkit.Broker(tmp_path / "first") as first:
        first.create_topic("t", 1)
        with first.ship(url, storage_options=options) as shipper:
            shipper.flush()
    generation = manifest(fs, root)["generation"]
    with logkit.Broker(tmp_path / "second") as second:
        second.create_topic("t", 1)
        shipper = second.ship(url, storage_options=options)
        with pytest.raises(logkit.NotLeaderError, match="no longer the leader"):
            shipper.flush()
        assert shipper.fenced
        with pytest.raises(logkit.NotLeaderError):
            second.topic("t").partition(0).append([(None, b"x", [], None)])
    assert manifest(fs, root)["generation"] == generation


def test_restore_takes_no_lease_so_the_leader_ships_on(tmp_path, local_store):
    url, options, fs, root = local_store
    with logkit.Broker(tmp_path / "leader") as broker:
        broker.create_topic("t", 1)
        with broker.ship(url) as shipper:
            shipper.flush()
            logkit.ObjectStoreSource(url).restore(tmp_path / "restored")
            broker.topic("t").partition(0).append([(None, b"x", [], None)])
            shipper.flush()
            assert store_lease(url, None).read().holder == replica_id(tmp_path / "leader")


def test_a_store_without_conditional_writes_keeps_no_lease(tmp_path, caplog):
    """fsspec's in-memory filesystem has no conditional write: the shipper ships without
    a lease, and a promotion through it goes on unfenced, saying so."""
    url = f"memory://logkit-{tmp_path.name}/data"
    caplog.set_level(logging.INFO, logger="logkit.replication.follower")
    with logkit.Broker(tmp_path / "leader") as broker:
        broker.create_topic("t", 1)
        broker.topic("t").partition(0).append([(None, b"a", [], None)])
        with broker.ship(url) as shipper:
            shipper.flush()
            assert not shipper.fenced
    source = logkit.ObjectStoreSource(url)
    assert source.lease() is None
    assert source.take_lease("me", ttl_ms=1000, min_epoch=1) is None
    follower = logkit.Follower(tmp_path / "follower", source)
    follower.catch_up(timeout=30)
    follower.promote()
    assert any("keeps no lease" in r.getMessage() for r in caplog.records)
    with logkit.Broker(tmp_path / "follower") as copy:
        assert copy.topic("t").partition(0).leader_epoch == 1


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_a_follower_of_the_store_promotes_with_fencing_after_the_leader_dies(
        request, tmp_path, kind):
    """The leader (its own process) renews the lease in the store: a promotion fails
    while it lives. SIGKILLed, its lease lapses after the TTL and the follower
    promotes in the next lease epoch. The old leader restarted is fenced by its
    shipper's first pass: it ships nothing and refuses writes; the new leader ships
    to the same URL and goes on from the old manifest."""
    url, options, fs, root = make_store(request, tmp_path, kind)
    leader, copy = tmp_path / "leader", tmp_path / "follower"
    proc = python(LEADER, leader, url, json.dumps(options))
    try:
        source = logkit.ObjectStoreSource(url, storage_options=options)
        follower = logkit.Follower(copy, source, config=FAST)
        follower.catch_up(timeout=30)
        follower.stop()
        with pytest.raises(logkit.NotLeaderError, match="valid for"):
            follower.promote()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        try:
            follower.promote()
            break
        except logkit.NotLeaderError:
            assert time.monotonic() < deadline, "the dead leader's lease never lapsed"
            time.sleep(0.1)
    lease = source.lease()
    assert lease.holder == replica_id(copy) and lease.epoch == 1
    generation = manifest(fs, root)["generation"]
    with logkit.Broker(leader, config=FAST) as old:
        shipper = old.ship(url, storage_options=options)
        with pytest.raises(logkit.NotLeaderError):
            shipper.flush()
        assert shipper.fenced
        with pytest.raises(logkit.NotLeaderError):
            old.topic("t").partition(0).append([(None, b"stale", [], None)])
    assert manifest(fs, root)["generation"] == generation
    with logkit.Broker(copy, config=FAST) as new:
        new.topic("t").partition(0).append([(None, b"after", [], None)])
        with new.ship(url, storage_options=options) as shipper:
            shipper.flush()
    body = manifest(fs, root)
    assert body["generation"] > generation
    assert body["partitions"][0]["log_end_offset"] == 21
    assert body["partitions"][0]["epochs"] == [[0, 0], [1, 20]]
    logkit.ObjectStoreSource(url, storage_options=options).restore(tmp_path / "restored")
    with logkit.Broker(tmp_path / "restored") as restored:
        assert restored.topic("t").partition(0).read(20)[0].value == b"after"


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_two_processes_racing_to_promote_through_the_store_one_wins_every_round(
        request, tmp_path, kind):
    url, options, fs, root = make_store(request, tmp_path, kind)
    rounds = RACE_ROUNDS[kind]
    for n in range(rounds):              # each round: a lapsed lease of a dead leader
        lease = store_lease(f"{url}/round-{n}", options)
        lease.take_next("dead-leader", ttl_ms=1000, min_epoch=5)
        assert lease.release("dead-leader", 5)
    procs = [python(RACER, url, json.dumps(options), tmp_path / f"racer-{i}")
             for i in range(2)]
    wins = [0, 0]
    try:
        for n in range(rounds):
            for proc in procs:
                proc.stdin.write(f"round-{n}\n")
            for proc in procs:
                proc.stdin.flush()
            results = [proc.stdout.readline().split() for proc in procs]
            assert sorted(r[0] for r in results) == ["lost", "won"], (n, results)
            loser = [r[0] for r in results].index("lost")
            assert results[loser][1] == "NotLeaderError"
            winner = 1 - loser
            wins[winner] += 1
            lease = store_lease(f"{url}/round-{n}", options).read()
            assert lease.holder == replica_id(tmp_path / f"racer-{winner}" / f"round-{n}")
            assert lease.epoch == 6
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait(timeout=60)
    assert sum(wins) == rounds


# ---- transactions: what a read_committed reader of the store needs -----------------------

def _markers(p):
    """{producer id: [offsets of its control batches]} from the partition's headers."""
    out = {}
    for header in p.batch_headers(0):
        if header.is_control:
            out.setdefault(header.producer_id, []).append(header.base_offset)
    return out


def test_the_manifest_records_the_last_stable_offset_and_the_aborted_transactions(
        tmp_path, local_store):
    """Two producers' aborted transactions interleaved, one committed and one left open:
    the entry's LSO is the partition's (the open transaction's first offset), each
    aborted span runs from its first batch to its ABORT marker, and once retention moves
    the log start past a span, the span leaves the manifest."""
    url, _, fs, root = local_store
    with logkit.Broker(tmp_path / "leader") as broker:
        broker.create_topic("tx", 1, config={"segment.bytes": 1024})
        p = broker.topic("tx").partition(0)
        a = broker.producer(transactional_id="a")
        b = broker.producer(transactional_id="b", transaction_timeout_ms=600_000)
        a.init_transactions()
        b.init_transactions()
        a.begin_transaction()
        b.begin_transaction()
        for i in range(6):                      # interleaved batches, several segments
            (a if i % 2 else b).send("tx", b"x" * 200)
            (a if i % 2 else b).flush()
        first_a = 1
        a.abort_transaction()                   # a: offsets 1, 3, 5; marker at 6
        b.commit_transaction()                  # b: 0, 2, 4; marker at 7
        b.begin_transaction()
        b.send("tx", b"b-aborted")
        b.flush()
        b.abort_transaction()                   # b: 8; marker at 9
        b.begin_transaction()
        b.send("tx", b"b-open")                 # 10, left open
        b.flush()
        a.begin_transaction()
        a.send("tx", b"a-committed")
        a.commit_transaction()                  # 11, marker 12
        ids = {h.producer_id for h in p.batch_headers(0) if not h.is_control}
        assert len(ids) == 2
        markers = _markers(p)
        pid_a = next(h.producer_id for h in p.batch_headers(first_a))
        pid_b = next(i for i in ids if i != pid_a)
        with broker.ship(url) as shipper:
            shipper.flush()
            entry = manifest(fs, root)["partitions"][0]
            assert len(p.segment_base_offsets()) > 2
            assert entry["last_stable_offset"] == p.last_stable_offset == 10
            assert entry["log_end_offset"] == p.log_end_offset == 13
            assert entry["aborted_transactions"] == [
                [pid_a, 1, markers[pid_a][0]], [pid_b, 8, 9]]
            assert markers[pid_a][0] == 6
            b.commit_transaction()              # marker at 13
            a.begin_transaction()
            a.send("tx", b"a-aborted")
            a.flush()
            a.abort_transaction()               # a: 14; marker at 15
            shipper.flush()                     # the spans shipped before are carried
            entry = manifest(fs, root)["partitions"][0]
            assert entry["last_stable_offset"] == p.high_watermark == 16
            assert entry["aborted_transactions"] == [
                [pid_a, 1, 6], [pid_b, 8, 9], [pid_a, 14, 15]]
            p.increase_log_start_offset(7)      # the first span lies wholly below it
            shipper.flush()
            entry = manifest(fs, root)["partitions"][0]
            assert entry["log_start_offset"] == 7
            assert entry["aborted_transactions"] == [[pid_b, 8, 9], [pid_a, 14, 15]]
        a.close()
        b.close()


def test_a_manifest_with_a_malformed_aborted_transaction_is_refused(tmp_path, local_store):
    url, options, fs, root = shipped(tmp_path, local_store)
    body = manifest(fs, root)
    body["partitions"][0]["aborted_transactions"] = [[7, 9, 3]]
    fs.pipe_file(f"{root}/{MANIFEST_KEY}", json.dumps(body).encode())
    with pytest.raises(logkit.CorruptRecordError, match="aborted transaction 9..3"):
        objectstore.read_manifest(url)
    body["partitions"][0]["aborted_transactions"] = []
    body["partitions"][0]["last_stable_offset"] = body["partitions"][0]["log_end_offset"] + 1
    fs.pipe_file(f"{root}/{MANIFEST_KEY}", json.dumps(body).encode())
    with pytest.raises(logkit.CorruptRecordError, match="last stable offset"):
        objectstore.read_manifest(url)
