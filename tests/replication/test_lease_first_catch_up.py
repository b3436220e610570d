"""A follower in the ISR can always see a lease expire (issue 36, part 3).

A leader takes its lease once a follower has reported; a leader that stopped before it
did (SIGSTOP as soon as the first `catch_up()` returned) left no lease to expire, and
its follower followed a silent leader for ever. Now a running, auto-promoting follower's
`catch_up()` returns only once the source shows the leader's lease, so a leader stopped
at that moment is replaced within about one TTL; through TCP, where a stopped leader
cannot be asked, the lease still exists in the leader's root when `catch_up()`
returns; through an object store, in the store. Real leader processes, 2 s leases.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import logkit
from logkit.leader.lease import read_lease
from tests.helpers.procs import ROOT_DIR

HELPER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "helpers", "failover_proc.py")
TTL_MS = 2000
TTL = {"broker.session.timeout.ms": TTL_MS}


def start_leader(root) -> subprocess.Popen:
    """failover_proc's `lead`: a leader process with background chores, producing."""
    proc = subprocess.Popen([sys.executable, HELPER, "lead", str(root), str(TTL_MS), "w"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": ROOT_DIR})
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(root, "t-0")):     # topic made: it leads
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the leader never made its topic"
        time.sleep(0.02)
    return proc


def end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
    proc.wait()


@pytest.mark.parametrize("round_", range(3))
def test_a_leader_stopped_as_the_first_catch_up_returns_is_replaced(tmp_path, round_):
    leader_root, follower_root = tmp_path / "L", tmp_path / "F"
    leader = start_leader(leader_root)
    follower = logkit.Follower(follower_root, logkit.DirectorySource(leader_root),
                               config=TTL)
    try:
        follower.start()
        follower.catch_up(timeout=30)
        leader.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        assert follower.promoted.wait(3 * TTL_MS / 1000), \
            (f"no promotion {3 * TTL_MS} ms after the leader stopped; its lease: "
             f"{read_lease(leader_root)}; follower error: {follower.error}")
        took_s = time.monotonic() - stopped
        assert took_s < 3 * TTL_MS / 1000
        assert read_lease(leader_root).holder == follower.follower_id
    finally:
        follower.stop()
        end(leader)


def test_a_tcp_follower_in_the_isr_implies_a_lease_at_the_leader(tmp_path):
    """Through TCP the follower's report reaches the leader's root through its server:
    when catch_up() returns, the leader's lease is there."""
    with logkit.Broker(tmp_path / "L", config=TTL) as leader:
        leader.create_topic("t", 1).partition(0).append([(None, b"v", None, None)])
        server = leader.serve_replication(secret="s")
        follower = logkit.Follower(tmp_path / "F",
                                   logkit.TcpSource("127.0.0.1", server.port, secret="s"),
                                   config=TTL)
        try:
            follower.start()
            follower.catch_up(timeout=30)
            lease = read_lease(tmp_path / "L")
            assert lease is not None and lease.holder != follower.follower_id
            assert lease.valid()
        finally:
            follower.stop()
            server.close()


def test_an_object_store_follower_in_the_isr_implies_a_lease_in_the_store(tmp_path):
    store = f"file://{tmp_path / 'store'}"
    with logkit.Broker(tmp_path / "L", config={**TTL, "ship.interval.ms": 50}) as leader:
        leader.create_topic("t", 1).partition(0).append([(None, b"v", None, None)])
        with leader.ship(store):
            source = logkit.ObjectStoreSource(store)
            follower = logkit.Follower(tmp_path / "F", source, config=TTL)
            try:
                follower.start()
                follower.catch_up(timeout=30)
                lease = source.lease()
                assert lease is not None and lease.holder != follower.follower_id
                assert lease.valid()
            finally:
                follower.stop()
