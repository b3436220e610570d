"""The schema registry's REST API: the subset confluent-kafka's SchemaRegistryClient uses.

Owns: the HTTP front end of the embedded registry (schema_registry.py). Two layers, as
h11 splits them: `handle(registry, method, path, query, body)` is a pure function from a
parsed request to (status, JSON body), routed by the table `ROUTES`; `RegistryServer`
(a stdlib ThreadingHTTPServer) only moves bytes: it bounds and reads the body, calls
`handle`, writes the answer. The server knows nothing about schemas.

Endpoints (Confluent's paths and shapes): `GET /schemas/ids/{id}` (`?format=serialized`
gives Protobuf as a base64 FileDescriptorProto), `/schemas/ids/{id}/schema|subjects|
versions`, `/schemas/types`; `GET /subjects`, `/subjects/{s}/versions`,
`/subjects/{s}/versions/{v}` (`v` = n, -1 or latest) and `/schema`, `/referencedby`;
`POST /subjects/{s}/versions` (register), `POST /subjects/{s}` (look up);
`DELETE /subjects/{s}` and `/subjects/{s}/versions/{v}` (`?permanent=true`);
`POST /compatibility/subjects/{s}/versions[/{v}]` (`?verbose=true`);
`GET|PUT|DELETE /config` and `/config/{s}`; `GET /mode`, `/mode/{s}`; `GET /contexts`;
`/associations/...` answers 404, which the client reads as "none".

Invariant: every answer is JSON; errors are `{"error_code", "message"}` with
Confluent's codes (40401 subject, 40402 version, 40403 schema not found, 409
incompatible, 42201 invalid schema, 42202 invalid version, 42203 invalid level, 400
for a body that is not JSON or nests deeper than `MAX_BODY_DEPTH`, 413 for one larger
than `MAX_BODY_BYTES`, 503 when every connection slot is busy); no request, however
malformed, gets a 500 unless logkit itself failed (then it is logged).

Bounded (docs/security.md): at most `max_connections` open connections, each one
thread; a new connection at the cap closes the connection idle the longest, or, when
none is idle, is answered 503 and closed. A connection waits at most `idle_timeout_ms`
for a request's first byte; from that byte, the whole request (line, headers, body) and
its answer get `request_timeout_ms` in total, however slowly the bytes trickle: the
deadline is per request, not per read (`_Deadlines`). Bodies being read or handled
hold at most `MAX_INFLIGHT_BODY_BYTES` together (a request waits for room until its
deadline, then gets 503). Loopback by default.
"""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qsl, unquote, urlsplit

from .compat import LEVELS, SCHEMA_TYPES, deeper_than
from .compat.errors import (InvalidSchemaError, SchemaNotFoundError, SchemaRegistryError)
from ._threads import start_thread
from .errors import (ClosedError, CodecUnavailableError, ConfigError, LogkitError,
                     ReadOnlyError, ResourceError)
from .schema_registry import RegisteredSchema, Schema, SchemaRegistry, check_version

