"""Typed key and value columns: schema'd bytes decoded into Spark types, and back.

Owns: the `keyFormat` / `valueFormat` options (`avro`, `json`, `protobuf`) with
`keySchema` / `valueSchema` (schema text), `keySubject` / `valueSubject` (a subject of
the directory's registry), `keySchemaVersion` / `valueSchemaVersion` and
`failOnDecodeError`; choosing the reader (or writer) schema on the driver — the text
given, or a registered version of the subject, the latest when the query starts; the
mapping from a schema to an Arrow type (the Spark type follows from it through
pyspark's `from_arrow_type`, so the two cannot disagree); decoding a column of framed
bytes into that type on a worker, and encoding a typed column into framed bytes for the
sink. docs/spark.md has the type mapping.

Invariant: a decoded column has exactly the Arrow type the driver declared, whatever
writer schema each record used (Avro schema resolution by the id in each record,
Protobuf field numbers, JSON property names). A value that does not decode raises
LogkitSparkError naming topic, partition and offset (failOnDecodeError=true, the
default), or becomes null with a WARNING (false). Only public logkit names are used:
`logkit.serde` does the wire format and the registry lookups.
"""

from __future__ import annotations

import datetime
import decimal
import json
import logging
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import pyarrow as pa

import logkit
from logkit import serde

from .options import TYPED_OPTIONS, LogkitSparkError, split_options

__all__ = ["Typed", "TYPED_OPTIONS", "split_options", "resolve", "arrow_type",
           "decode_column", "encode_column"]

log = logging.getLogger(__name__)

FORMATS = {"avro": "AVRO", "json": "JSON", "protobuf": "PROTOBUF"}
SIDES = ("key", "value")
MAX_DEPTH = 32                   # nesting of a schema mapped to Spark types
Fix = Callable[[Any], Any] | None    # a per-value conversion; None: the value as it is


@dataclass(frozen=True)
class Typed:
    """One typed column, as the driver chose it; pickled to the workers."""

    side: str                    # "key" or "value"
    format: str                  # "avro", "json", "protobuf"
    schema: str                  # the reader's (or writer's) schema text
    schema_id: int | None        # its registered id (None: text given, not registered)
    subject: str | None
    fail_on_error: bool = True


def resolve(broker: logkit.Broker, typed: Mapping[str, str], topic: str | None, *,
            write: bool) -> dict[str, Typed]:
    """The typed sides chosen by the options (driver). `topic`: the one topic read or
    written, which names the default subject `<topic>-key` / `<topic>-value`
    (Confluent's TopicNameStrategy), or None when there are several."""
    fail = str(typed.get("failondecodeerror", "true")).strip().lower()
    if fail not in ("true", "false"):
        raise LogkitSparkError(f"logkit: option 'failOnDecodeError' must be true or false, "
                               f"got {typed['failondecodeerror']!r}")
    if write and "failondecodeerror" in typed:
        raise LogkitSparkError("logkit: 'failOnDecodeError' is a read option; a row that "
                               "does not encode always fails the write")
    out = {}
    for side in SIDES:
        spec = _side(broker, typed, side, topic, write=write, fail=fail == "true")
        if spec is not None:
            out[side] = spec
    return out


