"""Fault injection: writer processes SIGKILLed at random moments, many times. After
every kill the log reopens consistent, with every acknowledged append intact."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time

import logkit
from tests.helpers.tailpoke import simulate_reboot
from tests.helpers.procs import ROOT_DIR

WRITER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "helpers", "writer.py")


def start_writer(root, writer_id, segment_bytes=None):
    args = [sys.executable, WRITER, str(root), "t", writer_id]
    if segment_bytes:
        args.append(str(segment_bytes))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT_DIR})
    assert read_line(proc) == "ready"
    return proc


def read_line(proc, timeout_s=30):
    """One line of the writer's stdout, read byte by byte from the pipe: a buffered
    readline would take later lines into a buffer that communicate() (which reads the
    pipe itself) never sees, and could hand it a line cut at the front."""
    fd, line = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout_s
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"the writer printed no line within {timeout_s} s (so far {line!r})"
        byte = os.read(fd, 1)
        assert byte, f"the writer exited (so far {line!r})"
        line += byte
    return line.decode().strip()


def kill_and_collect(proc, run_s):
    """SIGKILL after run_s seconds; return the appends the writer saw acknowledged."""
    time.sleep(run_s)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    acked = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:                     # a line cut by the kill has fewer parts
            acked.append(tuple(map(int, parts)))
    return acked


def verify(root, writer_acks):
    """Reopen; check() passes; every acknowledged record is at its offset, intact."""
    with logkit.Broker(root, background=False) as broker:
        p = broker.topic("t").partition(0)
        p.check()
        for writer_id, acks in writer_acks.items():
            for base, first_number, count in acks:
                records = p.read(base, max_records=count)
                assert [r.offset for r in records] == list(range(base, base + count))
                expected = [b"%s-%d" % (writer_id.encode(), first_number + i) * 3
                            for i in range(count)]
                assert [r.value for r in records] == expected
        end = p.log_end_offset
        assert p.append([(None, b"probe", None, None)]) == end       # appends go on
        return end + 1


def test_sigkill_single_writer_many_times(tmp_path):
    """30 kills at random instants (rolls included); each reopen loses nothing acked."""
    rng = random.Random(1234)
    acks: dict[str, list] = {}
    previous_end = 0
    for round_number in range(30):
        proc = start_writer(tmp_path, "w%d" % round_number, segment_bytes=4096)
        acks["w%d" % round_number] = kill_and_collect(proc, rng.uniform(0.0, 0.15))
        if round_number % 3 == 2:               # sometimes: as if the OS crashed too
            simulate_reboot(os.path.join(tmp_path, "t-0"), recovery_point=0)
        end = verify(tmp_path, acks)
        assert end > previous_end
        previous_end = end
    assert sum(len(a) for a in acks.values()) > 30, "the writers did append"


def first_ack(proc):
    """The writer's first acknowledged append (base, first number, count), waited for
    with a bound: the writer is then appending, not still starting."""
    return tuple(map(int, read_line(proc).split()))


def test_sigkill_two_concurrent_writers(tmp_path):
    """Two writers on one partition, both appending when both are killed: every round
    each has acknowledged appends, all of them intact at their offsets, no overlap, and
    the log holds every acknowledged record."""
    rng = random.Random(99)
    acked_records = 0
    for round_number in range(6):
        a = start_writer(tmp_path, "a%d" % round_number)
        b = start_writer(tmp_path, "b%d" % round_number)
        firsts = [first_ack(a), first_ack(b)]          # both are appending now
        time.sleep(rng.uniform(0, 0.15))               # the kill's random moment
        acks = {"a%d" % round_number: [firsts[0]] + kill_and_collect(a, 0),
                "b%d" % round_number: [firsts[1]] + kill_and_collect(b, rng.uniform(0, 0.05))}
        offsets = [o for acked in acks.values() for base, _, n in acked
                   for o in range(base, base + n)]
        assert all(acked for acked in acks.values()), acks
        assert len(offsets) == len(set(offsets)), "two appends got the same offsets"
        acked_records += len(offsets) + 1              # + verify()'s probe
        assert verify(tmp_path, acks) >= acked_records


def test_survivor_keeps_appending_while_its_peer_is_killed_mid_roll(tmp_path):
    """With tiny segments (a roll every few appends), one writer is SIGKILLed again and
    again while another keeps running: the survivor never fails, and every reopen finds
    both writers' acknowledged records intact."""
    rng = random.Random(2024)
    survivor = start_writer(tmp_path, "s", segment_bytes=1024)
    acks: dict[str, list] = {}
    try:
        for round_number in range(20):
            victim = start_writer(tmp_path, "v%d" % round_number, segment_bytes=1024)
            acks["v%d" % round_number] = kill_and_collect(victim, rng.uniform(0.01, 0.1))
            assert survivor.poll() is None, "the surviving writer died"
    finally:
        survivor.send_signal(signal.SIGKILL)
        out, _ = survivor.communicate(timeout=30)
    assert survivor.returncode == -signal.SIGKILL, "the survivor must have been alive"
    acks["s"] = [tuple(map(int, line.split())) for line in out.splitlines()
                 if len(line.split()) == 3]
    assert len(acks["s"]) > 12
    verify(tmp_path, acks)
    segments = [n for n in os.listdir(os.path.join(tmp_path, "t-0")) if n.endswith(".log")]
    assert len(segments) > 20, "the writers should have rolled many times"
