"""The testing kit (docs/design.md §13): the pytest plugin's fixtures, loaded through the
pytest11 entry point in a fresh pytest process as a user's project loads them, and the
helpers of `logkit.testing` — each helper's success and its failure message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

import logkit
from logkit import ConfigError, UnknownTopicError
from logkit.testing import assert_topic, lag_table, produce, read_all, wait_for_no_lag

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FIXTURE_TESTS = '''
import pytest
import logkit

SEEN = []

@pytest.fixture
def logkit_broker_config():
    return {"num.partitions": 3}

@pytest.mark.parametrize("run", [1, 2])
def test_logkit_broker_is_fresh_each_test(logkit_broker, tmp_path, run):
    assert logkit_broker.topics() == [] and os.listdir(tmp_path) == []
    assert logkit_broker.create_topic("t").num_partitions == 3     # the config override
    SEEN.append(logkit_broker.path)
    assert len(set(SEEN)) == run

@pytest.mark.parametrize("run", [1, 2])
def test_logkit_broker_session_is_shared(logkit_broker_session, run):
    logkit_broker_session.create_topic(f"s{run}", 1)
    assert logkit_broker_session.topics() == [f"s{n}" for n in range(1, run + 1)]

def test_producer_and_consumer_are_bound_to_logkit_broker(logkit_broker, logkit_producer,
                                                          logkit_consumer):
    logkit_broker.create_topic("orders", 1)
    logkit_producer.send("orders", b"v", key=b"k").result()
    logkit_consumer.subscribe(["orders"])
    assert [(r.key, r.value) for r in logkit_consumer.poll(timeout_ms=1000)] == [(b"k", b"v")]

def test_logkit_server(logkit_server):
    host, port = logkit_server.bootstrap_servers.rsplit(":", 1)
    assert int(port) > 0
'''


def test_fixtures_through_the_entry_point_and_the_example_stream_job(tmp_path):
    """In one fresh pytest process with no conftest.py: every fixture does what it says,
    logkit_server skips with its reason until Broker.serve() exists (and runs once it
    does), and the example stream job's tests (examples/test_large_orders.py) pass."""
    (tmp_path / "test_fixtures.py").write_text("import os\n" + FIXTURE_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    example = os.path.join(CHECKOUT, "examples", "test_large_orders.py")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p",
                           "no:cacheprovider", "test_fixtures.py", example],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    if hasattr(logkit.Broker, "serve"):
        assert "9 passed" in proc.stdout, proc.stdout
    else:
        assert "8 passed, 1 skipped" in proc.stdout, proc.stdout
        assert "logkit_server needs Broker.serve()" in proc.stdout


def test_produce_takes_values_pairs_and_dicts(logkit_broker):
    """Each record form, every ack waited for, metadata in the order given."""
    logkit_broker.create_topic("t", 2)
    sent = produce(logkit_broker, "t", [
        b"plain", "text", (b"k", b"v"),
        {"key": b"h", "value": b"x", "headers": [("a", b"1")], "partition": 1,
         "timestamp_ms": 1_700_000_000_000}])
    assert [m.offset for m in sent if m.partition == 1][-1] == \
        logkit_broker.topic("t").partition(1).high_watermark - 1
    last = read_all(logkit_broker, "t", partitions=[1])[-1]
    assert (last.key, last.value, last.headers, last.timestamp) == \
        (b"h", b"x", [("a", b"1")], 1_700_000_000_000)
    assert sorted(r.value for r in read_all(logkit_broker, "t")) == \
        [b"plain", b"text", b"v", b"x"]
    with pytest.raises(ConfigError, match="unknown field.*'val'"):
        produce(logkit_broker, "t", [{"val": b"x"}])
    with pytest.raises(ConfigError, match="tuple of 3"):
        produce(logkit_broker, "t", [(b"k", b"v", b"extra")])


def test_read_all_reads_every_partition_up_to_the_high_watermark(logkit_broker):
    """Partition by partition, in offset order, from the log start; never blocks on an
    empty topic; an unknown topic raises UnknownTopicError."""
    topic = logkit_broker.create_topic("t", 3)
    assert read_all(logkit_broker, "t") == []
    topic.partition(2).append([(None, b"c%d" % i, None, None) for i in range(3)])
    topic.partition(0).append([(None, b"a", None, None)])
    assert [(r.partition, r.offset, r.value) for r in read_all(logkit_broker, "t")] == \
        [(0, 0, b"a"), (2, 0, b"c0"), (2, 1, b"c1"), (2, 2, b"c2")]
    with pytest.raises(UnknownTopicError):
        read_all(logkit_broker, "missing")


