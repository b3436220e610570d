"""Replication over TCP: `broker.serve_replication()` and `logkit.TcpSource`. A follower
copies byte for byte through the server (also under TLS); the shared secret is checked
both ways and a wrong one stops the follower with a named error; the server refuses
unknown partitions, offsets outside the log, malformed, unknown and oversize requests
and goes on serving; and with real processes: a leader producing while a fault proxy
delays, drops, cuts, half-opens and partitions the connection, and a follower SIGKILLed
mid-copy, both converging to byte-identical, gap-free copies."""

from __future__ import annotations

import filecmp
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time

import pytest

import logkit
from logkit.replication import ReplicationAuthError
from logkit.replication import tcp
from logkit.leader.lease import read_lease, release, replica_id
from tests.helpers.faultproxy import FaultProxy
from tests.helpers.procs import wait_until
from tests.helpers.tls import self_signed

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = "correct horse battery staple"
SMALL = {"segment.bytes": 4096}
FAST = {"replica.fetch.backoff.ms": 50}


def produce(broker, topic, count, *, prefix=b"v"):
    producer = broker.producer(linger_ms=0)
    for i in range(count):
        producer.send(topic, prefix + b"%d" % i, key=b"k%d" % (i % 7))
    producer.flush()
    producer.close()


def assert_same_logs(leader_root, follower_root, topic, partitions):
    """Every .log file of the follower equals the leader's byte for byte, they have the
    same segments, and the follower's partitions pass check() and read without gaps."""
    with logkit.Broker(follower_root, read_only=True) as copy:
        for n in range(partitions):
            mine = copy.topic(topic).partition(n)
            theirs_dir = os.path.join(leader_root, os.path.basename(mine.directory))
            logs = sorted(x for x in os.listdir(mine.directory) if x.endswith(".log"))
            assert logs == sorted(x for x in os.listdir(theirs_dir) if x.endswith(".log"))
            for name in logs:
                assert filecmp.cmp(os.path.join(mine.directory, name),
                                   os.path.join(theirs_dir, name), shallow=False), name
            mine.check()
            offsets = [r.offset for r in mine.read(0, max_records=1 << 20)]
            assert offsets == list(range(mine.log_end_offset))


@pytest.fixture
def leader(tmp_path):
    with logkit.Broker(tmp_path / "leader") as b:
        yield b


def test_a_tcp_follower_copies_every_partition_byte_for_byte(leader, tmp_path):
    leader.create_topic("orders", 3, config=SMALL)
    produce(leader, "orders", 1500)
    with leader.serve_replication(secret=SECRET) as server:
        assert (server.host, server.port > 0) == ("127.0.0.1", True)
        source = logkit.TcpSource(server.host, server.port, secret=SECRET)
        with logkit.Follower(tmp_path / "f", source, config=FAST) as follower:
            follower.catch_up(timeout=30)
            produce(leader, "orders", 300, prefix=b"w")           # while it runs
            follower.catch_up(timeout=30)
            # the leader sees the TCP follower's progress as a directory follower's
            # (reported at most every 250 ms)
            ends = {f"orders-{p.partition}": p.log_end_offset
                    for p in leader.topic("orders").partitions}
            view = logkit.DirectorySource(leader.path, report_progress=False)
            wait_until(lambda: view.progress().get(follower.follower_id, {}).get(
                "log_end_offsets") == ends, 30, "the follower's progress at the leader")
    server.close()                                                # safe twice
    assert_same_logs(leader.path, tmp_path / "f", "orders", 3)