__all__ = ["RegistryServer", "serve", "handle", "ROUTES", "MAX_BODY_BYTES",
           "MAX_BODY_DEPTH", "MAX_CONNECTIONS", "IDLE_TIMEOUT_MS", "REQUEST_TIMEOUT_MS",
           "MAX_INFLIGHT_BODY_BYTES"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 << 20          # a schema is at most 1 MiB; JSON escaping may double it
MAX_BODY_DEPTH = 64               # arrays and objects in a body; Confluent's bodies nest ~5
DRAIN_LIMIT_BYTES = 4 * MAX_BODY_BYTES   # a larger body is not read: the connection closes
MAX_CONNECTIONS = 128             # open connections (each one thread); Kafka's max.connections
IDLE_TIMEOUT_MS = 30_000          # wait for a request's first byte (Confluent's idle.timeout.ms)
REQUEST_TIMEOUT_MS = 30_000       # first byte of a request to its answer sent, in total
WRITE_GRACE_MS = 1_000            # an answer computed past the deadline still gets this long
REFUSED_LINGER_MS = 1_000         # a refused connection is closed after this (or the client)
LISTEN_BACKLOG = 128              # connections the kernel queues before the accepting thread
MAX_INFLIGHT_BODY_BYTES = 32 << 20  # bodies read or being handled at once, all connections
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
Answer = tuple[int, Any]


class BadRequest(Exception):
    """A request the REST layer refuses before the registry sees it."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.error_code = status, error_code


# ---- request helpers ---------------------------------------------------------------------

def _flag(query: dict[str, str], name: str) -> bool:
    return query.get(name, "false").lower() == "true"


def _schema_id(text: str) -> int:
    if not text.isdigit() or len(text) > 10:
        raise SchemaNotFoundError(f"schema {text!r} not found")
    return int(text)


def _body(body: bytes) -> dict[str, Any]:
    if not body:
        raise BadRequest(422, 42201, "the request needs a JSON body")
    try:
        document = json.loads(body)
        too_deep = deeper_than(document, MAX_BODY_DEPTH)
    except RecursionError:              # json's decoder refused the depth itself
        too_deep = True
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(400, 400, f"the request body is not JSON: {exc}") from None
    if too_deep:
        raise BadRequest(400, 400, f"the request body nests deeper than {MAX_BODY_DEPTH} "
                                   "arrays and objects")
    if not isinstance(document, dict):
        raise BadRequest(422, 42201, "the request body must be a JSON object")
    return document


def _schema_body(body: bytes) -> tuple[str, str, Any]:
    """(schema text, type, references) from a register / look up / check body."""
    document = _body(body)
    schema = document.get("schema")
    if not isinstance(schema, str) or not schema.strip():
        raise InvalidSchemaError("the body needs \"schema\": the schema as a string")
    schema_type = document.get("schemaType") or "AVRO"
    if not isinstance(schema_type, str) or schema_type.upper() not in SCHEMA_TYPES:
        raise InvalidSchemaError(f"unknown schemaType {schema_type!r}")
    references = document.get("references") or []
    if not isinstance(references, list) or not all(isinstance(r, dict)
                                                   for r in references):
        raise InvalidSchemaError("\"references\" must be a list of objects")
    return schema, schema_type.upper(), references


def _references(refs: tuple[Any, ...]) -> list[dict[str, Any]]:
    return [{"name": r.name, "subject": r.subject, "version": r.version} for r in refs]


def _schema_fields(registry: SchemaRegistry, schema: Schema | RegisteredSchema,
                   schema_id: int, query: dict[str, str]) -> dict[str, Any]:
    text, kind = schema.schema, schema.schema_type
    if kind == "PROTOBUF" and query.get("format") == "serialized":
        from .compat.protobuf import to_serialized
        text = to_serialized(registry.get(schema_id)[1])
    out: dict[str, Any] = {"schema": text}
    if kind != "AVRO":                  # Confluent leaves out the default type
        out["schemaType"] = kind
    if schema.references:
        out["references"] = _references(schema.references)
    return out


def _version(registry: SchemaRegistry, registered: RegisteredSchema,
             query: dict[str, str]) -> dict[str, Any]:
    return {"subject": registered.subject, "version": registered.version,
            "id": registered.schema_id,
            **_schema_fields(registry, registered, registered.schema_id, query)}


def _raw(schema: Schema | RegisteredSchema) -> Any:
    """`.../schema` endpoints: Avro and JSON Schema as JSON, Protobuf as a string."""
    return schema.schema if schema.schema_type == "PROTOBUF" else json.loads(schema.schema)


# ---- handlers: (registry, params, query, body) -> (status, JSON) -------------------------

def _root(r: SchemaRegistry, p: dict[str, str], q: dict[str, str], b: bytes) -> Answer:
    return 200, {}


def _types(r: SchemaRegistry, p: dict[str, str], q: dict[str, str], b: bytes) -> Answer:
    return 200, list(SCHEMA_TYPES)


def _by_id(r: SchemaRegistry, p: dict[str, str], q: dict[str, str], b: bytes) -> Answer:
    schema_id = _schema_id(p["id"])
    return 200, _schema_fields(r, r.schema(schema_id), schema_id, q)


def _by_id_raw(r: SchemaRegistry, p: dict[str, str], q: dict[str, str],
               b: bytes) -> Answer:
    return 200, _raw(r.schema(_schema_id(p["id"])))


def _id_subjects(r: SchemaRegistry, p: dict[str, str], q: dict[str, str],
                 b: bytes) -> Answer:
    usages = r.usages(_schema_id(p["id"]), deleted=_flag(q, "deleted"))
    return 200, sorted({subject for subject, _ in usages})


def _id_versions(r: SchemaRegistry, p: dict[str, str], q: dict[str, str],
                 b: bytes) -> Answer:
    usages = r.usages(_schema_id(p["id"]), deleted=_flag(q, "deleted"))
    return 200, [{"subject": s, "version": v} for s, v in usages]


def _by_guid(r: SchemaRegistry, p: dict[str, str], q: dict[str, str], b: bytes) -> Answer:
    raise SchemaNotFoundError("schema guids are not supported; use ids")


def _subjects(r: SchemaRegistry, p: dict[str, str], q: dict[str, str], b: bytes) -> Answer:
    return 200, r.subjects(deleted=_flag(q, "deleted"), prefix=q.get("subjectPrefix", ""))


def _versions(r: SchemaRegistry, p: dict[str, str], q: dict[str, str], b: bytes) -> Answer:
    return 200, r.versions(p["subject"], deleted=_flag(q, "deleted"))


def _register(r: SchemaRegistry, p: dict[str, str], q: dict[str, str], b: bytes) -> Answer:
    schema, kind, references = _schema_body(b)
    return 200, {"id": r.register(p["subject"], schema, kind, references=references)}


def _get_version(r: SchemaRegistry, p: dict[str, str], q: dict[str, str],
                 b: bytes) -> Answer:
    found = r.version(p["subject"], p["version"], deleted=_flag(q, "deleted"))
    return 200, _version(r, found, q)


def _get_version_raw(r: SchemaRegistry, p: dict[str, str], q: dict[str, str],
                     b: bytes) -> Answer:
    return 200, _raw(r.version(p["subject"], p["version"], deleted=_flag(q, "deleted")))


def _referenced_by(r: SchemaRegistry, p: dict[str, str], q: dict[str, str],
                   b: bytes) -> Answer:
    return 200, r.referenced_by(p["subject"], p["version"])


def _delete_version(r: SchemaRegistry, p: dict[str, str], q: dict[str, str],
                    b: bytes) -> Answer:
    return 200, r.delete_version(p["subject"], p["version"],
                                 permanent=_flag(q, "permanent"))


def _lookup(r: SchemaRegistry, p: dict[str, str], q: dict[str, str], b: bytes) -> Answer:
    schema, kind, references = _schema_body(b)
    found = r.lookup(p["subject"], schema, kind, references=references,
                     deleted=_flag(q, "deleted"))
    return 200, _version(r, found, q)


def _delete_subject(r: SchemaRegistry, p: dict[str, str], q: dict[str, str],
                    b: bytes) -> Answer:
    return 200, r.delete_subject(p["subject"], permanent=_flag(q, "permanent"))


def _compatible(r: SchemaRegistry, p: dict[str, str], q: dict[str, str],
                b: bytes) -> Answer:
    schema, kind, references = _schema_body(b)
    version = p.get("version")
    if version is not None:
        check_version(version)
    messages = r.incompatibilities(p["subject"], schema, kind, references=references,
                                   version=version)
    answer: dict[str, Any] = {"is_compatible": not messages}
    if _flag(q, "verbose"):
        answer["messages"] = messages
    return 200, answer


def _get_config(r: SchemaRegistry, p: dict[str, str], q: dict[str, str],
                b: bytes) -> Answer:
    subject = p.get("subject")
    return 200, {"compatibilityLevel": r.compatibility(
        subject, default_to_global=subject is None or _flag(q, "defaultToGlobal"))}


def _put_config(r: SchemaRegistry, p: dict[str, str], q: dict[str, str],
                b: bytes) -> Answer:
    document = _body(b)
    level = document.get("compatibility", document.get("compatibilityLevel"))
    if not isinstance(level, str):
        from .compat.errors import InvalidCompatibilityLevelError
        raise InvalidCompatibilityLevelError(f"the body needs \"compatibility\", one of "
                                             f"{', '.join(LEVELS)}")
    return 200, {"compatibility": r.set_compatibility(level, p.get("subject"))}


def _delete_config(r: SchemaRegistry, p: dict[str, str], q: dict[str, str],
                   b: bytes) -> Answer:
    return 200, {"compatibilityLevel": r.delete_compatibility(p.get("subject"))}


def _get_mode(r: SchemaRegistry, p: dict[str, str], q: dict[str, str], b: bytes) -> Answer:
    return 200, {"mode": "READONLY" if r.read_only else "READWRITE"}


def _put_mode(r: SchemaRegistry, p: dict[str, str], q: dict[str, str], b: bytes) -> Answer:
    mode = _body(b).get("mode")
    if mode != "READWRITE":
        raise BadRequest(422, 42204, f"mode {mode!r} is not supported: logkit's registry "
                                     "is READWRITE (or READONLY on a read-only broker)")
    return 200, {"mode": mode}


def _contexts(r: SchemaRegistry, p: dict[str, str], q: dict[str, str], b: bytes) -> Answer:
    return 200, ["."]


def _no_associations(r: SchemaRegistry, p: dict[str, str], q: dict[str, str],
                     b: bytes) -> Answer:
    raise BadRequest(404, 404, "associations are not supported by logkit's registry")


def _no_metadata(r: SchemaRegistry, p: dict[str, str], q: dict[str, str],
                 b: bytes) -> Answer:
    raise SchemaNotFoundError("schema metadata is not supported by logkit's registry")


Handler = Callable[[SchemaRegistry, dict[str, str], dict[str, str], bytes], Answer]

# (method, path pattern, handler). `{name}` matches one path segment; `*` the rest.
ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("GET", "", _root),
    ("GET", "schemas/types", _types),
    ("GET", "schemas/ids/{id}", _by_id),
    ("GET", "schemas/ids/{id}/schema", _by_id_raw),
    ("GET", "schemas/ids/{id}/subjects", _id_subjects),
    ("GET", "schemas/ids/{id}/versions", _id_versions),
    ("GET", "schemas/guids/{guid}", _by_guid),
    ("GET", "subjects", _subjects),
    ("GET", "subjects/{subject}/versions", _versions),
    ("POST", "subjects/{subject}/versions", _register),
    ("GET", "subjects/{subject}/versions/{version}", _get_version),
    ("GET", "subjects/{subject}/versions/{version}/schema", _get_version_raw),
    ("GET", "subjects/{subject}/versions/{version}/referencedby", _referenced_by),
    ("DELETE", "subjects/{subject}/versions/{version}", _delete_version),
    ("GET", "subjects/{subject}/metadata", _no_metadata),
    ("POST", "subjects/{subject}", _lookup),
    ("DELETE", "subjects/{subject}", _delete_subject),
    ("POST", "compatibility/subjects/{subject}/versions", _compatible),
    ("POST", "compatibility/subjects/{subject}/versions/{version}", _compatible),
    ("GET", "config", _get_config),
    ("PUT", "config", _put_config),
    ("DELETE", "config", _delete_config),
    ("GET", "config/{subject}", _get_config),
    ("PUT", "config/{subject}", _put_config),
    ("DELETE", "config/{subject}", _delete_config),
    ("GET", "mode", _get_mode),
    ("PUT", "mode", _put_mode),
    ("GET", "mode/{subject}", _get_mode),
    ("PUT", "mode/{subject}", _put_mode),
    ("GET", "contexts", _contexts),
    ("GET", "associations/*", _no_associations),
)
_COMPILED = tuple((method, [part for part in pattern.split("/") if part], handler)
                  for method, pattern, handler in ROUTES)


def _route(method: str, segments: list[str]
           ) -> tuple[Handler | None, dict[str, str], bool]:
    """(handler, path parameters, whether the path exists for another method)."""
    path_known = False
    for route_method, pattern, handler in _COMPILED:
        params: dict[str, str] = {}
        if pattern[-1:] == ["*"]:
            ok = segments[:len(pattern) - 1] == pattern[:-1]
        elif len(pattern) != len(segments):
            continue
        else:
            ok = True
            for want, got in zip(pattern, segments):
                if want.startswith("{"):
                    params[want[1:-1]] = got
                elif want != got:
                    ok = False
                    break
        if ok:
            if route_method == method:
                return handler, params, True
            path_known = True
    return None, {}, path_known


def handle(registry: SchemaRegistry, method: str, path: str, query: dict[str, str],
           body: bytes) -> Answer:
    """The pure request handler: (HTTP status, JSON-able body)."""
    segments = [unquote(part) for part in path.split("/") if part]
    handler, params, path_known = _route(method, segments)
    if handler is None:
        if path_known:
            return 405, {"error_code": 405, "message": f"{method} is not allowed on {path}"}
        return 404, {"error_code": 404, "message": f"HTTP 404 Not Found: {path}"}
    try:
        return handler(registry, params, query, body)
    except BadRequest as exc:
        return exc.status, {"error_code": exc.error_code, "message": str(exc)}
    except SchemaRegistryError as exc:
        return exc.http_status, exc.to_dict()
    except ReadOnlyError as exc:
        return 422, {"error_code": 42205, "message": str(exc)}
    except CodecUnavailableError as exc:
        return 422, {"error_code": 42201, "message": str(exc)}
    except ClosedError as exc:
        return 500, {"error_code": 50001, "message": str(exc)}
    except LogkitError as exc:
        log.warning("schema registry %s %s failed: %s", method, path, exc)
        return 500, {"error_code": 50001, "message": str(exc)}
    except Exception as exc:              # a bug in logkit: answered, logged, not hidden
        log.exception("schema registry %s %s raised", method, path)
        return 500, {"error_code": 50001, "message": f"internal error: "
                                                     f"{type(exc).__name__}"}


# ---- the socket loop ---------------------------------------------------------------------

class _Deadlines(io.RawIOBase):
    """A connection's reads, bounded in time. Idle (between requests), reads wait until
    `idle_timeout_s` after the last answer; a request's first byte starts its deadline,
    and every read after it waits only for what is left of `request_timeout_s`, so a
    client trickling one byte at a time is cut off when the request's time is up. `busy`
    and `idle_since` are read by the server, under its lock, to pick a connection to
    close at the cap."""

    def __init__(self, sock: socket.socket, idle_timeout_s: float,
                 request_timeout_s: float) -> None:
        super().__init__()
        self.sock = sock
        self.idle_timeout_s, self.request_timeout_s = idle_timeout_s, request_timeout_s
        self.busy = False
        self.idle_since = time.monotonic()
        self.deadline = self.idle_since + idle_timeout_s

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left_s = self.deadline - time.monotonic()
        if left_s <= 0:
            raise TimeoutError("the request deadline passed" if self.busy
                               else "the connection was idle too long")
        self.sock.settimeout(left_s)
        count = self.sock.recv_into(buffer)
        if count and not self.busy:         # a request's first byte: its deadline starts
            self.busy = True
            self.deadline = time.monotonic() + self.request_timeout_s
        return count

    def answered(self) -> None:
        """The request was answered: the connection is idle again."""
        self.busy = False
        self.idle_since = time.monotonic()
        self.deadline = self.idle_since + self.idle_timeout_s

    def write_timeout_s(self) -> float:
        return max(self.deadline - time.monotonic(), WRITE_GRACE_MS / 1000)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"   # so a garbled request line gets a status line
    server: "_Server"

    def setup(self) -> None:
        super().setup()
        self.rfile.close()              # http.server's reader, replaced by one with deadlines
        server = self.server
        deadlines = server.connections.get(self.connection)
        if deadlines is None:           # the cap already closed this connection: its first
            deadlines = _Deadlines(self.connection, server.idle_timeout_s,   # read ends it
                                   server.request_timeout_s)
        self.deadlines = deadlines
        self.rfile = io.BufferedReader(deadlines)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.forget(self.connection)

    def handle_one_request(self) -> None:
        super().handle_one_request()
        self.deadlines.answered()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("schema registry %s: " + format, self.address_string(), *args)

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """http.server's own refusals (a garbled request line, too many headers, a URI
        too long) in the registry's JSON error shape; the connection then closes."""
        self.close_connection = True
        self._answer(code, {"error_code": code,
                            "message": message or explain or "bad request"})

    def _answer(self, status: int, document: Any) -> None:
        payload = json.dumps(document).encode()
        self.connection.settimeout(self.deadlines.write_timeout_s())
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(payload)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _run(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() not in ("", "identity"):
            self.close_connection = True
            self._answer(411, {"error_code": 411, "message": "send the body with a "
                                                             "Content-Length"})
            return
        length_header = self.headers.get("Content-Length", "0") or "0"
        if not re.fullmatch(r"\d{1,12}", length_header.strip()):
            self.close_connection = True
            self._answer(400, {"error_code": 400, "message": "invalid Content-Length"})
            return
        length = int(length_header)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            if length <= DRAIN_LIMIT_BYTES:        # read and drop it, so the client sees
                self._drain(length)                # the answer, not a reset connection
            self._answer(413, {"error_code": 413, "message": f"the body is {length} bytes; "
                                                             f"the limit is {MAX_BODY_BYTES}"})
            return
        if not self.server.reserve_body(length, self.deadlines.deadline):
            self.close_connection = True
            self._answer(503, {"error_code": 503, "message": "the registry is reading "
                                                             "too many bodies; retry later"})
            return
        try:
            body = self.rfile.read(length) if length else b""
            if len(body) != length:
                self.close_connection = True
                return
            parts = urlsplit(self.path)
            query = dict(parse_qsl(parts.query, keep_blank_values=True))
            status, document = handle(self.server.registry, self.command, parts.path,
                                      query, body)
        finally:
            self.server.release_body(length)
        self._answer(status, document)

    def _drain(self, length: int) -> None:
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 16))
            if not chunk:
                return
            length -= len(chunk)

    # Every method goes to `handle`, which answers 405 (JSON) for one it does not route.
    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _run


