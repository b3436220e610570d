"""The CLI and the testing kit over compacted topics (DESIGN §14, §16): `topics create
--config cleanup.policy=compact`, `topics describe` naming the policy, `topics compact`
running one pass per partition and printing its report, `consume` reading across the
offsets the cleaner removed and stopping at the end; `logkit.testing`'s read_all,
assert_topic and wait_for_no_lag over offset gaps."""

from __future__ import annotations

import json
import time

import pytest

import logkit
from logkit import cli, testing
from tests.helpers.compacted import COMPACTED, NO_CLEANER, fill_and_compact


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def table(out):
    return [line.split() for line in out.splitlines()]


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "data")


def _dirty(root, name="table", partitions=2, records=200, keys=5):
    """A compacted topic never cleaned: `records` keyed records per partition over
    several segments, the active one rolled. Returns the survivors' (key, value) per
    partition (the latest record of each key)."""
    expected = {}
    with logkit.Broker(root, config=NO_CLEANER) as broker:
        topic = broker.create_topic(name, partitions, config=COMPACTED)
        for number, partition in enumerate(topic.partitions):
            latest = {}
            for first in range(0, records, 4):
                rows = [(b"k%d" % (n % keys), b"%d-%d" % (number, n), None, None)
                        for n in range(first, first + 4)]
                partition.append(rows)
                latest.update((k, v) for k, v, _, _ in rows)
            partition.roll()
            expected[number] = sorted(latest.items(), key=lambda kv: kv[1])
    return expected


def test_create_with_cleanup_policy_compact_and_describe_names_it(root, capsys):
    """`topics create --config cleanup.policy=compact` makes a compacted topic;
    describe's table has a CLEANUP-POLICY column, --configs and --json the configs."""
    assert run(capsys, "topics", "create", root, "table", "--partitions", "2",
               "--config", "cleanup.policy=compact",
               "--config", "min.compaction.lag.ms=0")[0] == 0
    assert run(capsys, "topics", "create", root, "plain")[0] == 0
    code, out, _ = run(capsys, "topics", "describe", root)
    rows = table(out)
    assert rows[0][-1] == "CLEANUP-POLICY"
    assert {(r[0], r[-1]) for r in rows[1:]} == {("table", "compact"), ("plain", "delete")}
    code, out, _ = run(capsys, "topics", "describe", root, "table", "--configs")
    assert ["table", "cleanup.policy", "compact"] in table(out)
    code, out, _ = run(capsys, "topics", "describe", root, "table", "--json")
    assert json.loads(out)["config"]["cleanup.policy"] == "compact"
    code, _, err = run(capsys, "topics", "create", root, "bad", "--config",
                       "cleanup.policy=shred")
    assert code == 1 and len(err.splitlines()) == 1 and "cleanup.policy" in err


def test_topics_compact_runs_a_pass_per_partition_and_prints_the_report(root, capsys):
    """One row per partition with records and bytes before and after; --partition N
    cleans that one alone; --json for scripts; after the pass the topic holds the
    latest record of each key."""
    expected = _dirty(root)
    code, out, _ = run(capsys, "topics", "compact", root, "table", "--partition", "1",
                       "--json")
    assert code == 0
    [report] = json.loads(out)
    assert report["partition"] == 1
    assert (report["records_before"], report["records_after"]) == (200, 5)
    assert report["bytes_after"] < report["bytes_before"]
    code, out, _ = run(capsys, "topics", "compact", root, "table")
    rows = table(out)
    assert rows[0][:6] == ["TOPIC", "PARTITION", "RECORDS-BEFORE", "RECORDS-AFTER",
                           "BYTES-BEFORE", "BYTES-AFTER"]
    assert [(r[1], r[2], r[3]) for r in rows[1:]] == [("0", "200", "5"), ("1", "5", "5")]
    with logkit.Broker(root, config=NO_CLEANER) as broker:
        testing.assert_topic(broker, "table", expected)


def test_topics_compact_refuses_a_topic_that_is_not_compacted(root, capsys):
    """A delete-policy topic and a missing topic: exit 1, one line on stderr."""
    assert run(capsys, "topics", "create", root, "plain")[0] == 0
    for name in ("plain", "ghost"):
        code, out, err = run(capsys, "topics", "compact", root, name)
        assert code == 1 and out == "" and len(err.splitlines()) == 1, (name, err)


def test_consume_reads_across_the_gaps_and_stops_at_the_end(root, capsys):
    """consume --from-beginning prints exactly the survivors and stops at the end of
    the log, not after its idle timeout, even when the log's last offsets were all
    removed (a tombstoned key, cleaned away)."""
    with logkit.Broker(root, config=NO_CLEANER) as broker:
        expected = fill_and_compact(broker, "table", records=90, keys=6,
                                    tombstones=[b"k5"])[0]
    started = time.monotonic()
    code, out, _ = run(capsys, "consume", root, "table", "--from-beginning",
                       "--format", "kv", "--key-separator", "=", "--timeout-ms", "30000")
    assert code == 0 and time.monotonic() - started < 15
    assert out.splitlines() == [f"{k.decode()}={v.decode()}" for _, k, v in expected]


def test_the_testing_kit_reads_compares_and_waits_across_gaps(root):
    """read_all returns the survivors, assert_topic passes on them and fails (with a
    diff) on what was written before the pass, wait_for_no_lag returns once a group
    committed its positions past the gaps."""
    with logkit.Broker(root, config=NO_CLEANER) as broker:
        expected = fill_and_compact(broker, "table", partitions=2, records=80, keys=4,
                                    tombstones=[b"k3"])
        got = testing.read_all(broker, "table")
        assert [(r.partition, r.offset, r.key, r.value) for r in got] == \
            [(p, *row) for p in (0, 1) for row in expected[p]]
        testing.assert_topic(broker, "table", {p: [(k, v) for _, k, v in rows]
                                               for p, rows in expected.items()})
        with pytest.raises(AssertionError, match="partition 0"):
            testing.assert_topic(broker, "table", {0: [(b"k0", b"0-0")], 1: []})
        with broker.consumer("table", group_id="g", auto_offset_reset="earliest",
                             enable_auto_commit=False) as consumer:
            deadline = time.monotonic() + 15
            topic = broker.topic("table")
            while not consumer.assignment() or any(
                    consumer.position(p.topic_partition) < p.high_watermark
                    for p in topic.partitions):
                assert time.monotonic() < deadline
                consumer.poll(timeout_ms=100)
            consumer.commit()
            testing.wait_for_no_lag(broker, "g", timeout=5)


def test_consume_with_a_group_commits_past_the_removed_tail(root, capsys):
    """consume --group over a compacted topic whose last offsets were all removed
    commits its position past them: the group's lag is zero, as after a Kafka console
    consumer."""
    with logkit.Broker(root, config=NO_CLEANER) as broker:
        expected = fill_and_compact(broker, "table", records=40, keys=4,
                                    tombstones=[b"k3"])[0]
        end = broker.topic("table").partition(0).high_watermark
    assert expected[-1][0] < end - 1                  # the last offsets hold no record
    code, out, _ = run(capsys, "consume", root, "table", "--group", "g",
                       "--from-beginning", "--timeout-ms", "30000")
    assert code == 0 and len(out.splitlines()) == len(expected)
    with logkit.Broker(root, config=NO_CLEANER) as broker:
        assert broker.group("g").committed() == {logkit.TopicPartition("table", 0): end}
        assert set(broker.group("g").lag().values()) == {0}
