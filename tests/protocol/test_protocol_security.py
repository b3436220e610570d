"""The listener's optional security: TLS (the standard `ssl` module) and SASL/PLAIN, with
kafka-python and confluent-kafka as the clients; a client without credentials, or with
wrong ones, gets nothing, and no request but ApiVersions and SASL is served before
authentication."""

import socket
import ssl
import struct

import pytest

import logkit
from logkit.protocol.frame import encode_request, parse_response
from tests.helpers.tls import self_signed

USERS = {"alice": "s3cret"}


@pytest.fixture
def broker(tmp_path):
    with logkit.Broker(tmp_path / "d") as b:
        b.create_topic("t", 1)
        yield b


def _call(sock, api_key, version, body):
    sock.sendall(encode_request(api_key, version, 1, body))
    size = struct.unpack(">i", sock.recv(4))[0]
    data = b""
    while len(data) < size:
        data += sock.recv(size - len(data))
    return parse_response(api_key, version, data)[1]


def test_tls_with_kafka_python_and_confluent_kafka(broker, tmp_path):
    kafka = pytest.importorskip("kafka")
    ck = pytest.importorskip("confluent_kafka")
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with broker.serve(ssl_context=context) as server:
        producer = kafka.KafkaProducer(bootstrap_servers=server.bootstrap_servers,
                                       security_protocol="SSL", ssl_cafile=cert)
        producer.send("t", b"over tls").get(timeout=20)
        producer.close()
        other = ck.Producer({"bootstrap.servers": server.bootstrap_servers,
                             "security.protocol": "SSL", "ssl.ca.location": cert})
        other.produce("t", b"over tls too")
        assert other.flush(20) == 0
        plain = socket.create_connection((server.host, server.port), timeout=10)
        plain.sendall(encode_request(18, 0, 1, {}))      # not a TLS hello: closed
        try:
            answer = plain.recv(100)
        except ConnectionResetError:
            answer = b""
        assert answer[:1] in (b"", b"\x15")           # closed, or a TLS alert: no answer
        plain.close()
    assert [r.value for r in broker.topic("t").partition(0).read(0)] == \
        [b"over tls", b"over tls too"]


def test_sasl_plain_admits_the_right_password_only(broker):
    kafka = pytest.importorskip("kafka")
    ck = pytest.importorskip("confluent_kafka")
    with broker.serve(sasl_plain_users=USERS) as server:
        common = {"bootstrap_servers": server.bootstrap_servers,
                  "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}
        producer = kafka.KafkaProducer(**common, sasl_plain_username="alice",
                                       sasl_plain_password="s3cret")
        producer.send("t", b"authenticated").get(timeout=20)
        producer.close()
        other = ck.Producer({"bootstrap.servers": server.bootstrap_servers,
                             "security.protocol": "SASL_PLAINTEXT",
                             "sasl.mechanism": "PLAIN", "sasl.username": "alice",
                             "sasl.password": "s3cret"})
        other.produce("t", b"authenticated too")
        assert other.flush(20) == 0
        wrong = socket.create_connection((server.host, server.port), timeout=10)
        assert _call(wrong, 17, 1, {"mechanism": "PLAIN"})["error_code"] == 0
        answer = _call(wrong, 36, 2, {"auth_bytes": b"\0alice\0wrong"})
        assert answer["error_code"] == 58                 # SASL_AUTHENTICATION_FAILED
        try:                                  # closed after the failure: nothing more
            wrong.sendall(encode_request(3, 1, 9, {"topics": None}))
            assert wrong.recv(100) == b""
        except (ConnectionResetError, BrokenPipeError):
            pass
        wrong.close()
        anonymous = socket.create_connection((server.host, server.port), timeout=10)
        anonymous.sendall(encode_request(3, 1, 1, {"topics": None}))
        assert anonymous.recv(100) == b""          # closed: Metadata before SASL
        anonymous.close()
        versions = socket.create_connection((server.host, server.port), timeout=10)
        versions.sendall(encode_request(18, 0, 1, {}))
        assert struct.unpack(">i", versions.recv(4))[0] > 0   # ApiVersions is answered
        versions.close()
    assert [r.value for r in broker.topic("t").partition(0).read(0)] == \
        [b"authenticated", b"authenticated too"]