def test_a_tcp_follower_is_in_the_isr_and_acks_all_waits_for_it(leader, tmp_path):
    """The leader's ISR counts a TCP follower as a directory one (its progress and
    caught-up times arrive through the server), so acks="all" with
    min.insync.replicas=2 completes; the replication factor reaches the copy."""
    topic = leader.create_topic("t", 1, replication_factor=2,
                                config={"min.insync.replicas": 2})
    p = topic.partition(0)
    with leader.serve_replication(secret=SECRET) as server:
        source = logkit.TcpSource(server.host, server.port, secret=SECRET)
        with logkit.Follower(tmp_path / "f", source, config=FAST) as follower:
            wait_until(lambda: len(p.in_sync_replicas()) == 2, 30, "the follower in the ISR")
            producer = leader.producer(acks="all", request_timeout_ms=30000)
            futures = [producer.send("t", b"%d" % i, partition=0) for i in range(300)]
            assert [f.result(timeout=60).offset for f in futures] == list(range(300))
            assert p.high_watermark == 300
            producer.close()
            follower.catch_up(timeout=30)
    with logkit.Broker(tmp_path / "f", read_only=True) as copy:
        assert copy.topic("t").replication_factor == 2
        assert copy.topic("t").partition(0).log_end_offset == 300


def test_the_leaders_lease_is_read_and_taken_through_the_server(tmp_path):
    """lease() and take_lease() cross the wire: a promotion through a TcpSource is
    refused with NotLeaderError while the leader's lease is valid, and once the leader
    steps down it takes the lease at the leader, which then refuses every write."""
    fast = {"broker.session.timeout.ms": 1000}
    with logkit.Broker(tmp_path / "leader", config=fast) as leader:
        leader.create_topic("t", 1)
        produce(leader, "t", 20)
        with leader.serve_replication(secret=SECRET) as server:
            source = logkit.TcpSource(server.host, server.port, secret=SECRET)
            follower = logkit.Follower(tmp_path / "f", source, config={**FAST, **fast})
            follower.catch_up(timeout=30)
            wait_until(lambda: source.lease() is not None, 30, "the leader's lease")
            lease = source.lease()
            assert lease.holder == replica_id(leader.path) and lease.valid()
            with pytest.raises(logkit.NotLeaderError, match="valid"):
                follower.promote()

            def stepped_down_and_promoted():
                release(leader.path, lease.holder, lease.epoch)   # a clean handover
                try:                         # (unless the leader renewed meanwhile)
                    follower.promote()
                except logkit.NotLeaderError:
                    return False
                return True
            wait_until(stepped_down_and_promoted, 30, "a promotion through the server")
            taken = read_lease(leader.path)
            assert (taken.holder, taken.epoch) == (follower.follower_id, lease.epoch + 1)
            assert source.lease() is None               # it names another replica now
            producer = leader.producer(linger_ms=0)

            def fenced():
                try:
                    producer.send("t", b"stale", partition=0).result()
                except logkit.NotLeaderError:
                    return True
                return False
            wait_until(fenced, 30, "the old leader refusing writes")
            source.close()


def test_a_wrong_secret_stops_the_follower_with_an_error_that_says_so(leader, tmp_path):
    leader.create_topic("t", 1)
    with leader.serve_replication(secret=SECRET) as server:
        wrong = logkit.TcpSource(server.host, server.port, secret="guess")
        with pytest.raises(ReplicationAuthError, match="wrong replication secret"):
            logkit.Follower(tmp_path / "f", wrong).catch_up(timeout=30)
        follower = logkit.Follower(tmp_path / "g", logkit.TcpSource(
            server.host, server.port, secret="guess"))
        follower.start()
        with pytest.raises(logkit.LogkitError, match="secret"):
            follower.catch_up(timeout=30)
        follower.stop()                          # joins the thread the error ended
        assert isinstance(follower.error, ReplicationAuthError)
        # a server that does not know the secret is refused by the client too
        with logkit.TcpSource(server.host, server.port, secret=SECRET) as right:
            assert "t" in right.topics()
    with pytest.raises(logkit.ConfigError):
        leader.serve_replication(secret="")


def test_tls_carries_the_copy_and_a_plain_client_gets_nothing(leader, tmp_path):
    cert, key = self_signed(tmp_path)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=cert)
    leader.create_topic("t", 2, config=SMALL)
    produce(leader, "t", 500)
    with leader.serve_replication(secret=SECRET, ssl_context=server_context) as server:
        source = logkit.TcpSource(server.host, server.port, secret=SECRET,
                                  ssl_context=client_context)
        logkit.Follower(tmp_path / "f", source).catch_up(timeout=30)
        plain = logkit.TcpSource(server.host, server.port, secret=SECRET, timeout=1.0)
        with pytest.raises((logkit.LogkitError, OSError)):
            plain.topics()
        plain.close()
    assert_same_logs(leader.path, tmp_path / "f", "t", 2)


