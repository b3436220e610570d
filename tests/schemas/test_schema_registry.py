"""The embedded schema registry on a real broker directory (real LMDB): ids, versions,
deletes, compatibility levels, and the Avro / JSON Schema / Protobuf rules."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import logkit
from logkit.compat import MAX_SCHEMA_BYTES
from logkit.serde import (IncompatibleSchemaError, InvalidCompatibilityLevelError,
                          InvalidSchemaError, InvalidSubjectError, InvalidVersionError,
                          SchemaNotFoundError, SubjectConfigNotFoundError,
                          SubjectNotFoundError, SubjectNotSoftDeletedError,
                          SubjectSoftDeletedError, VersionNotFoundError,
                          VersionNotSoftDeletedError, VersionSoftDeletedError)


def record(*fields, name="Order", namespace="shop"):
    """An Avro record schema as text; each field a (name, type) or (name, type, default)."""
    out = []
    for spec in fields:
        field = {"name": spec[0], "type": spec[1]}
        if len(spec) > 2:
            field["default"] = spec[2]
        out.append(field)
    return json.dumps({"type": "record", "name": name, "namespace": namespace,
                       "fields": out})


V1 = record(("id", "long"), ("note", "string", ""))


@pytest.fixture
def registry(broker):
    return broker.schema_registry()


# ---- ids and versions ------------------------------------------------------------------

def test_same_schema_gets_the_same_id_and_no_new_version(registry):
    """Registering a schema twice, or with other whitespace, returns its id; the same
    schema under another subject gets the same id."""
    first = registry.register("orders-value", V1)
    again = registry.register("orders-value", json.dumps(json.loads(V1), indent=4))
    other = registry.register("payments-value", V1)
    assert first == again == other == 1
    assert registry.versions("orders-value") == [1]
    assert registry.version("orders-value", "latest").schema_id == first


def test_a_schema_differing_only_by_a_default_is_a_new_version(registry):
    """Defaults are part of a schema's identity (as in Confluent's registry)."""
    first = registry.register("orders-value", V1)
    second = registry.register("orders-value", record(("id", "long"), ("note", "string", "-")))
    assert second != first
    assert registry.versions("orders-value") == [1, 2]
    assert registry.version("orders-value", 2).schema_id == second


def test_registry_is_stored_in_lmdb_and_seen_after_reopen_and_by_other_processes(tmp_path):
    """Subjects, ids and levels survive a reopen, and another process registering into
    the same directory gets the next id, not a reused one."""
    path = tmp_path / "data"
    with logkit.Broker(path) as broker:
        registry = broker.schema_registry()
        assert registry.register("a-value", V1) == 1
        registry.set_compatibility("FULL", "a-value")
    script = textwrap.dedent(f"""
        import json, logkit
        with logkit.Broker({str(path)!r}) as broker:
            registry = broker.schema_registry()
            print(json.dumps([registry.register("b-value", '"string"'),
                              registry.compatibility("a-value"),
                              registry.register("a-value", {V1!r})]))
    """)
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                         text=True).stdout
    assert json.loads(out) == [2, "FULL", 1]
    with logkit.Broker(path) as broker:
        registry = broker.schema_registry()
        assert registry.subjects() == ["a-value", "b-value"]
        assert registry.schema(2).schema == '"string"'


def test_two_processes_registering_at_once_get_distinct_ids(tmp_path):
    """Registration is one LMDB write transaction: racing writers never share an id."""
    path = tmp_path / "data"
    logkit.Broker(path).close()
    script = textwrap.dedent("""
        import json, sys, logkit
        with logkit.Broker(sys.argv[1]) as broker:
            registry = broker.schema_registry()
            ids = [registry.register(f"{sys.argv[2]}-{i}", json.dumps(
                {"type": "enum", "name": "E", "symbols": [f"{sys.argv[2]}_{i}"]}))
                for i in range(15)]
            print(json.dumps(ids))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), tag],
                              stdout=subprocess.PIPE, text=True) for tag in ("p", "q")]
    ids = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        ids += json.loads(out)
    assert sorted(ids) == list(range(1, 31))


