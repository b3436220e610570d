"""The registry's REST API on a real socket: confluent-kafka's SchemaRegistryClient
against it, Confluent's error codes, and malformed requests answered with a 4xx."""

from __future__ import annotations

import http.client
import json
import socket

import pytest

import logkit
from logkit.registry_http import MAX_BODY_BYTES

V1 = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "note", "type": "string", "default": ""}]})
V2 = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}]})
ADDS_DEFAULTLESS = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "note", "type": "string", "default": ""},
    {"name": "age", "type": "int"}]})


@pytest.fixture
def server(broker):
    with broker.serve_schema_registry() as handle:
        yield handle


def call(server, method, path, body=None, *, raw=None, headers=None):
    """(status, parsed JSON) of one request on a fresh connection."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=10)
    payload = raw if raw is not None else (None if body is None else json.dumps(body))
    connection.request(method, path, body=payload, headers=headers or {
        "Content-Type": "application/vnd.schemaregistry.v1+json"})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, json.loads(data) if data else None


def test_handle_is_loopback_with_a_url_and_closes_twice(broker):
    handle = broker.serve_schema_registry()
    assert handle.host == "127.0.0.1" and handle.url == f"http://127.0.0.1:{handle.port}"
    handle.close()
    handle.close()
    with pytest.raises(OSError):
        socket.create_connection((handle.host, handle.port), timeout=2).close()


def test_broker_close_closes_the_server(tmp_path):
    broker = logkit.Broker(tmp_path / "data")
    handle = broker.serve_schema_registry()
    broker.close()
    assert handle.closed


def test_confluent_client_round_trip(server):
    pytest.importorskip("confluent_kafka.schema_registry")
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    client = SchemaRegistryClient({"url": server.url, "max.retries": 0})
    first = client.register_schema("orders-value", Schema(V1, "AVRO"))
    assert client.register_schema("orders-value", Schema(V1, "AVRO")) == first
    assert client.get_schema(first).schema_str == V1
    second = client.register_schema("orders-value", Schema(V2, "AVRO"))
    assert client.get_subjects() == ["orders-value"]
    assert client.get_versions("orders-value") == [1, 2]
    latest = client.get_latest_version("orders-value")
    assert (latest.schema_id, latest.version) == (second, 2)
    assert client.get_version("orders-value", 1).schema_id == first
    assert client.lookup_schema("orders-value", Schema(V1, "AVRO")).version == 1
    assert client.test_compatibility("orders-value", Schema(V1, "AVRO")) is True
    assert client.test_compatibility("orders-value", Schema(ADDS_DEFAULTLESS, "AVRO")) is False
    client.set_compatibility("orders-value", "FULL")
    assert client.get_compatibility("orders-value") == "FULL"
    assert client.get_compatibility() == "BACKWARD"
    with pytest.raises(SchemaRegistryError) as raised:
        client.register_schema("orders-value", Schema(ADDS_DEFAULTLESS, "AVRO"))
    assert raised.value.http_status_code == 409 and "age" in raised.value.error_message
    assert client.delete_version("orders-value", 2) == 2
    assert client.delete_subject("orders-value") == [1]
    assert client.delete_subject("orders-value", permanent=True) == [1, 2]
    assert client.get_subjects() == []


def test_soft_delete_keeps_the_id_and_lists_deleted_subjects(server):
    status, body = call(server, "POST", "/subjects/orders-value/versions", {"schema": V1})
    assert status == 200
    schema_id = body["id"]
    assert call(server, "DELETE", "/subjects/orders-value") == (200, [1])
    assert call(server, "GET", f"/schemas/ids/{schema_id}") == (200, {"schema": V1})
    assert call(server, "GET", "/subjects") == (200, [])
    assert call(server, "GET", "/subjects?deleted=true") == (200, ["orders-value"])
    assert call(server, "GET", f"/schemas/ids/{schema_id}/versions?deleted=true") == \
        (200, [{"subject": "orders-value", "version": 1}])
    status, body = call(server, "GET", "/subjects/orders-value/versions/1?deleted=true")
    assert status == 200 and body["id"] == schema_id and body["version"] == 1


@pytest.mark.parametrize("method,path,body,status,code", [
    ("GET", "/subjects/nope/versions", None, 404, 40401),
    ("GET", "/subjects/nope/versions/latest", None, 404, 40401),
    ("GET", "/schemas/ids/12345", None, 404, 40403),
    ("GET", "/schemas/ids/abc", None, 404, 40403),
    ("POST", "/subjects/s/versions", {"schema": "{not json"}, 422, 42201),
    ("POST", "/subjects/s/versions", {"schema": '{"type": "record"}'}, 422, 42201),
    ("POST", "/subjects/s/versions", {"schema": "message {", "schemaType": "PROTOBUF"},
     422, 42201),
    ("POST", "/subjects/s/versions", {"schema": '{"type": 7}', "schemaType": "JSON"},
     422, 42201),
    ("POST", "/subjects/s/versions", {"schema": V1, "schemaType": "XML"}, 422, 42201),
    ("POST", "/subjects/s/versions", {"nothing": 1}, 422, 42201),
    ("POST", "/subjects/s/versions", [1, 2], 422, 42201),
    ("PUT", "/config", {"compatibility": "SIDEWAYS"}, 422, 42203),
    ("PUT", "/config/s", {}, 422, 42203),
    ("GET", "/config/s", None, 404, 40408),
    ("GET", "/nowhere", None, 404, 404),
    ("PATCH", "/subjects", None, 405, 405),
    ("DELETE", "/schemas/types", None, 405, 405),
    ("GET", "/associations/resources/-/orders?resourceType=topic", None, 404, 404),
])
def test_errors_have_confluents_codes(server, method, path, body, status, code):
    got_status, got = call(server, method, path, body)
    assert got_status == status
    if code is not None:
        assert got["error_code"] == code and isinstance(got["message"], str)


def test_version_errors_and_incompatible_message(server):
    call(server, "POST", "/subjects/s/versions", {"schema": V1})
    assert call(server, "GET", "/subjects/s/versions/7")[1]["error_code"] == 40402
    assert call(server, "GET", "/subjects/s/versions/0")[1]["error_code"] == 42202
    assert call(server, "GET", "/subjects/s/versions/x")[1]["error_code"] == 42202
    status, body = call(server, "POST", "/subjects/s/versions", {"schema": ADDS_DEFAULTLESS})
    assert status == 409 and body["error_code"] == 409
    assert "age" in body["message"] and "READER_FIELD_MISSING_DEFAULT_VALUE" in \
        body["message"]
    status, body = call(server, "POST",
                        "/compatibility/subjects/s/versions/latest?verbose=true",
                        {"schema": ADDS_DEFAULTLESS})
    assert status == 200 and body["is_compatible"] is False
    assert "age" in body["messages"][0]


def test_malformed_requests_get_4xx_and_the_server_keeps_serving(server):
    assert call(server, "POST", "/subjects/s/versions", raw="{garbage")[0] == 400
    assert call(server, "POST", "/subjects/s/versions", raw=b"\xff\xfe")[0] == 400
    status, body = call(server, "POST", "/subjects/s/versions",
                        raw=b"x" * (MAX_BODY_BYTES + 1))
    assert status == 413 and body["error_code"] == 413
    with socket.create_connection((server.host, server.port), timeout=10) as raw:
        raw.sendall(b"POST /subjects/s/versions HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Length: 999999999999\r\n\r\n")     # answered unread
        assert b" 413 " in raw.recv(64)
    with socket.create_connection((server.host, server.port), timeout=10) as raw:
        raw.sendall(b"\x16\x03\x01garbage that is not HTTP\r\n\r\n")
        assert raw.recv(64).startswith(b"HTTP/1.1 400 ")
    with socket.create_connection((server.host, server.port), timeout=10) as raw:
        raw.sendall(b"POST /subjects/s/versions HTTP/1.1\r\nHost: x\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n")
        assert b" 411 " in raw.recv(64)
    assert call(server, "GET", "/subjects")[0] == 200
    status, body = call(server, "POST", "/subjects/s/versions", {"schema": V1})
    assert status == 200 and body == {"id": 1}


def test_protobuf_serialized_format_and_raw_schema_endpoints(server):
    pytest.importorskip("google.protobuf")
    import base64
    from google.protobuf import descriptor_pb2
    text = 'syntax = "proto3";\npackage shop;\nmessage Order { int64 id = 1; }\n'
    call(server, "POST", "/subjects/p/versions", {"schema": text, "schemaType": "PROTOBUF"})
    status, body = call(server, "GET", "/schemas/ids/1?format=serialized")
    assert status == 200 and body["schemaType"] == "PROTOBUF"
    file = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(body["schema"]))
    assert file.package == "shop" and file.message_type[0].name == "Order"
    assert call(server, "GET", "/schemas/ids/1/schema") == (200, text)
    call(server, "POST", "/subjects/a/versions", {"schema": V1})
    assert call(server, "GET", "/subjects/a/versions/latest/schema") == (200, json.loads(V1))
    assert call(server, "GET", "/schemas/types") == (200, ["AVRO", "JSON", "PROTOBUF"])
    assert call(server, "GET", "/mode") == (200, {"mode": "READWRITE"})
