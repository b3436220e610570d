"""The REST proxy: Confluent REST Proxy's v3 and v2 shapes over the embedded broker.

Owns: the HTTP front end `broker.serve_rest()` starts (docs/web.md, "REST proxy";
DESIGN §17) — v3 clusters, topics (list, create, get), records produce (one JSON object,
or concatenated objects streamed in one chunked request, one delivery report per record
in order), consumer groups and lags; v2 consumer instances (create, subscription,
records, offsets, positions, delete; idle ones expire after
`consumer.instance.timeout.ms`) and v2 produce. Its consumer instances are embedded
`Consumer`s of the broker's groups, so their offsets are the group's offsets everywhere.

Two layers, as registry_http.py splits them: the route handlers turn a parsed request
into broker calls and a JSON answer; aiohttp's server (an asyncio HTTP/1.1 server with
streaming request bodies and chunked responses, run on its own event loop in its own
thread) moves the bytes. Every broker call runs on a thread pool, never on the loop.

Invariant: every answer is JSON; errors are `{"error_code", "message"}` with
Confluent's codes (40401 unknown topic, 40402 unknown partition, 40403 unknown consumer
instance, 40601 embedded format not acceptable, 40902 instance exists, 42204 invalid
consumer configuration, 42206 unsupported content, 400 malformed, 401 credentials, 413
body too large, 415 Content-Type, 503 connection cap). A request that is malformed in
any way writes nothing; in a streamed produce each record is checked on its own and
answered in its own report (HTTP 200 for the stream). REST produce never creates a
topic.

Bounded: at most `max_connections` open connections (one over the cap is answered 503
and closed); a connection idle `idle_timeout_ms` is closed; a request (but a streamed
produce) is answered within `request_timeout_ms`; a streamed produce waits at most
`idle_timeout_ms` for each next chunk. A body is at most `max_body_bytes` (413), or,
streamed, each record is (its report says 413 and the stream ends). Loopback by default.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import concurrent.futures
import datetime
import hmac
import json
import logging
import re
import sys
import threading
import time
import uuid
from typing import Any, Callable

try:
    from aiohttp import web
except ImportError:                       # an optional dependency: logkit[rest]
    web = None  # type: ignore[assignment]

from .errors import (CodecUnavailableError, ConfigError, IllegalStateError, InvalidTopicError, LogkitError,
                     SerializationError, TopicExistsError, UnknownTopicError)
from .broker import MAX_REPLICATION_FACTOR
from .config import check_topic_config, overrides_only
from .topic import MAX_PARTITIONS, TopicPartition, validate_topic_name

__all__ = ["RestServer", "serve", "MAX_BODY_BYTES", "MAX_CONNECTIONS", "IDLE_TIMEOUT_MS",
           "REQUEST_TIMEOUT_MS", "CONSUMER_INSTANCE_TIMEOUT_MS"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 << 20            # per request, or per record when streaming
MAX_CONNECTIONS = 128                # open connections
IDLE_TIMEOUT_MS = 30_000             # a keep-alive connection, or a stream's next chunk
REQUEST_TIMEOUT_MS = 30_000          # a non-streamed request, read to answered
CONSUMER_INSTANCE_TIMEOUT_MS = 300_000   # Confluent's consumer.instance.timeout.ms
CONSUMER_REQUEST_TIMEOUT_MS = 1_000      # Confluent's consumer.request.timeout.ms
MAX_POLL_RECORDS = 500                   # Kafka's max.poll.records
WORKER_THREADS = 16                      # blocking broker calls in flight
STREAM_BATCH_RECORDS = 4096              # records parsed before one append round
STREAM_QUEUE_CHUNKS = 64                 # parsed chunks waiting for their append round
LINGERING_S = 1.0                        # reading an unread body's rest before a close

JSON = "application/json"
V2 = "application/vnd.kafka.v2+json"
V2_JSON = "application/vnd.kafka.json.v2+json"
V2_BINARY = "application/vnd.kafka.binary.v2+json"
V2_EMBEDDED = {V2_JSON: "json", V2_BINARY: "binary"}
EMBEDDED_TYPES = ("BINARY", "JSON", "STRING")
SCHEMA_TYPES = ("AVRO", "JSONSCHEMA")
CONSUMER_KEYS = {"name", "format", "auto.offset.reset", "auto.commit.enable",
                 "fetch.min.bytes", "consumer.request.timeout.ms"}

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_ISO_Z = re.compile(r"Z$")


class RestError(LogkitError):
    """An answer other than success: HTTP `status`, Confluent's `error_code`."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message


def _bad(message: str) -> RestError:
    return RestError(400, 400, message)


def _unknown_topic(name: str) -> RestError:
    return RestError(404, 40401, f"Topic {name!r} not found.")


def _error_json(status: int, error_code: int, message: str,
                headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error_code": error_code, "message": message},
                             status=status, headers=headers)


def _media(request: web.Request) -> str:
    return request.headers.get("Content-Type", "").split(";")[0].strip().lower()


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc) \
        .strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _parse_timestamp(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(f"timestamp must be an ISO-8601 string, got {value!r}")
    try:
        moment = datetime.datetime.fromisoformat(_ISO_Z.sub("+00:00", value))
    except ValueError:
        raise _bad(f"timestamp {value!r} is not ISO-8601") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp() * 1000)


def _a2b_strict(data: bytes) -> bytes:
    return binascii.a2b_base64(data, strict_mode=True)  # type: ignore[call-arg]


def _a2b_checked(data: bytes) -> bytes:                  # before Python 3.11
    return base64.b64decode(data, validate=True)


_a2b = _a2b_strict if sys.version_info >= (3, 11) else _a2b_checked


