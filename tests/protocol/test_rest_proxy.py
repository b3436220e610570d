"""The REST proxy (logkit/rest.py, DESIGN §17) answers Confluent REST Proxy's v3 and v2
requests as Confluent documents them: curl's requests from the docs produce and consume,
a streamed produce answers one report per record in order, every error code comes in
the `{"error_code", "message"}` shape, and v2 consumer offsets are the group's offsets
for every client."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from logkit import TopicPartition

V2 = "application/vnd.kafka.v2+json"
V2_JSON = "application/vnd.kafka.json.v2+json"
V2_BINARY = "application/vnd.kafka.binary.v2+json"


def call(url, method="GET", body=None, content_type="application/json", accept=None,
         auth=None, context=None):
    """(status, parsed JSON or None, raw bytes) of one request through urllib."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    headers = {"Content-Type": content_type} if data is not None else {}
    if accept:
        headers["Accept"] = accept
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(
            f"{auth[0]}:{auth[1]}".encode()).decode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    if not raw.strip():
        return status, None, raw
    parsed = concatenated(raw)            # a body of several records: several reports
    return status, parsed[0] if len(parsed) == 1 else parsed, raw


def concatenated(raw: bytes) -> list[dict]:
    text, decoder, out, index = raw.decode(), json.JSONDecoder(), [], 0
    while index < len(text):
        while index < len(text) and text[index].isspace():
            index += 1
        if index >= len(text):
            break
        value, index = decoder.raw_decode(text, index)
        out.append(value)
    return out


def curl(*args: str) -> tuple[int, bytes]:
    done = subprocess.run(["curl", "-sS", "-w", "\n%{http_code}", *args],
                          capture_output=True, timeout=60, check=True)
    body, _, code = done.stdout.rpartition(b"\n")
    return int(code), body


@pytest.fixture
def rest(broker):
    server = broker.serve_rest()
    yield server
    server.close()


def records_url(server, topic):
    return f"{server.url}/v3/clusters/{server.cluster_id}/topics/{topic}/records"


def read_all(broker, topic):
    consumer = broker.consumer(topic, auto_offset_reset="earliest")
    out, deadline = [], time.monotonic() + 10
    end = sum(p.high_watermark for p in broker.topic(topic).partitions)
    while len(out) < end and time.monotonic() < deadline:
        out += consumer.poll(timeout_ms=200)
    consumer.close()
    return out


# ---- v3: clusters, topics ------------------------------------------------------------------

def test_clusters_and_topics_list_create_and_get_in_confluents_shapes(broker, rest):
    status, body, _ = call(f"{rest.url}/v3/clusters")
    assert status == 200 and body["kind"] == "KafkaClusterList"
    cluster = body["data"][0]["cluster_id"]
    assert cluster == rest.cluster_id
    base = f"{rest.url}/v3/clusters/{cluster}"
    status, body, _ = call(f"{base}/topics", "POST", {
        "topic_name": "orders", "partitions_count": 3,
        "configs": [{"name": "cleanup.policy", "value": "compact"}]})
    assert status == 201 and body["topic_name"] == "orders" \
        and body["partitions_count"] == 3
    assert broker.topic("orders").config["cleanup.policy"] == "compact"
    status, body, _ = call(f"{base}/topics", "POST", {"topic_name": "orders"})
    assert (status, body["error_code"]) == (400, 40002)
    status, body, _ = call(f"{base}/topics")
    assert [t["topic_name"] for t in body["data"]] == ["orders"]
    status, body, _ = call(f"{base}/topics/orders")
    assert status == 200 and body["kind"] == "KafkaTopic"
    status, body, _ = call(f"{base}/topics/missing")
    assert (status, body["error_code"]) == (404, 40401) and body["message"]
    status, body, _ = call(f"{rest.url}/v3/clusters/not-this-one/topics")
    assert status == 404 and set(body) == {"error_code", "message"}


# ---- v3: produce ---------------------------------------------------------------------------

