"""The `logkit` command: Kafka's command-line tools over a broker directory.

Owns: argument parsing, the output formats (tables, JSON, record formats) and turning
library errors into a message and an exit code. Each command opens one Broker, makes a
few public library calls and prints what they return; it uses only the public names of
`logkit` (tests/kit/test_seams.py holds it to that), so it knows nothing of the file formats
beyond what they expose. Every command's help carries an example (tests/kit/test_cli.py
checks that); docs/cli.md is generated from the same help (tools/cli_docs.py).

    logkit topics list|create|delete|describe|alter|alter-config DIR ...   kafka-topics, kafka-configs
    logkit produce DIR TOPIC                       kafka-console-producer: lines from stdin
    logkit consume DIR TOPIC                       kafka-console-consumer (--follow: tail -f)
    logkit groups list|describe|reset-offsets|delete DIR ...         kafka-consumer-groups
    logkit schemas list|show|register|check|delete|config DIR ...    the schema registry
    logkit follow SOURCE DIR                       copy a leader (a directory or tcp://) into DIR
    logkit describe DIR TOPIC                      the partitions of one topic
    logkit dump SEGMENT.log                        the batches (and records) of a segment file
    logkit restore URL DIR                         a directory rebuilt from broker.ship(url)
    logkit bench [BENCHMARK ...]                   the benchmark suite (benchmarks/ of a checkout)
    logkit completion bash                         a bash completion script

Output: tables are whitespace-aligned columns when stdout is not a terminal (for `awk`,
`cut`, `sort`), drawn with rich when it is and rich is installed (the `cli` extra); `-`
stands for "none". `--json` gives JSON instead.

Exit codes: 0 success; 1 an operating error (a logkit or OS error), one line on stderr;
2 bad usage (argparse's message). `consume --follow` exits 0 on SIGINT/SIGTERM after
closing the broker.

Adding a command: write `cmd_x(args) -> int` and `add_x(parser)`, then add a `Command`
row to COMMANDS (or to a group's table, like TOPICS and GROUPS).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import difflib
import json
import logging
import os
import re
import signal
import sys
import time
from typing import Any, Callable, Iterator, NamedTuple, Sequence, TextIO

from . import (Broker, ConfigError, LogkitError, ObjectStoreSource, Record,
               SerializationError, TopicPartition, iter_segment_batches, mirror,
               mirror_from)

__all__ = ["main", "build_parser", "COMMANDS", "FORMATS", "format_record"]

log = logging.getLogger(__name__)

FORMAT_FILE = "logkit.json"
POLL_MS = 100                     # one consume step; also the bound on reacting to SIGTERM
DEFAULT_IDLE_MS = 2000            # consume without --follow stops after this long idle


class UsageError(Exception):
    """A combination of arguments argparse cannot check by itself: exit status 2."""


class Command(NamedTuple):
    name: str
    help: str
    example: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int] | None   # None: has subcommands
    subcommands: Sequence["Command"] = ()


# ---- opening a directory -----------------------------------------------------------------

def _broker(directory: str, *, write: bool = False, create: bool = False) -> Broker:
    """Open `directory`: read-only unless `write`; it must already be a logkit root
    unless `create` (commands that make topics may start a new one)."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise LogkitError(f"{directory} is a file, not a logkit directory")
    if not create and not os.path.isfile(os.path.join(directory, FORMAT_FILE)):
        # inspection must never turn an arbitrary directory into a broker root
        if not os.path.isdir(directory):
            raise LogkitError(f"{directory} does not exist (no logkit directory there)")
        raise LogkitError(f"{directory} is not a logkit directory (no {FORMAT_FILE})")
    if write or create:
        return Broker(directory, background=False)
    # Inspection writes nothing: no recovery, no format file, no clean marks.
    return Broker(directory, background=False, read_only=True)


@contextlib.contextmanager
def _creating_broker(directory: str) -> Iterator[Broker]:
    """A writable Broker for a command that may start a new root. When the command fails
    before it made any topic in a root it started, the root's files are removed again, so
    a refused command (a bad topic name, say) leaves no empty logkit directory behind."""
    fresh = not os.path.isfile(os.path.join(directory, FORMAT_FILE))
    existed = os.path.isdir(directory)
    broker = _broker(directory, create=True)
    try:
        with broker:
            yield broker
    except BaseException:
        if fresh:
            _remove_unused_root(directory, existed)
        raise


def _remove_unused_root(directory: str, existed: bool) -> None:
    """Undo the start of a root this command made, if it still holds no topic."""
    try:
        with Broker(directory, background=False, read_only=True) as broker:
            if broker.topics() or broker.groups():
                return
    except LogkitError:
        return
    import shutil
    if not existed:
        shutil.rmtree(directory, ignore_errors=True)
        return
    for name in os.listdir(directory):        # it was empty before: take back what we made
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


# ---- output ------------------------------------------------------------------------------

def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _rich_console(stream: TextIO) -> Any:
    """A rich Console on `stream` when it is a terminal and rich is installed."""
    if not stream.isatty() or os.environ.get("TERM") == "dumb":
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(file=stream)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
                title: str | None = None) -> None:
    """A table on stdout: rich on a terminal, else columns separated by two or more
    spaces (none of our cells holds a space), `-` for none."""
    cells = [[_cell(v) for v in row] for row in rows]
    console = _rich_console(sys.stdout)
    if console is not None:
        from rich.table import Table
        table = Table(*headers, title=title, box=None, header_style="bold")
        for row in cells:
            table.add_row(*row)
        console.print(table)
        return
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    for row in [list(headers)] + cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


@contextlib.contextmanager
def progress(description: str, total: int | None = None, *, shown: bool = True
             ) -> Iterator[Callable[[int], None]]:
    """A progress counter on stderr when `shown` and stderr is a terminal (rich), else
    nothing; yields `advance(n)`."""
    console = _rich_console(sys.stderr) if shown else None
    if console is None:
        yield lambda n: None
        return
    from rich.progress import Progress
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


def note(command: str, message: str) -> None:
    """A line for the person at the terminal, on stderr (stdout stays data)."""
    print(f"logkit {command}: {message}", file=sys.stderr)


# ---- record formats (consume) ------------------------------------------------------------

def _text(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", "backslashreplace")


def _json_bytes(data: bytes | None) -> Any:
    """bytes as JSON: text when they are UTF-8, else {"base64": ...}; None as null.
    `produce --json` reads the same shapes."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def _format_value(record: Record, args: argparse.Namespace) -> str:
    return _text(record.value)


def _format_kv(record: Record, args: argparse.Namespace) -> str:
    return f"{_text(record.key)}{args.key_separator}{_text(record.value)}"


def _format_json(record: Record, args: argparse.Namespace) -> str:
    return json.dumps({"topic": record.topic, "partition": record.partition,
                       "offset": record.offset, "timestamp": record.timestamp,
                       "key": _json_bytes(record.key), "value": _json_bytes(record.value),
                       "headers": [[k, _json_bytes(v)] for k, v in record.headers or ()]},
                      separators=(",", ":"))


def _decoded_json(value: Any) -> Any:
    """json.dumps' fallback for what the serdes decode into: bytes as text or
    {"base64": ...}, times and dates as ISO 8601, decimals and UUIDs as strings,
    Protobuf messages as their JSON mapping."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _json_bytes(bytes(value))
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "DESCRIPTOR"):                      # a Protobuf message
        from google.protobuf import json_format
        return json_format.MessageToDict(value, preserving_proto_field_name=True)
    return str(value)                                     # Decimal, UUID


def _framed(data: bytes | None) -> bool:
    """Confluent's wire format starts with magic byte 0 and a 4-byte schema id."""
    return data is not None and len(data) >= 5 and data[0] == 0


def _format_schema(record: Record, args: argparse.Namespace) -> str:
    """A record whose value is in Confluent's wire format, decoded through the
    directory's registry with the writer's schema (the id in the record): the JSON
    object of --format json with the decoded value. A key is decoded the same way when
    it is framed (magic byte 0 and a schema id), else printed as text. A value (or
    framed key) that does not decode is a SerializationError naming topic, partition
    and offset; nothing is printed for it."""
    key: Any = record.key
    try:
        value = args.value_decoder(record.value)
        key = args.key_decoder(key) if _framed(key) else _json_bytes(key)
    except SerializationError as exc:
        raise exc.at(record.topic, record.partition, record.offset) from exc
    if hasattr(value, "DESCRIPTOR"):
        value = _decoded_json(value)
    if hasattr(key, "DESCRIPTOR"):
        key = _decoded_json(key)
    return json.dumps({"topic": record.topic, "partition": record.partition,
                       "offset": record.offset, "timestamp": record.timestamp,
                       "key": key, "value": value,
                       "headers": [[k, _json_bytes(v)] for k, v in record.headers or ()]},
                      separators=(",", ":"), default=_decoded_json)