def _authenticated(server):
    """A raw socket past the handshake, for sending hand-made frames."""
    sock = socket.create_connection((server.host, server.port), timeout=10)
    size, kind = tcp.SIZE.unpack(tcp.recv_exactly(sock, tcp.SIZE.size))
    body = tcp.recv_exactly(sock, size - 1)
    assert kind == tcp.HELLO and body.startswith(tcp.MAGIC)
    nonce = os.urandom(tcp.NONCE_BYTES)
    proof = tcp.client_proof(SECRET.encode(), body[len(tcp.MAGIC):], nonce)
    sock.sendall(tcp.frame(tcp.AUTH, nonce + proof))
    size, kind = tcp.SIZE.unpack(tcp.recv_exactly(sock, tcp.SIZE.size))
    tcp.recv_exactly(sock, size - 1)
    assert kind == tcp.AUTH_OK
    return sock


def _answer(sock):
    size, kind = tcp.SIZE.unpack(tcp.recv_exactly(sock, tcp.SIZE.size))
    return kind, tcp.recv_exactly(sock, size - 1)


def _closed(sock):
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_garbage_unknown_and_oversize_requests_are_refused_and_others_served(leader,
                                                                             tmp_path):
    leader.create_topic("t", 1)
    produce(leader, "t", 50)
    with leader.serve_replication(secret=SECRET) as server:
        source = logkit.TcpSource(server.host, server.port, secret=SECRET)
        assert source.topics()["t"].partitions == 1
        # garbage instead of the handshake: closed, nothing served
        garbage = socket.create_connection((server.host, server.port), timeout=10)
        _answer(garbage)                                            # the HELLO
        garbage.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(64))
        assert _closed(garbage)
        # after the handshake: an unknown kind and a body that is not JSON are
        # answered with an ERROR and the connection stays usable
        sock = _authenticated(server)
        sock.sendall(tcp.frame(0x7E, b"{}"))
        kind, body = _answer(sock)
        assert kind == tcp.ERROR and "unknown request kind" in json.loads(body)["message"]
        sock.sendall(tcp.frame(tcp.TOPICS, os.urandom(40)))
        kind, body = _answer(sock)
        assert kind == tcp.ERROR and "not JSON" in json.loads(body)["message"]
        sock.sendall(tcp.frame(tcp.TOPICS, b"[" * 100000 + b"]" * 100000))  # deep
        assert _answer(sock)[0] == tcp.ERROR
        sock.sendall(tcp.json_frame(tcp.PARTITION, {"topic": "t", "partition": "zero"}))
        assert _answer(sock)[0] == tcp.ERROR
        sock.sendall(tcp.json_frame(tcp.TOPICS, {}))
        kind, body = _answer(sock)
        assert kind == tcp.RESULT and "t" in json.loads(body)["topics"]
        # a frame declaring more than the bound: closed before its body is read
        sock.sendall(tcp.SIZE.pack(tcp.MAX_REQUEST_BYTES + 2, tcp.TOPICS))
        assert _closed(sock)
        sock.close()
        garbage.close()
        # the real follower was never disturbed
        assert source.partition("t", 0).log_end_offset == 50
        assert len(source.fetch("t", 0, 0, max_bytes=1 << 20)) > 0
        assert source.connects == 1
        source.close()


def test_stalled_idle_and_surplus_connections_are_closed(leader):
    """The server's time and connection bounds: a client that never authenticates, one
    that stops in the middle of a frame, and an idle one are closed; a connection past
    max_connections takes the slot of one that never authenticated, and a slot freed is
    usable again."""
    leader.create_topic("t", 1)
    with leader.serve_replication(secret=SECRET, request_timeout_ms=1000,
                                  idle_timeout_ms=1500, max_connections=3) as server:
        silent = socket.create_connection((server.host, server.port), timeout=10)
        assert _answer(silent)[0] == tcp.HELLO             # and then says nothing
        stalled = _authenticated(server)
        stalled.sendall(tcp.SIZE.pack(100, tcp.TOPICS)[:3])   # half a header
        idle = _authenticated(server)
        surplus = socket.create_connection((server.host, server.port), timeout=10)
        assert _answer(surplus)[0] == tcp.HELLO        # the fourth takes silent's slot
        for sock in (silent, stalled, idle, surplus):   # surplus: never authenticated
            assert _closed(sock)
            sock.close()
        wait_until(lambda: server.connections == 0, 30, "the closed slots freed")
        with logkit.TcpSource(server.host, server.port, secret=SECRET) as source:
            assert "t" in source.topics()


