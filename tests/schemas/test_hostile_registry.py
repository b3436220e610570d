"""The schema registry's REST API under a hostile client (issue 38, findings 6-9): a
backtracking regex in a registered JSON Schema, 2,000-level nesting in a body or a
schema, a client trickling bytes, idle connections taking every slot. Each attack runs
against a registry (and a Kafka listener) served by a child process, so a stall in it
shows as latency here; each test failed before its fix."""

from __future__ import annotations

import http.client
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

import logkit
from logkit.compat.errors import UnsupportedPatternError
from logkit.protocol.frame import encode_request
from logkit.registry_http import serve
from tests.helpers.procs import ROOT_DIR, wait_until

SERVER = """
import json, sys, logkit
from logkit.registry_http import serve
broker = logkit.Broker(sys.argv[1])
registry = serve(broker.schema_registry(), **json.loads(sys.argv[2]))
kafka = broker.serve()
print(registry.port, kafka.port, flush=True)
sys.stdin.read()
registry.close()
broker.close()
"""
BACKTRACKING = "^(a+)+$"                 # exponential in Python's re on "aaa...a!"
PROBE_LIMIT_S = 1.0                      # what a prompt answer is, on a loaded machine


class Served:
    """A registry and a Kafka listener in a child process: `.registry_port`,
    `.kafka_port`, `.threads()`."""

    def __init__(self, root, **options):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(root), json.dumps(options)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": ROOT_DIR})
        self.registry_port, self.kafka_port = map(int, self.proc.stdout.readline().split())

    def threads(self):
        with open(f"/proc/{self.proc.pid}/status") as status:
            return next(int(line.split()[1]) for line in status
                        if line.startswith("Threads:"))

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def served(tmp_path, request):
    options = getattr(request, "param", {})
    handle = Served(tmp_path / "data", **options)
    yield handle
    handle.close()


def call(port, method, path, body=None, *, raw=None, timeout=30):
    """(status, parsed JSON) of one request on a fresh connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    payload = raw if raw is not None else (None if body is None else json.dumps(body))
    connection.request(method, path, body=payload,
                       headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, json.loads(data) if data else None


def api_versions_s(port):
    """Seconds for one ApiVersions round trip to the Kafka listener."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(encode_request(18, 0, 1, {}))
        assert struct.unpack(">i", sock.recv(4))[0] > 0
    return time.monotonic() - started