# The --format choices of `consume`: name -> (record, args) -> one output line.
FORMATS: dict[str, Callable[[Record, argparse.Namespace], str]] = {
    "value": _format_value, "kv": _format_kv, "json": _format_json,
    "avro": _format_schema, "json-schema": _format_schema, "protobuf": _format_schema}

# The schema'd formats: name -> the logkit.serde class that decodes the values (imported
# when used: the serdes' libraries are not needed by the other commands).
SCHEMA_FORMATS = {"avro": "AvroSerde", "json-schema": "JsonSchemaSerde",
                  "protobuf": "ProtobufSerde"}


def _schema_decoder(broker: Broker, topic: str, format_name: str, *,
                    is_key: bool = False) -> Callable[[Any], Any]:
    """The deserialize of a serde without a schema of its own: each value (key) is read
    with its writer's schema (the id in its frame)."""
    from . import serde
    return getattr(serde, SCHEMA_FORMATS[format_name])(broker, topic,
                                                        is_key=is_key).deserialize


def format_record(record: Record, args: argparse.Namespace) -> str:
    """One consumed record as one line of output, in `args.format`."""
    return FORMATS[args.format](record, args)


# ---- topics ------------------------------------------------------------------------------

def cmd_topics_list(args: argparse.Namespace) -> int:
    with _broker(args.directory) as broker:
        rows = [{"topic": name, "partitions": broker.topic(name).num_partitions}
                for name in broker.topics()]
    if args.json:
        print_json(rows)
    else:
        for row in rows:
            print(row["topic"])
    return 0


def _config_pairs(items: Sequence[str] | None, flag: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items or ():
        for part in item.split(","):
            key, sep, value = part.partition("=")
            if not sep or not key:
                raise UsageError(f"{flag} takes KEY=VALUE[,KEY=VALUE...], got {part!r}")
            pairs[key.strip()] = value.strip()
    return pairs


def cmd_topics_create(args: argparse.Namespace) -> int:
    config = _config_pairs(args.config, "--config")
    with _creating_broker(args.directory) as broker:
        existed = args.topic in broker.topics()
        if existed and args.if_not_exists:
            note("topics create", f"topic {args.topic!r} already exists; left as it is")
            return 0
        topic = broker.create_topic(args.topic, args.partitions, config=config or None)
        print(f"Created topic {topic.name} ({topic.num_partitions} partition(s)).")
    return 0


def cmd_topics_delete(args: argparse.Namespace) -> int:
    with _broker(args.directory, write=True) as broker:
        if args.if_exists and args.topic not in broker.topics():
            return 0
        broker.delete_topic(args.topic)
    print(f"Deleted topic {args.topic}.")
    return 0


def _partition_rows(broker: Broker, name: str) -> list[dict[str, Any]]:
    return [{"topic": name, "partition": p.topic_partition.partition,
             "log_start_offset": p.log_start_offset, "log_end_offset": p.log_end_offset,
             "high_watermark": p.high_watermark, "size_bytes": p.size_bytes()}
            for p in broker.topic(name).partitions]


def cmd_topics_describe(args: argparse.Namespace) -> int:
    with _broker(args.directory) as broker:
        names = [args.topic] if args.topic else broker.topics()
        described = [{"topic": name, "partitions": _partition_rows(broker, name),
                      "config": broker.topic(name).config} for name in names]
    if args.json:
        print_json(described if args.topic is None else described[0])
        return 0
    if args.configs:
        rows = [(t["topic"], key, value) for t in described
                for key, value in sorted(t["config"].items())]
        print_table(["TOPIC", "CONFIG", "VALUE"], rows)
        return 0
    rows = [(r["topic"], r["partition"], r["log_start_offset"], r["log_end_offset"],
             r["high_watermark"], r["size_bytes"], t["config"]["cleanup.policy"])
            for t in described for r in t["partitions"]]
    print_table(["TOPIC", "PARTITION", "LOG-START-OFFSET", "LOG-END-OFFSET",
                 "HIGH-WATERMARK", "SIZE-BYTES", "CLEANUP-POLICY"], rows)
    return 0


def cmd_topics_compact(args: argparse.Namespace) -> int:
    """One cleaning pass of each partition (or --partition N) now: Partition.compact."""
    with _broker(args.directory, write=True) as broker:
        topic = broker.topic(args.topic)
        numbers = range(topic.num_partitions) if args.partition is None \
            else [args.partition]
        reports = [(n, topic.partition(n).compact()) for n in numbers]
    rows = [{"topic": args.topic, "partition": n, "records_before": r.records_before,
             "records_after": r.records_after, "bytes_before": r.bytes_before,
             "bytes_after": r.bytes_after, "segments_before": r.segments_before,
             "segments_after": r.segments_after, "first_dirty_offset": r.first_dirty_offset,
             "seconds": round(r.seconds, 3)} for n, r in reports]
    if args.json:
        print_json(rows)
        return 0
    print_table(["TOPIC", "PARTITION", "RECORDS-BEFORE", "RECORDS-AFTER", "BYTES-BEFORE",
                 "BYTES-AFTER", "SEGMENTS-BEFORE", "SEGMENTS-AFTER", "SECONDS"],
                [(r["topic"], r["partition"], r["records_before"], r["records_after"],
                  r["bytes_before"], r["bytes_after"], r["segments_before"],
                  r["segments_after"], f"{r['seconds']:.3f}") for r in rows])
    return 0


def cmd_topics_alter(args: argparse.Namespace) -> int:
    with _broker(args.directory, write=True) as broker:
        before = broker.topic(args.topic).num_partitions
        topic = broker.create_partitions(args.topic, args.partitions)
    print(f"Topic {topic.name} now has {topic.num_partitions} partition(s) (was {before}); "
          "keyed records map by the new count from now on.")
    return 0


def cmd_topics_alter_config(args: argparse.Namespace) -> int:
    changes: dict[str, Any] = dict(_config_pairs(args.add_config, "--add-config"))
    for item in args.delete_config or ():
        for key in item.split(","):
            changes[key.strip()] = None
    if not changes:
        raise UsageError("give --add-config KEY=VALUE and/or --delete-config KEY")
    with _broker(args.directory, write=True) as broker:
        overrides = broker.alter_topic_config(args.topic, changes)
    print(f"Completed updating config for topic {args.topic}; overrides now: "
          + (", ".join(f"{k}={v}" for k, v in sorted(overrides.items())) or "none"))
    return 0


# ---- produce -----------------------------------------------------------------------------

def _json_field(value: Any, field: str, number: int) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dict) and set(value) == {"base64"}:
        return base64.b64decode(value["base64"], validate=True)
    if isinstance(value, (dict, list, int, float, bool)):
        return json.dumps(value, separators=(",", ":")).encode()   # JSON as JSON text
    raise ConfigError(f"line {number}: {field} must be text, JSON or {{\"base64\": ...}}")


def _parse_json_line(line: str, number: int) -> dict[str, Any]:
    try:
        item = json.loads(line)
    except ValueError as exc:
        raise ConfigError(f"line {number} is not JSON: {exc}") from None
    if not isinstance(item, dict):
        raise ConfigError(f"line {number}: a JSON line is an object such as "
                          '{"key": "k", "value": "v"}, got ' + type(item).__name__)
    sent: dict[str, Any] = {"key": _json_field(item.get("key"), "key", number),
                            "value": _json_field(item.get("value"), "value", number)}
    headers = item.get("headers") or []
    if isinstance(headers, dict):
        headers = list(headers.items())
    sent["headers"] = [(str(k), _json_field(v, "a header value", number))
                       for k, v in headers] or None
    for field, keyword in (("partition", "partition"), ("timestamp", "timestamp_ms")):
        if item.get(field) is not None:
            sent[keyword] = item[field]
    return sent


def _parse_text_line(line: str, number: int, args: argparse.Namespace) -> dict[str, Any]:
    headers = None
    if args.headers:
        head, sep, line = line.partition("\t")
        if not sep:
            raise ConfigError(f"line {number}: --headers wants the headers, then a tab, "
                              "then the record (h1:v1,h2:v2<TAB>value)")
        headers = []
        for pair in filter(None, head.split(",")):
            key, _, value = pair.partition(":")
            headers.append((key, value.encode()))
    key = None
    if args.key_separator is not None:
        key_text, sep, line = line.partition(args.key_separator)
        if not sep:
            raise ConfigError(f"line {number} has no key separator "
                              f"{args.key_separator!r} (KEY{args.key_separator}VALUE)")
        key = key_text.encode()
    return {"key": key, "value": line.encode(), "headers": headers or None}