def test_unknown_partitions_and_offsets_outside_the_log_are_refused(leader):
    leader.create_topic("t", 2)
    produce(leader, "t", 100)
    end = leader.topic("t").partition(0).log_end_offset
    with leader.serve_replication(secret=SECRET) as server:
        with logkit.TcpSource(server.host, server.port, secret=SECRET) as source:
            with pytest.raises(logkit.UnknownTopicError):
                source.fetch("nope", 0, 0, max_bytes=1024)
            with pytest.raises(logkit.UnknownTopicError):
                source.partition("t", 2)
            with pytest.raises(logkit.InvalidTopicError):
                source.fetch("../../etc", 0, 0, max_bytes=1024)
            with pytest.raises(logkit.OffsetOutOfRangeError):
                source.fetch("t", 0, end + 1, max_bytes=1024)
            with pytest.raises(logkit.LogkitError, match="max_bytes"):
                source.fetch("t", 0, 0, max_bytes=tcp.MAX_FETCH_BYTES + 1)
            with pytest.raises(logkit.LogkitError, match="offset"):
                source.fetch("t", 0, -1, max_bytes=1024)
            assert source.fetch("t", 0, end, max_bytes=1024) == b""
            data = source.fetch("t", 0, 0, max_bytes=1)              # one whole batch
            assert data == leader.topic("t").partition(0).batches_since(
                0, upto=end, max_bytes=1)
            assert source.connects == 1                  # refusals kept the connection


# ---- real processes ------------------------------------------------------------------

LEADER = r"""
import sys, threading, time, logkit
root, count, pause_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[4])
stop = threading.Event()
def read_stdin():
    sys.stdin.readline()                # a line: stop producing; EOF: also exit
    stop.set()
    sys.stdin.read()
    stop.set()
with logkit.Broker(root) as broker:
    broker.create_topic("t", 2, config={"segment.bytes": 8192}, exist_ok=True)
    server = broker.serve_replication(secret=sys.argv[3])
    print(server.port, flush=True)
    reader = threading.Thread(target=read_stdin)
    reader.start()
    producer = broker.producer(acks=1, linger_ms=0)
    for n in range(count):
        if stop.is_set():
            break
        producer.send("t", b"r-%d" % n, partition=n % 2)
        if n % 10 == 9:
            producer.flush()
            time.sleep(pause_s)
    producer.flush()
    print("done", flush=True)
    reader.join()                       # serve until the test closes stdin
"""

CLI = "import sys; from logkit.cli import main; sys.exit(main())"


def _follow_cli(source, directory, *options, secret=SECRET):
    """`logkit follow SOURCE DIR` in its own process; returns once it is following."""
    proc = subprocess.Popen([sys.executable, "-c", CLI, "follow", str(source),
                             str(directory), *options], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT_DIR,
                                 "LOGKIT_REPLICATION_SECRET": secret})
    assert proc.stdout.readline().startswith("following ")
    return proc


def _python(code, *args, stdin=None):
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)],
                            stdin=stdin, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT_DIR})


