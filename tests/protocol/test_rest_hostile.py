"""The REST proxy under hostile input (logkit/rest.py's bounds): fuzzed and truncated
bodies get a 4xx and write nothing, deep nesting, oversized records, stalled bodies and
too many connections are answered in Confluent's error shape, and the server keeps
serving afterwards."""

from __future__ import annotations

import json
import random
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.protocol.test_rest_proxy import call, concatenated, records_url, stream

V2_JSON = "application/vnd.kafka.json.v2+json"
VALID = [{"key": {"type": "STRING", "data": "k"}, "value": {"type": "JSON",
                                                            "data": {"a": [1, 2]}},
          "headers": [{"name": "h", "value": "dg=="}]},
         {"partition_id": 0, "value": {"type": "BINARY", "data": "aGk="}},
         {"value": {"type": "STRING", "data": "three"}}]


@pytest.fixture
def served(broker):
    broker.create_topic("f", 1)
    server = broker.serve_rest(max_body_bytes=4096)
    yield broker, server
    server.close()


def written(broker):
    return broker.topic("f").partition(0).high_watermark


def still_serving(server):
    status, report, _ = call(records_url(server, "f"), "POST",
                             {"value": {"type": "STRING", "data": "alive"}})
    assert status == 200 and report["error_code"] == 200


def is_records(body: bytes) -> bool:
    """Whether `body` parses as one or more concatenated JSON objects."""
    try:
        values = concatenated(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return bool(values) and all(isinstance(v, dict) for v in values)


def mutations(seed: int, count: int) -> list[bytes]:
    """Valid bodies with bytes flipped, dropped, inserted or cut (a seeded loop)."""
    rng = random.Random(seed)
    base = b"".join(json.dumps(r).encode() for r in VALID)
    out = []
    for _ in range(count):
        body = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(body))
            kind = rng.randrange(4)
            if kind == 0:
                body[at] = rng.randrange(256)
            elif kind == 1:
                del body[at]
            elif kind == 2:
                body.insert(at, rng.choice(b'{}[]",:\\0 \xff'))
            else:
                del body[at:]
                break
        out.append(bytes(body))
    return out


def test_a_fuzzed_v3_body_that_is_not_records_writes_nothing_and_gets_a_4xx(served):
    broker, server = served
    url = records_url(server, "f")
    bodies = mutations(34, 300)
    bodies += [bytes(random.Random(i).randbytes(random.Random(i).randrange(1, 200)))
               for i in range(100)]
    refused = 0
    for body in bodies:
        before = written(broker)
        status, _, raw = call(url, "POST", body)
        assert status < 500, raw
        if not is_records(body):
            assert 400 <= status < 500, (body, raw)
            assert json.loads(raw)["error_code"] >= 400
            assert written(broker) == before, body
            refused += 1
        elif status >= 400:
            assert written(broker) == before, body
    assert refused > 200
    still_serving(server)


JSONISH = st.text(alphabet='{}[]":,0123456789.-etrufalsn \\abvdkyipBINARYJSOTG=',
                  max_size=300).map(str.encode)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(st.binary(max_size=300), JSONISH))
def test_hypothesis_bodies_never_write_unless_they_are_records(served, body):
    broker, server = served
    before = written(broker)
    status, _, raw = call(records_url(server, "f"), "POST", body)
    assert status < 500, raw
    if not is_records(body):
        assert 400 <= status < 500 and written(broker) == before, (body, raw)


def test_a_fuzzed_v2_body_writes_nothing_unless_it_is_a_valid_request(served):
    broker, server = served
    base = json.dumps({"records": [{"key": "k", "value": {"a": 1}},
                                   {"value": [1, 2, 3], "partition": 0}]}).encode()
    rng = random.Random(2)
    for _ in range(200):
        body = bytearray(base)
        at = rng.randrange(len(body))
        body[at:at + rng.randint(1, 3)] = bytes(rng.randrange(256)
                                                for _ in range(rng.randint(0, 2)))
        before = written(broker)
        status, _, raw = call(f"{server.url}/topics/f", "POST", bytes(body),
                              content_type=V2_JSON)
        assert status < 500, raw
        if status >= 400:
            assert written(broker) == before
            assert set(json.loads(raw)) == {"error_code", "message"}
    still_serving(server)


def test_every_truncation_of_a_body_gets_400_and_writes_nothing(served):
    broker, server = served
    body = b"".join(json.dumps(r).encode() for r in VALID)
    ends = set()
    index = 0
    for record in VALID:                      # the cuts between whole records are valid
        index += len(json.dumps(record))
        ends.add(index)
    for cut in range(1, len(body)):
        if cut in ends:
            continue
        status, answer, _ = call(records_url(server, "f"), "POST", body[:cut])
        assert (status, answer["error_code"]) == (400, 400), cut
    assert written(broker) == 0
    still_serving(server)