def cmd_produce(args: argparse.Namespace) -> int:
    if args.json and (args.key_separator is not None or args.headers):
        raise UsageError("--json lines carry their own key and headers; drop "
                         "--key-separator / --headers")
    count = 0
    with _creating_broker(args.directory) as broker:
        producer = broker.producer(acks=args.acks, linger_ms=5)
        with progress(f"producing to {args.topic}", shown=not sys.stdin.isatty()) as advance:
            for number, raw in enumerate(sys.stdin, 1):
                line = raw[:-1] if raw.endswith("\n") else raw
                if args.json:
                    if not line.strip():
                        continue
                    fields = _parse_json_line(line, number)
                else:
                    fields = _parse_text_line(line, number, args)
                producer.send(args.topic, **fields)
                count += 1
                advance(1)
        producer.flush()
        producer.close()
    note("produce", f"{count} record(s) to {args.topic}")
    return 0


# ---- serve (the Kafka protocol listener: Broker.serve) ------------------------------------

def add_serve(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("directory", help="the broker directory (created when missing)")
    cmd.add_argument("--host", default="127.0.0.1",
                     help="address to listen on (default 127.0.0.1: this machine only)")
    cmd.add_argument("--port", type=int, default=9092, help="TCP port (default 9092; 0: "
                     "any free port, printed)")
    cmd.add_argument("--advertised-host", default=None,
                     help="host name clients are told to connect to (default: --host)")
    cmd.add_argument("--config", action="append", metavar="KEY=VALUE",
                     help="a broker setting, Kafka's names, e.g. num.partitions=3 or "
                     "auto.create.topics.enable=false (repeatable)")
    cmd.add_argument("--sasl-users", metavar="FILE",
                     help="require SASL/PLAIN: FILE holds one USER:PASSWORD a line (# "
                     "comments); without it any client that reaches --host may read, "
                     "write and delete topics (docs/security.md)")
    cmd.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate "
                     "chain (with --tls-key)")
    cmd.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    cmd.add_argument("--schema-registry-port", type=int, default=None, metavar="N",
                     help="also serve the schema registry's REST API (Confluent's), "
                     "which has no authentication, on --schema-registry-host:N (0: any "
                     "free port, printed)")
    cmd.add_argument("--schema-registry-host", default="127.0.0.1", metavar="HOST",
                     help="address of the schema registry (default 127.0.0.1 whatever "
                     "--host is: it is opened to the network only when asked)")
    cmd.add_argument("--rest-port", type=int, default=None, metavar="N",
                     help="also serve Confluent's REST Proxy API (v3 and v2) on "
                     "--rest-host:N (0: any free port, printed), with --sasl-users as "
                     "its Basic auth users and --tls-cert/--tls-key as its TLS")
    cmd.add_argument("--rest-host", default="127.0.0.1", metavar="HOST",
                     help="address of the REST proxy (default 127.0.0.1)")


def _sasl_users(path: str | None) -> dict[str, str] | None:
    """USER:PASSWORD lines of a --sasl-users file as {user: password}."""
    if path is None:
        return None
    users = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise UsageError(f"--sasl-users: cannot read {path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        user, colon, password = line.partition(":")
        if not colon or not user or not password:
            raise UsageError(f"--sasl-users: {path} line {number} is not USER:PASSWORD")
        users[user] = password
    if not users:
        raise UsageError(f"--sasl-users: {path} names no user")
    return users


def _tls_context(cert: str | None, key: str | None) -> Any:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise UsageError("--tls-cert and --tls-key go together")
    import ssl
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"--tls-cert/--tls-key: {exc}") from None
    return context


def cmd_serve(args: argparse.Namespace) -> int:
    config = _config_pairs(args.config, "--config")
    users = _sasl_users(args.sasl_users)
    context = _tls_context(args.tls_cert, args.tls_key)
    if users is None and args.host not in ("127.0.0.1", "::1", "localhost"):
        note("serve", f"no --sasl-users: any client that reaches {args.host} may read, "
             "write and delete topics (docs/security.md)")
    with Broker(args.directory, config=config or None) as broker, \
            _stop_on_signals() as stop:
        server = broker.serve(host=args.host, port=args.port,
                              advertised_host=args.advertised_host,
                              sasl_plain_users=users, ssl_context=context)
        print(f"serving {args.directory} to Kafka clients at {server.bootstrap_servers}"
              f"{' (SASL/PLAIN)' if users else ''}{' (TLS)' if context else ''}",
              flush=True)
        if args.schema_registry_port is not None:
            registry = broker.serve_schema_registry(host=args.schema_registry_host,
                                                    port=args.schema_registry_port)
            print(f"serving the schema registry at {registry.url}", flush=True)
        if args.rest_port is not None:
            rest = broker.serve_rest(host=args.rest_host, port=args.rest_port,
                                     users=users, ssl_context=context)
            print(f"serving the REST proxy at {rest.url}", flush=True)
        while not stop.requested:
            time.sleep(POLL_MS / 1000)
        server.close()
    note("serve", "stopped by a signal; the broker is closed")
    return 0


# ---- follow (logkit.Follower: a replica of another broker) -------------------------------

SECRET_ENV = "LOGKIT_REPLICATION_SECRET"


