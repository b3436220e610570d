"""The object-store shipper and a compacted topic: a cleaned sealed segment is shipped
once (its new bytes under a content key replace the old object in the manifest, the old
one retires), not again on every pass while nothing changes; followers and `logkit
restore` read the survivors, with the leader's offset gaps, from it; a manifest with
gaps is refused for a topic that is not compacted. Against file:// URLs and a real S3
API server (moto's, in its own process)."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

import logkit
from logkit.replication import objectstore
from logkit.replication.objectstore import MANIFEST_KEY
from tests.helpers.s3server import s3_server  # noqa: F401  (a session fixture)
from tests.replication.test_compaction_replication import (COMPACTED, LEADER,
                                                           assert_same_copy, records, write)


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    """(url, storage_options, fsspec filesystem, root path) of an empty store."""
    if request.param == "file":
        import fsspec
        root = str(tmp_path / "bucket")
        return f"file://{root}", None, fsspec.filesystem("file"), root
    server = request.getfixturevalue("s3_server")
    url = server.bucket() + "/shipped"
    return url, server.storage_options, server.filesystem(), url[len("s3://"):]


def entry_of(fs, root):
    fs.invalidate_cache(f"{root}/{MANIFEST_KEY}")
    body = json.loads(fs.cat_file(f"{root}/{MANIFEST_KEY}"))
    return body, next(e for e in body["partitions"] if e["topic"] == "table")


def rolled(entry):
    """{segment base: object record} of the whole rolled segments."""
    return {o["segment"]: o for o in entry["objects"]
            if objectstore._WHOLE_KEY.fullmatch(o["key"])}


def test_a_cleaned_segment_is_shipped_once_and_replaces_the_old_object(
        tmp_path, store, monkeypatch):
    url, options, fs, root = store
    monkeypatch.setattr(objectstore, "RETIRE_GRACE_MIN_S", 0.0)
    monkeypatch.setattr(objectstore, "RETIRE_GRACE_INTERVALS", 0)
    with logkit.Broker(tmp_path / "leader", config={**LEADER, "ship.interval.ms": 3600000}
                       ) as broker:
        p = broker.create_topic("table", 1, config=COMPACTED).partition(0)
        write(p, 0, 8, unique=False)            # the first batches go in the pass
        write(p, 8, 150, tombstones=[b"k2"])
        p.roll()
        with broker.ship(url, storage_options=options) as shipper:
            shipper.flush()
            _, entry = entry_of(fs, root)
            old = rolled(entry)
            assert sorted(old) == p.segment_base_offsets()[:-1]
            assert entry["clean_count"] == 0
            uploads = shipper.uploaded_objects
            report = p.compact()
            assert report.records_after < report.records_before
            shipper.flush()
            _, entry = entry_of(fs, root)
            new = rolled(entry)
            changed = {base for base in new if new[base]["sha256"] != old.get(
                base, {}).get("sha256")}
            assert changed                                      # the cleaned ones
            assert shipper.uploaded_objects - uploads == len(changed)
            assert entry["clean_count"] == p.clean_count >= 1
            assert entry["objects"][0]["first_offset"] >= 8      # a gap at the start
            for base, obj in new.items():                       # the leader's bytes
                with open(os.path.join(p.directory, f"{base:020d}.log"), "rb") as f:
                    data = f.read()
                assert hashlib.sha256(data).hexdigest() == obj["sha256"]
                assert fs.cat_file(f"{root}/{obj['key']}") == data
                if base in changed:        # a new key: no key a manifest named changes
                    assert obj["key"] != old[base]["key"]
                    assert obj["key"].endswith(f".log.{obj['sha256'][:24]}")
            for base in changed:                                # retired, then deleted
                assert not fs.exists(f"{root}/{old[base]['key']}")
            uploads = shipper.uploaded_objects
            for _ in range(3):                                  # nothing new: nothing
                shipper.flush()
            assert shipper.uploaded_objects == uploads
            write(p, 150, 160)                                  # the active segment only
            shipper.flush()
            assert shipper.uploaded_objects == uploads + 1
            assert rolled(entry_of(fs, root)[1]) == new
        with broker.ship(url, storage_options=options) as again:   # a new shipper
            again.flush()
            assert again.uploaded_objects == 0                  # the manifest's count
        expected = records(p)
    restored = logkit.ObjectStoreSource(url, storage_options=options).restore(
        tmp_path / "restored")
    assert restored["offsets"] == 160 + 1
    with logkit.Broker(tmp_path / "leader", read_only=True) as leader, \
            logkit.Broker(tmp_path / "restored", read_only=True) as copy:
        q = copy.topic("table").partition(0)
        assert records(q) == expected
        assert q.config["cleanup.policy"] == "compact"
        assert_same_copy(leader.topic("table").partition(0), q)


def test_a_follower_through_the_store_copies_a_second_cleaning(tmp_path, store):
    """A follower that copied the first cleaning, and a second pass (its tombstones
    past their delete horizon) shipped later: it ends byte-identical again."""
    url, options, fs, root = store
    with logkit.Broker(tmp_path / "leader", config=LEADER) as broker:
        p = broker.create_topic("table", 1, config=COMPACTED).partition(0)
        write(p, 0, 120, tombstones=[b"k1", b"k3"])
        p.roll()
        p.compact()
        with broker.ship(url, storage_options=options) as shipper:
            shipper.flush()
            source = logkit.ObjectStoreSource(url, storage_options=options)
            with logkit.Follower(tmp_path / "f", source,
                                 config={"replica.fetch.backoff.ms": 20}) as follower:
                follower.catch_up(timeout=30)
                p.compact(now_ms=int(time.time() * 1000) + 60_000)   # horizon passed
                write(p, 120, 130)
                shipper.flush()
                follower.catch_up(timeout=30)
        with logkit.Broker(tmp_path / "f", read_only=True) as copy:
            q = copy.topic("table").partition(0)
            assert not [r for r in records(q) if r[2] is None]   # the tombstones went
            assert_same_copy(p, q)


def test_a_manifest_with_gaps_is_refused_unless_the_topic_is_compacted(tmp_path):
    import fsspec
    root = str(tmp_path / "bucket")
    url = f"file://{root}"
    with logkit.Broker(tmp_path / "leader", config=LEADER) as broker:
        p = broker.create_topic("table", 1, config=COMPACTED).partition(0)
        write(p, 0, 8, unique=False)
        write(p, 8, 100)
        p.roll()
        p.compact()
        with broker.ship(url) as shipper:
            shipper.flush()
    fs = fsspec.filesystem("file")
    body = json.loads(fs.cat_file(f"{root}/{MANIFEST_KEY}"))
    objectstore._validate(body)                          # compacted: gaps are fine
    body["topics"]["table"]["config"].pop("cleanup.policy")
    for entry in body["partitions"]:
        entry["clean_count"] = 0
    with pytest.raises(ValueError):
        objectstore._validate(body)                      # not compacted: a gap is damage
