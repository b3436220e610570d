"""A .proto text parser: proto2/proto3 source to a `FileDescriptorProto`, without protoc.

Owns: reading the schema text users register (`syntax`, `package`, `import`, `option`,
`message` with nested messages and enums, fields with labels and `[options]`, `map<K, V>`,
`oneof`, proto3 `optional`, `reserved`, `extensions`, `enum`, and `service`/`extend`
blocks, which are skipped). Type names are resolved the way protoc resolves them: the
innermost enclosing scope first, then outwards, then the imported well-known types.

Invariant: the descriptor built here equals what protoc emits for the same file in every
field the registry reads (names, numbers, types, labels, type names, oneofs, map entries,
packages); source locations and options other than `map_entry`, `packed` and
`deprecated` are not kept. Anything outside the grammar raises `InvalidSchemaError`
with the line number. Bounded: at most `MAX_TOKENS` tokens, messages nested at most
`MAX_NESTING` deep.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Iterator

from . import MAX_NESTING
from .errors import InvalidSchemaError

__all__ = ["parse_proto", "MAX_TOKENS"]

log = logging.getLogger(__name__)

MAX_TOKENS = 200_000
_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>-?(?:0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|inf|nan)\b)
  | (?P<ident>\.?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<symbol>[{}\[\]()<>;,=:\-+])
""", re.VERBOSE | re.DOTALL)

SCALARS = {
    "double": 1, "float": 2, "int64": 3, "uint64": 4, "int32": 5, "fixed64": 6,
    "fixed32": 7, "bool": 8, "string": 9, "bytes": 12, "uint32": 13, "sfixed32": 15,
    "sfixed64": 16, "sint32": 17, "sint64": 18,
}
TYPE_MESSAGE, TYPE_ENUM, TYPE_GROUP = 11, 14, 10
LABELS = {"optional": 1, "required": 2, "repeated": 3}
MAP_KEY_TYPES = frozenset(SCALARS) - {"double", "float", "bytes"}


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    position, line = 0, 1
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise InvalidSchemaError(f"invalid .proto schema, line {line}: unexpected "
                                     f"{text[position:position + 10]!r}")
        kind = match.lastgroup or ""
        value = match.group()
        if kind not in ("space", "comment"):
            out.append((kind, value, line))
            if len(out) > MAX_TOKENS:
                raise InvalidSchemaError(f"the .proto schema is longer than {MAX_TOKENS} "
                                         "tokens")
        line += value.count("\n")
        position = match.end()
    return out


def _json_name(name: str) -> str:
    """protoc's json_name: underscores dropped, the letter after each capitalised."""
    parts = name.split("_")
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


def _map_entry_name(field: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in field.split("_")) + "Entry"