def add_follow(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("source", metavar="SOURCE",
                     help="the leader: its directory, or tcp://HOST:PORT of its "
                     "broker.serve_replication()")
    cmd.add_argument("directory", metavar="DIR",
                     help="the follower's broker directory (created when missing)")
    cmd.add_argument("--secret-file", metavar="FILE",
                     help=f"a file holding the replication secret of a tcp:// source "
                     f"(default: the {SECRET_ENV} environment variable)")
    cmd.add_argument("--tls-cafile", metavar="FILE",
                     help="connect to a tcp:// source with TLS, trusting the CA "
                     "certificate(s) in FILE")
    cmd.add_argument("--config", action="append", metavar="KEY=VALUE",
                     help="a broker setting, Kafka's names, e.g. "
                     "replica.fetch.max.bytes=4194304 (repeatable)")
    cmd.add_argument("--serve", metavar="[HOST:]PORT",
                     help="also serve Kafka's wire protocol on HOST:PORT (127.0.0.1 by "
                     "default): it sends clients to the leader until this replica is "
                     "promoted, then answers as the leader (set broker.id with --config)")
    _storage_option(cmd)


def _follow_source(args: argparse.Namespace) -> Any:
    from . import DirectorySource, TcpSource
    if "://" in args.source and not args.source.startswith("tcp://"):
        if args.secret_file or args.tls_cafile:
            raise UsageError("--secret-file and --tls-cafile are for a tcp:// source")
        return ObjectStoreSource(args.source,
                                 storage_options=_storage_options(args.storage_option))
    if args.storage_option:
        raise UsageError("--storage-option is for an object store URL (s3://, file://, ...)")
    if not args.source.startswith("tcp://"):
        if args.secret_file or args.tls_cafile:
            raise UsageError("--secret-file and --tls-cafile are for a tcp:// source")
        return DirectorySource(args.source)
    host, sep, port = args.source[len("tcp://"):].rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UsageError(f"a TCP source is tcp://HOST:PORT, got {args.source!r}")
    if args.secret_file:
        with open(args.secret_file, "rb") as f:
            secret = f.read().rstrip(b"\r\n")
    else:
        secret = os.environ.get(SECRET_ENV, "").encode()
    if not secret:
        raise UsageError(f"a tcp:// source needs the replication secret: --secret-file "
                         f"FILE or the {SECRET_ENV} environment variable")
    context = None
    if args.tls_cafile:
        import ssl
        context = ssl.create_default_context(cafile=args.tls_cafile)
    return TcpSource(host.strip("[]"), int(port), secret=secret, ssl_context=context)


def cmd_follow(args: argparse.Namespace) -> int:
    from . import Follower
    config = _config_pairs(args.config, "--config")
    follower = Follower(args.directory, _follow_source(args), config=config or None)
    server = None
    if args.serve:
        host, _, port = args.serve.rpartition(":")
        if not port.isdigit():
            raise UsageError(f"--serve takes [HOST:]PORT, got {args.serve!r}")
    with _stop_on_signals() as stop:
        follower.start()
        try:
            if args.serve:
                server = follower.serve(host.strip("[]") or "127.0.0.1", int(port))
                print(f"serving Kafka clients on {server.bootstrap_servers}", flush=True)
            print(f"following {args.source} into {args.directory}", flush=True)
            # once promoted, a serving follower goes on serving, as the leader
            while not stop.requested and (follower.running or (
                    server is not None and follower.promoted.is_set())):
                time.sleep(POLL_MS / 1000)
        finally:
            if server is not None:
                server.close()
            follower.stop()
    if follower.error is not None:
        raise follower.error
    note("follow", "stopped by a signal; the directory is released")
    return 0


# ---- promote (Follower.promote: a replica becomes the leader) ----------------------------

def add_promote(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("directory", metavar="DIR",
                     help="a follower's directory (one `logkit follow` or logkit.Follower "
                     "filled; its follower must be stopped)")
    cmd.add_argument("--unclean", action="store_true",
                     help="promote even when the leader cannot be reached to take its "
                     "lease (Kafka's unclean.leader.election.enable: a leader still alive "
                     "there is then not fenced)")
    cmd.add_argument("--secret-file", metavar="FILE",
                     help=f"for a follower of tcp://: the replication secret (default: the "
                     f"{SECRET_ENV} environment variable)")
    cmd.add_argument("--tls-cafile", metavar="FILE",
                     help="for a follower of tcp://: TLS, trusting the CA certificate(s) in "
                     "FILE")
    _storage_option(cmd)


_RECORDED_SOURCES = {"DirectorySource(": "", "TcpSource(": "tcp://",
                     "ObjectStoreSource(": ""}


def _promote_source(args: argparse.Namespace) -> Any:
    """The source DIR's follower last used (the lease is taken there), opened with the
    command's --secret-file, --tls-cafile and --storage-option."""
    import ast

    from . import Follower
    described = Follower.recorded_source(args.directory)
    if described is None:
        raise UsageError(f"{args.directory} is not a follower's directory (no leader "
                         "recorded in its follower.json)")
    for prefix, scheme in _RECORDED_SOURCES.items():
        if described.startswith(prefix) and described.endswith(")"):
            try:
                where = ast.literal_eval(described[len(prefix):-1])
            except (ValueError, SyntaxError):
                break
            source = argparse.Namespace(**{**vars(args), "source": scheme + str(where)})
            return _follow_source(source)
    raise UsageError(f"{args.directory} follows a leader this command cannot open: "
                     f"{described!r}")


def cmd_promote(args: argparse.Namespace) -> int:
    from . import Follower
    source = _promote_source(args)
    Follower(args.directory, source, auto_promote=False).promote(unclean=args.unclean)
    with Broker(args.directory, read_only=True) as broker:
        epochs = {broker.topic(name).partition(n).leader_epoch
                  for name in broker.topics()
                  for n in range(broker.topic(name).num_partitions)}
    epoch = f" in leader epoch {max(epochs)}" if epochs else ""
    print(f"{args.directory} is the leader{epoch} (was following {source.describe()}); "
          "open it with logkit.Broker or `logkit serve`", flush=True)
    return 0


# ---- mirror (logkit.mirror: the way out to a Kafka cluster) -------------------------------

def add_mirror(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("directory", help="the broker directory to copy from (--to) or "
                     "into (--from)")
    way = cmd.add_mutually_exclusive_group(required=True)
    way.add_argument("--to", metavar="BOOTSTRAP",
                     help="bootstrap servers of the target Kafka cluster (host:port,...)")
    way.add_argument("--from", dest="source", metavar="BOOTSTRAP",
                     help="the other direction: pull the topics of the Kafka cluster at "
                     "BOOTSTRAP into DIRECTORY (created when missing), to replay them "
                     "locally")
    cmd.add_argument("--topics", default=None,
                     help="comma-separated topics to copy (default: every topic)")
    cmd.add_argument("--groups", action="store_true",
                     help="also copy every consumer group's committed offsets, translated "
                     "to the target's offsets")
    cmd.add_argument("--client-config", action="append", default=[], metavar="KEY=VALUE",
                     help="a confluent-kafka setting for the Kafka cluster "
                     "(security.protocol, sasl.username, ...); repeatable")
    cmd.add_argument("--topic-config", action="append", default=[], metavar="KEY=VALUE",
                     help="with --from: a config override for the topics it creates "
                     "(retention.ms=-1 keeps old records from time retention); repeatable")


def _key_values(option: str, items: Sequence[str]) -> dict[str, str]:
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} takes KEY=VALUE, got {item!r}")
        settings[key] = value
    return settings


def cmd_mirror(args: argparse.Namespace) -> int:
    settings = _key_values("--client-config", args.client_config)
    topic_config = _key_values("--topic-config", args.topic_config)
    if topic_config and not args.source:
        raise UsageError("--topic-config goes with --from (the topics created locally)")
    topics = [t for t in args.topics.split(",") if t] if args.topics else None
    with Broker(args.directory) as broker:
        if args.source:
            report = mirror_from(args.source, broker, topics=topics, groups=args.groups,
                                 client_config=settings, config=topic_config)
        else:
            report = mirror(broker, args.to, topics=topics, groups=args.groups,
                            client_config=settings)
    for topic, partitions in sorted(report["records"].items()):
        print(f"{topic}: {sum(partitions.values())} record(s) copied")
    for group, count in sorted(report["offsets"].items()):
        print(f"group {group}: {count} committed offset(s) copied")
    return 0


# ---- restore (an object store that broker.ship() fills) ---------------------------------

def _storage_option(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                     help="for an object store URL: an fsspec storage option, the value as "
                     "JSON when it parses (endpoint_url=http://127.0.0.1:9000, anon=true); "
                     "repeatable; default: fsspec's configuration and the environment")


def _storage_options(items: Sequence[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--storage-option takes KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def add_restore(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("url", metavar="URL", help="where the leader ships (any fsspec URL: "
                     "s3://bucket/prefix, file:///backups/data)")
    cmd.add_argument("directory", metavar="DIR",
                     help="the broker directory to write (missing or empty)")
    _storage_option(cmd)
    cmd.add_argument("--timeout", type=float, default=600.0, metavar="S",
                     help="give up after S seconds (default 600)")


def cmd_restore(args: argparse.Namespace) -> int:
    options = _storage_options(args.storage_option)
    with ObjectStoreSource(args.url, storage_options=options) as source:
        summary = source.restore(args.directory, timeout=args.timeout)
    print(f"restored {summary['topics']} topic(s), {summary['partitions']} partition(s), "
          f"{summary['groups']} group(s) from manifest generation "
          f"{summary['generation']} into {args.directory}")
    return 0


# ---- consume -----------------------------------------------------------------------------

class _Stop:
    """Set by SIGINT/SIGTERM while consuming: the loop ends at its next step."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.requested = True


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[_Stop]:
    stop = _Stop()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start_offset(text: str | None) -> str | int | None:
    if text is None or text in ("earliest", "latest"):
        return text
    try:
        offset = int(text)
    except ValueError:
        offset = -1
    if offset < 0:
        raise UsageError(f"--offset takes an offset >= 0, 'earliest' or 'latest', "
                         f"got {text!r}")
    return offset


def cmd_consume(args: argparse.Namespace) -> int:
    offset = _start_offset(args.offset)
    if offset is not None and args.partition is None:
        raise UsageError("--offset needs --partition (an offset belongs to one partition)")
    if args.max_messages is not None and args.max_messages < 1:
        raise UsageError("--max-messages must be >= 1")
    reset = "earliest" if args.from_beginning else "latest"
    printed = 0
    with _broker(args.directory, write=args.group is not None) as broker, \
            _stop_on_signals() as stop:
        topic = broker.topic(args.topic)              # UnknownTopicError: exit 1
        if args.format in SCHEMA_FORMATS:
            args.value_decoder = _schema_decoder(broker, args.topic, args.format)
            args.key_decoder = _schema_decoder(broker, args.topic, args.format,
                                               is_key=True)
        manual = args.group is None or args.partition is not None
        consumer = broker.consumer(group_id=args.group, auto_offset_reset=reset,
                                   enable_auto_commit=False,
                                   isolation_level=args.isolation_level)
        if manual:
            numbers = [args.partition] if args.partition is not None \
                else range(topic.num_partitions)
            tps = [topic.partition(n).topic_partition for n in numbers]
            consumer.assign(tps)
            if offset == "earliest" or (offset is None and args.from_beginning
                                        and args.group is None):
                consumer.seek_to_beginning(*tps)
            elif offset == "latest" or (offset is None and args.group is None):
                consumer.seek_to_end(*tps)
            elif isinstance(offset, int):
                consumer.seek(tps[0], offset)
        else:
            consumer.subscribe([args.topic])
        ends: dict[TopicPartition, int] = {}
        committed: dict[TopicPartition, int] = {}
        cut = False                     # --max-messages left polled records unprinted
        idle_since = time.monotonic()
        out = sys.stdout
        while not stop.requested:
            records = consumer.poll(timeout_ms=POLL_MS)
            if args.max_messages is not None:
                cut = cut or len(records) > args.max_messages - printed
                records = records[:args.max_messages - printed]
            for record in records:
                out.write(format_record(record, args) + "\n")
            if records:
                out.flush()
                printed += len(records)
                idle_since = time.monotonic()
                if args.group is not None:
                    committed.update(_next_offsets(records))
                    consumer.commit(_next_offsets(records))
            if args.max_messages is not None and printed >= args.max_messages:
                break
            if args.follow:
                continue
            for tp in consumer.assignment():
                if tp not in ends:         # the LSO for read_committed (its end now)
                    ends[tp] = consumer.end_offsets([tp])[tp]
            if ends and all(consumer.position(tp) >= end for tp, end in ends.items()
                            if tp in consumer.assignment()):
                break
            if (time.monotonic() - idle_since) * 1000 >= args.timeout_ms:
                break
        if args.group is not None and not cut:
            _commit_past_gaps(consumer, topic, committed)
        consumer.close(autocommit=False)
    if stop.requested:
        note("consume", f"stopped by a signal after {printed} record(s)")
    return 0


def _commit_past_gaps(consumer: Any, topic: Any, committed: dict[TopicPartition, int]
                      ) -> None:
    """Commit the positions that moved past offsets with no record (a compacted topic's
    removed records) after the last record printed, so the group's lag is what is left
    to read; a partition the consumer never moved in keeps no commit."""
    moved = {}
    for tp in consumer.assignment():
        position = consumer.position(tp)
        if position > committed.get(tp, topic.partition(tp.partition).log_start_offset):
            moved[tp] = position
    if moved:
        consumer.commit(moved)


def _next_offsets(records: Sequence[Record]) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    for record in records:
        out[TopicPartition(record.topic, record.partition)] = record.offset + 1
    return out


# ---- groups ------------------------------------------------------------------------------

def _require_group(broker: Broker, group_id: str) -> Any:
    """The group, or LogkitError when the broker knows nothing of it (Kafka's "Dead"
    state: never used, deleted or misspelt), with the closest known ids."""
    group = broker.group(group_id)
    if group.state != "Dead":
        return group
    known = broker.groups()
    close = difflib.get_close_matches(group_id, known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else \
        f"; known groups: {', '.join(known) if known else 'none'}"
    raise LogkitError(f"consumer group {group_id!r} does not exist (state Dead: no "
                      f"members, no committed offsets){hint}")


def cmd_groups_list(args: argparse.Namespace) -> int:
    with _broker(args.directory) as broker:
        rows = []
        for group_id in broker.groups():
            group = broker.group(group_id)
            rows.append({"group": group_id, "state": group.state,
                         "members": len(group.members())})
    if args.json:
        print_json(rows)
    elif args.state:
        print_table(["GROUP", "STATE", "MEMBERS"],
                    [(r["group"], r["state"], r["members"]) for r in rows])
    else:
        for row in rows:
            print(row["group"])
    return 0


def cmd_groups_describe(args: argparse.Namespace) -> int:
    with _broker(args.directory) as broker:
        group = _require_group(broker, args.group)
        state, generation = group.state, group.generation
        members = group.members()
        owner = {tp: m for m in members for tp in m.assignment}
        committed = group.committed()
        rows = []
        for tp, lag in sorted(group.lag().items()):
            end = broker.topic(tp.topic).partition(tp.partition).high_watermark
            member = owner.get(tp)
            rows.append({"group": args.group, "topic": tp.topic, "partition": tp.partition,
                         "current_offset": committed.get(tp), "log_end_offset": end,
                         "lag": lag, "consumer_id": member and member.member_id,
                         "host": member and member.host,
                         "client_id": member and member.client_id})
    if args.json:
        print_json({"group": args.group, "state": state, "generation": generation,
                    "members": [m.member_id for m in members], "partitions": rows})
        return 0
    if not members:
        note("groups describe", f"consumer group {args.group!r} has no active members "
             f"(state {state})")
    print_table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                 "CONSUMER-ID", "HOST", "CLIENT-ID"],
                [tuple(r.values()) for r in rows])
    return 0


def _reset_targets(broker: Broker, group: Any, args: argparse.Namespace
                   ) -> dict[TopicPartition, int]:
    if args.all_topics:
        names = sorted({tp.topic for tp in group.lag()})
        if not names:
            raise LogkitError(f"consumer group {args.group!r} has no committed offsets "
                              "and no subscriptions; name topics with --topic")
    else:
        names = list(dict.fromkeys(args.topic))
    targets = {}
    for name in names:
        for p in broker.topic(name).partitions:
            start, end = p.log_start_offset, p.high_watermark
            if args.to_earliest:
                target = start
            elif args.to_latest:
                target = end
            else:
                target = min(max(args.to_offset, start), end)
                if target != args.to_offset:
                    note("groups reset-offsets", f"{name}-{p.topic_partition.partition}: "
                         f"offset {args.to_offset} is outside [{start}, {end}]; using "
                         f"{target}")
            targets[p.topic_partition] = target
    return targets


def cmd_groups_reset_offsets(args: argparse.Namespace) -> int:
    if args.to_offset is not None and args.to_offset < 0:
        raise UsageError("--to-offset takes an offset >= 0")
    with _broker(args.directory, write=args.execute) as broker:
        group = broker.group(args.group)
        if group.state == "Stable":
            # Kafka's rule, and logkit's: offsets move only while nobody consumes
            members = ", ".join(m.member_id for m in group.members())
            raise LogkitError(f"consumer group {args.group!r} has active members "
                              f"({members}); offsets can be reset only when it is inactive "
                              "(stop its consumers, or wait for their session timeout)")
        targets = _reset_targets(broker, group, args)
        if args.execute:
            group.reset_offsets(targets)
    print_table(["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
                [(args.group, tp.topic, tp.partition, offset)
                 for tp, offset in sorted(targets.items())])
    if not args.execute:
        note("groups reset-offsets", "dry run: nothing committed; add --execute to commit "
             "these offsets")
    return 0


def cmd_groups_delete(args: argparse.Namespace) -> int:
    with _broker(args.directory, write=True) as broker:
        _require_group(broker, args.group).delete()
    print(f"Deleted consumer group {args.group}.")
    return 0


# ---- schemas (the embedded schema registry: broker.schema_registry()) ---------------------

SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
MAX_SCHEMA_BYTES = 1 << 20        # the registry's own bound on schema text (docs/schemas.md)


def _schema_text(source: str) -> str:
    """The schema text in file `source`, or stdin for `-`, bounded like the registry."""
    if source == "-":
        text = sys.stdin.read(MAX_SCHEMA_BYTES + 1)
    else:
        with open(source, encoding="utf-8") as f:
            text = f.read(MAX_SCHEMA_BYTES + 1)
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise LogkitError(f"schema text from {source} is over {MAX_SCHEMA_BYTES} bytes")
    if not text.strip():
        raise LogkitError(f"no schema text in {'stdin' if source == '-' else source}")
    return text


def _version_arg(text: str | None) -> str | int | None:
    if text is None or text == "latest":
        return text
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1 and number != -1:
        raise UsageError(f"--version takes a version >= 1, -1 or 'latest', got {text!r}")
    return "latest" if number == -1 else number


def _registered_json(found: Any) -> dict[str, Any]:
    return {"subject": found.subject, "version": found.version, "id": found.schema_id,
            "schemaType": found.schema_type, "schema": found.schema,
            "references": [list(r) for r in found.references], "deleted": found.deleted}


def cmd_schemas_list(args: argparse.Namespace) -> int:
    with _broker(args.directory) as broker:
        registry = broker.schema_registry()
        rows = []
        for subject in registry.subjects(deleted=args.deleted, prefix=args.prefix):
            versions = registry.versions(subject, deleted=args.deleted)
            latest = registry.version(subject, versions[-1], deleted=True)
            rows.append({"subject": subject, "versions": versions,
                         "latest_id": latest.schema_id, "type": latest.schema_type,
                         "compatibility": registry.compatibility(subject)})
    if args.json:
        print_json(rows)
    else:
        print_table(["SUBJECT", "VERSIONS", "LATEST-ID", "TYPE", "COMPATIBILITY"],
                    [(r["subject"], len(r["versions"]), r["latest_id"], r["type"],
                      r["compatibility"]) for r in rows])
    return 0


def cmd_schemas_show(args: argparse.Namespace) -> int:
    version = _version_arg(args.version)
    with _broker(args.directory) as broker:
        registry = broker.schema_registry()
        if version is None:
            found = [registry.version(args.subject, v, deleted=True)
                     for v in registry.versions(args.subject, deleted=args.deleted)]
        else:
            found = [registry.version(args.subject, version, deleted=args.deleted)]
    if args.json:
        shown = [_registered_json(f) for f in found]
        print_json(shown[0] if version is not None else shown)
    elif version is None:
        print_table(["SUBJECT", "VERSION", "ID", "TYPE", "DELETED"],
                    [(f.subject, f.version, f.schema_id, f.schema_type,
                      "yes" if f.deleted else "-") for f in found])
    else:
        one = found[0]
        print(f"subject: {one.subject}  version: {one.version}  id: {one.schema_id}  "
              f"type: {one.schema_type}"
              + "".join(f"\nreference: {r.name} -> {r.subject} version {r.version}"
                        for r in one.references))
        print(one.schema.rstrip("\n"))
    return 0


def cmd_schemas_register(args: argparse.Namespace) -> int:
    text = _schema_text(args.file)
    with _creating_broker(args.directory) as broker:
        found = broker.schema_registry().register_version(args.subject, text, args.type)
    if args.json:
        print_json({"subject": found.subject, "version": found.version,
                    "id": found.schema_id})
    else:
        print(found.schema_id)
        note("schemas register", f"subject {found.subject!r} version {found.version}, "
             f"schema id {found.schema_id}")
    return 0


def cmd_schemas_check(args: argparse.Namespace) -> int:
    text = _schema_text(args.file)
    version = _version_arg(args.version)
    with _broker(args.directory) as broker:
        registry = broker.schema_registry()
        problems = registry.incompatibilities(args.subject, text, args.type,
                                              version=version)
        level = registry.compatibility(args.subject)
    if args.json:
        print_json({"subject": args.subject, "compatibility": level,
                    "is_compatible": not problems, "messages": problems})
    elif problems:
        for problem in problems:
            print(f"incompatible: {problem}")
    else:
        print(f"compatible with subject {args.subject!r} "
              f"({'version ' + str(version) if version else 'level ' + level})")
    return 1 if problems else 0


def cmd_schemas_delete(args: argparse.Namespace) -> int:
    with _broker(args.directory, write=True) as broker:
        registry = broker.schema_registry()
        if args.version is None:
            versions = registry.delete_subject(args.subject, permanent=args.permanent)
        else:
            versions = [registry.delete_version(args.subject, _version_arg(args.version),
                                                permanent=args.permanent)]
    how = "permanently deleted" if args.permanent else "soft deleted"
    if args.json:
        print_json({"subject": args.subject, "versions": versions,
                    "permanent": args.permanent})
    else:
        print(f"{how}: subject {args.subject!r} version(s) "
              f"{', '.join(map(str, versions))}")
    return 0


def cmd_schemas_config(args: argparse.Namespace) -> int:
    if args.level is not None and args.reset:
        raise UsageError("--level sets a level and --reset drops it: give one")
    with _broker(args.directory, write=args.level is not None or args.reset) as broker:
        registry = broker.schema_registry()
        if args.level is not None:
            registry.set_compatibility(args.level, args.subject)
        elif args.reset:
            registry.delete_compatibility(args.subject)
        level = registry.compatibility(args.subject)
        own = None if args.subject is None else _own_level(registry, args.subject)
    if args.json:
        shown: dict[str, Any] = {"subject": args.subject, "compatibility": level}
        if own is not None:
            shown["own"] = own
        print_json(shown)
    elif args.subject is None:
        print(f"global compatibility: {level}")
    else:
        print(f"subject {args.subject!r} compatibility: {level}"
              + ("" if own else " (the global level)"))
    return 0


def _own_level(registry: Any, subject: str) -> bool:
    """Has `subject` a compatibility level of its own (else the global one applies)?"""
    from .serde import SubjectConfigNotFoundError
    try:
        registry.compatibility(subject, default_to_global=False)
    except SubjectConfigNotFoundError:
        return False
    return True


def _subject(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("subject", metavar="SUBJECT", help="the subject, e.g. orders-value")


def _schema_source(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("file", metavar="FILE", nargs="?", default="-",
                     help="the schema text: an .avsc, a JSON Schema, a .proto; - or "
                     "none: stdin")
    cmd.add_argument("--type", default="AVRO", choices=SCHEMA_TYPES, type=str.upper,
                     help="the schema's type (default AVRO)")


def add_schemas_list(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    cmd.add_argument("--prefix", default="", help="only subjects starting with this")
    cmd.add_argument("--deleted", action="store_true", help="include soft-deleted ones")
    _json(cmd)


def add_schemas_show(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    _subject(cmd)
    cmd.add_argument("--version", metavar="V",
                     help="one version (a number or latest): its id, type and schema "
                     "text (without: the subject's versions)")
    cmd.add_argument("--deleted", action="store_true", help="include soft-deleted ones")
    _json(cmd)


def add_schemas_register(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    _subject(cmd)
    _schema_source(cmd)
    _json(cmd)


def add_schemas_check(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    _subject(cmd)
    _schema_source(cmd)
    cmd.add_argument("--version", metavar="V",
                     help="check against this version only (a number or latest); "
                     "default: the versions the subject's level compares")
    _json(cmd)


def add_schemas_delete(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    _subject(cmd)
    cmd.add_argument("--version", metavar="V",
                     help="delete this version only (a number or latest); default: every "
                     "version of the subject")
    cmd.add_argument("--permanent", action="store_true",
                     help="remove for good what was soft deleted before (as Confluent, a "
                     "live version must be soft deleted first)")
    _json(cmd)


def add_schemas_config(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    cmd.add_argument("subject", metavar="SUBJECT", nargs="?",
                     help="the subject (default: the global level)")
    cmd.add_argument("--level", metavar="LEVEL",
                     help="set the level: NONE, BACKWARD, FORWARD, FULL, or one of the "
                     "last three with _TRANSITIVE (docs/schemas.md)")
    cmd.add_argument("--reset", action="store_true",
                     help="drop the subject's own level (it follows the global one), or "
                     "reset the global level to BACKWARD")
    _json(cmd)


SCHEMAS = (
    Command("list", "list the subjects of the schema registry",
            "logkit schemas list data/", add_schemas_list, cmd_schemas_list),
    Command("show", "a subject's versions, or one version with its id, type and schema",
            "logkit schemas show data/ orders-value --version latest", add_schemas_show,
            cmd_schemas_show),
    Command("register", "register a schema under a subject (checked against the "
            "subject's compatibility level); prints its id",
            "logkit schemas register data/ orders-value order.avsc\n"
            "logkit schemas register data/ orders-value --type PROTOBUF < order.proto",
            add_schemas_register, cmd_schemas_register),
    Command("check", "is a schema compatible with a subject? prints each rule broken "
            "and exits 1 when it is not", "logkit schemas check data/ orders-value "
            "order-v2.avsc", add_schemas_check, cmd_schemas_check),
    Command("delete", "soft delete a subject or one version of it; --permanent removes "
            "what was soft deleted", "logkit schemas delete data/ orders-value --version 2"
            "\nlogkit schemas delete data/ orders-value --version 2 --permanent",
            add_schemas_delete, cmd_schemas_delete),
    Command("config", "show or set the compatibility level, global or a subject's",
            "logkit schemas config data/\n"
            "logkit schemas config data/ orders-value --level FULL_TRANSITIVE",
            add_schemas_config, cmd_schemas_config),
)


# ---- describe, dump, bench, completion ---------------------------------------------------

def cmd_replicas(args: argparse.Namespace) -> int:
    with _broker(args.directory) as broker:
        rows = broker.describe_replicas()
    if args.json:
        print_json(rows)
        return 0
    table = []
    for row in rows:
        followers = ",".join(f"{name}:{f['log_end_offset']}(lag:{f['lag']}"
                             f"{'' if f['assigned'] else ',extra'})"
                             for name, f in row["followers"].items())
        table.append((f"{row['topic']}-{row['partition']}", row["replication_factor"],
                      ",".join(row["replicas"]), ",".join(row["isr"]),
                      row["log_end_offset"], row["high_watermark"],
                      ",".join(f"{e}@{o}" for e, o in row["leader_epochs"]),
                      followers or None))
    print_table(("partition", "rf", "replicas", "isr", "log_end", "high_watermark",
                 "epochs", "followers"), table)
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    args.configs = False
    return cmd_topics_describe(args)


def cmd_dump(args: argparse.Namespace) -> int:
    path = args.segment
    size = os.stat(path).st_size
    if size == 0:
        print(f"{path}: empty")
        return 0
    batches = records = 0
    for batch in iter_segment_batches(path, decode=args.records):
        header = batch.header
        print(f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} "
              f"count: {header.records_count} position: {batch.position} "
              f"size: {header.size} codec: {header.codec} "
              f"maxTimestamp: {header.max_timestamp} crc: {header.crc} "
              f"isControl: {header.is_control}")
        for r in batch.records or ():
            print(f"| offset: {r.offset} timestamp: {r.timestamp} "
                  f"key: {_show(r.key)} value: {_show(r.value)}"
                  + (f" headers: {list(r.headers)}" if r.headers else ""))
        batches += 1
        records += header.records_count
    print(f"{batches} batch(es), {records} record(s), {size} bytes: all CRCs valid")
    return 0


def _show(data: bytes | None, limit: int = 60) -> str:
    if data is None:
        return "null"
    text = repr(data)
    return text if len(text) <= limit else text[:limit] + "..."


def _benchmarks() -> Any:
    """The `benchmarks` package, or None. It is not part of the installed library: it is
    the benchmarks/ folder of the source checkout, found on sys.path (`python -m`
    from the checkout's root) or beside the `logkit/` this module was loaded from (an
    editable install)."""
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isfile(os.path.join(checkout, "benchmarks", "__init__.py")) \
            and checkout not in sys.path:
        sys.path.append(checkout)
    try:
        import benchmarks
    except ImportError:
        return None
    return benchmarks if hasattr(benchmarks, "run_from_args") else None


BENCH_MISSING = ("the benchmark suite is not installed with logkit: it is the benchmarks/ "
                 "folder of a source checkout (git clone, then `make bench` or "
                 "`python -m benchmarks --help` from its root)")


def cmd_bench(args: argparse.Namespace) -> int:
    suite = _benchmarks()
    if suite is None:
        print(f"logkit bench: {BENCH_MISSING}", file=sys.stderr)
        return 1
    return suite.run_from_args(args)


def add_bench(cmd: argparse.ArgumentParser) -> None:
    suite = _benchmarks()
    if suite is None:
        cmd.description = f"{cmd.description}. Not available here: {BENCH_MISSING}."
        cmd.add_argument("benchmarks", nargs="*")
    else:
        suite.build_parser(cmd)


COMPLETION_TEMPLATE = """\
# bash completion for logkit; generated by `logkit completion bash`.
# Load it with:  eval "$(logkit completion bash)"   (or save it in
# ~/.local/share/bash-completion/completions/logkit)
_logkit_complete() {
    local cur="${COMP_WORDS[COMP_CWORD]}" path="" word i
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${COMP_WORDS[i]}"
        case "$path/$word" in
%(paths)s) path="$path/$word" ;;
        esac
    done
    local words=""
    case "$path" in
%(words)s
    esac
    if [[ "$cur" == -* || "$words" != -* ]]; then
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
    fi
}
complete -o default -F _logkit_complete logkit
"""


def completion_script() -> str:
    """A bash completion script for the commands of COMMANDS: commands and subcommands
    by position, options after them, file names (directories, segments) otherwise."""
    parsers: dict[str, argparse.ArgumentParser] = {}
    build_parser(parsers)
    entries: dict[str, list[str]] = {}
    for path, parser in parsers.items():
        children = [p.rsplit("/", 1)[1] for p in parsers
                    if p.rsplit("/", 1)[0] == path and p != path]
        options = re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", parser.format_usage())
        entries[path] = children + list(dict.fromkeys(options))
    paths = " | ".join(f'"{p}"' for p in sorted(entries) if p)
    words = "\n".join(f'        "{p}") words="{" ".join(w)}" ;;' for p, w in
                      sorted(entries.items()))
    return COMPLETION_TEMPLATE % {"paths": "            " + paths, "words": words}


def cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(completion_script())
    return 0


# ---- the command table -------------------------------------------------------------------

def _directory(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("directory", metavar="DIR", help="the broker's root directory")


def _json(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--json", action="store_true", help="print JSON")


def add_topics_list(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    _json(cmd)


def add_topics_create(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    cmd.add_argument("topic", metavar="TOPIC")
    cmd.add_argument("--partitions", type=int, metavar="N",
                     help="number of partitions (default: the broker's num.partitions)")
    cmd.add_argument("--config", action="append", metavar="KEY=VALUE",
                     help="a topic config override, Kafka's names (repeatable)")
    cmd.add_argument("--if-not-exists", action="store_true",
                     help="succeed without change when the topic exists")


def add_topics_delete(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    cmd.add_argument("topic", metavar="TOPIC")
    cmd.add_argument("--if-exists", action="store_true",
                     help="succeed when there is no such topic")


def add_topics_describe(cmd: argparse.ArgumentParser, *, optional_topic: bool = True
                        ) -> None:
    _directory(cmd)
    if optional_topic:
        cmd.add_argument("topic", metavar="TOPIC", nargs="?",
                         help="one topic (default: every topic)")
        cmd.add_argument("--configs", action="store_true",
                         help="every topic config with its value, defaults included")
    else:
        cmd.add_argument("topic", metavar="TOPIC")
    _json(cmd)


def add_topics_compact(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    cmd.add_argument("topic", metavar="TOPIC")
    cmd.add_argument("--partition", type=int, metavar="N",
                     help="only partition N (default: every partition)")
    _json(cmd)


def add_topics_alter(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    cmd.add_argument("topic", metavar="TOPIC")
    cmd.add_argument("--partitions", type=int, metavar="N", required=True,
                     help="the new total number of partitions (more than it has)")


def add_topics_alter_config(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    cmd.add_argument("topic", metavar="TOPIC")
    cmd.add_argument("--add-config", action="append", metavar="KEY=VALUE[,...]",
                     help="set overrides (repeatable)")
    cmd.add_argument("--delete-config", action="append", metavar="KEY[,...]",
                     help="drop overrides: back to the default (repeatable)")


def add_produce(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    cmd.add_argument("topic", metavar="TOPIC")
    cmd.add_argument("--key-separator", metavar="SEP",
                     help="each line is KEY<SEP>VALUE (without it: the line is the value)")
    cmd.add_argument("--headers", action="store_true",
                     help="each line starts with headers then a tab: h1:v1,h2:v2<TAB>...")
    cmd.add_argument("--json", action="store_true",
                     help='each line is a JSON object: {"key", "value", "headers", '
                          '"partition", "timestamp"} (values as text or {"base64": ...})')
    cmd.add_argument("--acks", default="1", choices=["0", "1", "all"],
                     help="as the producer's acks (default 1)")


def add_consume(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    cmd.add_argument("topic", metavar="TOPIC")
    cmd.add_argument("--from-beginning", action="store_true",
                     help="start at the earliest offset when there is no committed one "
                          "(default: only records produced from now on)")
    cmd.add_argument("--group", metavar="G",
                     help="consume as a member of group G, committing what is printed")
    cmd.add_argument("--partition", type=int, metavar="N", help="only partition N")
    cmd.add_argument("--offset", metavar="N",
                     help="start at offset N (or earliest, latest) of --partition")
    cmd.add_argument("--max-messages", type=int, metavar="N", help="stop after N records")
    cmd.add_argument("--follow", action="store_true",
                     help="keep waiting for new records, like tail -f (stop with Ctrl-C)")
    cmd.add_argument("--timeout-ms", type=int, default=DEFAULT_IDLE_MS, metavar="MS",
                     help=f"without --follow, stop after MS without a record (default "
                          f"{DEFAULT_IDLE_MS}); it stops sooner at the end of the log")
    cmd.add_argument("--format", default="value", choices=list(FORMATS),
                     help="value: the value; kv: key, separator, value; json: one JSON "
                          "object per record; avro, json-schema, protobuf: as json with "
                          "the value decoded from Confluent's wire format through the "
                          "directory's schema registry, and the key too when it is in "
                          "that format (else as text) (default value)")
    cmd.add_argument("--key-separator", default="\t", metavar="SEP",
                     help="the separator of --format kv (default a tab)")
    cmd.add_argument("--isolation-level", default="read_uncommitted",
                     choices=["read_uncommitted", "read_committed"],
                     help="read_committed prints only committed transactions' records "
                          "and stops at the last stable offset (default "
                          "read_uncommitted: every record; never a transaction marker)")


def add_groups_list(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    cmd.add_argument("--state", action="store_true", help="a table with state and members")
    _json(cmd)


def add_groups_describe(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    cmd.add_argument("group", metavar="GROUP")
    _json(cmd)


def add_groups_reset_offsets(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    cmd.add_argument("group", metavar="GROUP")
    to = cmd.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="each partition's log start")
    to.add_argument("--to-latest", action="store_true", help="each partition's end")
    to.add_argument("--to-offset", type=int, metavar="N",
                    help="offset N in every partition (kept within its log)")
    scope = cmd.add_mutually_exclusive_group(required=True)
    scope.add_argument("--topic", action="append", metavar="TOPIC",
                       help="every partition of TOPIC (repeatable)")
    scope.add_argument("--all-topics", action="store_true",
                       help="every topic the group subscribes to or has committed on")
    cmd.add_argument("--execute", action="store_true",
                     help="commit the new offsets (without it: a dry run that prints them)")


def add_groups_delete(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    cmd.add_argument("group", metavar="GROUP")


def add_replicas(cmd: argparse.ArgumentParser) -> None:
    _directory(cmd)
    _json(cmd)


def add_describe(cmd: argparse.ArgumentParser) -> None:
    add_topics_describe(cmd, optional_topic=False)


def add_dump(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("segment", metavar="SEGMENT",
                     help="path of a NNNNNNNNNNNNNNNNNNNN.log file")
    cmd.add_argument("--records", action="store_true", help="print every record")


def add_completion(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("shell", choices=["bash"], help="the shell (bash; zsh loads it with "
                     "bashcompinit)")


TOPICS = (
    Command("list", "list the topics", "logkit topics list data/", add_topics_list,
            cmd_topics_list),
    Command("create", "create a topic", "logkit topics create data/ orders --partitions 3 "
            "--config retention.ms=86400000", add_topics_create, cmd_topics_create),
    Command("delete", "delete a topic and its records", "logkit topics delete data/ orders",
            add_topics_delete, cmd_topics_delete),
    Command("describe", "offsets and sizes of each partition (or --configs: the settings)",
            "logkit topics describe data/ orders", add_topics_describe, cmd_topics_describe),
    Command("compact", "one log-cleaning pass of a compacted topic's partitions now "
            "(cleanup.policy compact or compact,delete): the latest record of each key "
            "stays; prints records and bytes before and after",
            "logkit topics compact data/ users --partition 0", add_topics_compact,
            cmd_topics_compact),
    Command("alter", "grow a topic to --partitions N (Kafka's kafka-topics --alter "
            "--partitions): partitions are added, never removed; keyed records map by the "
            "new count from then on", "logkit topics alter data/ orders --partitions 6",
            add_topics_alter, cmd_topics_alter),
    Command("alter-config", "change a topic's config overrides (Kafka's kafka-configs "
            "--alter); brokers that have the topic open apply them too, within "
            "log.flush.scheduler.interval.ms",
            "logkit topics alter-config data/ orders --add-config retention.ms=3600000",
            add_topics_alter_config, cmd_topics_alter_config),
)

GROUPS = (
    Command("list", "list the consumer groups", "logkit groups list data/ --state",
            add_groups_list, cmd_groups_list),
    Command("describe", "each partition's committed offset, end and lag, and its owner "
            "(kafka-consumer-groups --describe)", "logkit groups describe data/ billing",
            add_groups_describe, cmd_groups_describe),
    Command("reset-offsets", "move a group's committed offsets; a dry run unless "
            "--execute; the group must have no live members",
            "logkit groups reset-offsets data/ billing --to-earliest --topic orders "
            "--execute", add_groups_reset_offsets, cmd_groups_reset_offsets),
    Command("delete", "delete a group and its committed offsets (no live members)",
            "logkit groups delete data/ billing", add_groups_delete, cmd_groups_delete),
)

COMMANDS: list[Command] = [
    Command("topics", "list, create, delete, describe and configure topics",
            "logkit topics list data/", lambda cmd: None, None, TOPICS),
    Command("produce", "send the lines of stdin as records (kafka-console-producer)",
            "logkit produce data/ orders --key-separator : < records.txt\n"
            "printf 'k1:v1\\nk2:v2\\n' | logkit produce data/ orders --key-separator :",
            add_produce, cmd_produce),
    Command("consume", "print records (kafka-console-consumer); --follow waits for more",
            "logkit consume data/ orders --from-beginning --format json --max-messages 10",
            add_consume, cmd_consume),
    Command("groups", "list, describe, reset and delete consumer groups",
            "logkit groups describe data/ billing", lambda cmd: None, None, GROUPS),
    Command("schemas", "list, show, register, check and delete schemas, and set "
            "compatibility levels, in the embedded schema registry", "logkit schemas list data/", lambda cmd: None, None, SCHEMAS),
    Command("serve", "serve the directory to Kafka clients (kafka-python, aiokafka, "
            "confluent-kafka) over Kafka's wire protocol, until SIGINT/SIGTERM",
            "logkit serve data/ --port 9092 --config num.partitions=3\n"
            "logkit serve data/ --host 0.0.0.0 --advertised-host myhost --port 9092 "
            "--sasl-users users.txt --tls-cert cert.pem --tls-key key.pem\n"
            "logkit serve data/ --port 9092 --schema-registry-port 8081\n"
            "logkit serve data/ --port 9092 --rest-port 8082",
            add_serve, cmd_serve),
    Command("follow", "copy a leader broker into DIR and keep copying (a replica), until "
            "SIGINT/SIGTERM; SOURCE is the leader's directory, tcp://HOST:PORT of its "
            "broker.serve_replication(), or the object store URL of its broker.ship()",
            "logkit follow /mnt/leader/data replica/\n"
            "logkit follow s3://backups/data replica/\n"
            "LOGKIT_REPLICATION_SECRET=... logkit follow tcp://10.0.0.5:9093 replica/\n"
            "logkit follow tcp://leader:9093 replica/ --secret-file /etc/logkit/secret "
            "--tls-cafile ca.pem", add_follow, cmd_follow),
    Command("promote", "make a stopped follower's DIR the leader: take the leader's "
            "lease through the source DIR follows (exit 1 while that lease is valid), "
            "then stamp the next leader epoch", "logkit promote replica/\n"
            "logkit promote replica/ --unclean        (the leader's disk is gone)",
            add_promote, cmd_promote),
    Command("mirror", "copy topics (and --groups: committed offsets) to a Kafka cluster, "
            "or with --from from one into DIR; run again to resume, without duplicates",
            "logkit mirror data/ --to kafka1:9092 --topics orders,payments --groups\n"
            "logkit mirror replay/ --from kafka1:9092 --topics orders --groups "
            "--topic-config retention.ms=-1",
            add_mirror, cmd_mirror),
    Command("replicas", "per partition: replication factor, replica set, ISR, log end, "
            "high watermark, leader epochs (epoch@start offset) and each follower's log "
            "end and lag (extra: copying beyond the replication factor); the ISR as "
            "judged with replica.lag.time.max.ms's default", "logkit replicas data/ --json",
            add_replicas, cmd_replicas),
    Command("restore", "rebuild a broker directory from an object store that "
            "broker.ship() fills (every object checked; exit 1 on a damaged one)",
            "logkit restore s3://backups/data restored/\n"
            "logkit restore file:///mnt/backup/data restored/ --timeout 120",
            add_restore, cmd_restore),
    Command("describe", "offsets and sizes of each partition of a topic (as topics "
            "describe)", "logkit describe data/ orders", add_describe, cmd_describe),
    Command("dump", "print the batches (and with --records the records) of a .log file, "
            "checking every CRC", "logkit dump --records data/orders-1/00000000000000000000.log",
            add_dump, cmd_dump),
    Command("bench", "run the benchmark suite beside its peers",
            "logkit bench produce consume --records 1000000 --json results.json", add_bench,
            cmd_bench),
    Command("completion", "print a shell completion script",
            "logkit completion bash > ~/.local/share/bash-completion/completions/logkit\n"
            'eval "$(logkit completion bash)"          (this shell only)',
            add_completion, cmd_completion),
]


def _add_commands(sub: Any, commands: Sequence[Command], path: str,
                  parsers: dict[str, argparse.ArgumentParser]) -> None:
    for command in commands:
        cmd = sub.add_parser(command.name, help=command.help, description=command.help,
                             epilog="example: " + command.example.replace("\n", "\n  "),
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        parsers[f"{path}/{command.name}"] = cmd
        command.add_arguments(cmd)
        if command.subcommands:
            inner = cmd.add_subparsers(dest="subcommand", metavar="SUBCOMMAND",
                                       required=True)
            _add_commands(inner, command.subcommands, f"{path}/{command.name}", parsers)
        else:
            where = f"{path}/{command.name}".strip("/").replace("/", " ")
            cmd.set_defaults(func=command.run, command_path=where)


def build_parser(parsers: dict[str, argparse.ArgumentParser] | None = None
                 ) -> argparse.ArgumentParser:
    """The `logkit` parser; `parsers`, when given, receives every (sub)command's parser
    by path ("", "/topics", "/topics/list", ...)."""
    parser = argparse.ArgumentParser(
        prog="logkit", description="Kafka's command-line tools over a logkit directory: "
        "topics, produce, consume, groups; inspect segments; benchmark.",
        epilog="example: logkit topics list data/",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parsers = {} if parsers is None else parsers
    parsers[""] = parser
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_commands(sub, COMMANDS, "", parsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:                 # usage errors (2) and --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    where = args.command_path
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"usage error: logkit {where}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:          # `logkit consume ... | head`
        # stdout is gone: point it at /dev/null so the interpreter's last flush is quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (LogkitError, OSError) as exc:
        log.debug("logkit %s failed", where, exc_info=exc)   # the traceback, if wanted
        print(f"logkit {where}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"logkit {where}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