# ---- deletes -----------------------------------------------------------------------------

def test_soft_delete_keeps_ids_resolvable_and_lists_the_subject_as_deleted(registry):
    schema_id = registry.register("orders-value", V1)
    assert registry.delete_subject("orders-value") == [1]
    assert registry.subjects() == []
    assert registry.subjects(deleted=True) == ["orders-value"]
    assert registry.schema(schema_id).schema == V1          # old records still decode
    with pytest.raises(SubjectNotFoundError):
        registry.versions("orders-value")
    assert registry.versions("orders-value", deleted=True) == [1]
    with pytest.raises(SubjectSoftDeletedError) as raised:
        registry.delete_subject("orders-value")
    assert raised.value.error_code == 40404


def test_permanent_delete_needs_a_soft_delete_first_and_ids_are_never_reused(registry):
    first = registry.register("orders-value", V1)
    with pytest.raises(SubjectNotSoftDeletedError) as raised:
        registry.delete_subject("orders-value", permanent=True)
    assert raised.value.error_code == 40405
    registry.delete_subject("orders-value")
    assert registry.delete_subject("orders-value", permanent=True) == [1]
    assert registry.subjects(deleted=True) == []
    with pytest.raises(SchemaNotFoundError) as raised:
        registry.schema(first)
    assert raised.value.error_code == 40403
    other = registry.register("orders-value", '"string"')
    assert other == first + 1                                 # not reused
    assert registry.register("other-value", V1) == first      # the same schema, its id


def test_version_deletes_follow_confluent(registry):
    registry.register("s", V1)
    registry.register("s", record(("id", "long"), ("note", "string", ""), ("x", "int", 0)))
    with pytest.raises(VersionNotSoftDeletedError):
        registry.delete_version("s", 2, permanent=True)
    assert registry.delete_version("s", "latest") == 2
    assert registry.versions("s") == [1]
    with pytest.raises(VersionSoftDeletedError):
        registry.delete_version("s", 2)
    assert registry.delete_version("s", 2, permanent=True) == 2
    with pytest.raises(VersionNotFoundError) as raised:
        registry.version("s", 2, deleted=True)
    assert raised.value.error_code == 40402
    v3 = record(("id", "long"), ("note", "string", ""), ("y", "int", 0))
    registry.register("s", v3)
    assert registry.versions("s") == [1, 2]     # numbering goes on after the newest kept