def closed_by_server(sock, within_s):
    """Whether the server closes `sock` within `within_s` (reading what it sends)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            if sock.recv(4096) == b"":
                return True
        except socket.timeout:
            return False
        except OSError:                          # reset: closed too
            return True
    return False


def json_schema(document):
    return {"schemaType": "JSON", "schema": json.dumps(document)}


# ---- finding 8: a regex in a registered JSON Schema ---------------------------------------

def test_a_backtracking_pattern_stalls_neither_the_kafka_listener_nor_the_registry(served):
    writer = {"type": "object", "patternProperties": {BACKTRACKING: {}}}
    assert call(served.registry_port, "POST", "/subjects/s/versions",
                json_schema(writer))[0] == 200
    # The new schema's property is checked against the writer's pattern (is it covered?)
    reader = {**writer, "properties": {"a" * 28 + "!": {"type": "string"}}}
    answer = {}

    def attack():
        started = time.monotonic()
        answer["status"] = call(served.registry_port, "POST", "/subjects/s/versions",
                                json_schema(reader), timeout=120)[0]
        answer["seconds"] = time.monotonic() - started

    attacker = threading.Thread(target=attack)
    attacker.start()
    kafka_s, registry_s = [], []
    while attacker.is_alive() or not kafka_s:
        kafka_s.append(api_versions_s(served.kafka_port))
        started = time.monotonic()
        assert call(served.registry_port, "GET", "/subjects")[0] == 200
        registry_s.append(time.monotonic() - started)
    attacker.join()
    assert max(kafka_s) < PROBE_LIMIT_S, kafka_s
    assert max(registry_s) < PROBE_LIMIT_S, registry_s
    assert answer["status"] == 409                     # incompatible, answered
    assert answer["seconds"] < 5, answer


@pytest.mark.parametrize("pattern", [r"^(a)\1$", "^(?=a)b", "(?<!x)y"])
def test_a_pattern_re2_cannot_run_is_refused_at_registration(broker, pattern):
    pytest.importorskip("re2")                  # google-re2, in the schemas extra
    with serve(broker.schema_registry()) as server:
        status, body = call(server.port, "POST", "/subjects/s/versions",
                            json_schema({"type": "string", "pattern": pattern}))
        assert (status, body["error_code"]) == (422, 42201)
        assert "RE2" in body["message"] and json.dumps(pattern) in body["message"]
        for schema in ({"type": "object", "patternProperties": {pattern: {}}},
                       {"properties": {"default": {"type": "string", "pattern": pattern}}}):
            status, body = call(server.port, "POST", "/subjects/s/versions",
                                json_schema(schema))
            assert (status, body["error_code"]) == (422, 42201), schema
    with pytest.raises(UnsupportedPatternError) as raised:
        broker.schema_registry().register("s", json.dumps({"pattern": pattern}), "JSON")
    assert raised.value.pattern == pattern and isinstance(raised.value, logkit.LogkitError)


def test_patterns_re2_can_run_are_still_registered_and_matched(broker):
    """ECMA-262's \\uXXXX escape is translated; a value that looks like a pattern
    inside `default` or `enum` is data, not a regex."""
    pytest.importorskip("re2")                  # google-re2, in the schemas extra
    registry = broker.schema_registry()
    writer = {"type": "object", "patternProperties": {"^x_\\u00e9+$": {"type": "string"}},
              "default": {"pattern": "(?=data)"}}
    registry.register("s", json.dumps(writer), "JSON")
    covered = {**writer, "properties": {"x_éé": {"type": "string"}}}
    assert registry.incompatibilities("s", json.dumps(covered), "JSON") == []
    uncovered = {**writer, "properties": {"y": {"type": "string"}}}
    assert registry.incompatibilities("s", json.dumps(uncovered), "JSON")


# ---- finding 9: deep nesting ---------------------------------------------------------------

@pytest.mark.parametrize("depth", [500, 2000])
def test_deep_nesting_in_a_body_or_a_schema_is_a_4xx_in_confluents_shape(broker, depth):
    nested_object = '{"a":' * depth + "1" + "}" * depth
    nested_array = "[" * depth + "]" * depth
    schemas = {
        "JSON": '{"not":' * depth + "{}" + "}" * depth,
        "AVRO": nested_array,
        "PROTOBUF": 'syntax = "proto3";\n' + "message M { " * depth + "}" * depth,
    }
    with serve(broker.schema_registry()) as server:
        for body in (nested_object, '{"schema": "x", "references": ' + nested_array + "}"):
            for path in ("/subjects/s/versions", "/subjects/s",
                         "/compatibility/subjects/s/versions", "/config"):
                status, answer = call(server.port, "PUT" if path == "/config" else "POST",
                                      path, raw=body)
                assert (status, answer["error_code"]) == (400, 400), (path, answer)
                assert "nests deeper" in answer["message"]
        for kind, schema in schemas.items():
            status, answer = call(server.port, "POST", "/subjects/s/versions",
                                  {"schemaType": kind, "schema": schema})
            assert (status, answer["error_code"]) == (422, 42201), (kind, answer)
            assert set(answer) == {"error_code", "message"}


# ---- findings 6 and 7: slow clients and connection slots ---------------------------------

@pytest.mark.parametrize("served", [{"request_timeout_ms": 1500}], indirect=True)
def test_a_client_trickling_a_byte_every_200_ms_is_cut_off_at_the_request_deadline(served):
    slow = socket.create_connection(("127.0.0.1", served.registry_port), timeout=10)
    slow.sendall(b"POST /subjects/s/versions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    started = time.monotonic()
    cut_off = False
    while not cut_off and time.monotonic() - started < 6:
        try:
            slow.sendall(b"a")
        except OSError:
            cut_off = True
            break
        cut_off = closed_by_server(slow, 0.2)        # the trickle's own pace
        started_probe = time.monotonic()
        assert call(served.registry_port, "GET", "/subjects")[0] == 200
        assert time.monotonic() - started_probe < PROBE_LIMIT_S
    elapsed = time.monotonic() - started
    slow.close()
    assert cut_off, "the trickling connection was still open after 6 s"
    assert 1.0 < elapsed < 4.0, elapsed


@pytest.mark.parametrize("served", [{"idle_timeout_ms": 1000}], indirect=True)
def test_an_idle_connection_is_closed_after_the_idle_timeout(served):
    with socket.create_connection(("127.0.0.1", served.registry_port)) as idle:
        started = time.monotonic()
        assert closed_by_server(idle, 5), "an idle connection was kept for 5 s"
        assert time.monotonic() - started > 0.8
    with socket.create_connection(("127.0.0.1", served.registry_port)) as reused:
        reused.sendall(b"GET /subjects HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive, answered
        assert reused.recv(4096).startswith(b"HTTP/1.1 200")
        assert closed_by_server(reused, 5), "an idle kept-alive connection was kept for 5 s"


CAP = 16


@pytest.mark.parametrize("served", [{"max_connections": CAP, "request_timeout_ms": 1500}],
                         indirect=True)
def test_idle_connections_cannot_take_every_slot_nor_a_thread_each(served):
    base_threads = served.threads()
    flood = [socket.create_connection(("127.0.0.1", served.registry_port))
             for _ in range(20 * CAP)]
    # A legitimate client is served although 320 connections were opened before it:
    # the connection idle the longest made room each time.
    assert call(served.registry_port, "GET", "/subjects", timeout=5)[0] == 200
    wait_until(lambda: served.threads() <= base_threads + CAP, 5,
               "at most one thread per slot")
    closed = sum(closed_by_server(sock, 0.01) for sock in flood)
    assert closed >= len(flood) - CAP
    for sock in flood:
        sock.close()


@pytest.mark.parametrize("served", [{"max_connections": CAP, "request_timeout_ms": 1500}],
                         indirect=True)
def test_when_every_slot_is_in_a_request_a_new_client_gets_503_then_a_slot(served):
    busy = []
    for _ in range(CAP):
        sock = socket.create_connection(("127.0.0.1", served.registry_port))
        sock.sendall(b"GET /subjects HTTP/1.1\r\n")            # a request, never finished
        busy.append(sock)
    answers = []

    def refused():
        for i, sock in enumerate(busy):  # one whose first bytes were not read yet looked
            if closed_by_server(sock, 0.01):          # idle and made room: replace it
                sock.close()
                busy[i] = socket.create_connection(("127.0.0.1", served.registry_port))
                busy[i].sendall(b"GET /subjects HTTP/1.1\r\n")
        try:
            answers.append(call(served.registry_port, "GET", "/subjects", timeout=5))
        except OSError:                  # the refusal may reach us as a reset instead
            return False
        return answers[-1][0] == 503
    wait_until(refused, 5, "a 503 while every slot is in a request")
    assert answers[-1][1]["error_code"] == 503
    # Those requests' deadline passes: their slots come back.
    wait_until(lambda: call(served.registry_port, "GET", "/subjects", timeout=5)[0] == 200,
               10, "a slot after the busy connections' request deadline")
    for sock in busy:
        sock.close()


def test_a_serde_validates_a_backtracking_pattern_in_linear_time(broker):
    """A consumer validates every record with its writer's schema: a record built to
    make Python's `re` backtrack is refused in linear time, not after seconds."""
    pytest.importorskip("jsonschema")
    pytest.importorskip("re2")                  # google-re2, in the schemas extra
    from logkit.serde import JsonSchemaSerde
    schema = {"type": "object", "additionalProperties": False,
              "properties": {"name": {"type": "string", "pattern": BACKTRACKING}},
              "patternProperties": {BACKTRACKING: {"type": "integer"}}}
    serde = JsonSchemaSerde(broker, "events", schema)
    assert serde.deserialize(serde.serialize({"name": "aaa", "aa": 1})) == \
        {"name": "aaa", "aa": 1}
    hostile = "a" * 26 + "!"                 # seconds in `re`, microseconds in RE2
    for value, field in (({"name": hostile}, "name"), ({hostile: 1}, "")):
        started = time.monotonic()
        with pytest.raises(logkit.SerializationError) as raised:
            serde.serialize(value)
        assert time.monotonic() - started < PROBE_LIMIT_S
        assert raised.value.field == field
    with pytest.raises(logkit.SerializationError):
        serde.serialize({"aa": "not an integer"})


