"""Protobuf schemas: parsing either form Confluent accepts, and its compatibility rules.

Owns: the Protobuf half of compatibility. A schema arrives as .proto text (parsed by
proto_text.py) or as Confluent's "serialized" form, a base64 `FileDescriptorProto` (what
confluent-kafka's ProtobufSerializer registers); both parse to a descriptor, and the
canonical form is the descriptor's deterministic bytes without json names, so the two
forms of one file get one id. `check` applies Confluent's Protobuf rules, field by field
number: MESSAGE_REMOVED, FIELD_KIND_CHANGED (scalar / message / enum),
FIELD_SCALAR_KIND_CHANGED outside a wire-compatible group, FIELD_NAMED_TYPE_CHANGED,
REQUIRED_FIELD_ADDED, REQUIRED_FIELD_REMOVED, ONEOF_FIELD_REMOVED,
MULTIPLE_FIELDS_MOVED_TO_ONEOF, FIELD_MOVED_TO_EXISTING_ONEOF, PACKAGE_CHANGED. Adding
or removing an optional field, renaming a field, and adding enum values are compatible.

Invariant: parsing needs the `protobuf` package (`pip install logkit[schemas]`); without
it a Protobuf schema raises CodecUnavailableError, never a wrong answer.
"""

from __future__ import annotations

import logging
import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import CodecUnavailableError
from . import Incompatibility, ParsedSchema
from .errors import InvalidSchemaError

__all__ = ["parse", "check", "ProtoModel", "to_serialized", "message_indexes",
           "message_at"]

log = logging.getLogger(__name__)

_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]+\Z")
# Scalar types whose values decode from each other's wire bytes (Confluent's groups).
_GROUPS = ({"int32", "uint32", "int64", "uint64", "bool"}, {"sint32", "sint64"},
           {"fixed32", "sfixed32"}, {"fixed64", "sfixed64"}, {"string", "bytes"})
_SCALAR_NAMES = {1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32",
                 6: "fixed64", 7: "fixed32", 8: "bool", 9: "string", 12: "bytes",
                 13: "uint32", 15: "sfixed32", 16: "sfixed64", 17: "sint32",
                 18: "sint64"}
TYPE_MESSAGE, TYPE_ENUM, TYPE_GROUP = 11, 14, 10
LABEL_REQUIRED = 2


@dataclass(frozen=True)
class _Field:
    name: str
    number: int
    kind: str                 # "scalar", "message" or "enum"
    scalar: str | None
    type_name: str
    required: bool
    oneof: str | None         # a real oneof's name (not proto3 optional's synthetic one)


@dataclass(frozen=True)
class _Message:
    name: str
    fields: dict[int, _Field]


class ProtoModel:
    """`file`: the FileDescriptorProto; `messages`: full name -> fields by number."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self.package = file.package
        self.messages: dict[str, _Message] = {}
        prefix = file.package + "." if file.package else ""
        for message in file.message_type:
            self._add(message, prefix)

    def _add(self, message: Any, prefix: str) -> None:
        full = prefix + message.name
        fields = {}
        for f in message.field:
            oneof = None
            if f.HasField("oneof_index") and not f.proto3_optional:
                oneof = message.oneof_decl[f.oneof_index].name
            kind = "message" if f.type in (TYPE_MESSAGE, TYPE_GROUP) else \
                "enum" if f.type == TYPE_ENUM else "scalar"
            fields[f.number] = _Field(f.name, f.number, kind, _SCALAR_NAMES.get(f.type),
                                      f.type_name.lstrip("."), f.label == LABEL_REQUIRED,
                                      oneof)
        self.messages[full] = _Message(full, fields)
        for nested in message.nested_type:
            if not nested.options.map_entry:
                self._add(nested, full + ".")


def _descriptor_pb2() -> Any:
    try:
        from google.protobuf import descriptor_pb2
    except ImportError:
        raise CodecUnavailableError("Protobuf schemas need the protobuf package: "
                                    "pip install 'logkit[schemas]'") from None
    return descriptor_pb2


def parse(text: str, references: Sequence[ParsedSchema] = ()) -> ParsedSchema:
    descriptor_pb2 = _descriptor_pb2()
    stripped = text.strip()
    if stripped and _BASE64.match(stripped) and "{" not in stripped:
        try:
            file = descriptor_pb2.FileDescriptorProto.FromString(
                base64.b64decode(stripped, validate=False))
        except (binascii.Error, ValueError) as exc:
            raise InvalidSchemaError(f"invalid Protobuf schema: not .proto text and not "
                                     f"a base64 FileDescriptorProto ({exc})") from None
        if not file.message_type and not file.enum_type:
            raise InvalidSchemaError("invalid Protobuf schema: the descriptor defines no "
                                     "message")
    else:
        from .proto_text import parse_proto
        file = parse_proto(text)
    if not file.message_type:
        raise InvalidSchemaError("a Protobuf schema needs at least one message")
    canonical = _canonical(file)
    first = file.message_type[0].name
    record_name = f"{file.package}.{first}" if file.package else first
    return ParsedSchema("PROTOBUF", text, canonical, record_name, ProtoModel(file))


def _canonical(file: Any) -> str:
    """Base64 of the descriptor without its name, json names and source info."""
    copy = type(file)()
    copy.CopyFrom(file)
    copy.ClearField("name")
    copy.ClearField("source_code_info")

    def strip(messages: Any) -> None:
        for message in messages:
            for f in message.field:
                f.ClearField("json_name")
            strip(message.nested_type)
    strip(copy.message_type)
    return base64.b64encode(copy.SerializeToString(deterministic=True)).decode("ascii")


def to_serialized(parsed: ParsedSchema, name: str = "schema.proto") -> str:
    """Confluent's "serialized" format: base64 of the FileDescriptorProto."""
    file = type(parsed.model.file)()
    file.CopyFrom(parsed.model.file)
    if not file.name:
        file.name = name
    return base64.b64encode(file.SerializeToString(deterministic=True)).decode("ascii")