def test_assert_topic_passes_and_fails_with_a_diff(logkit_broker):
    """A list for a one-partition topic, a dict otherwise; a mismatch shows a unified
    diff of the (key, value) pairs, per partition."""
    logkit_broker.create_topic("one", 1)
    produce(logkit_broker, "one", [(b"k1", b"v1"), (b"k2", b"v2")])
    assert_topic(logkit_broker, "one", [(b"k1", b"v1"), ("k2", "v2")])
    with pytest.raises(AssertionError) as failed:
        assert_topic(logkit_broker, "one", [(b"k1", b"v1"), (b"k2", b"v9")])
    message = str(failed.value)
    assert "partition 0: expected 2 record(s), found 2" in message
    assert "-(b'k2', b'v9')" in message and "+(b'k2', b'v2')" in message
    logkit_broker.create_topic("three", 3)
    produce(logkit_broker, "three", [{"value": b"x", "partition": 2}])
    assert_topic(logkit_broker, "three", {2: [(None, b"x")]})
    with pytest.raises(AssertionError, match="has 3 partitions; give expected as"):
        assert_topic(logkit_broker, "three", [(None, b"x")])
    with pytest.raises(AssertionError, match="partition 2: expected 0 record"):
        assert_topic(logkit_broker, "three", {0: []})
    with pytest.raises(TypeError, match=r"\(key, value\) pairs"):
        assert_topic(logkit_broker, "one", [b"v1", b"v2"])


def test_assert_topic_read_committed_leaves_out_aborted_and_open_transactions(
        logkit_broker):
    """With isolation_level="read_committed" it compares what a read_committed consumer
    sees; the default still compares every record."""
    logkit_broker.create_topic("tx", 1)
    producer = logkit_broker.producer(transactional_id="kit")
    producer.init_transactions()
    for value, commit in ((b"kept", True), (b"dropped", False)):
        producer.begin_transaction()
        producer.send("tx", value)
        (producer.commit_transaction if commit else producer.abort_transaction)()
    producer.begin_transaction()
    producer.send("tx", b"open")
    producer.flush()
    assert_topic(logkit_broker, "tx", [(None, b"kept")], isolation_level="read_committed")
    assert_topic(logkit_broker, "tx", [(None, b"kept"), (None, b"dropped"), (None, b"open")])
    with pytest.raises(AssertionError, match="partition 0"):
        assert_topic(logkit_broker, "tx", [(None, b"kept"), (None, b"open")],
                     isolation_level="read_committed")
    producer.abort_transaction()
    producer.close()


def test_wait_for_no_lag_returns_when_caught_up_and_shows_the_table_when_not(
        logkit_broker):
    """It returns once the group has committed everything; on timeout the message is
    the lag table; a group that never started is not taken as caught up."""
    logkit_broker.create_topic("t", 2)
    produce(logkit_broker, "t", [{"value": b"%d" % i, "partition": i % 2}
                                 for i in range(6)])
    consumer = logkit_broker.consumer("t", group_id="g", auto_offset_reset="earliest",
                                      enable_auto_commit=False)
    with pytest.raises(AssertionError) as failed:
        wait_for_no_lag(logkit_broker, "g", timeout=0.05)
    lines = str(failed.value).splitlines()
    assert lines[0] == "consumer group 'g' is still 6 record(s) behind after 0.05 s:"
    assert [line.split() for line in lines[1:]] == [
        ["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"],
        ["t", "0", "-", "3", "3"], ["t", "1", "-", "3", "3"]]
    done = threading.Event()

    def consume():
        got = 0
        while got < 6:
            got += len(consumer.poll(timeout_ms=100))
        consumer.commit()
        done.set()

    worker = threading.Thread(target=consume)
    worker.start()
    wait_for_no_lag(logkit_broker, "g", timeout=30)
    worker.join(timeout=30)
    assert done.is_set()
    assert [line.split() for line in lag_table(logkit_broker, "g").splitlines()[1:]] == \
        [["t", "0", "3", "3", "0"], ["t", "1", "3", "3", "0"]]
    with pytest.raises(AssertionError, match="'nobody' has no live members and no "
                                             r"committed offsets .*state Dead"):
        wait_for_no_lag(logkit_broker, "nobody", timeout=0)
    with pytest.raises(ConfigError, match="seconds"):
        wait_for_no_lag(logkit_broker, "g", timeout="30")


def test_the_fixture_benchmark_runs_small(tmp_path):
    """benchmarks.fixture_setup (its own command line) reports medians for the floor,
    the fixture and a typical test, in order, and writes its JSON."""
    from benchmarks import fixture_setup
    out = tmp_path / "fixture.json"
    assert fixture_setup.main(["--repeats", "3", "--tests", "0", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["measure"] for r in rows] in (["direct"] * 3, ["direct"] * 4)
    assert all(0 < r["median_ms"] <= r["max_ms"] for r in rows)