def test_bad_input_raises_named_errors(registry):
    with pytest.raises(InvalidSubjectError):
        registry.register("", V1)
    with pytest.raises(InvalidSubjectError):
        registry.register("x" * 300, V1)
    with pytest.raises(InvalidVersionError) as raised:
        registry.version("s", 0)
    assert raised.value.error_code == 42202
    with pytest.raises(InvalidCompatibilityLevelError) as raised:
        registry.set_compatibility("SIDEWAYS")
    assert raised.value.error_code == 42203
    for bad in ("{not json", '{"type": "record", "name": "R"}', '"nosuchtype"',
                record(("n", "int", "text")), record(("n", {"type": "enum", "name": "E",
                                                           "symbols": ["A", "A"]}))):
        with pytest.raises(InvalidSchemaError) as raised:
            registry.register("s", bad)
        assert raised.value.error_code == 42201
    with pytest.raises(InvalidSchemaError, match="limit"):
        registry.register("s", json.dumps({"type": "enum", "name": "Big", "symbols": [
            f"S{i}" for i in range(MAX_SCHEMA_BYTES // 5)]}))
    assert registry.subjects() == []


def test_read_only_broker_reads_the_registry_and_refuses_changes(tmp_path):
    path = tmp_path / "data"
    with logkit.Broker(path) as broker:
        broker.schema_registry().register("s", V1)
    with logkit.Broker(path, read_only=True) as broker:
        registry = broker.schema_registry()
        assert registry.version("s").schema == V1
        with pytest.raises(logkit.ReadOnlyError):
            registry.register("s", '"string"')


# ---- levels ------------------------------------------------------------------------------

def test_backward_is_the_default_and_names_the_field_and_rule(registry):
    registry.register("orders-value", V1)
    assert registry.compatibility() == "BACKWARD"
    added = record(("id", "long"), ("note", "string", ""), ("customer", "string"))
    with pytest.raises(IncompatibleSchemaError) as raised:
        registry.register("orders-value", added)
    message = str(raised.value)
    assert raised.value.error_code == 409
    assert "customer" in message and "READER_FIELD_MISSING_DEFAULT_VALUE" in message
    assert registry.check("orders-value", record(("id", "long"), ("note", "string", ""),
                                                 ("customer", "string", "")))
    assert registry.versions("orders-value") == [1]


def test_levels_forward_full_none(registry):
    removes_defaultless = record(("note", "string", ""))          # drops id (no default)
    adds_defaultless = record(("id", "long"), ("note", "string", ""), ("x", "int"))
    registry.register("s", V1)
    registry.set_compatibility("FORWARD", "s")
    assert registry.compatibility("s") == "FORWARD"
    assert registry.compatibility() == "BACKWARD"               # the global level stays
    assert not registry.check("s", removes_defaultless)         # v1 needs "id"
    assert registry.check("s", adds_defaultless)                # v1 ignores "x"
    registry.set_compatibility("FULL", "s")
    assert not registry.check("s", removes_defaultless)
    assert not registry.check("s", adds_defaultless)
    registry.set_compatibility("NONE", "s")
    assert registry.check("s", '"string"')
    assert registry.delete_compatibility("s") == "NONE"
    assert registry.compatibility("s") == "BACKWARD"
    with pytest.raises(SubjectConfigNotFoundError):
        registry.compatibility("s", default_to_global=False)


def test_transitive_levels_check_every_live_version(registry):
    """v3 reads v2's data but not v1's: BACKWARD accepts it, BACKWARD_TRANSITIVE not."""
    v1 = record(("id", "long"))
    v2 = record(("id", "long"), ("b", "string", "x"))
    v3 = record(("id", "long"), ("b", "string"))
    registry.register("s", v1)
    registry.register("s", v2)
    assert registry.check("s", v3)
    registry.set_compatibility("BACKWARD_TRANSITIVE", "s")
    problems = registry.incompatibilities("s", v3)
    assert len(problems) == 1 and "version 1" in problems[0] and "b:" in problems[0]
    assert registry.check("s", v3, version=2)            # one version: not transitive
    registry.delete_version("s", 1)                      # soft-deleted: not checked
    assert registry.check("s", v3)


# ---- Avro rules --------------------------------------------------------------------------

AVRO_CASES = [
    # (old, new, backward ok, forward ok)
    ("int", "long", True, False),                      # promotion, one way
    ("float", "double", True, False),
    ("string", "bytes", True, True),
    ("long", "int", False, True),
    ({"type": "enum", "name": "E", "symbols": ["A", "B"]},
     {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}, True, False),
    ({"type": "enum", "name": "E", "symbols": ["A", "B"]},
     {"type": "enum", "name": "E", "symbols": ["A", "B", "C"], "default": "A"}, True, False),
    ({"type": "enum", "name": "E", "symbols": ["A", "B"], "default": "A"},
     {"type": "enum", "name": "E", "symbols": ["A", "B", "C"], "default": "A"}, True, True),
    (["null", "string"], ["null", "string", "int"], True, False),
    ("string", ["null", "string"], True, False),
    ({"type": "array", "items": "int"}, {"type": "array", "items": "long"}, True, False),
    ({"type": "map", "values": "int"}, {"type": "map", "values": "string"}, False, False),
    ({"type": "fixed", "name": "F", "size": 4}, {"type": "fixed", "name": "F", "size": 8},
     False, False),
    ({"type": "record", "name": "A", "fields": []},
     {"type": "record", "name": "B", "aliases": ["A"], "fields": []}, True, False),
]


@pytest.mark.parametrize("old,new,backward,forward", AVRO_CASES)
def test_avro_resolution_rules(registry, old, new, backward, forward):
    for level, expected in (("BACKWARD", backward), ("FORWARD", forward)):
        subject = f"s-{level}"
        registry.set_compatibility("NONE", subject)
        registry.register(subject, json.dumps(old))
        registry.set_compatibility(level, subject)
        assert registry.check(subject, json.dumps(new)) is expected, level


def test_avro_recursive_records_and_rule_names(registry):
    linked = {"type": "record", "name": "Node", "fields": [
        {"name": "value", "type": "int"},
        {"name": "next", "type": ["null", "Node"], "default": None}]}
    registry.register("list", json.dumps(linked))
    longer = json.loads(json.dumps(linked))
    longer["fields"][0]["type"] = "long"
    assert registry.check("list", json.dumps(longer))
    registry.register("e", json.dumps({"type": "enum", "name": "E", "symbols": ["A", "B"]}))
    registry.set_compatibility("FORWARD", "e")
    problems = registry.incompatibilities("e", json.dumps(
        {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}))
    assert "MISSING_ENUM_SYMBOLS" in problems[0]


# ---- JSON Schema rules -------------------------------------------------------------------

def obj(properties, *, required=(), closed=True):
    schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return json.dumps(schema)


JSON_CASES = [
    # (old, new, backward ok, rule expected when not)
    (obj({"a": {"type": "string"}}), obj({"a": {"type": "string"}, "b": {"type": "integer"}}),
     True, None),
    (obj({"a": {"type": "string"}}, closed=False),
     obj({"a": {"type": "string"}, "b": {"type": "integer"}}, closed=False),
     False, "PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL"),
    (obj({"a": {"type": "string"}}),
     obj({"a": {"type": "string"}, "b": {"type": "integer"}}, required=["b"]),
     False, "REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL"),
    (obj({"a": {"type": "string"}, "b": {"type": "integer"}}), obj({"a": {"type": "string"}}),
     False, "PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL"),
    (obj({"a": {"type": "string"}, "b": {"type": "integer"}}, closed=False),
     obj({"a": {"type": "string"}}, closed=False), True, None),
    (obj({"n": {"type": "integer"}}), obj({"n": {"type": "number"}}), True, None),
    (obj({"n": {"type": "number"}}), obj({"n": {"type": "integer"}}), False, "TYPE_NARROWED"),
    (obj({"s": {"type": "string", "maxLength": 10}}),
     obj({"s": {"type": "string", "maxLength": 5}}), False, "MAX_LENGTH_DECREASED"),
    (obj({"e": {"enum": ["a", "b"]}}), obj({"e": {"enum": ["a"]}}), False,
     "ENUM_ARRAY_NARROWED"),
    (obj({"l": {"type": "array", "items": {"type": "integer"}}}),
     obj({"l": {"type": "array", "items": {"type": "string"}}}), False, "TYPE_CHANGED"),
]


@pytest.mark.parametrize("old,new,ok,rule", JSON_CASES)
def test_json_schema_rules(registry, old, new, ok, rule):
    registry.register("j", old, "JSON")
    problems = registry.incompatibilities("j", new, "JSON")
    assert (not problems) is ok
    if rule:
        assert rule in problems[0]


def test_invalid_json_schema_is_refused(registry):
    with pytest.raises(InvalidSchemaError):
        registry.register("j", '{"type": "object", "properties": 5}', "JSON")


# ---- Protobuf rules ----------------------------------------------------------------------

def proto(body, *, syntax="proto3", package="shop"):
    return f'syntax = "{syntax}";\npackage {package};\n{body}\n'


PROTO_V1 = proto("message Order {\n  int64 id = 1;\n  string note = 2;\n"
                 "  oneof pay { string card = 3; string iban = 4; }\n}")
PROTO_CASES = [
    ("message Order { int64 id = 1; string note = 2; int32 extra = 5;"
     " oneof pay { string card = 3; string iban = 4; } }", True, None),
    ("message Order { int64 id = 1; oneof pay { string card = 3; string iban = 4; } }",
     True, None),
    ("message Order { uint64 id = 1; string renamed = 2;"
     " oneof pay { string card = 3; string iban = 4; } }", True, None),
    ("message Order { string id = 1; string note = 2;"
     " oneof pay { string card = 3; string iban = 4; } }", False, "FIELD_SCALAR_KIND_CHANGED"),
    ("message Order { Money id = 1; string note = 2;"
     " oneof pay { string card = 3; string iban = 4; } } message Money { int64 units = 1; }",
     False, "FIELD_KIND_CHANGED"),
    ("message Order { int64 id = 1; string note = 2; oneof pay { string card = 3; } }",
     False, "ONEOF_FIELD_REMOVED"),
    ("message Order { oneof key { int64 id = 1; string note = 2; }"
     " oneof pay { string card = 3; string iban = 4; } }", False,
     "MULTIPLE_FIELDS_MOVED_TO_ONEOF"),
    ("message Invoice { int64 id = 1; }", False, "MESSAGE_REMOVED"),
]


@pytest.mark.parametrize("new,ok,rule", PROTO_CASES)
def test_protobuf_rules(registry, new, ok, rule):
    pytest.importorskip("google.protobuf")
    registry.register("p", PROTO_V1, "PROTOBUF")
    problems = registry.incompatibilities("p", proto(new), "PROTOBUF")
    assert (not problems) is ok, problems
    if rule:
        assert rule in problems[0]


def test_protobuf_required_fields_and_package(registry):
    pytest.importorskip("google.protobuf")
    registry.register("p2", proto("message M { optional int32 a = 1; }", syntax="proto2"),
                      "PROTOBUF")
    problems = registry.incompatibilities(
        "p2", proto("message M { optional int32 a = 1; required int32 b = 2; }",
                    syntax="proto2"), "PROTOBUF")
    assert "REQUIRED_FIELD_ADDED" in problems[0] and "M.b" in problems[0]
    problems = registry.incompatibilities(
        "p2", proto("message M { optional int32 a = 1; }", syntax="proto2", package="other"),
        "PROTOBUF")
    assert "PACKAGE_CHANGED" in problems[0]


def test_protobuf_text_and_serialized_forms_share_an_id(registry):
    """The .proto text and the base64 descriptor of one file are one schema."""
    pytest.importorskip("google.protobuf")
    from logkit.compat import parse
    from logkit.compat.protobuf import to_serialized
    text_id = registry.register("p", PROTO_V1, "PROTOBUF")
    serialized = to_serialized(parse("PROTOBUF", PROTO_V1), name="shop/order.proto")
    assert registry.register("p", serialized, "PROTOBUF") == text_id
    with pytest.raises(InvalidSchemaError):
        registry.register("p", "message {", "PROTOBUF")


def test_proto_parser_matches_protobufs_own_descriptor_building():
    """The .proto parser's descriptor builds working message classes: maps, nested
    types, enums, oneofs, proto3 optional, and imported well-known types."""
    pytest.importorskip("google.protobuf")
    from google.protobuf import descriptor_pool, message_factory, timestamp_pb2
    from logkit.compat.proto_text import parse_proto
    fd = parse_proto(proto("""
        import "google/protobuf/timestamp.proto";
        // a comment
        message Order {
          int64 id = 1 [deprecated = true];
          map<string, Line> lines = 2;
          message Line { int32 qty = 1; Kind kind = 2; }
          enum Kind { KIND_UNSET = 0; BOOK = 1; }
          optional string note = 3;
          oneof pay { string card = 4; Money cash = 5; }
          google.protobuf.Timestamp at = 6;
          repeated int32 tags = 7 [packed = true];
          reserved 8, 9;
        }
        message Money { int64 units = 1; }
    """))
    fd.name = "order.proto"
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fd)
    order_class = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
    order = order_class(id=1, note="n", tags=[1, 2])
    order.lines["a"].qty = 2
    order.lines["a"].kind = 1
    order.cash.units = 5
    order.at.seconds = 10
    again = order_class.FromString(order.SerializeToString())
    assert again == order and again.HasField("note") and again.WhichOneof("pay") == "cash"
    assert order_class.DESCRIPTOR.fields_by_name["lines"].message_type.GetOptions().map_entry
