"""Hostile clients against the Kafka listener and the replication listener (issue 38),
each beside legitimate clients whose work must complete: slowloris, slot exhaustion,
pre-authentication floods, SASL password guessing, the frame fuzzer, and the bounds on
what one request may create. The server runs in a child process, so its memory high
water mark (VmHWM) is its own; each test checks the mark stays bounded.

Set LOGKIT_HOSTILE_REPORT=<file> to append each attack's figures (JSON lines) there; the
table in docs/security.md ("Under attack: measured") comes from such a run.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid

import pytest

import logkit
from logkit.protocol import errors as E
from logkit.protocol.frame import encode_request, parse_response
from logkit.replication import tcp

ck = pytest.importorskip("confluent_kafka")

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = "correct horse battery staple"
USERS = {"alice": "s3cret"}
SASL = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
        "sasl.username": "alice", "sasl.password": "s3cret"}
MEMORY_GROWTH_KB = 96 << 10            # what any attack may add to the server's peak

# The server: a broker with topic "t" serving Kafka (and replication if asked); it
# prints its ports, then serves until its stdin closes.
_SERVER = """
import json, logging, sys
import logkit
root, spec = sys.argv[1], json.loads(sys.argv[2])
logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                    format="%(levelname)s %(name)s %(message)s")
kafka = spec.get("kafka", {})
if "tls" in spec:
    import ssl
    kafka["ssl_context"] = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    kafka["ssl_context"].load_cert_chain(*spec["tls"])
with logkit.Broker(root, config=spec.get("config") or None) as broker:
    broker.create_topic("t", 1)
    ports = {"kafka": broker.serve(**kafka).port}
    if "replication" in spec:
        ports["replication"] = broker.serve_replication(**spec["replication"]).port
    print(json.dumps(ports), flush=True)
    sys.stdin.read()
"""


class Server:
    """The child process serving a broker; `.kafka`, `.replication` (ports), `vm_kb()`,
    `close()` (returns its log)."""

    def __init__(self, tmp_path, **spec):
        self.root = tmp_path / "served"
        self.log_path = tmp_path / "server.log"
        env = dict(os.environ, PYTHONPATH=ROOT_DIR)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(self.root),
                                          json.dumps(spec)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, env=env,
                                         cwd=ROOT_DIR)
        line = self.proc.stdout.readline()
        assert line, f"the server did not start: {self.log_path.read_text()}"
        ports = json.loads(line)
        self.kafka = ports["kafka"]
        self.replication = ports.get("replication")
        self.bootstrap = f"127.0.0.1:{self.kafka}"
        self.started_kb = self.vm_kb()

    def vm_kb(self, field="VmHWM"):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        raise AssertionError(f"no {field} in /proc/{self.proc.pid}/status")

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def start(tmp_path):
    servers = []

    def make(**spec):
        servers.append(Server(tmp_path, **spec))
        return servers[-1]
    yield make
    for server in servers:
        server.close()


def report(attack, server, seconds, **more):
    """Check the server's peak memory stayed bounded and record the figures."""
    peak = server.vm_kb()
    figures = {"attack": attack, "peak_mb": round(peak / 1024, 1),
               "growth_mb": round((peak - server.started_kb) / 1024, 1),
               "seconds": round(seconds, 2), "date": time.strftime("%Y-%m-%d"), **more}
    target = os.environ.get("LOGKIT_HOSTILE_REPORT")
    if target:
        with open(target, "a") as f:
            f.write(json.dumps(figures) + "\n")
    assert peak - server.started_kb < MEMORY_GROWTH_KB, figures