def _side(broker: logkit.Broker, typed: Mapping[str, str], side: str, topic: str | None,
          *, write: bool, fail: bool) -> Typed | None:
    name = side[0].upper() + side[1:]
    fmt = typed.get(f"{side}format")
    given = [f"{side}{what}" for what in ("Schema", "Subject", "SchemaVersion")
             if f"{side}{what}".lower() in typed]
    if fmt is None:
        if given:
            raise LogkitSparkError(f"logkit: option {given[0]!r} needs {side}Format "
                                   "(avro, json or protobuf)")
        return None
    fmt = fmt.strip().lower()
    if fmt not in FORMATS:
        raise LogkitSparkError(f"logkit: option '{side}Format' must be avro, json or "
                               f"protobuf, got {typed[f'{side}format']!r}")
    text = typed.get(f"{side}schema")
    subject = typed.get(f"{side}subject")
    version = typed.get(f"{side}schemaversion")
    if text is not None and subject is not None:
        raise LogkitSparkError(f"logkit: set one of '{side}Schema' and '{side}Subject'")
    if text is not None and version is not None:
        raise LogkitSparkError(f"logkit: '{side}SchemaVersion' picks a version of "
                               f"'{side}Subject'; it does not go with '{side}Schema'")
    if subject is None and (text is None or write):
        if topic is None:
            raise LogkitSparkError(f"logkit: {side}Format={fmt} over several topics needs "
                                   f"'{side}Subject' (or '{side}Schema' for reads)")
        subject = f"{topic}-{side}"
    registry = broker.schema_registry()
    schema_id = None
    try:
        if text is None:
            wanted: Any = "latest"
            if version is not None:
                try:
                    wanted = int(version)
                except ValueError:
                    raise LogkitSparkError(f"logkit: option '{side}SchemaVersion' must be "
                                           f"a version number, got {version!r}") from None
            found = registry.version(subject, wanted)
            if found.schema_type != FORMATS[fmt]:
                raise LogkitSparkError(f"logkit: subject {subject!r} version "
                                       f"{found.version} is {found.schema_type}, not "
                                       f"{FORMATS[fmt]} ({side}Format={fmt})")
            text, schema_id = found.schema, found.schema_id
            log.debug("%s column: subject %s version %d (schema id %d)", side, subject,
                      found.version, schema_id)
        elif write:
            # as Confluent's serializers do: the schema written is registered first
            schema_id = registry.register(subject, text, FORMATS[fmt])
    except logkit.LogkitError as exc:
        if isinstance(exc, LogkitSparkError):
            raise
        raise LogkitSparkError(f"logkit: {name} schema ({side}Format={fmt}): "
                               f"{exc}") from None
    spec = Typed(side, fmt, text, schema_id, subject, fail)
    tagged = _mapping(broker, spec)[2]  # a schema Spark cannot take fails here, early
    if write and tagged:
        raise LogkitSparkError(
            f"logkit: the {side} schema ({_schema_name(spec)}) has a union of several "
            "types, read as a struct of member0, member1, ...; writing such a struct back "
            "into the union is not supported: write the column as binary, encoded in the "
            "query (to_avro)")
    return spec


# ---- schema -> Arrow type (and the per-value fix the decoded values need) ---------------

_lock = threading.Lock()
_compiled: dict[tuple[int, str, Typed], Any] = {}


def _cached(kind: str, broker: logkit.Broker, spec: Typed,
            build: Callable[[], Any]) -> Any:
    key = (id(broker), kind, spec)
    with _lock:
        found = _compiled.get(key)
    if found is None:
        found = build()
        with _lock:
            _compiled[key] = found
    return found


def arrow_type(broker: logkit.Broker, spec: Typed) -> pa.DataType:
    """The Arrow type of the column (its Spark type is pyspark's from_arrow_type)."""
    return _mapping(broker, spec)[0]


def _mapping(broker: logkit.Broker, spec: Typed) -> tuple[pa.DataType, Fix, bool]:
    """(Arrow type, per-value fix, whether Avro unions are decoded tagged)."""
    def build() -> tuple[pa.DataType, Fix, bool]:
        try:
            if spec.format == "avro":
                return _avro_mapping(json.loads(spec.schema), spec.side)
            if spec.format == "json":
                document = json.loads(spec.schema)
                return (*_json(document, document, spec.side, 0), False)
            return (*_proto(_message_class(broker, spec).DESCRIPTOR, spec.side, 0), False)
        except LogkitSparkError:
            raise
        except (ValueError, logkit.LogkitError) as exc:
            message = getattr(exc, "message", None) or str(exc)
            raise LogkitSparkError(f"logkit: the {spec.side} schema does not parse: "
                                   f"{message}") from None
    return _cached("type", broker, spec, build)


def _unsupported(path: str, what: str) -> LogkitSparkError:
    return LogkitSparkError(f"logkit: {path}: {what} has no Spark type here; read the "
                            "column as binary (no keyFormat/valueFormat) and decode it in "
                            "the query")


_AVRO_PRIMITIVES = {"null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(),
                    "long": pa.int64(), "float": pa.float32(), "double": pa.float64(),
                    "bytes": pa.binary(), "string": pa.string()}