@pytest.mark.parametrize("served", [{"request_timeout_ms": 3000}], indirect=True)
def test_bodies_held_one_byte_short_take_bounded_memory(served):
    """64 clients each send a 4 MiB body but its last byte: the registry holds at most
    MAX_INFLIGHT_BODY_BYTES of them (32 MiB); the others wait for room, not memory."""
    def peak_rss_mib():
        with open(f"/proc/{served.proc.pid}/status") as status:
            return next(int(line.split()[1]) for line in status
                        if line.startswith("VmHWM:")) // 1024
    base_mib = peak_rss_mib()
    body = json.dumps({"schema": "x" * ((4 << 20) - 30)}).encode()
    head = b"POST /subjects/s/versions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"

    def hold():
        with socket.create_connection(("127.0.0.1", served.registry_port)) as sock:
            sock.settimeout(2)
            try:
                sock.sendall(head % len(body) + body[:-1])
                sock.recv(1)                     # until the request's deadline ends it
            except OSError:
                pass
    holders = [threading.Thread(target=hold) for _ in range(64)]
    for holder in holders:
        holder.start()
    for holder in holders:
        holder.join()
    assert peak_rss_mib() - base_mib < 128, (base_mib, peak_rss_mib())
    assert call(served.registry_port, "GET", "/subjects")[0] == 200