def message_indexes(file: Any, full_name: str) -> list[int]:
    """Confluent's message-index path of message `full_name` in `file`."""
    prefix = file.package + "." if file.package else ""
    if not full_name.startswith(prefix):
        raise KeyError(full_name)
    parts = full_name[len(prefix):].split(".")
    path: list[int] = []
    messages = file.message_type
    for part in parts:
        for i, message in enumerate(messages):
            if message.name == part:
                path.append(i)
                messages = message.nested_type
                break
        else:
            raise KeyError(full_name)
    return path


def message_at(file: Any, indexes: Sequence[int]) -> str:
    """The full name of the message at Confluent's index path `indexes` in `file`."""
    name = file.package
    messages = file.message_type
    for index in indexes:
        if not 0 <= index < len(messages):
            raise KeyError(f"no message at index path {list(indexes)}")
        message = messages[index]
        name = f"{name}.{message.name}" if name else message.name
        messages = message.nested_type
    return name


def check(reader: ParsedSchema, writer: ParsedSchema) -> list[Incompatibility]:
    r, w = reader.model, writer.model
    out: list[Incompatibility] = []
    if r.package != w.package:
        out.append(Incompatibility("PACKAGE_CHANGED", "", f"the package changed from "
                                   f"{w.package!r} to {r.package!r}"))
        return out
    for name, w_message in w.messages.items():
        r_message = r.messages.get(name)
        if r_message is None:
            out.append(Incompatibility("MESSAGE_REMOVED", name,
                                       f"message {name} is missing from the reader"))
            continue
        _fields(r_message, w_message, out)
    return out


def _fields(r: _Message, w: _Message, out: list[Incompatibility]) -> None:
    def add(rule: str, field: _Field, message: str) -> None:
        out.append(Incompatibility(rule, f"{r.name}.{field.name}", message))

    for number, wf in w.fields.items():
        rf = r.fields.get(number)
        if rf is None:
            if wf.required:
                add("REQUIRED_FIELD_REMOVED", wf, f"required field {wf.name} = {number} "
                                                  "was removed")
            if wf.oneof is not None:
                add("ONEOF_FIELD_REMOVED", wf, f"field {wf.name} = {number} was removed "
                                               f"from oneof {wf.oneof}")
            continue
        if rf.kind != wf.kind:
            add("FIELD_KIND_CHANGED", rf, f"field {number} changed from a {wf.kind} to a "
                                          f"{rf.kind}")
        elif rf.kind == "scalar" and rf.scalar != wf.scalar and not any(
                {rf.scalar, wf.scalar} <= group for group in _GROUPS):
            add("FIELD_SCALAR_KIND_CHANGED", rf, f"field {number} changed from {wf.scalar} "
                                                 f"to {rf.scalar}, which do not share a "
                                                 "wire encoding")
        elif rf.kind != "scalar" and rf.type_name != wf.type_name:
            add("FIELD_NAMED_TYPE_CHANGED", rf, f"field {number} changed type from "
                                                f"{wf.type_name} to {rf.type_name}")
    for number, rf in r.fields.items():
        if rf.required and (number not in w.fields or not w.fields[number].required):
            add("REQUIRED_FIELD_ADDED", rf, f"required field {rf.name} = {number} is new")
    writer_oneofs = {f.oneof for f in w.fields.values() if f.oneof}
    moved: dict[str, list[_Field]] = {}
    for number, rf in r.fields.items():
        wf = w.fields.get(number)
        if rf.oneof and wf is not None and wf.oneof is None:
            moved.setdefault(rf.oneof, []).append(rf)
    for oneof, fields in moved.items():
        if oneof in writer_oneofs:
            add("FIELD_MOVED_TO_EXISTING_ONEOF", fields[0],
                f"field {fields[0].name} moved into the existing oneof {oneof}")
        elif len(fields) > 1:
            add("MULTIPLE_FIELDS_MOVED_TO_ONEOF", fields[0],
                f"fields {[f.name for f in fields]} moved into the new oneof {oneof}")