def _millis_of_day(value: Any) -> Any:
    if isinstance(value, datetime.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1000 + \
            value.microsecond // 1000
    return value


def _micros_of_day(value: Any) -> Any:
    if isinstance(value, datetime.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + \
            value.microsecond
    return value


def _to_str(value: Any) -> Any:
    return value if value is None or isinstance(value, str) else str(value)


class _Tagged(Exception):
    """Raised by the first mapping when it meets a union of several types: the column
    is mapped again with fastavro's named-type tags on (see `_avro_mapping`)."""


def _avro_mapping(schema: Any, side: str) -> tuple[pa.DataType, Fix, bool]:
    """(Arrow type, fix, tagged): `tagged` when the schema has a union of several types,
    which is then decoded with `return_named_type` so a named branch says its name."""
    try:
        data_type, fix = _avro(schema, {}, side, 0, False, "")
        return data_type, fix, False
    except _Tagged:
        data_type, fix = _avro(schema, {}, side, 0, True, "")
        return data_type, fix, True


def _untag(fix: Fix) -> Fix:
    """A nullable-T union's value when tagged: a named T comes as (name, value)."""
    if fix is None:
        return lambda v: v[1] if type(v) is tuple else v
    return lambda v: fix(v[1] if type(v) is tuple else v)


_INT32 = (-2 ** 31, 2 ** 31)


def _branch_test(node: Any, named: dict[str, Any], ns: str) -> Callable[[Any], bool] | str:
    """How to tell a decoded union value belongs to this branch: a named type's full
    name (the value comes tagged), else a test of the Python value fastavro gives."""
    if isinstance(node, str) and node not in _AVRO_PRIMITIVES:
        return _named_key(node, named, ns) or node
    kind = node if isinstance(node, str) else node.get("type")
    logical = None if isinstance(node, str) else node.get("logicalType")
    if kind in ("record", "enum", "fixed") and isinstance(node, dict):
        return _full_name(node, ns)
    if logical in ("timestamp-millis", "timestamp-micros", "local-timestamp-millis",
                   "local-timestamp-micros"):
        return lambda v: isinstance(v, datetime.datetime)
    if logical == "date":
        return lambda v: isinstance(v, datetime.date) and \
            not isinstance(v, datetime.datetime)
    if logical == "decimal":
        return lambda v: isinstance(v, decimal.Decimal)
    if logical in ("time-millis", "time-micros"):
        return lambda v: isinstance(v, datetime.time)
    if logical == "uuid":
        return lambda v: isinstance(v, (str, uuid.UUID))
    return {"boolean": lambda v: type(v) is bool,
            "int": lambda v: type(v) is int and _INT32[0] <= v < _INT32[1],
            "long": lambda v: type(v) is int,
            "float": lambda v: type(v) is float, "double": lambda v: type(v) is float,
            "string": lambda v: type(v) is str, "bytes": lambda v: type(v) is bytes,
            "array": lambda v: type(v) is list, "map": lambda v: type(v) is dict,
            }.get(kind, lambda v: False)


def _members(branches: list[Any], named: dict[str, Any], path: str, depth: int, ns: str
             ) -> tuple[pa.DataType, Fix]:
    """A union of several types, as Spark's from_avro maps it: a struct with a nullable
    field `member<i>` per non-null branch, in order; the branch a value took is set,
    the others null."""
    fields, fixes, tests = [], [], []
    for i, branch in enumerate(branches):
        child, fix = _avro(branch, named, f"{path}.member{i}", depth + 1, True, ns)
        fields.append(pa.field(f"member{i}", child))
        fixes.append(fix)
        tests.append(_branch_test(branch, named, ns))
    by_name = {test: i for i, test in enumerate(tests) if isinstance(test, str)}
    by_value = [(i, test) for i, test in enumerate(tests) if not isinstance(test, str)]
    names = [f"member{i}" for i in range(len(branches))]

    def fix(value: Any) -> Any:
        if value is None:
            return None
        if type(value) is tuple:
            chosen = by_name.get(value[0])
            if chosen is None:                       # a short name of the branch's
                chosen = next((i for n, i in by_name.items()
                               if n.rsplit(".", 1)[-1] == value[0].rsplit(".", 1)[-1]),
                              None)
            value = value[1]
        else:
            chosen = next((i for i, test in by_value if test(value)), None)
        if chosen is None:
            raise ValueError(f"{path}: a union value of type {type(value).__name__} "
                             "matches none of the union's branches")
        out = dict.fromkeys(names)
        one = fixes[chosen]
        out[names[chosen]] = value if one is None else one(value)
        return out
    return pa.struct(fields), fix


def _named_key(name: str, named: dict[str, Any], ns: str) -> str | None:
    """The full name a type reference means (the enclosing namespace first)."""
    for candidate in ((f"{ns}.{name}" if ns and "." not in name else name), name):
        if candidate in named:
            return candidate
    short = [k for k in named if k.rsplit(".", 1)[-1] == name]
    return short[0] if len(short) == 1 else None


def _avro(node: Any, named: dict[str, Any], path: str, depth: int, tagged: bool,
          ns: str) -> tuple[pa.DataType, Fix]:
    if depth > MAX_DEPTH:
        raise _unsupported(path, f"nesting deeper than {MAX_DEPTH}")
    if isinstance(node, list):                                     # a union
        branches = [b for b in node if b != "null" and b != {"type": "null"}]
        if len(branches) == 1:                                     # nullable T
            data_type, fix = _avro(branches[0], named, path, depth + 1, tagged, ns)
            return data_type, (_untag(fix) if tagged else fix)
        kinds = sorted(str(b if isinstance(b, str) else b.get("type")) for b in branches)
        plain = all(isinstance(b, str) for b in branches)
        if plain and kinds == ["int", "long"]:
            return pa.int64(), None
        if plain and kinds == ["double", "float"]:
            return pa.float64(), None
        if not branches:
            return pa.null(), None
        if not tagged:
            raise _Tagged()
        return _members(branches, named, path, depth, ns)
    if isinstance(node, str):
        if node in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[node], None
        key = _named_key(node, named, ns)
        if key is None:
            raise LogkitSparkError(f"logkit: {path}: unknown Avro type {node!r}")
        if named[key] is None:
            raise LogkitSparkError(
                f"logkit: {path}: the Avro type {key} refers to itself (a recursive "
                "type); Spark's from_avro refuses recursive schemas too, since a Spark "
                "type is finite. Read the column as binary (no keyFormat/valueFormat) "
                "and decode it in the query")
        return named[key]
    kind = node.get("type")
    logical = node.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(node.get("precision", 0)), int(node.get("scale", 0))
        if not 0 < precision <= 38:
            raise _unsupported(path, f"decimal({precision}, {scale})")
        result: tuple[pa.DataType, Fix] = (pa.decimal128(precision, scale), None)
        if kind == "fixed":
            named[_full_name(node, ns)] = result
    elif logical == "date" and kind == "int":
        result = pa.date32(), None
    elif logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        result = pa.timestamp("us", tz="UTC"), None
    elif logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        result = pa.timestamp("us"), None
    elif logical == "time-millis" and kind == "int":
        result = pa.int32(), _millis_of_day
    elif logical == "time-micros" and kind == "long":
        result = pa.int64(), _micros_of_day
    elif logical == "uuid" and kind == "string":
        result = pa.string(), _to_str
    elif kind == "record":
        full = _full_name(node, ns)
        inner_ns = full.rsplit(".", 1)[0] if "." in full else ""
        named[full] = None                       # a reference to itself is recursion
        fields, fixes = [], []
        for field in node.get("fields", []):
            child, fix = _avro(field["type"], named, f"{path}.{field['name']}", depth + 1,
                               tagged, inner_ns)
            fields.append(pa.field(field["name"], child))
            if fix is not None:
                fixes.append((field["name"], fix))
        result = pa.struct(fields), _record_fix(fixes)
        named[full] = result
        return result
    elif kind == "enum":
        result = pa.string(), None
        named[_full_name(node, ns)] = result
    elif kind == "fixed":
        result = pa.binary(), None
        named[_full_name(node, ns)] = result
    elif kind == "array":
        child, fix = _avro(node["items"], named, f"{path}[]", depth + 1, tagged, ns)
        result = pa.list_(child), (None if fix is None else _list_fix(fix))
    elif kind == "map":
        child, fix = _avro(node["values"], named, f"{path}{{}}", depth + 1, tagged, ns)
        result = pa.map_(pa.string(), child), (None if fix is None else _map_fix(fix))
    else:
        result = _avro(kind, named, path, depth + 1, tagged, ns)
    return result


def _full_name(node: dict, ns: str = "") -> str:
    """A named type's full name: its own dotted name, its namespace, or the enclosing
    one (Avro's rule)."""
    name = node["name"]
    if "." in name:
        return name
    space = node.get("namespace", ns)
    return f"{space}.{name}" if space else name


def _record_fix(fixes: list[tuple[str, Callable[[Any], Any]]]) -> Fix:
    if not fixes:
        return None

    def fix(value: Any) -> Any:
        if value is None:
            return None
        value = dict(value)
        for name, one in fixes:
            if value.get(name) is not None:
                value[name] = one(value[name])
        return value
    return fix


def _list_fix(one: Callable[[Any], Any]) -> Fix:
    return lambda value: None if value is None else \
        [None if v is None else one(v) for v in value]


def _map_fix(one: Callable[[Any], Any]) -> Fix:
    return lambda value: None if value is None else \
        {k: None if v is None else one(v) for k, v in value.items()}


def _json_ref(root: Any, ref: str) -> Any:
    if not ref.startswith("#/"):
        raise LogkitSparkError(f"logkit: only local $refs map to Spark types, got {ref!r}")
    node = root
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _iso_timestamp(value: Any) -> Any:
    if isinstance(value, str):
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.timezone.utc)
    return value


def _iso_date(value: Any) -> Any:
    return datetime.date.fromisoformat(value) if isinstance(value, str) else value


def _json_text(value: Any) -> Any:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _json(node: Any, root: Any, path: str, depth: int) -> tuple[pa.DataType, Fix]:
    if depth > MAX_DEPTH:
        raise _unsupported(path, f"nesting deeper than {MAX_DEPTH}")
    if not isinstance(node, dict):
        return pa.string(), _json_text
    if "$ref" in node:
        return _json(_json_ref(root, node["$ref"]), root, path, depth + 1)
    kind = node.get("type")
    if isinstance(kind, list):
        others = [k for k in kind if k != "null"]
        kind = others[0] if len(others) == 1 else None
    if kind == "object" and isinstance(node.get("properties"), dict):
        fields, fixes = [], []
        for name, child_node in node["properties"].items():
            child, fix = _json(child_node, root, f"{path}.{name}", depth + 1)
            fields.append(pa.field(name, child))
            if fix is not None:
                fixes.append((name, fix))
        return pa.struct(fields), _record_fix(fixes)
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        child, fix = _json(node["additionalProperties"], root, f"{path}{{}}", depth + 1)
        return pa.map_(pa.string(), child), (None if fix is None else _map_fix(fix))
    if kind == "array" and isinstance(node.get("items"), dict):
        child, fix = _json(node["items"], root, f"{path}[]", depth + 1)
        return pa.list_(child), (None if fix is None else _list_fix(fix))
    if kind == "string":
        if node.get("format") == "date-time":
            return pa.timestamp("us", tz="UTC"), _iso_timestamp
        if node.get("format") == "date":
            return pa.date32(), _iso_date
        return pa.string(), None
    if kind == "integer":
        return pa.int64(), None
    if kind == "number":
        return pa.float64(), None
    if kind == "boolean":
        return pa.bool_(), None
    return pa.string(), _json_text          # anything else: its JSON text


_PROTO_SCALARS = {
    "TYPE_DOUBLE": pa.float64(), "TYPE_FLOAT": pa.float32(), "TYPE_INT64": pa.int64(),
    "TYPE_UINT64": pa.int64(), "TYPE_INT32": pa.int32(), "TYPE_FIXED64": pa.int64(),
    "TYPE_FIXED32": pa.int64(), "TYPE_BOOL": pa.bool_(), "TYPE_STRING": pa.string(),
    "TYPE_BYTES": pa.binary(), "TYPE_UINT32": pa.int64(), "TYPE_SFIXED32": pa.int32(),
    "TYPE_SFIXED64": pa.int64(), "TYPE_SINT32": pa.int32(), "TYPE_SINT64": pa.int64()}


def _proto_field(field: Any, path: str, depth: int) -> tuple[pa.DataType, Fix]:
    names = {number: name for name, number in vars(type(field)).items()
             if name.startswith("TYPE_")}
    kind = names.get(field.type)
    if kind == "TYPE_ENUM":
        enum = field.enum_type
        return pa.string(), lambda v: enum.values_by_number[v].name \
            if v in enum.values_by_number else str(v)
    if kind in ("TYPE_MESSAGE", "TYPE_GROUP"):
        if field.message_type.full_name == "google.protobuf.Timestamp":
            return pa.timestamp("us", tz="UTC"), \
                lambda v: v.ToDatetime(tzinfo=datetime.timezone.utc)
        return _proto(field.message_type, path, depth + 1)
    return _PROTO_SCALARS[kind], None


def _proto(descriptor: Any, path: str, depth: int) -> tuple[pa.DataType, Fix]:
    if depth > MAX_DEPTH:
        raise _unsupported(path, f"message nesting deeper than {MAX_DEPTH} (recursive?)")
    fields, converters = [], []
    for field in descriptor.fields:
        where = f"{path}.{field.name}"
        entry = field.message_type
        optional = False
        if entry is not None and entry.GetOptions().map_entry:
            key_type, key_fix = _proto_field(entry.fields_by_name["key"], where, depth)
            value_type, value_fix = _proto_field(entry.fields_by_name["value"], where, depth)
            data_type: pa.DataType = pa.map_(key_type, value_type)
            convert = _proto_map(key_fix, value_fix)
        elif field.is_repeated:
            item_type, item_fix = _proto_field(field, where, depth)
            data_type = pa.list_(item_type)
            convert = _proto_list(item_fix)
        else:
            data_type, fix = _proto_field(field, where, depth)
            convert = fix or _same
            optional = field.has_presence     # a message field, proto3 `optional`: null
        fields.append(pa.field(field.name, data_type))
        converters.append((field.name, convert, optional))

    def to_dict(message: Any) -> Any:
        return {name: convert(getattr(message, name))
                if not optional or message.HasField(name) else None
                for name, convert, optional in converters}
    return pa.struct(fields), to_dict


def _same(value: Any) -> Any:
    return value


def _proto_list(fix: Fix) -> Callable[[Any], Any]:
    return (lambda v: [fix(x) for x in v]) if fix is not None else list


def _proto_map(key_fix: Fix, value_fix: Fix) -> Callable[[Any], Any]:
    key_fix = key_fix or _same
    value_fix = value_fix or _same
    return lambda v: [(key_fix(k), value_fix(x)) for k, x in v.items()]


def _message_class(broker: logkit.Broker, spec: Typed) -> Any:
    """The message class of a Protobuf column: built from the registered schema, or
    from the .proto text of the `*Schema` option (no protoc: logkit's own parser); the
    file's first message, as Confluent's message index [0]."""
    def build() -> Any:
        made = serde.ProtobufSerde(broker, spec.subject or "spark")
        if spec.schema_id is None:
            return made.message_class_from_text(spec.schema)
        return made.message_class_for(spec.schema_id)
    return _cached("class", broker, spec, build)


# ---- decoding on a worker ---------------------------------------------------------------

def _decoder(broker: logkit.Broker, spec: Typed, topic: str) -> Callable[[bytes], Any]:
    def build() -> Callable[[bytes], Any]:
        _, fix, tagged = _mapping(broker, spec)
        if spec.format == "avro":
            decode = serde.AvroSerde(broker, topic, spec.schema, return_named_type=tagged,
                                     is_key=spec.side == "key").deserialize
        elif spec.format == "json":
            decode = _json_decode
        else:
            decode = serde.ProtobufSerde(broker, topic, _message_class(broker, spec),
                                         is_key=spec.side == "key").deserialize
        if fix is None:
            return decode
        return lambda data: fix(decode(data))
    return _cached(f"decode:{topic}", broker, spec, build)


def _json_decode(data: bytes) -> Any:
    """A JSON value, Confluent-framed (JSON Schema serializers: magic 0 and a schema id,
    which JSON text never starts with) or plain (JsonSerde, Kafka's JsonSerializer)."""
    if data[:1] == b"\x00":
        data = data[5:]
    try:
        return serde.JsonSerde().deserialize(data)
    except logkit.SerializationError:
        raise
    except ValueError as exc:
        raise logkit.SerializationError(f"not JSON: {exc}") from exc


def decode_column(broker: logkit.Broker, spec: Typed, topic: str, partition: int,
                  offsets: Iterable[int], data: list[bytes | None]) -> pa.Array:
    """The typed column of one chunk of records (a worker). Nulls stay null."""
    data_type = arrow_type(broker, spec)
    decode = _decoder(broker, spec, topic)
    try:
        values = [None if item is None else decode(item) for item in data]
        return pa.array(values, data_type)
    except (logkit.SerializationError, pa.ArrowException, TypeError, ValueError):
        pass
    # slow path, only when something failed: find which records, and say where
    offsets = list(offsets)
    values, bad = [], []
    for offset, item in zip(offsets, data):
        try:
            value = None if item is None else decode(item)
            pa.array([value], data_type)
        except (logkit.SerializationError, pa.ArrowException, TypeError, ValueError) as exc:
            message = getattr(exc, "message", None) or str(exc)
            if spec.fail_on_error:
                raise LogkitSparkError(
                    f"logkit: the {spec.side} of {topic}-{partition} offset {offset} does "
                    f"not decode as {spec.format} ({_schema_name(spec)}): {message}. Set "
                    "failOnDecodeError=false to read such records with a null "
                    f"{spec.side}.") from exc
            bad.append(offset)
            value = None
        values.append(value)
    if bad:
        log.warning("%d record(s) of %s-%d have a %s that does not decode as %s (offsets "
                    "%s); read with a null %s (failOnDecodeError=false)", len(bad), topic,
                    partition, spec.side, spec.format,
                    ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else ""),
                    spec.side)
    return pa.array(values, data_type)


