"""Several processes, one directory: appends serialised across processes, readers see
new data (and rolls and deletions) without reopening."""

from __future__ import annotations

import os
import subprocess
import sys

import logkit
from tests.helpers.procs import ROOT_DIR


APPENDER = r"""
import sys, logkit
root, writer, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
with logkit.Broker(root, background=False) as broker:
    p = broker.topic("t").partition(0)
    for n in range(batches):
        p.append([(writer.encode(), b"%s:%d:%d" % (writer.encode(), n, i), None, None)
                  for i in range(1 + n % 5)])
"""


def run_appenders(root, writers, batches):
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(root), w, str(batches)],
                              env={**os.environ, "PYTHONPATH": ROOT_DIR})
             for w in writers]
    for proc in procs:
        assert proc.wait(timeout=120) == 0


def test_concurrent_writer_processes_interleave_whole_batches(tmp_path):
    """4 processes append to one partition: every record exactly once, contiguous offsets,
    and each writer's records in its own order."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 16384})
    writers = ["w0", "w1", "w2", "w3"]
    run_appenders(tmp_path, writers, 150)
    with logkit.Broker(tmp_path) as broker:
        p = broker.topic("t").partition(0)
        p.check()
        records = p.read(0, max_records=10**6)
        assert [r.offset for r in records] == list(range(len(records)))
        per_batch = [1 + n % 5 for n in range(150)]
        assert len(records) == 4 * sum(per_batch)
        for w in writers:
            mine = [r.value for r in records if r.key == w.encode()]
            expected = [b"%s:%d:%d" % (w.encode(), n, i)
                        for n in range(150) for i in range(per_batch[n])]
            assert mine == expected
        # Each process added index entries: none overwrote another's, all increase.
        total = 0
        for name in sorted(os.listdir(p.directory)):
            if name.endswith(".index"):
                with open(os.path.join(p.directory, name), "rb") as f:
                    data = f.read()
                tail = p._log.tail()
                count = tail.index_entries if int(name[:20]) == tail.active_base_offset \
                    else len(data) // 8
                relative = [int.from_bytes(data[i:i + 4], "big") for i in range(0, 8 * count, 8)]
                assert relative == sorted(set(relative)), name
                total += count
        assert total > 10, "index.interval.bytes should give several entries"
        for offset in range(0, len(records), 37):              # lookups through them
            assert p.read(offset, max_records=1)[0].value == records[offset].value


def test_reader_sees_other_process_appends_rolls_and_retention(tmp_path):
    """A reader opened before any data sees appends from another process, across
    segment rolls and retention deletions, without reopening."""
    with logkit.Broker(tmp_path, background=False) as broker:
        p = broker.create_topic("t", 1, config={"segment.bytes": 4096,
                                                "retention.bytes": 8000}).partition(0)
        assert p.read(0) == []
        run_appenders(tmp_path, ["x"], 200)
        assert p.log_end_offset == sum(1 + n % 5 for n in range(200))
        records = p.read(0, max_records=10**6)
        assert len(records) == p.log_end_offset
        # Another process enforces retention; this reader notices the new start.
        subprocess.run([sys.executable, "-c",
                        "import sys, logkit; b = logkit.Broker(sys.argv[1]); "
                        "print(b.enforce_retention()); b.close()", str(tmp_path)],
                       check=True, env={**os.environ, "PYTHONPATH": ROOT_DIR})
        assert p.log_start_offset > 0
        tail = p.read(p.log_start_offset, max_records=10**6)
        assert tail[0].offset == p.log_start_offset and tail[-1].offset == p.log_end_offset - 1


def test_topic_created_in_one_process_is_visible_in_another(tmp_path):
    """Topic metadata lives in LMDB: another process lists and opens it at once."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("shared", 4, config={"retention.ms": 1234})
        out = subprocess.run(
            [sys.executable, "-c",
             "import sys, logkit\nwith logkit.Broker(sys.argv[1]) as b:\n"
             "    t = b.topic('shared'); print(b.topics(), t.num_partitions, "
             "t.config['retention.ms'])", str(tmp_path)],
            check=True, capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": ROOT_DIR}).stdout
        assert out.split() == ["['shared']", "4", "1234"]


OPENER = r"""
import sys, logkit
root, rounds = sys.argv[1], int(sys.argv[2])
recoveries = 0
for _ in range(rounds):
    with logkit.Broker(root, background=False) as broker:
        p = broker.topic("t").partition(0)
        recoveries += p._log.last_recovery is not None
        for attempt in range(50):        # retention may move the start between the calls
            try:
                p.read(p.log_start_offset, max_records=5)
                break
            except logkit.OffsetOutOfRangeError:
                if attempt == 49:
                    raise
print(recoveries)
"""


def test_opening_while_another_process_rolls_needs_no_recovery(tmp_path):
    """Processes opening the partition while another appends (rolling often) and runs
    retention never mistake the half-seen roll for a crash: no recovery runs."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 1024, "retention.bytes": 20_000,
                                            "file.delete.delay.ms": 0})
    env = {**os.environ, "PYTHONPATH": ROOT_DIR}
    writer = subprocess.Popen([sys.executable, "-c", APPENDER + """
        if n % 50 == 0:
            broker.enforce_retention()
""", str(tmp_path), "w", "1500"], env=env)
    openers = [subprocess.Popen([sys.executable, "-c", OPENER, str(tmp_path), "60"],
                                stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outputs = [o.communicate(timeout=120)[0] for o in openers]
    assert writer.wait(timeout=120) == 0
    assert all(o.returncode == 0 for o in openers)
    assert [int(out) for out in outputs] == [0, 0]
    with logkit.Broker(tmp_path) as broker:
        p = broker.topic("t").partition(0)
        assert p._log.last_recovery is None
        p.check()