class LeaderProcess:
    def __init__(self, root, count, pause_s):
        self.proc = _python(LEADER, root, count, SECRET, pause_s, stdin=subprocess.PIPE)
        self.port = int(self.proc.stdout.readline())

    def wait_done(self, *, stop_producing=False):
        if stop_producing:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "done"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def test_a_follower_converges_through_delay_drop_cut_half_open_and_partition(tmp_path):
    leader = LeaderProcess(tmp_path / "leader", 10 ** 9, 0.005)
    try:
        with FaultProxy("127.0.0.1", leader.port) as proxy:
            source = logkit.TcpSource(proxy.host, proxy.port, secret=SECRET, timeout=1.0)
            with logkit.Follower(tmp_path / "f", source, config=FAST) as follower:
                follower.catch_up(timeout=30)
                for fault in ("delay", "drop", "cut", "half_open", "partition"):
                    before = sum(follower.log_end_offsets().values())
                    connects = source.connects
                    if fault == "delay":
                        proxy.delay(0.05)
                    else:
                        getattr(proxy, fault)()
                    time.sleep(0.6)                  # the leader writes meanwhile
                    proxy.heal()
                    follower.catch_up(timeout=30)
                    assert sum(follower.log_end_offsets().values()) > before, fault
                    if fault in ("drop", "cut", "half_open"):
                        assert source.connects > connects, fault   # it reconnected
                assert follower.error is None
                leader.wait_done(stop_producing=True)
                follower.catch_up(timeout=30)
        assert_same_logs(tmp_path / "leader", tmp_path / "f", "t", 2)
    finally:
        leader.stop()


def test_a_follower_sigkilled_mid_copy_restarts_and_converges(tmp_path):
    leader = LeaderProcess(tmp_path / "leader", 20000, 0)
    try:
        leader.wait_done()
        rng = random.Random(10)
        for _ in range(3):
            follower = _follow_cli(f"tcp://127.0.0.1:{leader.port}", tmp_path / "f",
                                   "--config", "replica.fetch.max.bytes=512",
                                   "--config", "replica.fetch.backoff.ms=20")
            time.sleep(rng.uniform(0.1, 0.5))
            follower.send_signal(signal.SIGKILL)
            follower.wait(timeout=30)
            with logkit.Broker(tmp_path / "f", read_only=True) as copy:
                if "t" in copy.topics():
                    for p in copy.topic("t").partitions:
                        p.check()                    # a prefix, whole batches
        source = logkit.TcpSource("127.0.0.1", leader.port, secret=SECRET)
        logkit.Follower(tmp_path / "f", source).catch_up(timeout=30)
        assert_same_logs(tmp_path / "leader", tmp_path / "f", "t", 2)
    finally:
        leader.stop()


def test_logkit_follow_copies_over_tcp_or_a_directory_and_stops_on_sigterm(tmp_path):
    leader = LeaderProcess(tmp_path / "leader", 3000, 0)
    try:
        leader.wait_done()
        for source, name in ((f"tcp://127.0.0.1:{leader.port}", "f"),
                             (tmp_path / "leader", "g")):
            proc = _follow_cli(source, tmp_path / name)
            view = logkit.TcpSource("127.0.0.1", leader.port, secret=SECRET)
            ends = {n: view.partition("t", n).log_end_offset for n in range(2)}
            view.close()

            def copied():
                try:
                    with logkit.Broker(tmp_path / name, read_only=True) as copy:
                        return {n: copy.topic("t").partition(n).log_end_offset
                                for n in range(2)} == ends
                except logkit.LogkitError:                  # not created yet
                    return False
            wait_until(copied, 30, f"logkit follow {source} to copy everything")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            assert "stopped by a signal" in proc.stderr.read()
            assert_same_logs(tmp_path / "leader", tmp_path / name, "t", 2)
        wrong = subprocess.run([sys.executable, "-c", CLI, "follow",
                                f"tcp://127.0.0.1:{leader.port}", str(tmp_path / "h")],
                               capture_output=True, text=True, timeout=60,
                               env={**os.environ, "PYTHONPATH": ROOT_DIR,
                                    "LOGKIT_REPLICATION_SECRET": "guess"})
        assert wrong.returncode == 1 and "wrong replication secret" in wrong.stderr
        unset = subprocess.run([sys.executable, "-c", CLI, "follow",
                                f"tcp://127.0.0.1:{leader.port}", str(tmp_path / "h")],
                               capture_output=True, text=True, timeout=60,
                               env={**os.environ, "PYTHONPATH": ROOT_DIR,
                                    "LOGKIT_REPLICATION_SECRET": ""})
        assert unset.returncode == 2 and "secret" in unset.stderr
    finally:
        leader.stop()