def _schema_name(spec: Typed) -> str:
    if spec.subject is not None:
        return f"subject {spec.subject!r}, schema id {spec.schema_id}"
    return f"the {spec.side}Schema option"


# ---- encoding for the sink --------------------------------------------------------------

def _python(data_type: pa.DataType) -> Fix:
    """Arrow's to_pylist gives maps as lists of pairs; the serdes want dicts."""
    if pa.types.is_map(data_type):
        inner = _python(data_type.item_type)
        return lambda v: None if v is None else \
            {k: (x if inner is None or x is None else inner(x)) for k, x in v}
    if pa.types.is_struct(data_type):
        fixes = [(f.name, _python(f.type)) for f in data_type]
        fixes = [(n, f) for n, f in fixes if f is not None]
        return _record_fix(fixes)
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        inner = _python(data_type.value_type)
        return None if inner is None else _list_fix(inner)
    return None


def _encoder(broker: logkit.Broker, spec: Typed, topic: str) -> Callable[[Any], bytes]:
    def build() -> Callable[[Any], bytes]:
        options = {"is_key": spec.side == "key", "auto_register": False,
                   "subject_name_strategy": lambda *_: spec.subject}
        if spec.format == "avro":
            made: Any = serde.AvroSerde(broker, topic, spec.schema, **options)
        elif spec.format == "json":
            made = serde.JsonSchemaSerde(broker, topic, spec.schema, **options)
        else:
            made = serde.ProtobufSerde(broker, topic, _message_class(broker, spec),
                                       **options)
        return made.serialize
    return _cached(f"encode:{topic}", broker, spec, build)


def encode_column(broker: logkit.Broker, spec: Typed, topic: str, column: pa.Array,
                  first_row: int) -> list[bytes | None]:
    """Framed bytes of each value of a typed column (a sink task); a row that does not
    match the schema fails the write, naming the row and the field."""
    fix = _python(column.type)
    encode = _encoder(broker, spec, topic)
    out: list[bytes | None] = []
    for row, value in enumerate(column.to_pylist(), first_row):
        if value is None:
            out.append(None)
            continue
        try:
            out.append(encode(value if fix is None else fix(value)))
        except logkit.SerializationError as exc:
            raise LogkitSparkError(f"logkit: row {row} of this task refused: its "
                                   f"{spec.side} does not match {_schema_name(spec)}: "
                                   f"{exc.message}") from exc
    return out
