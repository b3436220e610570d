"""A process at its thread limit: every thread logkit starts on a public path either
raises ResourceError (a LogkitError, and a RuntimeError as Python's own is) with
nothing left half-open, or does its work without the thread. Thread.start is made to
fail for the named threads, as it does under RLIMIT_NPROC ("can't start new thread")."""

from __future__ import annotations

import threading

import pytest

import logkit
from logkit import LogkitError, ResourceError


@pytest.fixture
def no_threads_named(monkeypatch):
    """Make Thread.start raise for threads whose name starts with one of the prefixes
    given to the returned function; returns the names refused."""
    real_start = threading.Thread.start
    prefixes: list[str] = []
    refused: list[str] = []

    def start(thread):
        if any(thread.name.startswith(p) for p in prefixes):
            refused.append(thread.name)
            raise RuntimeError("can't start new thread")
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)

    def refuse(*names: str) -> list[str]:
        prefixes[:] = names
        return refused
    return refuse


def test_a_broker_that_cannot_start_its_chores_raises_and_leaves_nothing_open(
        tmp_path, no_threads_named):
    refused = no_threads_named("logkit-scheduler")
    with pytest.raises(ResourceError, match="retention scheduler") as caught:
        logkit.Broker(tmp_path / "data")
    assert isinstance(caught.value, LogkitError) and isinstance(caught.value, RuntimeError)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert refused == ["logkit-scheduler"]
    no_threads_named()                          # threads again: the directory opens
    with logkit.Broker(tmp_path / "data") as broker:
        broker.create_topic("t", 1)
        assert broker.topic("t").num_partitions == 1


def test_a_broker_whose_lease_cannot_renew_raises_and_closes(tmp_path, no_threads_named):
    no_threads_named("logkit-lease")
    with pytest.raises(ResourceError, match="lease"):
        logkit.Broker(tmp_path / "data")
    no_threads_named()
    with logkit.Broker(tmp_path / "data") as broker:   # the lease was let go
        broker.create_topic("t", 1)


def test_a_producer_without_its_sender_thread_is_a_resource_error(tmp_path,
                                                                  no_threads_named):
    with logkit.Broker(tmp_path / "data", background=False) as broker:
        broker.create_topic("t", 1)
        no_threads_named("logkit-producer")
        with pytest.raises(ResourceError, match="sender thread"):
            broker.producer()
        no_threads_named()
        with broker.producer() as producer:
            assert producer.send("t", b"v").result(timeout=10).offset == 0


def test_durable_sends_wait_for_their_sync_in_place_when_no_waiter_thread_starts(
        tmp_path, no_threads_named):
    with logkit.Broker(tmp_path / "data", background=False) as broker:
        broker.create_topic("t", 1, config={"flush.messages": 1})
        with broker.producer(linger_ms=60_000) as producer:
            refused = no_threads_named("logkit-sync")
            futures = [producer.send("t", b"v%d" % i) for i in range(20)]
            producer.flush(timeout=30)
            assert [f.result(timeout=10).offset for f in futures] == list(range(20))
            assert refused                         # the waiter was asked for, and refused
        got = broker.topic("t").partition(0).read(0, max_records=100)
        assert [r.value for r in got] == [b"v%d" % i for i in range(20)]


def test_a_group_consumer_without_its_heartbeat_thread_is_a_resource_error(
        tmp_path, no_threads_named):
    with logkit.Broker(tmp_path / "data", background=False) as broker:
        broker.create_topic("t", 1)
        with broker.producer() as producer:
            producer.send("t", b"v").result(timeout=10)
        no_threads_named("logkit-heartbeat")
        with pytest.raises(ResourceError, match="heartbeat"):
            broker.consumer("t", group_id="g", auto_offset_reset="earliest")
        assert broker.group("g").members() == []     # joined, then left: no ghost member
        no_threads_named()
        consumer = broker.consumer("t", group_id="g", auto_offset_reset="earliest")
        try:
            got = []
            for _ in range(20):
                got += consumer.poll(timeout_ms=500)
                if got:
                    break
            assert [r.value for r in got] == [b"v"]
            assert len(broker.group("g").members()) == 1
        finally:
            consumer.close()


def test_acks_all_without_its_waiter_thread_fails_the_batch_instead_of_hanging(
        tmp_path, no_threads_named):
    with logkit.Broker(tmp_path / "data") as broker:
        broker.create_topic("t", 1, replication_factor=2,
                            config={"min.insync.replicas": 1})
        with broker.producer(acks="all", request_timeout_ms=20_000) as producer:
            refused = no_threads_named("logkit-acks")
            future = producer.send("t", b"v", partition=0)
            with pytest.raises(ResourceError, match="acks=all waiter"):
                future.result(timeout=30)
            assert refused == ["logkit-acks"]
            no_threads_named()
            assert producer.send("t", b"w", partition=0).result(timeout=30).offset == 1
        got = broker.topic("t").partition(0).read(0, max_records=10)
        assert [r.value for r in got] == [b"v", b"w"]      # stored: its replication unconfirmed


def test_a_follower_without_its_thread_raises_and_releases_the_directory(
        tmp_path, no_threads_named):
    with logkit.Broker(tmp_path / "leader") as leader:
        leader.create_topic("t", 1)
        leader.topic("t").partition(0).append([(None, b"v", None, None)])
        source = logkit.DirectorySource(leader.path)
        follower = logkit.Follower(tmp_path / "f", source)
        refused = no_threads_named("logkit-follower")
        with pytest.raises(ResourceError, match="follower thread"):
            follower.start()
        assert refused and not follower.running
        no_threads_named()
        with logkit.Follower(tmp_path / "f", logkit.DirectorySource(leader.path)) as again:
            again.catch_up(timeout=30)              # the directory was let go
            assert again.running
        follower.stop()


@pytest.mark.parametrize("kind", ["kafka", "replication", "schema-registry"])
def test_a_listener_without_its_thread_raises_and_frees_its_port(
        tmp_path, no_threads_named, kind):
    with logkit.Broker(tmp_path / "data") as broker:
        start = {"kafka": lambda port: broker.serve(port=port),
                 "replication": lambda port: broker.serve_replication(port=port,
                                                                      secret="s"),
                 "schema-registry": lambda port: broker.serve_schema_registry(port=port)}
        first = start[kind](0)
        port = first.port
        first.close()
        refused = no_threads_named(f"logkit-{kind}")
        with pytest.raises(ResourceError):
            start[kind](port)
        assert refused
        no_threads_named()
        server = start[kind](port)                    # the socket was closed
        assert server.port == port
        server.close()


def test_a_shipper_without_its_thread_raises(tmp_path, no_threads_named):
    with logkit.Broker(tmp_path / "data") as broker:
        broker.create_topic("t", 1)
        url = f"file://{tmp_path / 'bucket'}"
        refused = no_threads_named("logkit-ship")
        with pytest.raises(ResourceError, match="shipping thread"):
            broker.ship(url)
        assert refused
        no_threads_named()
        with broker.ship(url) as shipper:
            shipper.flush()
