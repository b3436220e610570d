"""The listener's frame decoder under hostile input: random bytes, mutated and truncated
valid requests, huge declared lengths, unknown API keys and versions. The decoder either
returns a request or raises ProtocolError (nothing else); on a live listener a bad frame
closes only its own connection, another connection keeps being answered meanwhile, and
nothing is written to the broker."""

import random
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import logkit
from logkit.protocol.errors import FrameTooLargeError, ProtocolError
from logkit.protocol.frame import FrameDecoder, encode_request, parse_request, parse_response


def _seeds():
    """Valid request frames (without their size) of every API, none of which writes."""
    bodies = [
        (18, 3, {"client_software_name": "fuzz", "client_software_version": "1"}),
        (18, 0, {}),
        (3, 12, {"topics": [{"name": "t", "topic_id": bytes(16)}],
                 "allow_auto_topic_creation": True}),
        (3, 1, {"topics": None}),
        (1, 12, {"max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1000, "isolation_level": 0,
                 "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [],
                 "rack_id": "", "topics": [{"topic": "t", "partitions": [
                     {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 100}]}]}),
        (2, 5, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": "t", "partitions": [{"partition_index": 0, "timestamp": -1}]}]}),
        (10, 4, {"key_type": 0, "coordinator_keys": ["g"]}),
        (32, 4, {"resources": [{"resource_type": 2, "resource_name": "t",
                                "configuration_keys": None}]}),
        (9, 8, {"groups": [{"group_id": "g", "topics": None}]}),
        (16, 4, {"states_filter": []}),
    ]
    return [bytes(encode_request(key, version, 7, body)[4:]) for key, version, body in bodies]


SEEDS = _seeds()


def _mutate(rng, frame):
    data = bytearray(frame)
    for _ in range(rng.randint(1, 6)):
        choice = rng.random()
        if choice < 0.5 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice < 0.7:
            del data[rng.randrange(len(data) + 1):]
        elif choice < 0.85:
            at = rng.randrange(len(data) + 1)
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            at = rng.randrange(max(1, len(data) - 3))
            data[at:at + 4] = rng.choice([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff",
                                          b"\x80\x00\x00\x00", b"\xff\xff\xff\x7f"])
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_frames_parse_or_raise_protocol_error(data):
    try:
        parse_request(data)
    except ProtocolError:
        pass


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from(range(len(SEEDS))))
def test_mutated_valid_frames_parse_or_raise_protocol_error(seed, which):
    rng = random.Random(seed)
    try:
        parse_request(_mutate(rng, SEEDS[which]))
    except ProtocolError:
        pass


def test_a_declared_size_above_the_limit_is_refused_before_its_body():
    decoder = FrameDecoder(max_request_bytes=1000)
    with pytest.raises(FrameTooLargeError):
        decoder.feed(struct.pack(">i", 1001))
    for size in (0, -1, -2 ** 31):
        with pytest.raises(FrameTooLargeError):
            FrameDecoder().feed(struct.pack(">i", size))


def test_frames_split_anywhere_come_out_whole():
    stream = b"".join(struct.pack(">i", len(s)) + s for s in SEEDS)
    rng = random.Random(5)
    decoder, out, at = FrameDecoder(), [], 0
    while at < len(stream):
        step = rng.randint(1, 9)
        out += decoder.feed(stream[at:at + step])
        at += step
    assert out == SEEDS and decoder.pending_bytes == 0


def _answer(sock, api_key, version, correlation):
    def exactly(n):
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the listener closed a good connection"
            data += chunk
        return data
    size = struct.unpack(">i", exactly(4))[0]
    got, body = parse_response(api_key, version, exactly(size))
    assert got == correlation
    return body


def test_a_live_listener_survives_hostile_connections_and_writes_nothing(tmp_path):
    rng = random.Random(11)
    with logkit.Broker(tmp_path / "d", config={"auto.create.topics.enable": False}) as b, \
            b.serve(max_request_bytes=1 << 16, request_timeout_ms=2000) as server:
        p = b.create_topic("t", 1).partition(0)
        p.append([(b"k", b"v", None, None)])
        before = (b.topics(), p.log_end_offset)
        good = socket.create_connection((server.host, server.port), timeout=20)
        frames = []
        for _ in range(150):
            kind = rng.random()
            if kind < 0.5:
                body = _mutate(rng, rng.choice(SEEDS))
            elif kind < 0.7:
                body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
            elif kind < 0.8:
                body = struct.pack(">hhih", rng.randint(50, 32767), 0, 1, -1)
            elif kind < 0.9:
                body = struct.pack(">hhih", 3, rng.randint(13, 32767), 1, -1)
            else:
                body = None                     # a huge declared length
            frames.append(struct.pack(">i", 2 ** 31 - 1) if body is None
                          else struct.pack(">i", len(body)) + body)
        for n, frame in enumerate(frames):
            hostile = socket.create_connection((server.host, server.port), timeout=20)
            cut = frame if rng.random() < 0.8 else frame[:rng.randrange(len(frame))]
            hostile.sendall(cut)
            if cut is not frame:
                hostile.shutdown(socket.SHUT_WR)    # truncated, then half-closed
            if n % 10 == 0:                       # the good connection is still served
                good.sendall(encode_request(18, 0, n, {}))
                assert _answer(good, 18, 0, n)["error_code"] == 0
            hostile.close()
        good.sendall(encode_request(3, 1, 999, {"topics": None}))
        assert [t["name"] for t in _answer(good, 3, 1, 999)["topics"]] == ["t"]
        good.close()
        assert (b.topics(), p.log_end_offset) == before
        p.check()


def test_a_half_open_client_is_timed_out_and_others_are_served(tmp_path):
    with logkit.Broker(tmp_path / "d") as b, b.serve(request_timeout_ms=300) as server:
        slow = socket.create_connection((server.host, server.port), timeout=20)
        slow.sendall(struct.pack(">i", 100) + b"\x00\x12")       # begun, never finished
        good = socket.create_connection((server.host, server.port), timeout=20)
        good.sendall(encode_request(18, 0, 1, {}))
        assert _answer(good, 18, 0, 1)["error_code"] == 0
        assert slow.recv(10) == b""              # closed by the listener, nothing sent
        slow.close()
        good.close()