_BUSY_BODY = json.dumps({"error_code": 503, "message": "every connection slot is busy in "
                                                    "a request; retry later"}).encode()
_BUSY_ANSWER = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: " + CONTENT_TYPE.encode()
                + b"\r\nConnection: close\r\nContent-Length: "
                + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY)


class _Server(ThreadingHTTPServer):
    """Accepts on one thread, serves each connection on its own; `connections` maps
    each open connection to its `_Deadlines` (the table the cap is kept by)."""
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], registry: SchemaRegistry, *,
                 max_connections: int, idle_timeout_ms: int,
                 request_timeout_ms: int) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.registry = registry
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_ms / 1000
        self.request_timeout_s = request_timeout_ms / 1000
        self.lock = threading.Lock()
        self.connections: dict[socket.socket, _Deadlines] = {}
        # Refused connections, answered 503 and half-closed: closing one at once would
        # reset it when the client's request arrives, losing the answer. At most
        # max_connections linger, each REFUSED_LINGER_MS; the accepting thread ends them.
        self.refused: list[tuple[float, socket.socket]] = []
        self.refusals, self.next_refusal_log = 0, 0.0
        self.body_room = threading.Condition()      # guards body_bytes
        self.body_bytes = 0
        super().__init__(address, _RequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """At the cap, close the connection idle the longest to make room; when every
        connection is in a request, answer 503 and close the new one."""
        with self.lock:
            victim = None
            if len(self.connections) >= self.max_connections:
                idle = [(d.idle_since, c) for c, d in self.connections.items() if not d.busy]
                if not idle:
                    self._refuse(request)
                    return
                victim = min(idle, key=lambda pair: pair[0])[1]
                del self.connections[victim]
            self.connections[request] = _Deadlines(request, self.idle_timeout_s,
                                                   self.request_timeout_s)
        if victim is not None:
            log.debug("schema registry: %d connections open, the cap; closing the one "
                     "idle the longest", self.max_connections)
            _shut(victim)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.forget(request)
            raise

    def _refuse(self, request: socket.socket) -> None:
        self.refusals += 1
        if time.monotonic() >= self.next_refusal_log:        # a flood logs once a minute
            self.next_refusal_log = time.monotonic() + 60
            log.warning("schema registry: %d connections open, all in a request; "
                        "refusing new ones with 503 (%d so far)", self.max_connections,
                        self.refusals)
        try:
            request.setblocking(False)       # never wait on a client from this thread
            request.send(_BUSY_ANSWER)
            request.shutdown(socket.SHUT_WR)
        except OSError:
            self.shutdown_request(request)
            return
        if len(self.refused) >= self.max_connections:
            self.shutdown_request(self.refused.pop(0)[1])
        self.refused.append((time.monotonic() + REFUSED_LINGER_MS / 1000, request))

    def service_actions(self) -> None:
        """Between accepts (serve_forever's loop): a refused connection is closed once
        its client has closed it or REFUSED_LINGER_MS has passed; what it sent is
        dropped unread."""
        now, lingering = time.monotonic(), []
        for deadline, sock in self.refused:
            try:
                done = deadline <= now or sock.recv(1 << 16) == b""
            except BlockingIOError:
                done = False
            except OSError:
                done = True
            if done:
                self.shutdown_request(sock)
            else:
                lingering.append((deadline, sock))
        self.refused = lingering

    def reserve_body(self, length: int, deadline: float) -> bool:
        """Room for a body of `length` bytes among MAX_INFLIGHT_BODY_BYTES, waited for
        until `deadline` (the request's); False when it did not come in time."""
        if not length:
            return True
        with self.body_room:
            while self.body_bytes + length > MAX_INFLIGHT_BODY_BYTES:
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    return False
                self.body_room.wait(left_s)
            self.body_bytes += length
            return True

    def release_body(self, length: int) -> None:
        if length:
            with self.body_room:
                self.body_bytes -= length
                self.body_room.notify_all()

    def forget(self, connection: socket.socket) -> None:
        with self.lock:
            self.connections.pop(connection, None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection reset or timed out is the client's doing: logged, not printed."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            log.debug("schema registry: connection from %s ended: %r", client_address,
                      error)
        else:
            log.exception("schema registry: connection from %s failed", client_address)


def _shut(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:                        # already closed by its client
        pass


class RegistryServer:
    """A running REST front end: `.host`, `.port`, `.url`; `close()` (safe twice) stops
    accepting, ends open connections and joins the thread. A context manager."""

    def __init__(self, registry: SchemaRegistry, host: str = "127.0.0.1",
                 port: int = 0, *, max_connections: int = MAX_CONNECTIONS,
                 idle_timeout_ms: int = IDLE_TIMEOUT_MS,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS) -> None:
        for name, value in (("max_connections", max_connections),
                            ("idle_timeout_ms", idle_timeout_ms),
                            ("request_timeout_ms", request_timeout_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        self._server = _Server((host, port), registry, max_connections=max_connections,
                               idle_timeout_ms=idle_timeout_ms,
                               request_timeout_ms=request_timeout_ms)
        self.host = host
        self.port = self._server.server_address[1]
        bracketed = f"[{host}]" if ":" in host else host
        self.url = f"http://{bracketed}:{self.port}"
        self._closed = False
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.1},
                                        name=f"logkit-schema-registry-{self.port}",
                                        daemon=True)
        try:
            start_thread(self._thread, "the schema registry's HTTP server thread")
        except ResourceError:
            self._closed = True
            self._server.server_close()
            raise
        log.info("schema registry REST API on %s", self.url)

    def __repr__(self) -> str:
        return f"RegistryServer({self.url!r})"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        for _, sock in self._server.refused:
            sock.close()
        with self._server.lock:
            open_connections = list(self._server.connections)
        for connection in open_connections:
            _shut(connection)
        self._thread.join(timeout=10)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "RegistryServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def serve(registry: SchemaRegistry, *, host: str = "127.0.0.1", port: int = 0,
          max_connections: int = MAX_CONNECTIONS, idle_timeout_ms: int = IDLE_TIMEOUT_MS,
          request_timeout_ms: int = REQUEST_TIMEOUT_MS) -> RegistryServer:
    """Serve `registry` over REST on host:port (0: a free port); returns the handle.
    The limits are the module's constants by default (docs/security.md)."""
    return RegistryServer(registry, host, port, max_connections=max_connections,
                          idle_timeout_ms=idle_timeout_ms,
                          request_timeout_ms=request_timeout_ms)