def legit_work(bootstrap, count=20, extra=None):
    """A producer's records, all acknowledged, then read back by a group consumer."""
    conf = {"bootstrap.servers": bootstrap, **(extra or {})}
    tag = uuid.uuid4().hex[:8].encode()
    producer = ck.Producer(conf)
    for i in range(count):
        producer.produce("t", tag + b"-%d" % i)
    assert producer.flush(30) == 0, "the legitimate producer's records were not all sent"
    consumer = ck.Consumer({**conf, "group.id": "legit-" + tag.decode(),
                            "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["t"])
    got, deadline = set(), time.monotonic() + 30
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None \
                    and message.value().startswith(tag):
                got.add(message.value())
    finally:
        consumer.close()
    assert len(got) == count, "the legitimate consumer did not read every record"


def closed(sock, timeout_s):
    """Whether the peer closed `sock` within timeout_s (EOF or reset)."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(1 << 16):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def call(sock, api_key, version, body, correlation=1):
    sock.sendall(encode_request(api_key, version, correlation, body))
    head = _exactly(sock, 4)
    return parse_response(api_key, version, _exactly(sock, struct.unpack(">i", head)[0]))[1]


def _exactly(sock, size):
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed by the listener")
        data += chunk
    return data


def connect(port):
    return socket.create_connection(("127.0.0.1", port), timeout=20)


# ---- finding 6: a request's deadline runs from its first byte -----------------------

def test_slowloris_connections_are_cut_at_the_request_deadline_beside_real_clients(start):
    """Twenty clients trickle a byte every 0.2 s of a frame that would take minutes:
    each is closed once its request is 2 s old (request_timeout_ms), while a producer
    and a consumer do their work."""
    server = start(kafka={"request_timeout_ms": 2000})
    slow = [connect(server.kafka) for _ in range(20)]
    began = time.monotonic()
    closed_after = {}

    def trickle():
        for sock in slow:
            sock.sendall(struct.pack(">i", 1000))      # a 1000-byte frame, begun
        while len(closed_after) < len(slow) and time.monotonic() - began < 15:
            live = [s for s in slow if s not in closed_after]
            readable, _, _ = select.select(live, [], [], 0.2)   # the attack's cadence
            for sock in readable:                # readable: EOF or reset from the server
                try:
                    if sock.recv(100):
                        continue
                except OSError:
                    pass
                closed_after[sock] = time.monotonic() - began
            for sock in live:
                if sock not in closed_after:
                    try:
                        sock.send(b"\x00")
                    except OSError:
                        closed_after[sock] = time.monotonic() - began
    attacker = threading.Thread(target=trickle)
    attacker.start()
    legit_work(server.bootstrap)
    attacker.join()
    for sock in slow:
        sock.close()
    assert len(closed_after) == len(slow), "a trickling client was never cut off"
    assert max(closed_after.values()) < 2 + 3, closed_after   # the deadline, plus slack
    report("slowloris: 20 connections, 1 byte / 0.2 s each", server,
           max(closed_after.values()))


def test_a_tls_handshake_trickled_byte_by_byte_is_cut_at_its_deadline(start, tmp_path):
    """On a TLS listener, ten clients open a TLS record and trickle its bytes every
    0.2 s: the handshake is bounded as a whole (connections.max.unauthenticated.ms,
    1.5 s here), not per read, while a TLS producer and consumer do their work."""
    from tests.helpers.tls import self_signed
    cert, key = self_signed(tmp_path)
    server = start(kafka={"unauthenticated_timeout_ms": 1500},
                   tls=[str(cert), str(key)])
    slow = [connect(server.kafka) for _ in range(10)]
    began = time.monotonic()
    closed_after = {}

    def trickle():
        for sock in slow:
            sock.sendall(b"\x16\x03\x01\x40\x00")   # a 16 KiB handshake record, begun
        while len(closed_after) < len(slow) and time.monotonic() - began < 10:
            live = [s for s in slow if s not in closed_after]
            readable, _, _ = select.select(live, [], [], 0.2)   # the attack's cadence
            for sock in live:
                try:
                    if sock in readable and not sock.recv(100):
                        closed_after[sock] = time.monotonic() - began
                    else:
                        sock.send(b"\x00")
                except OSError:
                    closed_after[sock] = time.monotonic() - began
    attacker = threading.Thread(target=trickle)
    attacker.start()
    legit_work(server.bootstrap, extra={"security.protocol": "SSL",
                                        "ssl.ca.location": str(cert)})
    attacker.join()
    for sock in slow:
        sock.close()
    assert len(closed_after) == len(slow), "a trickled TLS handshake was never cut off"
    assert max(closed_after.values()) < 1.5 + 3, closed_after
    report("TLS handshakes: 10 connections, 1 byte / 0.2 s each", server,
           max(closed_after.values()))


# ---- finding 7: slots -----------------------------------------------------------------

def test_a_thousand_idle_connections_do_not_lock_out_a_new_client(start):
    """1,000 connections, half of them silent and half idle after one ApiVersions, fill
    max.connections; a new producer and consumer still get in (an idle or unproven
    connection gives its slot up) and finish their work."""
    server = start()
    began = time.monotonic()
    idle = []
    for n in range(1000):
        sock = connect(server.kafka)
        idle.append(sock)
        if n % 2:
            try:
                call(sock, 18, 0, {})
            except OSError:                      # evicted already: a slot was needed
                pass
    legit_work(server.bootstrap)
    seconds = time.monotonic() - began
    poller = select.poll()                      # select() stops at descriptor 1024
    for sock in idle:
        poller.register(sock, select.POLLIN)
    gone = {fd for fd, _ in poller.poll(1000)}
    for sock in idle:
        sock.close()
    # max.connections.per.ip (500): at least half of them gave their slots up
    assert len(gone) >= 500, len(gone)
    report("1,000 idle connections from one address", server, seconds)


def test_a_connection_that_does_not_authenticate_in_time_is_closed(start):
    """connections.max.unauthenticated.ms (1 s here): a SASL connection that asked only
    ApiVersions, and one that said nothing, are closed; an authenticated client works."""
    server = start(kafka={"sasl_plain_users": USERS, "unauthenticated_timeout_ms": 1000})
    asked, silent = connect(server.kafka), connect(server.kafka)
    began = time.monotonic()
    assert call(asked, 18, 0, {})["error_code"] == 0
    legit_work(server.bootstrap, count=5, extra=SASL)
    assert closed(asked, 5) and closed(silent, 5)
    seconds = time.monotonic() - began
    asked.close()
    silent.close()
    assert seconds < 1 + 5


def test_connections_that_never_log_in_do_not_starve_a_follower(start, tmp_path):
    """64 connections (max_connections) take the replication server's HELLO and never
    answer it; a real follower still connects and its catch_up() completes."""
    server = start(replication={"secret": SECRET})
    legit_work(server.bootstrap, count=50)
    began = time.monotonic()
    silent = []
    for _ in range(64):
        sock = connect(server.replication)
        size, kind = tcp.SIZE.unpack(tcp.recv_exactly(sock, tcp.SIZE.size))
        assert kind == tcp.HELLO
        tcp.recv_exactly(sock, size - 1)
        silent.append(sock)
    source = logkit.TcpSource("127.0.0.1", server.replication, secret=SECRET, timeout=5)
    with logkit.Follower(tmp_path / "follower", source,
                         config={"replica.fetch.backoff.ms": 50}) as follower:
        follower.catch_up(timeout=20)
    seconds = time.monotonic() - began
    for sock in silent:
        sock.close()
    with logkit.Broker(tmp_path / "follower", read_only=True) as copy:
        assert copy.topic("t").partition(0).log_end_offset >= 50
    report("64 replication connections that never log in", server, seconds)


# ---- finding 5: nothing big is read before SASL ---------------------------------------

def _metadata_frame(total_bytes):
    """A Metadata v1 request naming topics until it is `total_bytes` long, raw."""
    name = b"x"                          # the most entries per byte: the costliest
    entry = struct.pack(">h", len(name)) + name
    count = (total_bytes - 30) // len(entry)
    header = struct.pack(">hhih", 3, 1, 1, 4) + b"evil"
    body = header + struct.pack(">i", count) + entry * count
    return struct.pack(">i", len(body)) + body


def test_a_20_mb_metadata_before_sasl_is_closed_unread(start):
    """On a SASL listener, a 20 MB Metadata from an unauthenticated client, and a
    600 KB ApiVersions (past sasl.server.max.receive.size), close their connections
    without being decoded; the server's memory barely moves; an authenticated producer
    and consumer do their work meanwhile."""
    server = start(kafka={"sasl_plain_users": USERS})
    flood = _metadata_frame(20 << 20)
    big_versions = struct.pack(">i", 600 << 10) + struct.pack(">hhih", 18, 0, 1, -1)
    outcome = {}

    def attack():
        began = time.monotonic()
        for name, data in (("metadata", flood), ("api_versions", big_versions)):
            sock = connect(server.kafka)
            try:
                sock.sendall(data)
            except OSError:
                pass                             # closed while sending: good
            outcome[name] = closed(sock, 10)
            sock.close()
        outcome["seconds"] = time.monotonic() - began
    attacker = threading.Thread(target=attack)
    attacker.start()
    legit_work(server.bootstrap, extra=SASL)
    attacker.join()
    report("20 MB Metadata before SASL", server, outcome["seconds"])
    assert outcome["metadata"] and outcome["api_versions"], outcome


# ---- finding 10: one guess per connection, delayed, logged ---------------------------

def test_sasl_guessing_costs_a_connection_and_a_delay_per_guess_and_is_logged(start):
    """A wrong password is answered after connection.failed.authentication.delay.ms
    and the connection closed; SaslAuthenticate without a handshake is ILLEGAL_SASL_STATE
    and closed; each failure is logged with the peer and user, never the password; an
    authenticated producer and consumer work meanwhile."""
    server = start(kafka={"sasl_plain_users": USERS})
    results = []

    def guess(n):
        sock = connect(server.kafka)
        try:
            assert call(sock, 17, 1, {"mechanism": "PLAIN"})["error_code"] == 0
            began = time.monotonic()
            answer = call(sock, 36, 2, {"auth_bytes": b"\0alice\0guess-%d-zq" % n})
            results.append((answer["error_code"], time.monotonic() - began,
                            closed(sock, 5)))
        finally:
            sock.close()

    def attack():
        for n in range(10):
            guess(n)
    attacker = threading.Thread(target=attack)
    began = time.monotonic()
    attacker.start()
    legit_work(server.bootstrap, extra=SASL)
    attacker.join()
    seconds = time.monotonic() - began
    assert [code for code, _, _ in results] == [E.SASL_AUTHENTICATION_FAILED] * 10
    assert all(took >= 0.09 for _, took, _ in results), results   # the 100 ms delay
    assert all(gone for _, _, gone in results), "a connection stayed open after a failure"
    sock = connect(server.kafka)                 # no handshake first
    answer = call(sock, 36, 2, {"auth_bytes": b"\0alice\0s3cret"})
    assert answer["error_code"] == E.ILLEGAL_SASL_STATE
    assert closed(sock, 5)
    sock.close()
    report("10 SASL guesses, one per connection", server, seconds)
    log = server.close()
    failures = [line for line in log.splitlines()
                if line.startswith("WARNING") and "authentication failed" in line]
    assert len(failures) >= 10 and all("'alice'" in f and "127.0.0.1" in f
                                       for f in failures)
    assert "guess-" not in log and "s3cret" not in log


# ---- the fuzzer of test_protocol_fuzz, against a live server ----------------------------

def test_fuzzed_frames_beside_a_producer_and_consumer(start):
    """300 mutated, random and truncated frames on their own connections; the legitimate
    clients' work completes and no topic appears."""
    from tests.protocol.test_protocol_fuzz import SEEDS, _mutate
    server = start(config={"auto.create.topics.enable": False})
    rng = random.Random(38)
    done = threading.Event()

    def attack():
        for n in range(300):
            body = _mutate(rng, rng.choice(SEEDS)) if n % 3 else \
                bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
            frame = struct.pack(">i", len(body)) + body
            with connect(server.kafka) as sock:
                sock.sendall(frame if n % 5 else frame[:rng.randrange(len(frame))])
                sock.shutdown(socket.SHUT_WR)
                closed(sock, 5)
        done.set()
    began = time.monotonic()
    attacker = threading.Thread(target=attack)
    attacker.start()
    legit_work(server.bootstrap)
    attacker.join()
    assert done.is_set()
    with connect(server.kafka) as sock:
        names = [t["name"] for t in call(sock, 3, 1, {"topics": None})["topics"]]
    assert names == ["t"]
    report("300 fuzzed frames", server, time.monotonic() - began)


# ---- finding 11: what one request may create ------------------------------------------

def test_one_metadata_request_auto_creates_at_most_its_bound(start):
    """A Metadata naming 2,000 missing topics creates auto.create.topics.max.per.request
    (100) of them; the rest answer UNKNOWN_TOPIC_OR_PARTITION."""
    server = start()
    names = [f"auto-{n}" for n in range(2000)]
    began = time.monotonic()
    with connect(server.kafka) as sock:
        answer = call(sock, 3, 4, {"topics": [{"name": n} for n in names],
                                   "allow_auto_topic_creation": True})
        codes = [t["error_code"] for t in answer["topics"]]
        assert codes.count(E.NONE) == 100
        assert codes.count(E.UNKNOWN_TOPIC_OR_PARTITION) == 1900
        listed = call(sock, 3, 1, {"topics": None}, correlation=2)["topics"]
        assert len(listed) == 101                       # "t" and the 100
    report("Metadata naming 2,000 missing topics", server, time.monotonic() - began)


def test_create_topics_and_partitions_over_the_wire_are_bounded(start):
    """CreateTopics and CreatePartitions past create.topic.max.partitions (1000) are
    refused with POLICY_VIOLATION and nothing is made; within it they work."""
    server = start()
    with connect(server.kafka) as sock:
        def create(name, count):
            return call(sock, 19, 4, {"topics": [{
                "name": name, "num_partitions": count, "replication_factor": 1,
                "assignments": [], "configs": []}], "timeout_ms": 1000})["topics"][0]
        assert create("huge", 10000)["error_code"] == E.POLICY_VIOLATION
        assert create("wide", 1001)["error_code"] == E.POLICY_VIOLATION
        assert create("fine", 2)["error_code"] == E.NONE
        grown = call(sock, 37, 3, {"topics": [{"name": "fine", "count": 5000,
                                               "assignments": None}],
                                   "timeout_ms": 1000, "validate_only": False})
        assert grown["results"][0]["error_code"] == E.POLICY_VIOLATION
        topics = {t["name"]: len(t["partitions"])
                  for t in call(sock, 3, 1, {"topics": None})["topics"]}
    assert topics == {"t": 1, "fine": 2}


def test_logkit_serve_takes_sasl_users_and_tls_and_keeps_the_registry_on_loopback(
        tmp_path):
    """`logkit serve --host 0.0.0.0 --sasl-users FILE --tls-cert --tls-key
    --schema-registry-port 0`: clients need TLS and the password, and the registry
    (which has no authentication) stays on 127.0.0.1."""
    import ssl
    from tests.helpers.tls import self_signed
    cert, key = self_signed(tmp_path)
    users = tmp_path / "users.txt"
    users.write_text("# who may connect\nalice:s3cret\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "logkit.cli", "serve", str(tmp_path / "d"), "--port", "0",
         "--host", "0.0.0.0", "--advertised-host", "127.0.0.1", "--sasl-users",
         str(users), "--tls-cert", str(cert), "--tls-key", str(key),
         "--schema-registry-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=ROOT_DIR, env=dict(os.environ, PYTHONPATH=ROOT_DIR))
    try:
        kafka_line, registry_line = process.stdout.readline(), process.stdout.readline()
        assert kafka_line.endswith("(SASL/PLAIN) (TLS)\n"), kafka_line
        assert registry_line.startswith("serving the schema registry at "
                                        "http://127.0.0.1:"), registry_line
        address = kafka_line.split(" at ")[1].split()[0]
        legit_work(address, count=5, extra={
            **SASL, "security.protocol": "SASL_SSL", "ssl.ca.location": str(cert)})
        context = ssl.create_default_context(cafile=str(cert))
        host, port = address.rsplit(":", 1)
        with context.wrap_socket(socket.create_connection((host, int(port)), timeout=20),
                                 server_hostname=host) as anonymous:
            anonymous.sendall(encode_request(3, 1, 1, {"topics": None}))
            assert closed(anonymous, 10)            # Metadata before SASL: closed
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
