"""A rebalance reaches a member that is blocked in `poll()`: the committed rebalance
rings the doorbell's data word (the one a waiting poll sleeps on), so the member runs
the rebalance and its listeners inside that same poll — as a Kafka consumer's poll
does — without waiting for data or for its timeout. No timed assertions: the checks
are on the doorbell word and on the order of what the member reports."""

from __future__ import annotations

import subprocess
import sys

import logkit
from tests.helpers.procs import ROOT_DIR

MEMBER = r"""
import sys, logkit
broker = logkit.Broker(sys.argv[1], background=False)
consumer = broker.consumer(group_id="g", enable_auto_commit=False)
def assigned(tps):
    mine = sorted(tp.partition for tp in consumer.assignment())
    print("assigned", *mine, flush=True)
consumer.subscribe(["t"], on_assign=assigned)
consumer.poll(timeout_ms=200)                     # joins: every partition is its
print("polling", flush=True)
sys.stdin.readline()                              # wait until the test says go
consumer.poll(timeout_ms=60000)                   # no data comes: it blocks here
print("returned", flush=True)
consumer.close()
broker.close()
"""


def test_a_committed_rebalance_rings_the_data_word_a_waiting_poll_sleeps_on(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 2)
        bell = broker.doorbell
        before = bell.value()
        consumer = broker.consumer(group_id="g", enable_auto_commit=False)
        consumer.subscribe(["t"])
        consumer.poll(timeout_ms=0)                # joins the group: a rebalance
        assert consumer.assignment()
        assert bell.value() != before              # nothing was appended: the rebalance rang
        consumer.close()


def test_a_member_blocked_in_poll_takes_the_new_assignment_inside_that_poll(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 4)
    child = subprocess.Popen([sys.executable, "-c", MEMBER, str(tmp_path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={"PYTHONPATH": ROOT_DIR, "PATH": "/usr/bin:/bin"})
    try:
        assert child.stdout.readline().split() == ["assigned", "0", "1", "2", "3"]
        assert child.stdout.readline().strip() == "polling"
        child.stdin.write("go\n")
        child.stdin.flush()
        with logkit.Broker(tmp_path, background=False) as broker:
            other = broker.consumer(group_id="g", enable_auto_commit=False)
            other.subscribe(["t"])
            for _ in range(200):                   # until the child has given some up
                other.poll(timeout_ms=50)
                if other.assignment():
                    break
            mine = {tp.partition for tp in other.assignment()}
            assert mine and len(mine) < 4
            # The child reports its share from its listener while its 60 s poll is still
            # blocked: the next line is the new assignment, not "returned".
            line = child.stdout.readline().split()
            assert line[0] == "assigned", line
            assert {int(p) for p in line[1:]} == {0, 1, 2, 3} - mine
            assert child.poll() is None            # still inside poll(timeout_ms=60000)
            other.close()
    finally:
        child.kill()
        child.wait(timeout=30)