def test_a_check_of_many_names_against_many_patterns_is_bounded():
    """5,000 new property names against a writer's 5,000 patternProperties would be 25
    million searches inside the registry's write transaction; the check stops searching
    after MAX_PATTERN_SEARCHES and reports the rest conservatively."""
    from logkit import compat
    count = 5000
    writer = {"type": "object", "patternProperties": {f"^p{i}$": {} for i in range(count)}}
    reader = {**writer, "properties": {f"q{i}": {"type": "string"} for i in range(count)}}
    old, new = (compat.parse("JSON", json.dumps(s)) for s in (writer, reader))
    started = time.monotonic()
    problems = compat.check_compatibility(new, old)
    assert time.monotonic() - started < 5
    assert len(problems) == count                        # every new name, reported
    assert {p.rule for p in problems} == {"PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL"}


def test_the_brokers_handle_takes_the_limits_and_refuses_nonsense(broker):
    with broker.serve_schema_registry(idle_timeout_ms=500) as server:
        with socket.create_connection((server.host, server.port)) as idle:
            assert closed_by_server(idle, 5)
    for bad in ({"max_connections": 0}, {"idle_timeout_ms": -1},
                {"request_timeout_ms": 2.5}, {"max_connections": True}):
        with pytest.raises(logkit.ConfigError):
            broker.serve_schema_registry(**bad)