def _b64(data: Any, what: str) -> bytes:
    if not isinstance(data, str):
        raise _bad(f"{what} must be a base64 string, got {type(data).__name__}")
    try:
        return _a2b(data.encode("ascii"))
    except (binascii.Error, ValueError):
        raise _bad(f"{what} is not valid base64") from None


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _loads(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise _bad(f"the body is not JSON: {exc}") from None


# ---- the producing side: one JSON record to (partition, key, value, headers) -------------

class _Encoders:
    """Schema-aware key/value encoding through the embedded registry (§12): an encoder
    per schema id, built once (Confluent's wire format: magic 0, schema id, payload)."""

    def __init__(self, broker: Any) -> None:
        self._broker = broker
        self._lock = threading.Lock()
        self._by_id: dict[int, tuple[str, Callable[[Any], bytes]]] = {}

    def _registry(self) -> Any:
        return self._broker.schema_registry()

    def encoder(self, schema_id: int, topic: str, is_key: bool
                ) -> tuple[str, Callable[[Any], bytes]]:
        with self._lock:
            found = self._by_id.get(schema_id)
        if found is not None:
            return found
        from .compat.errors import SchemaRegistryError
        from .serde import AvroSerde, JsonSchemaSerde
        from .serde.wire import frame
        try:
            schema = self._registry().schema(schema_id)
        except SchemaRegistryError as exc:
            raise RestError(404, 40403, f"Schema {schema_id} not found: {exc}") from None
        if schema.schema_type == "AVRO":
            serde: Any = AvroSerde(self._registry(), topic, schema.schema, is_key=is_key,
                                   auto_register=False)
            kind = "AVRO"
        elif schema.schema_type == "JSON":
            serde = JsonSchemaSerde(self._registry(), topic, schema.schema, is_key=is_key,
                                    auto_register=False)
            kind = "JSONSCHEMA"
        else:
            raise RestError(422, 42206, f"schema {schema_id} is {schema.schema_type}; the "
                                        "REST proxy serialises AVRO and JSON schemas")
        encode = serde._encode                     # the compiled encoder of that schema

        def framed(value: Any) -> bytes:
            return frame(schema_id, encode(value))

        with self._lock:
            self._by_id[schema_id] = (kind, framed)
        return kind, framed

    def resolve(self, spec: dict[str, Any], topic: str, is_key: bool
                ) -> tuple[int, str, int | None]:
        """(schema id, subject, version) a key or value spec names."""
        from .compat.errors import SchemaRegistryError
        registry = self._registry()
        try:
            if "schema_id" in spec:
                schema_id = spec["schema_id"]
                if isinstance(schema_id, bool) or not isinstance(schema_id, int):
                    raise _bad(f"schema_id must be an integer, got {schema_id!r}")
                usages = registry.usages(schema_id)
                subject, version = usages[0] if usages else ("", None)
                return schema_id, subject, version
            subject = spec.get("subject")
            strategy = spec.get("subject_name_strategy")
            if subject is None:
                if strategy not in (None, "TOPIC_NAME"):
                    raise RestError(422, 42206, f"subject_name_strategy {strategy!r}: only "
                                                "TOPIC_NAME (or an explicit subject)")
                subject = f"{topic}-{'key' if is_key else 'value'}"
            if not isinstance(subject, str):
                raise _bad(f"subject must be a string, got {subject!r}")
            found = registry.version(subject, spec.get("schema_version", "latest"))
            return found.schema_id, subject, found.version
        except SchemaRegistryError as exc:
            raise RestError(404, 40403, f"Schema not found: {exc}") from None


_NO_DATA = {"type": None}


def _encode_part(spec: Any, what: str, topic: str, is_key: bool,
                 encoders: _Encoders) -> tuple[bytes | None, dict[str, Any] | None]:
    """One key or value of a v3 record: (bytes, its report without size)."""
    if spec is None:
        return None, None
    if not isinstance(spec, dict):
        raise _bad(f"{what} must be an object with type and data")
    data = spec.get("data")
    kind = spec.get("type")
    if "schema_id" in spec or "subject" in spec or "subject_name_strategy" in spec \
            or "schema_version" in spec:
        schema_id, subject, version = encoders.resolve(spec, topic, is_key)
        kind, encode = encoders.encoder(schema_id, topic, is_key)
        if data is None:
            return None, None
        try:
            raw = encode(data)
        except SerializationError as exc:
            raise _bad(f"{what} does not match schema {schema_id}: {exc}") from None
        return raw, {"type": kind, "subject": subject or None, "schema_id": schema_id,
                     "schema_version": version}
    if kind is None:
        kind = "JSON"
    if kind not in EMBEDDED_TYPES:
        if kind in SCHEMA_TYPES or kind == "PROTOBUF":
            raise RestError(422, 42206, f"{what} type {kind!r} needs schema_id or subject")
        raise RestError(422, 42206, f"{what} type {kind!r} is not supported "
                                    f"(BINARY, JSON, STRING)")
    if data is None:
        return None, None
    if kind == "BINARY":
        raw = _b64(data, f"{what}.data")
    elif kind == "STRING":
        if not isinstance(data, str):
            raise _bad(f"{what}.data of type STRING must be a string")
        raw = data.encode()
    else:
        raw = _compact(data)
    return raw, {"type": kind}


def _headers(spec: Any) -> list[tuple[str, bytes | None]] | None:
    if spec is None:
        return None
    if not isinstance(spec, list):
        raise _bad("headers must be a list of {name, value}")
    out = []
    for header in spec:
        if not isinstance(header, dict) or not isinstance(header.get("name"), str):
            raise _bad("a header needs a string name")
        value = header.get("value")
        out.append((header["name"], None if value is None else _b64(value, "header value")))
    return out


class _V3Record:
    """One record ready to send, and what its delivery report says of key and value."""

    __slots__ = ("partition", "key", "value", "headers", "timestamp", "key_report",
                 "value_report")

    @classmethod
    def plain(cls, partition: int | None, key: bytes | None, value: bytes | None
              ) -> "_V3Record":
        """A v2 record: bytes already, no headers, no timestamp."""
        item = cls.__new__(cls)
        item.partition, item.key, item.value = partition, key, value
        item.headers = item.timestamp = item.key_report = item.value_report = None
        return item

    def __init__(self, body: Any, topic: str, partitions: int, encoders: _Encoders) -> None:
        if not isinstance(body, dict):
            raise _bad("a record must be a JSON object")
        partition = body.get("partition_id")
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int):
                raise _bad(f"partition_id must be an integer, got {partition!r}")
            if not 0 <= partition < partitions:
                raise RestError(404, 40402, f"Partition {partition} of topic {topic!r} "
                                            f"not found.")
        self.partition = partition
        self.key, self.key_report = _encode_part(body.get("key"), "key", topic, True,
                                                 encoders)
        self.value, self.value_report = _encode_part(body.get("value"), "value", topic,
                                                     False, encoders)
        self.headers = _headers(body.get("headers"))
        self.timestamp = _parse_timestamp(body.get("timestamp"))


def _part_report(report: dict[str, Any] | None, raw: bytes | None) -> str:
    """A delivery report's key or value: its type (and schema) and size, as JSON."""
    if report is None:
        return "null"
    size = len(raw) if raw is not None else 0
    if len(report) == 1:
        return f'{{"type":"{report["type"]}","size":{size}}}'
    return json.dumps({**report, "size": size}, separators=(",", ":"))


# ---- consumer instances (v2) ---------------------------------------------------------------