def test_curl_produce_from_confluents_docs_writes_the_record_with_key_value_and_headers(
        broker, rest):
    broker.create_topic("topic_1", 1)
    code, raw = curl("-X", "POST", "-H", "Content-Type: application/json",
                     "-d", json.dumps({
                         "key": {"type": "BINARY", "data": "Zm9vYmFy"},
                         "value": {"type": "JSON", "data": {"foo": "bar"}},
                         "headers": [{"name": "h1", "value": "dmFsdWUx"}]}),
                     records_url(rest, "topic_1"))
    report = json.loads(raw)
    assert code == 200 and report["error_code"] == 200
    assert (report["topic_name"], report["partition_id"], report["offset"]) == \
        ("topic_1", 0, 0)
    assert report["key"] == {"type": "BINARY", "size": 6}
    assert report["value"] == {"type": "JSON", "size": len(b'{"foo":"bar"}')}
    assert report["timestamp"].endswith("Z")
    [record] = read_all(broker, "topic_1")
    assert record.key == b"foobar" and json.loads(record.value) == {"foo": "bar"}
    assert list(record.headers) == [("h1", b"value1")]


def test_string_type_partition_id_and_timestamp_are_honoured(broker, rest):
    broker.create_topic("t", 3)
    status, report, _ = call(records_url(rest, "t"), "POST", {
        "partition_id": 2, "value": {"type": "STRING", "data": "héllo"},
        "timestamp": "2021-02-05T19:14:42Z"})
    assert status == 200 and report["partition_id"] == 2
    [record] = broker.topic("t").partition(2).read(0)
    assert record.value == "héllo".encode() and record.timestamp == 1612552482000
    assert report["timestamp"] == "2021-02-05T19:14:42.000Z"


def test_curl_streams_concatenated_records_in_one_chunked_request(broker, rest, tmp_path):
    broker.create_topic("s", 1)
    lines = [json.dumps({"value": {"type": "STRING", "data": f"r{i}"}}) for i in range(5)]
    body = tmp_path / "records.json"
    body.write_text("\n".join(lines))
    code, raw = curl("-X", "POST", "-H", "Content-Type: application/json",
                     "-H", "Transfer-Encoding: chunked", "-T", str(body),
                     records_url(rest, "s"))
    reports = concatenated(raw)
    assert code == 200 and [r["offset"] for r in reports] == [0, 1, 2, 3, 4]
    assert [r.value for r in read_all(broker, "s")] == [f"r{i}".encode() for i in range(5)]


def stream(url, chunks, headers=None):
    """A chunked POST through aiohttp's client: (status, raw answer)."""
    import aiohttp

    async def run():
        async def body():
            for chunk in chunks:
                yield chunk
        async with aiohttp.ClientSession() as session:
            async with session.post(url, data=body(), headers={
                    "Content-Type": "application/json", **(headers or {})}) as response:
                return response.status, await response.read()
    return asyncio.run(run())