class _Parser:
    def __init__(self, text: str) -> None:
        from google.protobuf import descriptor_pb2
        self.pb = descriptor_pb2
        self.tokens = _tokens(text)
        self.i = 0
        # (field proto, scope full name, written type name): resolved after parsing.
        self.unresolved: list[tuple[Any, str, str]] = []
        self.types: dict[str, int] = {}          # full name (".pkg.Msg") -> kind

    # -- token helpers --

    def fail(self, message: str) -> InvalidSchemaError:
        line = self.tokens[min(self.i, len(self.tokens) - 1)][2] if self.tokens else 1
        return InvalidSchemaError(f"invalid .proto schema, line {line}: {message}")

    def peek(self, ahead: int = 0) -> str:
        i = self.i + ahead
        return self.tokens[i][1] if i < len(self.tokens) else ""

    def next(self) -> tuple[str, str, int]:
        if self.i >= len(self.tokens):
            raise self.fail("unexpected end of the schema")
        token = self.tokens[self.i]
        self.i += 1
        return token

    def expect(self, value: str) -> None:
        _, got, _ = self.next()
        if got != value:
            self.i -= 1
            raise self.fail(f"expected {value!r}, found {got!r}")

    def ident(self) -> str:
        kind, value, _ = self.next()
        if kind != "ident":
            self.i -= 1
            raise self.fail(f"expected a name, found {value!r}")
        return value

    def integer(self) -> int:
        kind, value, _ = self.next()
        if kind == "symbol" and value == "-":
            return -self.integer()
        if kind != "number":
            self.i -= 1
            raise self.fail(f"expected a number, found {value!r}")
        try:
            return int(value, 0)
        except ValueError:
            raise self.fail(f"expected an integer, found {value!r}") from None

    def string(self) -> str:
        kind, value, _ = self.next()
        if kind != "string":
            self.i -= 1
            raise self.fail(f"expected a string, found {value!r}")
        return value[1:-1].encode().decode("unicode_escape")

    def skip_statement(self) -> None:
        """Up to and including the next ';' at this level (a braced block counts)."""
        depth = 0
        while True:
            _, value, _ = self.next()
            if value in "{([<" and value:
                depth += 1
            elif value in "})]>" and value:
                depth -= 1
                if depth == 0 and value == "}":
                    return
            elif value == ";" and depth == 0:
                return

    def skip_block(self) -> None:
        """A `name ... { ... }` block whose content is not kept (service, extend)."""
        while self.peek() != "{":
            self.next()
        depth = 0
        while True:
            _, value, _ = self.next()
            if value == "{":
                depth += 1
            elif value == "}":
                depth -= 1
                if depth == 0:
                    return

    # -- the file --

    def file(self) -> Any:
        fd = self.pb.FileDescriptorProto()
        fd.name = "schema.proto"
        syntax = "proto2"
        if self.peek() == "syntax":
            self.next()
            self.expect("=")
            syntax = self.string()
            self.expect(";")
            if syntax not in ("proto2", "proto3"):
                raise self.fail(f"unknown syntax {syntax!r}")
        if syntax == "proto3":
            fd.syntax = "proto3"
        self.syntax = syntax
        while self.i < len(self.tokens):
            word = self.peek()
            if word == "package":
                self.next()
                fd.package = self.ident().lstrip(".")
                self.expect(";")
            elif word == "import":
                self.next()
                if self.peek() in ("public", "weak"):
                    self.next()
                fd.dependency.append(self.string())
                self.expect(";")
            elif word == "option":
                self.skip_statement()
            elif word == "message":
                self.next()
                self.message(fd.message_type.add(), self.scope(fd.package))
            elif word == "enum":
                self.next()
                self.enum(fd.enum_type.add(), self.scope(fd.package))
            elif word in ("service", "extend"):
                self.skip_block()
            elif word == ";":
                self.next()
            else:
                raise self.fail(f"unexpected {word!r} at the top level")
        self.resolve(fd)
        return fd

    @staticmethod
    def scope(package: str) -> str:
        return "." + package if package else ""

    # -- messages, fields, enums --

    def message(self, msg: Any, scope: str, depth: int = 0) -> None:
        if depth > MAX_NESTING:
            raise self.fail(f"messages nest deeper than {MAX_NESTING}")
        msg.name = self.ident()
        full = f"{scope}.{msg.name}"
        self.types[full] = TYPE_MESSAGE
        self.expect("{")
        synthetic: list[str] = []
        while self.peek() != "}":
            word = self.peek()
            if word == "message":
                self.next()
                self.message(msg.nested_type.add(), full, depth + 1)
            elif word == "enum":
                self.next()
                self.enum(msg.enum_type.add(), full)
            elif word == "oneof":
                self.next()
                index = len(msg.oneof_decl)
                msg.oneof_decl.add().name = self.ident()
                self.expect("{")
                while self.peek() != "}":
                    if self.peek() == "option":
                        self.skip_statement()
                        continue
                    field = msg.field.add()
                    field.oneof_index = index
                    self.field(field, msg, full, label=None)
                self.expect("}")
            elif word in ("reserved", "extensions", "option"):
                self.skip_statement()
            elif word in ("extend", "service"):
                self.skip_block()
            elif word == ";":
                self.next()
            elif word == "map" and self.peek(1) == "<":
                self.map_field(msg, full)
            else:
                label = None
                if word in LABELS:
                    label = self.next()[1]
                field = msg.field.add()
                self.field(field, msg, full, label=label)
                if label == "optional" and self.syntax == "proto3":
                    field.proto3_optional = True
                    synthetic.append(field.name)
        self.expect("}")
        # protoc puts proto3 `optional`'s synthetic oneofs after every real one.
        for name in synthetic:
            field = next(f for f in msg.field if f.name == name)
            field.oneof_index = len(msg.oneof_decl)
            msg.oneof_decl.add().name = "_" + name

    def field(self, field: Any, msg: Any, scope: str, *, label: str | None) -> None:
        written = self.ident()
        if written == "group":
            raise self.fail("proto2 groups are not supported")
        field.name = self.ident()
        self.expect("=")
        field.number = self.integer()
        if not 1 <= field.number <= (1 << 29) - 1:
            raise self.fail(f"field number {field.number} is out of range")
        field.json_name = _json_name(field.name)
        if label == "required" and self.syntax == "proto3":
            raise self.fail("proto3 has no required fields")
        field.label = LABELS[label] if label else LABELS["optional"]
        if written in SCALARS:
            field.type = SCALARS[written]
        else:
            self.unresolved.append((field, scope, written))
        if self.peek() == "[":
            self.field_options(field)
        self.expect(";")

    def field_options(self, field: Any) -> None:
        self.expect("[")
        while True:
            name = self.ident() if self.peek() != "(" else self.paren_name()
            self.expect("=")
            kind, value, _ = self.next()
            if kind == "symbol" and value == "-":
                kind, value, _ = self.next()
            if name == "packed":
                field.options.packed = value == "true"
            elif name == "deprecated":
                field.options.deprecated = value == "true"
            elif name == "default":
                field.default_value = value[1:-1] if kind == "string" else value
            elif name == "json_name" and kind == "string":
                field.json_name = value[1:-1]
            if self.peek() == ",":
                self.next()
                continue
            self.expect("]")
            return

    def paren_name(self) -> str:
        self.expect("(")
        name = self.ident()
        self.expect(")")
        while self.peek().startswith("."):
            name += self.ident()
        return name

    def map_field(self, msg: Any, scope: str) -> None:
        self.next()
        self.expect("<")
        key = self.ident()
        if key not in MAP_KEY_TYPES:
            raise self.fail(f"{key!r} cannot be a map key type")
        self.expect(",")
        value = self.ident()
        self.expect(">")
        field = msg.field.add()
        field.name = self.ident()
        self.expect("=")
        field.number = self.integer()
        field.json_name = _json_name(field.name)
        field.label = LABELS["repeated"]
        field.type = TYPE_MESSAGE
        entry = msg.nested_type.add()
        entry.name = _map_entry_name(field.name)
        entry.options.map_entry = True
        entry_full = f"{scope}.{entry.name}"
        self.types[entry_full] = TYPE_MESSAGE
        field.type_name = entry_full
        for number, (name, written) in enumerate((("key", key), ("value", value)), 1):
            part = entry.field.add()
            part.name, part.number, part.json_name = name, number, name
            part.label = LABELS["optional"]
            if written in SCALARS:
                part.type = SCALARS[written]
            else:
                self.unresolved.append((part, scope, written))
        if self.peek() == "[":
            self.field_options(field)
        self.expect(";")

    def enum(self, enum: Any, scope: str) -> None:
        enum.name = self.ident()
        self.types[f"{scope}.{enum.name}"] = TYPE_ENUM
        self.expect("{")
        while self.peek() != "}":
            word = self.peek()
            if word in ("option", "reserved"):
                self.skip_statement()
                continue
            if word == ";":
                self.next()
                continue
            value = enum.value.add()
            value.name = self.ident()
            self.expect("=")
            value.number = self.integer()
            if self.peek() == "[":
                self.skip_statement()
                self.i -= 1                       # skip_statement took the ';'
            self.expect(";")
        self.expect("}")
        if not enum.value:
            raise self.fail(f"enum {enum.name} has no values")

    # -- type names --

    def candidates(self, scope: str, written: str) -> Iterator[str]:
        if written.startswith("."):
            yield written
            return
        parts = scope.split(".") if scope else [""]
        for end in range(len(parts), 0, -1):
            prefix = ".".join(parts[:end])
            yield f"{prefix}.{written}" if prefix else f".{written}"
        yield "." + written

    def resolve(self, fd: Any) -> None:
        for field, scope, written in self.unresolved:
            for candidate in self.candidates(scope, written):
                kind = self.types.get(candidate) or _well_known(candidate)
                if kind:
                    field.type, field.type_name = kind, candidate
                    break
            else:
                # From an import this parser does not read: protoc would know whether it
                # is a message or an enum; a message is the common case.
                field.type = TYPE_MESSAGE
                field.type_name = "." + written.lstrip(".") if "." in written else \
                    f"{self.scope(fd.package)}.{written}"


_WELL_KNOWN_MODULES = ("any_pb2", "duration_pb2", "empty_pb2", "field_mask_pb2",
                       "struct_pb2", "timestamp_pb2", "wrappers_pb2")


def _well_known(full: str) -> int | None:
    if not full.startswith(".google.protobuf."):
        return None
    import importlib
    from google.protobuf import descriptor_pool
    for module in _WELL_KNOWN_MODULES:
        importlib.import_module(f"google.protobuf.{module}")
    pool = descriptor_pool.Default()
    name = full[1:]
    for finder, kind in ((pool.FindMessageTypeByName, TYPE_MESSAGE),
                         (pool.FindEnumTypeByName, TYPE_ENUM)):
        try:
            finder(name)
            return kind
        except KeyError:
            continue
    return None


def parse_proto(text: str) -> Any:
    """The `FileDescriptorProto` of .proto source `text` (named "schema.proto")."""
    return _Parser(text).file()