class _Instance:
    """One v2 consumer instance: an embedded Consumer of its group, used by one broker
    call at a time (its lock), expired when idle."""

    def __init__(self, group: str, name: str, fmt: str, consumer: Any,
                 request_timeout_ms: int) -> None:
        self.group = group
        self.name = name
        self.format = fmt
        self.consumer = consumer
        self.request_timeout_ms = request_timeout_ms
        self.lock = threading.Lock()
        self.last_used = time.monotonic()


def _record_json(record: Any, fmt: str) -> dict[str, Any]:
    if fmt == "binary":
        key = None if record.key is None else base64.b64encode(record.key).decode()
        value = None if record.value is None else base64.b64encode(record.value).decode()
    else:
        key = None if record.key is None else json.loads(record.key)
        value = None if record.value is None else json.loads(record.value)
    return {"topic": record.topic, "key": key, "value": value,
            "partition": record.partition, "offset": record.offset}


# ---- the server ------------------------------------------------------------------------------

class RestServer:
    """A running REST proxy: `.host`, `.port`, `.url`; `close()` (safe twice) stops
    serving, closes its consumer instances and producer; a context manager."""

    def __init__(self, broker: Any, host: str = "127.0.0.1", port: int = 0, *,
                 users: dict[str, str] | None = None, ssl_context: Any = None,
                 max_body_bytes: int = MAX_BODY_BYTES,
                 max_connections: int = MAX_CONNECTIONS,
                 idle_timeout_ms: int = IDLE_TIMEOUT_MS,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS,
                 consumer_instance_timeout_ms: int = CONSUMER_INSTANCE_TIMEOUT_MS) -> None:
        if web is None:
            raise CodecUnavailableError("the REST proxy needs aiohttp: pip install "
                                        "'logkit[rest]'")
        for name, value in (("max_body_bytes", max_body_bytes),
                            ("max_connections", max_connections),
                            ("idle_timeout_ms", idle_timeout_ms),
                            ("request_timeout_ms", request_timeout_ms),
                            ("consumer_instance_timeout_ms", consumer_instance_timeout_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if users is not None and (not isinstance(users, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in users.items())):
            raise ConfigError("users must be a dict {name: password} of strings")
        self._broker = broker
        self._users = {k: v.encode() for k, v in users.items()} if users else None
        self.max_body_bytes = max_body_bytes
        self._max_connections = max_connections
        self._idle_s = idle_timeout_ms / 1000
        self._request_s = request_timeout_ms / 1000
        self._instance_timeout_s = consumer_instance_timeout_ms / 1000
        from .protocol.cluster import cluster_id_for
        self.cluster_id = cluster_id_for(broker.path)
        self._encoders = _Encoders(broker)
        self._prefixes: dict[str, str] = {}
        self._last_stamp: tuple[int, str] = (-1, "")
        self._producer: Any = None
        self._producer_lock = threading.Lock()
        self._instances: dict[tuple[str, str], _Instance] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(
            WORKER_THREADS, thread_name_prefix="logkit-rest")
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="logkit-rest", daemon=True)
        self._thread.start()
        self.host = host
        try:
            self.port = asyncio.run_coroutine_threadsafe(
                self._start(host, port, ssl_context), self._loop).result(timeout=30)
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._pool.shutdown(wait=False)
            raise
        bracketed = f"[{host}]" if ":" in host else host
        scheme = "https" if ssl_context is not None else "http"
        self.url = f"{scheme}://{bracketed}:{self.port}"
        log.info("REST proxy on %s", self.url)

    def __repr__(self) -> str:
        return f"RestServer({getattr(self, 'url', None)!r})"

    # -- lifecycle --

    async def _start(self, host: str, port: int, ssl_context: Any) -> int:
        guard = self._guard

        async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
            return await guard(request, handler)
        app = web.Application(client_max_size=self.max_body_bytes,
                              middlewares=[web.middleware(middleware)])
        self._routes(app)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None,
                                     keepalive_timeout=self._idle_s,
                                     lingering_time=LINGERING_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=ssl_context,
                           backlog=self._max_connections)
        await site.start()
        self._reaper = asyncio.ensure_future(self._reap())
        return int(self._runner.addresses[0][1])

    async def _stop(self) -> None:
        self._reaper.cancel()
        await self._runner.cleanup()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            log.warning("REST proxy: stopping the server: %r", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        self._pool.shutdown(wait=True)
        for instance in list(self._instances.values()):
            self._close_instance(instance)
        self._instances.clear()
        if self._producer is not None:
            try:
                self._producer.close()
            except LogkitError as exc:
                log.warning("REST proxy: closing its producer: %s", exc)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "RestServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- plumbing --

    def _off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def producer(self) -> Any:
        with self._producer_lock:
            if self._producer is None:
                self._producer = self._broker.producer(acks=1, linger_ms=0)
            return self._producer

    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        server = self._runner.server
        if server is not None and len(server.connections) > self._max_connections:
            return _error_json(503, 50301, "Too many connections.",
                               {"Connection": "close"})
        if self._users is not None and not self._authorised(request):
            return _error_json(401, 401, "Unauthorized: missing or wrong credentials.",
                               {"WWW-Authenticate": 'Basic realm="logkit"'})
        try:
            if request.method == "POST" and request.path.endswith("/records") and \
                    "chunked" in request.headers.get("Transfer-Encoding", "").lower():
                return await handler(request)         # its own per-chunk deadline
            return await asyncio.wait_for(handler(request), self._request_s)
        except RestError as exc:
            return _error_json(exc.status, exc.error_code, exc.message)
        except web.HTTPRequestEntityTooLarge:
            return _error_json(413, 413, f"The request body is larger than "
                                         f"{self.max_body_bytes} bytes.")
        except web.HTTPException as exc:
            if exc.status >= 400:
                return _error_json(exc.status, exc.status, exc.reason)
            raise
        except asyncio.TimeoutError:
            return _error_json(408, 408, "The request was not answered in time.")
        except UnknownTopicError as exc:
            return _error_json(404, 40401, str(exc))
        except (ConfigError, InvalidTopicError) as exc:
            return _error_json(400, 400, str(exc))
        except LogkitError as exc:
            log.warning("REST proxy: %s %s: %s", request.method, request.path, exc)
            return _error_json(500, 50002, f"Kafka error: {exc}")

    def _authorised(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        try:
            name, _, password = base64.b64decode(header[6:], validate=True) \
                .decode().partition(":")
        except (binascii.Error, ValueError):
            return False
        expected = self._users.get(name) if self._users else None
        return expected is not None and hmac.compare_digest(expected, password.encode())

    async def _body(self, request: web.Request, *media: str, empty: Any = None) -> Any:
        """The JSON body of a non-streamed request whose Content-Type is one of
        `media` (415 else; 413 over max_body_bytes)."""
        length = request.content_length
        if length is not None and length > self.max_body_bytes:
            raise RestError(413, 413, f"The request body is larger than "
                                      f"{self.max_body_bytes} bytes.")
        raw = await request.read()
        if not raw.strip():
            return empty
        if _media(request) not in media:
            raise RestError(415, 415, f"Content-Type {_media(request)!r} is not supported "
                                      f"here (use {', '.join(media)}).")
        return _loads(raw)

    def _check_cluster(self, request: web.Request) -> str:
        cluster = request.match_info["cluster_id"]
        if cluster != self.cluster_id:
            raise RestError(404, 404, f"Cluster {cluster!r} not found.")
        return cluster

    def _base(self, request: web.Request) -> str:
        return f"{request.scheme}://{request.host}"

    def _routes(self, app: web.Application) -> None:
        r = app.router
        c = "/v3/clusters/{cluster_id}"
        r.add_get("/v3/clusters", self.clusters)
        r.add_get(c, self.cluster)
        r.add_get(c + "/topics", self.list_topics)
        r.add_post(c + "/topics", self.create_topic)
        r.add_get(c + "/topics/{topic}", self.get_topic)
        r.add_post(c + "/topics/{topic}/records", self.produce_v3)
        r.add_get(c + "/consumer-groups", self.list_groups)
        r.add_get(c + "/consumer-groups/{group}", self.get_group)
        r.add_get(c + "/consumer-groups/{group}/lags", self.lags)
        r.add_get("/topics", self.topics_v2)
        r.add_get("/topics/{topic}", self.topic_v2)
        r.add_post("/topics/{topic}", self.produce_v2)
        i = "/consumers/{group}/instances/{name}"
        r.add_post("/consumers/{group}", self.create_instance)
        r.add_delete(i, self.delete_instance)
        r.add_post(i + "/subscription", self.subscribe)
        r.add_get(i + "/subscription", self.subscription)
        r.add_delete(i + "/subscription", self.unsubscribe)
        r.add_get(i + "/assignments", self.assignments)
        r.add_get(i + "/records", self.records)
        r.add_post(i + "/offsets", self.commit)
        r.add_get(i + "/offsets", self.committed)
        r.add_post(i + "/positions", self.seek)
        r.add_post(i + "/positions/beginning", self.seek_beginning)
        r.add_post(i + "/positions/end", self.seek_end)

    # -- v3: clusters and topics --

    def _cluster_json(self, base: str) -> dict[str, Any]:
        c = f"{base}/v3/clusters/{self.cluster_id}"
        return {"kind": "KafkaCluster",
                "metadata": {"self": c, "resource_name": f"crn:///kafka={self.cluster_id}"},
                "cluster_id": self.cluster_id,
                "controller": {"related": f"{c}/brokers/0"},
                "acls": {"related": f"{c}/acls"}, "brokers": {"related": f"{c}/brokers"},
                "broker_configs": {"related": f"{c}/broker-configs"},
                "consumer_groups": {"related": f"{c}/consumer-groups"},
                "topics": {"related": f"{c}/topics"},
                "partition_reassignments": {"related":
                                            f"{c}/topics/-/partitions/-/reassignment"}}

    async def clusters(self, request: web.Request) -> web.Response:
        base = self._base(request)
        return web.json_response({"kind": "KafkaClusterList",
                                  "metadata": {"self": f"{base}/v3/clusters", "next": None},
                                  "data": [self._cluster_json(base)]})

    async def cluster(self, request: web.Request) -> web.Response:
        self._check_cluster(request)
        return web.json_response(self._cluster_json(self._base(request)))

    def _topic_json(self, base: str, name: str,
                    shape: tuple[int, int] | None = None) -> dict[str, Any]:
        """A KafkaTopic: topic `name`, or one that would have `shape` (replication
        factor, partition count) and does not exist (a validate_only create)."""
        if shape is None:
            topic = self._broker.topic(name)
            shape = (topic.replication_factor, len(topic.partitions))
        t = f"{base}/v3/clusters/{self.cluster_id}/topics/{name}"
        replication, count = shape
        return {"kind": "KafkaTopic",
                "metadata": {"self": t, "resource_name":
                             f"crn:///kafka={self.cluster_id}/topic={name}"},
                "cluster_id": self.cluster_id, "topic_name": name,
                "is_internal": name.startswith("__"),
                "replication_factor": replication,
                "partitions_count": count,
                "partitions": {"related": f"{t}/partitions"},
                "configs": {"related": f"{t}/configs"},
                "partition_reassignments": {"related": f"{t}/partitions/-/reassignment"},
                "authorized_operations": []}

    async def list_topics(self, request: web.Request) -> web.Response:
        self._check_cluster(request)
        base = self._base(request)

        def run() -> list[dict[str, Any]]:
            out = []
            for name in self._broker.topics():
                try:
                    out.append(self._topic_json(base, name))
                except UnknownTopicError:          # deleted meanwhile
                    continue
            return out
        data = await self._off_loop(run)
        return web.json_response({"kind": "KafkaTopicList", "metadata": {
            "self": f"{base}/v3/clusters/{self.cluster_id}/topics", "next": None},
            "data": data})

    async def get_topic(self, request: web.Request) -> web.Response:
        self._check_cluster(request)
        name = request.match_info["topic"]
        try:
            data = await self._off_loop(self._topic_json, self._base(request), name)
        except (UnknownTopicError, InvalidTopicError):
            raise _unknown_topic(name) from None
        return web.json_response(data)

    async def create_topic(self, request: web.Request) -> web.Response:
        self._check_cluster(request)
        body = await self._body(request, JSON)
        if not isinstance(body, dict) or not isinstance(body.get("topic_name"), str):
            raise _bad("the body must be an object with topic_name")
        name = body["topic_name"]
        partitions = body.get("partitions_count")
        replication = body.get("replication_factor")
        configs = body.get("configs") or []
        if not isinstance(configs, list) or not all(
                isinstance(c, dict) and isinstance(c.get("name"), str) for c in configs):
            raise _bad("configs must be a list of {name, value}")
        config = {c["name"]: c.get("value") for c in configs}
        validate_only = body.get("validate_only", False)
        if not isinstance(validate_only, bool):
            raise _bad("validate_only must be true or false")

        def run() -> dict[str, Any]:
            if validate_only:         # Confluent's field: checked as a create, nothing made
                return self._topic_json(self._base(request), name, self._would_create(
                    name, partitions, replication, config))
            self._broker.create_topic(name, partitions, replication_factor=replication,
                                      config=config or None)
            return self._topic_json(self._base(request), name)
        try:
            data = await self._off_loop(run)
        except TopicExistsError:
            raise RestError(400, 40002, f"Topic '{name}' already exists.") from None
        return web.json_response(data, status=201)

    def _would_create(self, name: str, partitions: Any, replication: Any,
                      config: dict[str, Any]) -> tuple[int, int]:
        """(replication factor, partition count) of the topic create_topic would make,
        raising as it would (InvalidTopicError, ConfigError, TopicExistsError); writes
        nothing."""
        validate_topic_name(name)
        settings = self._broker.config
        shape = (settings["default.replication.factor"] if replication is None
                 else replication, settings["num.partitions"] if partitions is None
                 else partitions)
        for what, value, most in zip(("replication_factor", "partitions_count"), shape,
                                     (MAX_REPLICATION_FACTOR, MAX_PARTITIONS)):
            if isinstance(value, bool) or not isinstance(value, int) \
                    or not 1 <= value <= most:
                raise ConfigError(f"{what} must be an integer in 1..{most}, got {value!r}")
        check_topic_config(overrides_only(config), settings)
        if name in self._broker.topics():
            raise TopicExistsError(f"topic {name!r} already exists")
        return shape

    async def topics_v2(self, request: web.Request) -> web.Response:
        return web.json_response(await self._off_loop(self._broker.topics))

    async def topic_v2(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        try:
            topic = await self._off_loop(self._broker.topic, name)
        except (UnknownTopicError, InvalidTopicError):
            raise _unknown_topic(name) from None
        configs = {k: v for k, v in topic.config.items()}
        return web.json_response({"name": name, "configs": configs, "partitions": [
            {"partition": p.partition, "leader": 0,
             "replicas": [{"broker": 0, "leader": True, "in_sync": True}]}
            for p in topic.partitions]}, dumps=lambda v: json.dumps(v, default=str))

    # -- v3: records --

    def _open_topic(self, name: str) -> int:
        """Partition count of an existing topic (never created here)."""
        try:
            return len(self._broker.topic(name).partitions)
        except (UnknownTopicError, InvalidTopicError):
            raise _unknown_topic(name) from None

    def _append(self, topic: str, records: list[Any]) -> list[Any]:
        """Send every ready record (others are errors already), wait for all; each
        entry becomes RecordMetadata or an exception. Runs on the pool."""
        producer = self.producer()
        futures: list[Any] = []
        for item in records:
            if isinstance(item, RestError):
                futures.append(item)
                continue
            try:
                futures.append(producer.send(topic, item.value, key=item.key,
                                             headers=item.headers,
                                             partition=item.partition,
                                             timestamp_ms=item.timestamp))
            except LogkitError as exc:
                futures.append(exc)
        producer.flush()
        out = []
        for future in futures:
            if isinstance(future, BaseException):
                out.append(future)
                continue
            try:
                out.append(future.result())
            except LogkitError as exc:
                out.append(exc)
        return out

    def _report(self, topic: str, item: Any, result: Any) -> bytes:
        """One delivery report as JSON bytes: written by hand for the success case (the
        streamed produce's hot path), with json.dumps for the rest."""
        if isinstance(result, RestError):
            return _compact({"error_code": result.error_code, "message": result.message})
        if isinstance(result, UnknownTopicError):
            return _compact({"error_code": 40401, "message": str(result)})
        if isinstance(result, BaseException):
            # Confluent's mapper: a Kafka error it has no code for is 50002 (HTTP 500)
            code = 413 if type(result).__name__ == "RecordTooLargeError" else 50002
            return _compact({"error_code": code, "message": str(result)})
        prefix = self._prefixes.get(topic)
        if prefix is None:
            prefix = self._prefixes[topic] = (
                '{"error_code":200,"cluster_id":' + json.dumps(self.cluster_id)
                + ',"topic_name":' + json.dumps(topic) + ',"partition_id":')
        stamp = self._last_stamp
        if stamp[0] != result.timestamp:
            stamp = self._last_stamp = (result.timestamp, _iso(result.timestamp))
        return (f'{prefix}{result.partition},"offset":{result.offset},"timestamp":'
                f'"{stamp[1]}","key":{_part_report(item.key_report, item.key)},'
                f'"value":{_part_report(item.value_report, item.value)}}}').encode()

    def _prepare(self, body: Any, topic: str, partitions: int) -> Any:
        try:
            return _V3Record(body, topic, partitions, self._encoders)
        except RestError as exc:
            return exc

    async def produce_v3(self, request: web.Request) -> web.StreamResponse:
        self._check_cluster(request)
        topic = request.match_info["topic"]
        media = _media(request)
        if media != JSON:
            raise RestError(415, 415, f"Content-Type {media!r} is not supported here "
                                      f"(use {JSON}).")
        partitions = await self._off_loop(self._open_topic, topic)
        if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
            return await self._produce_stream(request, topic, partitions)
        body = await request.read()         # bounded by client_max_size (413)
        objects = _split_objects(body)
        if objects is None:
            raise _bad("the body is not a JSON object (or concatenated objects)")
        if not objects:
            raise _bad("the body holds no record")
        prepared = await self._off_loop(
            lambda: [self._prepare(o, topic, partitions) for o in objects])
        if len(prepared) == 1 and isinstance(prepared[0], RestError):
            raise prepared[0]
        results = await self._off_loop(self._append, topic, prepared)
        reports = [self._report(topic, item, result)
                   for item, result in zip(prepared, results)]
        status = 200
        if len(reports) == 1 and isinstance(results[0], BaseException):
            code = json.loads(reports[0])["error_code"]
            status = code if code < 1000 else code // 100
        return web.Response(body=b"".join(reports), status=status, content_type=JSON)

    async def _produce_stream(self, request: web.Request, topic: str,
                              partitions: int) -> web.StreamResponse:
        """Concatenated records, one report each, in order; HTTP 200 once started.
        A reader task parses chunks while the records parsed before them are appended
        (one round at a time, in order), so reading and appending overlap."""
        response = web.StreamResponse(status=200, headers={"Content-Type": JSON})
        response.enable_chunked_encoding()
        await response.prepare(request)
        parsed: asyncio.Queue[tuple[list[Any], RestError | None, bool]] = \
            asyncio.Queue(maxsize=STREAM_QUEUE_CHUNKS)
        reader = asyncio.ensure_future(self._read_stream(request, parsed))
        try:
            done = False
            while not done:
                objects, error, done = await parsed.get()
                while not done and error is None and len(objects) < STREAM_BATCH_RECORDS \
                        and not parsed.empty():
                    more, error, done = parsed.get_nowait()
                    objects += more
                for start in range(0, len(objects), STREAM_BATCH_RECORDS):
                    await response.write(await self._off_loop(
                        self._stream_round, topic, partitions,
                        objects[start:start + STREAM_BATCH_RECORDS]))
                if error is not None:
                    await response.write(_compact({"error_code": error.error_code,
                                                   "message": error.message}))
                    done = True
        finally:
            reader.cancel()
        await response.write_eof()
        return response

    async def _read_stream(self, request: web.Request, parsed: asyncio.Queue[Any]) -> None:
        """Chunks to parsed records on `parsed`: (records, error ending it, last)."""
        parser = _StreamParser(self.max_body_bytes)
        while True:
            try:
                chunk = await asyncio.wait_for(request.content.readany(), self._idle_s)
            except asyncio.TimeoutError:
                await parsed.put(([], RestError(408, 408, "No record arrived in time."),
                                  True))
                return
            except Exception as exc:   # noqa: BLE001 - a reset, a body cut short:
                # end the stream, or its writer would wait on `parsed` for ever
                await parsed.put(([], RestError(400, 400, f"the request body could not "
                                                          f"be read: {exc}"), True))
                return
            final = not chunk
            objects, error = parser.feed(chunk, final=final)
            await parsed.put((objects, error, final or error is not None))
            if final or error is not None:
                return

    def _stream_round(self, topic: str, partitions: int, objects: list[Any]) -> bytes:
        prepared = [self._prepare(o, topic, partitions) for o in objects]
        results = self._append(topic, prepared)
        return b"".join([self._report(topic, item, result)
                         for item, result in zip(prepared, results)])

    # -- v2 produce --

    async def produce_v2(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        media = _media(request)
        fmt = V2_EMBEDDED.get(media)
        if fmt is None:
            raise RestError(415, 415, f"Content-Type {media!r} is not supported here "
                                      f"(use {V2_JSON} or {V2_BINARY}).")
        body = await self._body(request, media)
        if not isinstance(body, dict) or not isinstance(body.get("records"), list):
            raise RestError(422, 42206, "the body must be an object with a records list")
        partitions = await self._off_loop(self._open_topic, topic)
        prepared = []
        for record in body["records"]:
            if not isinstance(record, dict):
                raise RestError(422, 42206, "a record must be a JSON object")
            partition = record.get("partition")
            if partition is not None and (isinstance(partition, bool) or not isinstance(
                    partition, int) or not 0 <= partition < partitions):
                raise RestError(404, 40402, f"Partition {partition!r} of topic {topic!r} "
                                            f"not found.")
            encode = (lambda v, what: _b64(v, what)) if fmt == "binary" else \
                (lambda v, what: _compact(v))
            key, value = record.get("key"), record.get("value")
            prepared.append(_V3Record.plain(
                partition, None if key is None else encode(key, "key"),
                None if value is None else encode(value, "value")))
        results = await self._off_loop(self._append, topic, prepared)
        offsets = []
        for result in results:
            if isinstance(result, BaseException):
                offsets.append({"partition": None, "offset": None, "error_code": 50002,
                                "error": str(result)})
            else:
                offsets.append({"partition": result.partition, "offset": result.offset,
                                "error_code": None, "error": None})
        return web.json_response({"key_schema_id": None, "value_schema_id": None,
                                  "offsets": offsets}, content_type=V2)

    # -- v3: consumer groups --

    def _group_json(self, base: str, group_id: str) -> dict[str, Any]:
        group = self._broker.group(group_id)
        g = f"{base}/v3/clusters/{self.cluster_id}/consumer-groups/{group_id}"
        return {"kind": "KafkaConsumerGroup",
                "metadata": {"self": g, "resource_name":
                             f"crn:///kafka={self.cluster_id}/consumer-group={group_id}"},
                "cluster_id": self.cluster_id, "consumer_group_id": group_id,
                "is_simple": False, "partition_assignor": "range",
                "state": group.state.upper(),
                "coordinator": {"related": f"{base}/v3/clusters/{self.cluster_id}/brokers/0"},
                "consumers": {"related": f"{g}/consumers"},
                "lag_summary": {"related": f"{g}/lag-summary"}}

    async def list_groups(self, request: web.Request) -> web.Response:
        self._check_cluster(request)
        base = self._base(request)
        data = await self._off_loop(
            lambda: [self._group_json(base, g) for g in self._broker.groups()])
        return web.json_response({"kind": "KafkaConsumerGroupList", "metadata": {
            "self": f"{base}/v3/clusters/{self.cluster_id}/consumer-groups", "next": None},
            "data": data})

    def _known_group(self, group_id: str) -> Any:
        group = self._broker.group(group_id)
        if group.state == "Dead":
            raise RestError(404, 404, f"Consumer group {group_id!r} not found.")
        return group

    async def get_group(self, request: web.Request) -> web.Response:
        self._check_cluster(request)
        group_id = request.match_info["group"]
        await self._off_loop(self._known_group, group_id)
        return web.json_response(await self._off_loop(self._group_json,
                                                      self._base(request), group_id))

    async def lags(self, request: web.Request) -> web.Response:
        self._check_cluster(request)
        group_id = request.match_info["group"]
        base = self._base(request)

        def run() -> list[dict[str, Any]]:
            group = self._known_group(group_id)
            committed = group.committed()
            owner = {tp: m.member_id for m in group.members() for tp in m.assignment}
            out = []
            for tp, lag in sorted(group.lag().items()):
                partition = self._broker.topic(tp.topic).partition(tp.partition)
                end = partition.high_watermark
                current = committed.get(tp, partition.log_start_offset)
                out.append({"kind": "KafkaConsumerLag", "metadata": {
                    "self": f"{base}/v3/clusters/{self.cluster_id}/consumer-groups/"
                            f"{group_id}/lags/{tp.topic}/partitions/{tp.partition}",
                    "resource_name": f"crn:///kafka={self.cluster_id}/consumer-group="
                                     f"{group_id}/lag={tp.topic}/partition={tp.partition}"},
                    "cluster_id": self.cluster_id, "consumer_group_id": group_id,
                    "topic_name": tp.topic, "partition_id": tp.partition,
                    "current_offset": current, "log_end_offset": end, "lag": lag,
                    "consumer_id": owner.get(tp, ""), "instance_id": None,
                    "client_id": ""})
            return out
        data = await self._off_loop(run)
        return web.json_response({"kind": "KafkaConsumerLagList", "metadata": {
            "self": f"{base}/v3/clusters/{self.cluster_id}/consumer-groups/{group_id}/lags",
            "next": None}, "data": data})

    # -- v2: consumer instances --

    def _instance(self, request: web.Request) -> _Instance:
        key = (request.match_info["group"], request.match_info["name"])
        instance = self._instances.get(key)
        if instance is None:
            raise RestError(404, 40403, "Consumer instance not found.")
        instance.last_used = time.monotonic()
        return instance

    def _close_instance(self, instance: _Instance) -> None:
        with instance.lock:
            try:
                instance.consumer.close()
            except LogkitError as exc:
                log.warning("REST proxy: closing consumer %s/%s: %s", instance.group,
                            instance.name, exc)

    async def _reap(self) -> None:
        """Close instances idle longer than consumer.instance.timeout.ms."""
        period = min(1.0, self._instance_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for key, instance in list(self._instances.items()):
                if now - instance.last_used > self._instance_timeout_s \
                        and not instance.lock.locked():
                    self._instances.pop(key, None)
                    await self._off_loop(self._close_instance, instance)

    async def create_instance(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        body = await self._body(request, V2, JSON, empty={})
        if not isinstance(body, dict):
            raise RestError(422, 42204, "Invalid consumer configuration: not an object")
        unknown = set(body) - CONSUMER_KEYS
        if unknown:
            raise RestError(422, 42204, f"Invalid consumer configuration: unknown "
                                        f"{sorted(unknown)}")
        name = body.get("name") or f"rest-consumer-{uuid.uuid4()}"
        fmt = body.get("format", "binary")
        if fmt not in ("binary", "json"):
            raise RestError(422, 42206, f"Unsupported embedded format {fmt!r} (binary, "
                                        "json).")
        reset = {"smallest": "earliest", "largest": "latest"}.get(
            body.get("auto.offset.reset"), body.get("auto.offset.reset", "latest"))
        commit = str(body.get("auto.commit.enable", "true")).lower()
        timeout = body.get("consumer.request.timeout.ms", CONSUMER_REQUEST_TIMEOUT_MS)
        if reset not in ("earliest", "latest", "none") or commit not in ("true", "false") \
                or not isinstance(name, str) or not re.fullmatch(r"[\w.-]{1,200}", name):
            raise RestError(422, 42204, "Invalid consumer configuration.")
        try:
            timeout = int(timeout)
        except (TypeError, ValueError):
            raise RestError(422, 42204, "Invalid consumer configuration: "
                                        "consumer.request.timeout.ms") from None
        if (group, name) in self._instances:
            raise RestError(409, 40902, "Consumer instance with the specified name "
                                        "already exists.")

        def make() -> Any:
            return self._broker.consumer(group_id=group, client_id=name,
                                         auto_offset_reset=reset,
                                         enable_auto_commit=commit == "true")
        try:
            consumer = await self._off_loop(make)
        except ConfigError as exc:
            raise RestError(422, 42204, f"Invalid consumer configuration: {exc}") from None
        if (group, name) in self._instances:       # created meanwhile
            await self._off_loop(consumer.close)
            raise RestError(409, 40902, "Consumer instance with the specified name "
                                        "already exists.")
        self._instances[(group, name)] = _Instance(group, name, fmt, consumer,
                                                   max(0, min(timeout, 30_000)))
        return web.json_response({"instance_id": name, "base_uri":
                                  f"{self._base(request)}/consumers/{group}/instances/"
                                  f"{name}"}, content_type=V2)

    async def delete_instance(self, request: web.Request) -> web.Response:
        instance = self._instance(request)
        self._instances.pop((instance.group, instance.name), None)
        await self._off_loop(self._close_instance, instance)
        return web.Response(status=204)

    async def _with(self, instance: _Instance, fn: Callable[[Any], Any]) -> Any:
        def run() -> Any:
            with instance.lock:
                return fn(instance.consumer)
        try:
            return await self._off_loop(run)
        except IllegalStateError as exc:
            raise RestError(409, 40903, f"Illegal state: {exc}") from None

    async def subscribe(self, request: web.Request) -> web.Response:
        instance = self._instance(request)
        body = await self._body(request, V2, JSON)
        if not isinstance(body, dict):
            raise RestError(422, 42206, "the body must be an object with topics")
        topics, pattern = body.get("topics"), body.get("topic_pattern")
        if pattern is not None:
            if not isinstance(pattern, str) or topics:
                raise RestError(409, 40903, "Subscribe to topics or a topic_pattern, "
                                            "not both.")
            await self._with(instance, lambda c: c.subscribe(pattern=pattern))
        else:
            if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
                raise RestError(422, 42206, "topics must be a list of names")
            await self._with(instance, lambda c: c.subscribe(topics))
        return web.Response(status=204)

    async def subscription(self, request: web.Request) -> web.Response:
        instance = self._instance(request)
        topics = await self._with(instance, lambda c: sorted(c.subscription()))
        return web.json_response({"topics": topics}, content_type=V2)

    async def unsubscribe(self, request: web.Request) -> web.Response:
        instance = self._instance(request)
        await self._with(instance, lambda c: c.unsubscribe())
        return web.Response(status=204)

    async def assignments(self, request: web.Request) -> web.Response:
        instance = self._instance(request)
        tps = await self._with(instance, lambda c: sorted(c.assignment()))
        return web.json_response({"partitions": [{"topic": tp.topic, "partition":
                                                  tp.partition} for tp in tps]},
                                 content_type=V2)

    async def records(self, request: web.Request) -> web.Response:
        instance = self._instance(request)
        accept = request.headers.get("Accept", "*/*")
        wanted = [V2_EMBEDDED[m] for m in V2_EMBEDDED if m in accept]
        if wanted and instance.format not in wanted:
            raise RestError(406, 40601, "The requested embedded data format does not "
                                        "match the deserializer for this consumer "
                                        "instance.")
        if not wanted and not any(m in accept for m in ("*/*", JSON, V2)):
            raise RestError(406, 40601, f"Accept {accept!r}: use {V2_JSON} or {V2_BINARY}")
        try:
            timeout = int(request.query.get("timeout", instance.request_timeout_ms))
            max_bytes = int(request.query.get("max_bytes", 64 << 20))
        except ValueError:
            raise _bad("timeout and max_bytes must be integers") from None
        timeout = max(0, min(timeout, int(self._request_s * 1000) // 2))
        fmt = instance.format

        def fetch(consumer: Any) -> tuple[list[dict[str, Any]], str | None]:
            records = consumer.poll(timeout_ms=timeout, max_records=MAX_POLL_RECORDS)
            out: list[dict[str, Any]] = []
            size = 0
            problem = None
            for index, record in enumerate(records):
                size += len(record.key or b"") + len(record.value or b"")
                try:
                    item = _record_json(record, fmt) if size <= max_bytes or not out \
                        else None
                except ValueError as exc:
                    item = None
                    problem = f"record {record.topic}-{record.partition}@{record.offset} " \
                              f"is not JSON: {exc}"
                if item is None:              # give back the rest: positions move back
                    first: dict[TopicPartition, int] = {}
                    for later in records[index:]:
                        first.setdefault(TopicPartition(later.topic, later.partition),
                                         later.offset)
                    for tp, offset in first.items():
                        consumer.seek(tp, offset)
                    break
                out.append(item)
            return out, problem if not out else None
        out, problem = await self._with(instance, fetch)
        if problem is not None:
            raise RestError(500, 50002, f"Kafka error: {problem}")
        return web.json_response(out, content_type=V2_JSON if fmt == "json" else V2_BINARY)

    def _partitions(self, body: Any, key: str, with_offset: bool) -> dict[TopicPartition, int]:
        if not isinstance(body, dict) or not isinstance(body.get(key), list):
            raise RestError(422, 42206, f"the body must be an object with a {key} list")
        out = {}
        for entry in body[key]:
            if not isinstance(entry, dict) or not isinstance(entry.get("topic"), str) \
                    or isinstance(entry.get("partition"), bool) \
                    or not isinstance(entry.get("partition"), int):
                raise RestError(422, 42206, f"each of {key} needs topic and partition")
            offset = entry.get("offset", 0)
            if with_offset and (isinstance(offset, bool) or not isinstance(offset, int)
                                or offset < 0):
                raise RestError(422, 42206, "offset must be a non-negative integer")
            out[TopicPartition(entry["topic"], entry["partition"])] = offset
        return out

    def _check_partitions(self, tps: Any) -> None:
        for tp in tps:
            count = self._open_topic(tp.topic)
            if not 0 <= tp.partition < count:
                raise RestError(404, 40402, f"Partition {tp.partition} of topic "
                                            f"{tp.topic!r} not found.")

    async def commit(self, request: web.Request) -> web.Response:
        instance = self._instance(request)
        body = await self._body(request, V2, JSON)
        if body is None or (isinstance(body, dict) and not body.get("offsets")):
            await self._with(instance, lambda c: c.commit())
            return web.Response(status=200)
        offsets = self._partitions(body, "offsets", True)
        await self._off_loop(self._check_partitions, offsets)
        # Confluent's: an explicit offset names the last record consumed
        await self._with(instance, lambda c: c.commit(
            {tp: offset + 1 for tp, offset in offsets.items()}))
        return web.Response(status=200)

    async def committed(self, request: web.Request) -> web.Response:
        instance = self._instance(request)
        body = await self._body(request, V2, JSON)
        tps = self._partitions(body, "partitions", False)

        def run(consumer: Any) -> list[dict[str, Any]]:
            out = []
            for tp in tps:
                offset = consumer.committed(tp)
                out.append({"topic": tp.topic, "partition": tp.partition,
                            "offset": -1 if offset is None else offset, "metadata": ""})
            return out
        return web.json_response({"offsets": await self._with(instance, run)},
                                 content_type=V2)

    async def seek(self, request: web.Request) -> web.Response:
        instance = self._instance(request)
        offsets = self._partitions(await self._body(request, V2, JSON), "offsets", True)
        await self._off_loop(self._check_partitions, offsets)

        def run(consumer: Any) -> None:
            for tp, offset in offsets.items():
                consumer.seek(tp, offset)
        await self._with(instance, run)
        return web.Response(status=204)

    async def _seek_edge(self, request: web.Request, end: bool) -> web.Response:
        instance = self._instance(request)
        tps = self._partitions(await self._body(request, V2, JSON), "partitions", False)
        await self._off_loop(self._check_partitions, tps)
        await self._with(instance, lambda c: (c.seek_to_end if end else
                                              c.seek_to_beginning)(*tps))
        return web.Response(status=204)

    async def seek_beginning(self, request: web.Request) -> web.Response:
        return await self._seek_edge(request, False)

    async def seek_end(self, request: web.Request) -> web.Response:
        return await self._seek_edge(request, True)


# ---- concatenated JSON --------------------------------------------------------------------

_DECODER = json.JSONDecoder()


def _split_objects(body: bytes) -> list[Any] | None:
    """Every value of a body of concatenated JSON values; None when malformed."""
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return None
    out = []
    index = _WHITESPACE.match(text, 0).end()
    while index < len(text):
        try:
            value, index = _DECODER.raw_decode(text, index)
        except (ValueError, RecursionError):
            return None
        if not isinstance(value, dict):
            return None
        out.append(value)
        index = _WHITESPACE.match(text, index).end()
    return out


class _StreamParser:
    """Concatenated JSON objects arriving in chunks: `feed(chunk)` returns the complete
    objects so far and, at a malformed one (or one over `max_record_bytes`), the error
    that ends the stream."""

    def __init__(self, max_record_bytes: int) -> None:
        self._max = max_record_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._text = ""

    def feed(self, chunk: bytes, *, final: bool) -> tuple[list[Any], RestError | None]:
        try:
            self._text += self._utf8.decode(chunk, final=final)
        except UnicodeDecodeError:
            return [], _bad("the stream is not UTF-8")
        text, out, index = self._text, [], 0
        while True:
            index = _WHITESPACE.match(text, index).end()
            if index >= len(text):
                break
            try:
                value, end = _DECODER.raw_decode(text, index)
            except RecursionError:
                return out, _bad("a record nests too deeply")
            except json.JSONDecodeError as exc:
                truncated = exc.pos >= len(text) - 5 or exc.msg.startswith("Unterminated")
                if final or not truncated:
                    return out, _bad(f"record {len(out) + 1} of this chunk is not JSON: "
                                     f"{exc.msg}")
                break
            if not isinstance(value, dict):
                return out, _bad("a record must be a JSON object")
            if self._too_large(text, index, end):
                return out, self._too_large_error()
            out.append(value)
            index = end
        self._text = text[index:]
        if self._too_large(self._text, 0, len(self._text)):
            return out, self._too_large_error()
        return out, None

    def _too_large(self, text: str, start: int, end: int) -> bool:
        """Whether text[start:end] is over the bound in UTF-8 bytes (a character is
        1 to 4 bytes: encoded only when its length does not decide)."""
        if end - start > self._max:
            return True
        return (end - start) * 4 > self._max and \
            len(text[start:end].encode()) > self._max

    def _too_large_error(self) -> RestError:
        return RestError(413, 413, f"a record is larger than {self._max} bytes")


def serve(broker: Any, *, host: str = "127.0.0.1", port: int = 0,
          **options: Any) -> RestServer:
    """Serve `broker` as a REST proxy on host:port (0: a free port); the handle."""
    return RestServer(broker, host, port, **options)