def test_a_stream_of_10k_records_gets_10k_reports_in_order(broker, rest):
    broker.create_topic("big", 4)
    count = 10_000
    records = [json.dumps({"partition_id": i % 4, "key": {"type": "STRING", "data":
                                                          str(i)},
                           "value": {"type": "BINARY", "data": base64.b64encode(
                               f"value-{i}".encode()).decode()}}).encode()
               for i in range(count)]
    # chunk edges fall inside records: the parser keeps a record's head for the next chunk
    blob = b" ".join(records)
    chunks = [blob[i:i + 7_001] for i in range(0, len(blob), 7_001)]
    status, raw = stream(records_url(rest, "big"), chunks)
    reports = concatenated(raw)
    assert status == 200 and len(reports) == count
    assert all(r["error_code"] == 200 for r in reports)
    assert [r["partition_id"] for r in reports] == [i % 4 for i in range(count)]
    for partition in range(4):
        assert [r["offset"] for r in reports if r["partition_id"] == partition] == \
            list(range(count // 4))
    stored = {r.key: r.value for r in read_all(broker, "big")}
    assert len(stored) == count and stored[b"9999"] == b"value-9999"


def test_a_bad_record_in_a_stream_gets_its_own_error_report_and_the_rest_are_written(
        broker, rest):
    broker.create_topic("mixed", 2)
    chunks = [json.dumps({"value": {"type": "STRING", "data": "a"}}).encode(),
              json.dumps({"partition_id": 9, "value": {"type": "STRING",
                                                       "data": "b"}}).encode(),
              json.dumps({"value": {"type": "BINARY", "data": "!!notbase64"}}).encode(),
              json.dumps({"value": {"type": "AVRO", "data": 1}}).encode(),
              json.dumps({"value": {"type": "STRING", "data": "c"}}).encode()]
    status, raw = stream(records_url(rest, "mixed"), chunks)
    codes = [r["error_code"] for r in concatenated(raw)]
    assert status == 200 and codes == [200, 40402, 400, 42206, 200]
    assert sorted(r.value for r in read_all(broker, "mixed")) == [b"a", b"c"]


def test_a_malformed_stream_ends_with_a_400_report_after_the_good_records(broker, rest):
    broker.create_topic("m", 1)
    good = json.dumps({"value": {"type": "STRING", "data": "ok"}}).encode()
    status, raw = stream(records_url(rest, "m"), [good, b" {\"value\": nope} ", good])
    reports = concatenated(raw)
    assert status == 200 and [r["error_code"] for r in reports] == [200, 400]
    assert [r.value for r in read_all(broker, "m")] == [b"ok"]


# ---- errors -----------------------------------------------------------------------------

def test_every_produce_error_code_in_the_documented_shape_and_nothing_written(broker):
    broker.create_topic("e", 2)
    server = broker.serve_rest(max_body_bytes=1024)
    url = records_url(server, "e")
    value = {"value": {"type": "STRING", "data": "x"}}
    cases = [
        (call(records_url(server, "absent"), "POST", value), 404, 40401),
        (call(url, "POST", {"partition_id": 2, **value}), 404, 40402),
        (call(url, "POST", {"partition_id": -1, **value}), 404, 40402),
        (call(url, "POST", {"value": {"type": "XML", "data": "x"}}), 422, 42206),
        (call(url, "POST", {"value": {"type": "BINARY", "data": 5}}), 400, 400),
        (call(url, "POST", {"value": {"type": "STRING", "data": "x" * 2000}}), 413, 413),
        (call(url, "POST", b"{\"value\": "), 400, 400),
        (call(url, "POST", b"[1, 2]"), 400, 400),
        (call(url, "POST", json.dumps(value).encode(), content_type="text/plain"),
         415, 415),
        (call(f"{server.url}/topics/e", "POST", {"records": [{"value": 1}]},
              content_type="application/xml"), 415, 415),
        (call(f"{server.url}/topics/absent", "POST", {"records": [{"value": 1}]},
              content_type=V2_JSON), 404, 40401),
        (call(f"{server.url}/topics/e", "POST", {"records": [{"value": 1},
                                                             {"value": 2, "partition": 5}]},
              content_type=V2_JSON), 404, 40402),
        (call(f"{server.url}/topics/e", "POST", {"records": [{"value": "@@"}]},
              content_type=V2_BINARY), 400, 400),
    ]
    for (status, body, raw), want_status, want_code in cases:
        assert (status, body["error_code"]) == (want_status, want_code), raw
        assert set(body) == {"error_code", "message"} and body["message"]
    assert "absent" not in broker.topics()                 # REST never creates a topic
    assert [p.high_watermark for p in broker.topic("e").partitions] == [0, 0]
    assert call(url, "POST", value)[0] == 200             # and it keeps serving
    server.close()


def test_basic_auth_refuses_missing_and_wrong_credentials_with_401(broker, tmp_path):
    broker.create_topic("a", 1)
    server = broker.serve_rest(users={"alice": "s3cret"})
    url = records_url(server, "a")
    value = {"value": {"type": "STRING", "data": "x"}}
    for auth in (None, ("alice", "wrong"), ("bob", "s3cret")):
        status, body, _ = call(url, "POST", value, auth=auth)
        assert (status, body["error_code"]) == (401, 401)
    assert broker.topic("a").partition(0).high_watermark == 0
    assert call(url, "POST", value, auth=("alice", "s3cret"))[0] == 200
    code, _ = curl("-u", "alice:s3cret", f"{server.url}/v3/clusters")
    assert code == 200
    server.close()


def test_tls_serves_https(broker, tmp_path):
    from tests.helpers.tls import self_signed
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = broker.serve_rest(ssl_context=context)
    assert server.url.startswith("https://")
    client = ssl.create_default_context(cafile=str(cert))
    client.check_hostname = False
    status, body, _ = call(f"{server.url}/v3/clusters", context=client)
    assert status == 200 and body["data"][0]["cluster_id"] == server.cluster_id
    server.close()


# ---- v2: consumers and produce --------------------------------------------------------------

def test_v2_consumer_curl_flow_from_confluents_docs(broker, rest):
    broker.create_topic("jsontest", 1)
    code, raw = curl("-X", "POST", "-H", f"Content-Type: {V2_JSON}",
                     "-d", '{"records":[{"value":{"foo":"bar"}}]}',
                     f"{rest.url}/topics/jsontest")
    assert code == 200 and json.loads(raw)["offsets"] == [
        {"partition": 0, "offset": 0, "error_code": None, "error": None}]
    base = f"{rest.url}/consumers/my_json_consumer"
    code, raw = curl("-X", "POST", "-H", f"Content-Type: {V2}",
                     "-d", '{"name": "my_consumer_instance", "format": "json", '
                           '"auto.offset.reset": "earliest"}', base)
    assert code == 200 and json.loads(raw) == {
        "instance_id": "my_consumer_instance",
        "base_uri": f"{base}/instances/my_consumer_instance"}
    instance = f"{base}/instances/my_consumer_instance"
    code, _ = curl("-X", "POST", "-H", f"Content-Type: {V2}",
                   "--data", '{"topics":["jsontest"]}', f"{instance}/subscription")
    assert code == 204
    got, deadline = [], time.monotonic() + 15
    while not got and time.monotonic() < deadline:
        code, raw = curl("-X", "GET", "-H", f"Accept: {V2_JSON}", f"{instance}/records")
        assert code == 200
        got = json.loads(raw)
    assert got == [{"topic": "jsontest", "key": None, "value": {"foo": "bar"},
                    "partition": 0, "offset": 0}]
    code, _ = curl("-X", "POST", "-H", f"Content-Type: {V2}", "--data",
                   '{"offsets":[{"topic":"jsontest","partition":0,"offset":0}]}',
                   f"{instance}/offsets")
    assert code == 200
    # the last record consumed was 0: the group's committed offset is the next, 1
    assert broker.group("my_json_consumer").committed() == {TopicPartition("jsontest", 0): 1}
    code, _ = curl("-X", "DELETE", "-H", f"Content-Type: {V2}", instance)
    assert code == 204
    status, body, _ = call(f"{instance}/records", accept=V2_JSON)
    assert (status, body["error_code"]) == (404, 40403)


def test_v2_offsets_are_the_groups_offsets_for_an_embedded_consumer(broker, rest):
    topic = broker.create_topic("shared", 2)
    producer = broker.producer()
    for i in range(10):
        producer.send("shared", f"v{i}".encode(), partition=i % 2)
    producer.flush()
    base = f"{rest.url}/consumers/billing"
    status, body, _ = call(base, "POST", {"name": "c", "format": "binary",
                                          "auto.offset.reset": "earliest",
                                          "auto.commit.enable": "false"}, V2)
    assert status == 200
    instance = body["base_uri"]
    assert call(f"{instance}/subscription", "POST", {"topics": ["shared"]}, V2)[0] == 204
    seen, deadline = [], time.monotonic() + 15
    while len(seen) < 10 and time.monotonic() < deadline:
        status, got, _ = call(f"{instance}/records?timeout=200", accept=V2_BINARY)
        assert status == 200
        seen += got
    assert sorted(base64.b64decode(r["value"]) for r in seen) == \
        sorted(f"v{i}".encode() for i in range(10))
    # an empty body commits what was fetched
    assert call(f"{instance}/offsets", "POST", None, V2)[0] == 200
    assert broker.group("billing").committed() == {
        TopicPartition("shared", 0): 5, TopicPartition("shared", 1): 5}
    status, body, _ = call(f"{instance}/offsets", "GET", {"partitions": [
        {"topic": "shared", "partition": 0}]}, V2)
    assert body["offsets"][0]["offset"] == 5
    assert call(f"{instance}/offsets", "POST", {"offsets": [
        {"topic": "shared", "partition": 1, "offset": 2}]}, V2)[0] == 200
    assert call(instance, "DELETE")[0] == 204
    producer.send("shared", b"after", partition=0).result()
    consumer = broker.consumer("shared", group_id="billing")
    records, deadline = [], time.monotonic() + 15
    while len(records) < 3 and time.monotonic() < deadline:
        records += consumer.poll(timeout_ms=200)
    # partition 1 resumes after offset 2 (3, 4); partition 0 after the fetched five
    assert sorted((r.partition, r.offset) for r in records) == [(0, 5), (1, 3), (1, 4)]
    consumer.close()
    status, body, _ = call(f"{rest.url}/v3/clusters/{rest.cluster_id}/consumer-groups/"
                           "billing/lags")
    lags = {(e["topic_name"], e["partition_id"]): e["lag"] for e in body["data"]}
    assert lags == {(tp.topic, tp.partition): lag
                    for tp, lag in broker.group("billing").lag().items()}
    assert topic.partition(0).high_watermark == 6


def test_v2_consumer_errors_in_confluents_codes(broker, rest):
    broker.create_topic("x", 1)
    base = f"{rest.url}/consumers/g"
    assert call(base, "POST", {"name": "one", "format": "json"}, V2)[0] == 200
    status, body, _ = call(base, "POST", {"name": "one"}, V2)
    assert (status, body["error_code"]) == (409, 40902)
    status, body, _ = call(base, "POST", {"name": "two", "format": "avro"}, V2)
    assert (status, body["error_code"]) == (422, 42206)
    status, body, _ = call(base, "POST", {"name": "three", "auto.offset.reset": "never"},
                           V2)
    assert (status, body["error_code"]) == (422, 42204)
    status, body, _ = call(f"{base}/instances/one/records", accept=V2_BINARY)
    assert (status, body["error_code"]) == (406, 40601)
    status, body, _ = call(f"{base}/instances/nobody/records", accept=V2_JSON)
    assert (status, body["error_code"]) == (404, 40403)
    status, body, _ = call(f"{base}/instances/one/offsets", "POST", {"offsets": [
        {"topic": "x", "partition": 3, "offset": 1}]}, V2)
    assert (status, body["error_code"]) == (404, 40402)
    status, body, _ = call(f"{base}/instances/one/offsets", "POST", {"offsets": [
        {"topic": "nope", "partition": 0, "offset": 1}]}, V2)
    assert (status, body["error_code"]) == (404, 40401)
    assert broker.group("g").committed() == {}
    status, body, _ = call(f"{base}/instances/one/subscription", "POST", {"topics": ["x"]},
                           "text/plain")
    assert (status, body["error_code"]) == (415, 415)


def test_an_idle_consumer_instance_expires(broker):
    server = broker.serve_rest(consumer_instance_timeout_ms=300)
    base = f"{server.url}/consumers/idle"
    status, body, _ = call(base, "POST", {"name": "sleepy"}, V2)
    assert status == 200
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        status, body, _ = call(f"{base}/instances/sleepy/subscription")
        if status == 404:
            break
        time.sleep(0.4)         # longer than the timeout: the GET above refreshed it
    assert (status, body["error_code"]) == (404, 40403)
    assert broker.group("idle").members() == []
    server.close()


# ---- schemas ---------------------------------------------------------------------------

def test_schema_id_and_subject_serialise_through_the_embedded_registry(broker, rest):
    pytest.importorskip("fastavro")
    from logkit.serde import AvroSerde
    broker.create_topic("people", 1)
    schema = {"type": "record", "name": "Person",
              "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}]}
    registry = broker.schema_registry()
    schema_id = registry.register("people-value", json.dumps(schema))
    url = records_url(rest, "people")
    status, report, _ = call(url, "POST", {"value": {"schema_id": schema_id,
                                                     "data": {"name": "Ann", "age": 30}}})
    assert status == 200 and report["value"]["schema_id"] == schema_id \
        and report["value"]["type"] == "AVRO"
    status, report, _ = call(url, "POST", {"value": {"subject_name_strategy": "TOPIC_NAME",
                                                     "data": {"name": "Bo", "age": 4}}})
    assert status == 200 and report["value"]["subject"] == "people-value" \
        and report["value"]["schema_version"] == 1
    status, body, _ = call(url, "POST", {"value": {"schema_id": schema_id,
                                                   "data": {"name": "Cy"}}})
    assert status == 400 and body["error_code"] == 400
    serde = AvroSerde(registry, "people")
    values = [r.value for r in read_all(broker, "people")]
    assert [v[:5] for v in values] == [b"\x00" + schema_id.to_bytes(4, "big")] * 2
    assert [serde.deserialize(v) for v in values] == [{"name": "Ann", "age": 30},
                                                      {"name": "Bo", "age": 4}]


def test_cli_serve_rest_port_prints_the_url_and_serves(tmp_path):
    import os
    import signal
    import sys
    proc = subprocess.Popen([sys.executable, "-m", "logkit.cli", "serve",
                             str(tmp_path / "d"), "--port", "0", "--rest-port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        url, deadline = None, time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("serving the REST proxy at "):
                url = line.split(" at ")[1].strip()
        assert url is not None
        status, body, _ = call(f"{url}/v3/clusters")
        assert status == 200 and body["data"]
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_the_curl_examples_in_docs_web_md_run_against_a_live_proxy(broker, rest):
    import os
    import pathlib
    import re
    text = (pathlib.Path(__file__).parents[2] / "docs" / "web.md").read_text()
    section = text.split("## The REST proxy", 1)[1].split("\n## ", 1)[0]
    [script] = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert script.count("curl") >= 10
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True,
                          timeout=120, env={**os.environ, "REST": rest.url,
                                            "CLUSTER": rest.cluster_id})
    assert done.returncode == 0, done.stderr
    answers = concatenated(done.stdout.replace(b"}{", b"}\n{"))
    [fetched] = [a for a in answers if isinstance(a, list)]
    assert sorted(json.dumps(r["value"]) for r in fetched) == \
        sorted(['{"total": 12}', '"a"', '[2]', '{"total": 7}'])
    assert {r["key"] for r in fetched} == {"o-1", "o-2", None}
    assert broker.group("billing").committed()[TopicPartition("orders", 0)] == 1
    assert sum(p.high_watermark for p in broker.topic("orders").partitions) == 4


def test_v2_binary_produce_seek_and_pattern_subscription(broker, rest):
    broker.create_topic("bin-a", 1)
    broker.create_topic("bin-b", 1)
    for topic in ("bin-a", "bin-b"):
        status, body, _ = call(f"{rest.url}/topics/{topic}", "POST", {"records": [
            {"key": base64.b64encode(b"k").decode(),
             "value": base64.b64encode(f"{topic}-{i}".encode()).decode()}
            for i in range(3)]}, V2_BINARY)
        assert status == 200 and [o["offset"] for o in body["offsets"]] == [0, 1, 2]
    assert broker.topic("bin-a").partition(0).read(0)[2].value == b"bin-a-2"
    base = f"{rest.url}/consumers/seekers"
    instance = call(base, "POST", {"name": "s", "auto.offset.reset": "earliest"},
                    V2)[1]["base_uri"]
    assert call(f"{instance}/subscription", "POST", {"topic_pattern": "bin-.*"},
                V2)[0] == 204
    seen, deadline = [], time.monotonic() + 15
    while len(seen) < 6 and time.monotonic() < deadline:
        seen += call(f"{instance}/records?timeout=200", accept=V2_BINARY)[1]
    assert sorted((r["topic"], r["offset"]) for r in seen) == \
        [(t, o) for t in ("bin-a", "bin-b") for o in range(3)]
    assignment = call(f"{instance}/assignments")[1]["partitions"]
    assert sorted(p["topic"] for p in assignment) == ["bin-a", "bin-b"]
    assert call(f"{instance}/positions", "POST", {"offsets": [
        {"topic": "bin-a", "partition": 0, "offset": 1}]}, V2)[0] == 204
    again = call(f"{instance}/records?timeout=2000", accept=V2_BINARY)[1]
    assert [(r["topic"], r["offset"]) for r in again] == [("bin-a", 1), ("bin-a", 2)]
    assert call(f"{instance}/positions/beginning", "POST", {"partitions": [
        {"topic": "bin-b", "partition": 0}]}, V2)[0] == 204
    again = call(f"{instance}/records?timeout=2000", accept=V2_BINARY)[1]
    assert [base64.b64decode(r["value"]) for r in again] == \
        [b"bin-b-0", b"bin-b-1", b"bin-b-2"]
    status, body, _ = call(f"{rest.url}/v3/clusters/{rest.cluster_id}/topics/bin-a")
    assert body["replication_factor"] == 1 and body["partitions_count"] == 1


def test_an_unknown_schema_id_or_subject_is_40403_and_writes_nothing(broker, rest):
    broker.create_topic("sch", 1)
    for value in ({"schema_id": 999, "data": {}}, {"subject": "nobody", "data": {}}):
        status, body, _ = call(records_url(rest, "sch"), "POST", {"value": value})
        assert (status, body["error_code"]) == (404, 40403)
    assert broker.topic("sch").partition(0).high_watermark == 0