def test_deep_nesting_is_refused_not_crashed(served):
    broker, server = served
    deep = b'{"value": {"type": "JSON", "data": ' + b"[" * 50_000 + b"]" * 50_000 + b"}}"
    server_big = broker.serve_rest()
    status, answer, _ = call(records_url(server_big, "f"), "POST", deep)
    assert (status, answer["error_code"]) == (400, 400)
    status, raw = stream(records_url(server_big, "f"), [deep[i:i + 4096]
                                                        for i in range(0, len(deep), 4096)])
    assert status == 200 and concatenated(raw)[-1]["error_code"] == 400
    assert written(broker) == 0
    server_big.close()
    still_serving(server)


def test_a_streamed_record_over_max_body_bytes_ends_the_stream_with_413(served):
    broker, server = served
    small = json.dumps({"value": {"type": "STRING", "data": "s"}}).encode()
    large = json.dumps({"value": {"type": "STRING", "data": "x" * 10_000}}).encode()
    status, raw = stream(records_url(server, "f"),
                         [small] + [large[i:i + 1000] for i in range(0, len(large), 1000)])
    reports = concatenated(raw)
    assert status == 200 and [r["error_code"] for r in reports] == [200, 413]
    assert written(broker) == 1
    # many records of a stream may add up to more than max_body_bytes: the bound is each's
    status, raw = stream(records_url(server, "f"), [small] * 1000)
    assert status == 200 and len(concatenated(raw)) == 1000
    assert written(broker) == 1001


def raw_request(port: int, data: bytes, *, read_s: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=read_s) as sock:
        sock.sendall(data)
        chunks = []
        deadline = time.monotonic() + read_s
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def test_a_stalled_body_is_answered_408_within_the_request_deadline(broker):
    broker.create_topic("f", 1)
    server = broker.serve_rest(request_timeout_ms=500)
    path = f"/v3/clusters/{server.cluster_id}/topics/f/records"
    started = time.monotonic()
    answer = raw_request(server.port, (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: 100\r\nConnection: close\r\n\r\n{{\"value\":").encode())
    assert answer.startswith(b"HTTP/1.1 408") and b'"error_code": 408' in answer
    assert time.monotonic() - started < 5
    assert written(broker) == 0
    still_serving(server)
    server.close()


def test_a_stalled_stream_ends_with_a_408_report_after_the_idle_timeout(broker):
    broker.create_topic("f", 1)
    server = broker.serve_rest(idle_timeout_ms=500)
    path = f"/v3/clusters/{server.cluster_id}/topics/f/records"
    record = json.dumps({"value": {"type": "STRING", "data": "one"}}).encode()
    answer = raw_request(server.port, (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Transfer-Encoding: chunked\r\n\r\n").encode()
        + f"{len(record):x}\r\n".encode() + record + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 200")
    assert b'"error_code":200' in answer and b'"error_code":408' in answer
    assert written(broker) == 1
    still_serving(server)
    server.close()


def test_connections_over_the_cap_get_503_and_the_server_recovers(broker):
    broker.create_topic("f", 1)
    server = broker.serve_rest(max_connections=2)
    held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
    try:
        deadline = time.monotonic() + 10
        answer = b""
        while not answer.startswith(b"HTTP/1.1 503") and time.monotonic() < deadline:
            answer = raw_request(server.port, b"GET /v3/clusters HTTP/1.1\r\nHost: x\r\n"
                                              b"Connection: close\r\n\r\n", read_s=5)
        assert answer.startswith(b"HTTP/1.1 503") and b'"error_code": 50301' in answer
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if call(f"{server.url}/v3/clusters")[0] == 200:
            break
    assert call(f"{server.url}/v3/clusters")[0] == 200
    server.close()


def test_garbage_on_the_socket_closes_that_connection_only(served):
    broker, server = served
    answer = raw_request(server.port, b"\x16\x03\x01 not http at all\r\n\r\n", read_s=5)
    assert answer == b"" or answer.split(b" ")[1] == b"400"
    assert written(broker) == 0
    still_serving(server)


def test_a_streamed_body_whose_connection_breaks_ends_the_stream(served):
    """A client that goes away mid-stream (the body read raises) ends the stream with
    an error item, so the writer waiting on the parsed records is not left waiting for
    ever (a task and its request held per vanished client)."""
    import asyncio

    class _Broken:
        async def readany(self):
            raise ConnectionResetError("Connection lost")

    class _Request:
        content = _Broken()

    _, server = served

    async def read():
        parsed = asyncio.Queue()
        await asyncio.wait_for(server._read_stream(_Request(), parsed), 5)
        return parsed.get_nowait()

    objects, error, last = asyncio.run(read())
    assert (objects, error.status, last) == ([], 400, True)
    assert "could not be read" in error.message
