"""Avro schemas: parsing, Avro's resolution rules as a checker, and datum errors by path.

Owns: the Avro half of compatibility. `parse` turns schema JSON into a model where
every name is a full name and every later use of a named type is a reference; `check`
applies the Avro specification's schema-resolution rules (what Confluent's registry
applies): a reader field missing from the writer needs a default, a writer field the
reader lacks is skipped, primitives promote int->long->float->double and string<->bytes,
enum symbols the writer may send must exist in the reader unless it has a default,
unions are matched branch by branch, named types match by unqualified name or alias.
`find_error` names the dotted field path of the first part of a datum that does not fit
the schema (used for a clear `SerializationError` after fastavro refuses a value).

Invariant: the model is plain dicts, each node `{"type": kind, ...}`; `names` maps every
full name to its one definition, so recursive types are walked with a seen-set, never
expanded. Pure Python: no Avro library is needed to register or check Avro schemas.
"""

from __future__ import annotations

import logging
import json
import math
import re
from typing import Any, Sequence

from . import MAX_NESTING, Incompatibility, ParsedSchema, load_json
from .errors import InvalidSchemaError

__all__ = ["parse", "check", "find_error", "AvroModel"]

log = logging.getLogger(__name__)

PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes",
                        "string"))
NAMED = frozenset(("record", "error", "enum", "fixed"))
# (writer type, reader type) pairs the specification resolves by promotion.
PROMOTIONS = frozenset((("int", "long"), ("int", "float"), ("int", "double"),
                        ("long", "float"), ("long", "double"), ("float", "double"),
                        ("string", "bytes"), ("bytes", "string")))
INT_RANGE = (-(1 << 31), (1 << 31) - 1)
LONG_RANGE = (-(1 << 63), (1 << 63) - 1)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class AvroModel:
    """`root`: the normalized schema; `names`: full name -> definition."""

    def __init__(self, root: dict[str, Any], names: dict[str, dict[str, Any]]) -> None:
        self.root = root
        self.names = names

    def deref(self, node: dict[str, Any]) -> dict[str, Any]:
        return self.names[node["name"]] if node["type"] == "ref" else node


# ---- parsing -----------------------------------------------------------------------------

def parse(text: str, references: Sequence[ParsedSchema] = ()) -> ParsedSchema:
    document = load_json(text, "Avro schema")
    names: dict[str, dict[str, Any]] = {}
    for ref in references:
        if ref.schema_type != "AVRO":
            raise InvalidSchemaError("an Avro schema can only reference Avro schemas")
        names.update(ref.model.names)
    root = _Parser(names).walk(document, "", "", 0)
    record_name = root.get("name") if root["type"] in NAMED else None
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return ParsedSchema("AVRO", text, canonical, record_name, AvroModel(root, names))


class _Parser:
    def __init__(self, names: dict[str, dict[str, Any]]) -> None:
        self.names = names

    def fail(self, path: str, message: str) -> InvalidSchemaError:
        return InvalidSchemaError(f"invalid Avro schema at {path or '<root>'}: {message}")

    def walk(self, node: Any, namespace: str, path: str, depth: int) -> dict[str, Any]:
        if depth > MAX_NESTING:
            raise self.fail(path, f"nested deeper than {MAX_NESTING}")
        if isinstance(node, str):
            return self.named_use(node, namespace, path)
        if isinstance(node, list):
            return self.union(node, namespace, path, depth)
        if not isinstance(node, dict):
            raise self.fail(path, f"a type must be a string, list or object, not {node!r}")
        kind = node.get("type")
        if isinstance(kind, (dict, list)):
            return self.walk(kind, namespace, path, depth + 1)
        if not isinstance(kind, str):
            raise self.fail(path, "an object type needs a string \"type\"")
        if kind in PRIMITIVES:
            out = {"type": kind}
            if isinstance(node.get("logicalType"), str):
                out["logicalType"] = node["logicalType"]
            return out
        if kind == "array":
            if "items" not in node:
                raise self.fail(path, "an array needs \"items\"")
            return {"type": "array", "items": self.walk(node["items"], namespace,
                                                        path + "[]", depth + 1)}
        if kind == "map":
            if "values" not in node:
                raise self.fail(path, "a map needs \"values\"")
            return {"type": "map", "values": self.walk(node["values"], namespace,
                                                       path + "{}", depth + 1)}
        if kind in NAMED:
            return self.named_definition(kind, node, namespace, path, depth)
        return self.named_use(kind, namespace, path)

    def fullname(self, node: dict[str, Any], namespace: str, path: str) -> tuple[str, str]:
        name = node.get("name")
        if not isinstance(name, str) or not name:
            raise self.fail(path, f"a {node.get('type')} needs a \"name\"")
        if "." in name:
            namespace, _, short = name.rpartition(".")
        else:
            short = name
            if "namespace" in node:
                namespace = node["namespace"] or ""
                if not isinstance(namespace, str):
                    raise self.fail(path, "\"namespace\" must be a string")
        for part in ([short] + (namespace.split(".") if namespace else [])):
            if not _NAME.match(part):
                raise self.fail(path, f"{part!r} is not a valid Avro name")
        full = f"{namespace}.{short}" if namespace else short
        if short in PRIMITIVES:
            raise self.fail(path, f"{full!r} redefines a primitive type")
        if full in self.names:
            raise self.fail(path, f"{full!r} is defined twice")
        return full, namespace

    def named_use(self, name: str, namespace: str, path: str) -> dict[str, Any]:
        if name in PRIMITIVES:
            return {"type": name}
        candidates = [name] if "." in name else \
            ([f"{namespace}.{name}"] if namespace else []) + [name]
        for candidate in candidates:
            if candidate in self.names:
                return {"type": "ref", "name": candidate}
        raise self.fail(path, f"unknown type {name!r} (named types must be defined before "
                              "they are used, or come from a reference)")

    def union(self, branches: list[Any], namespace: str, path: str,
              depth: int) -> dict[str, Any]:
        out = []
        seen: set[str] = set()
        for branch in branches:
            node = self.walk(branch, namespace, path, depth + 1)
            if node["type"] == "union":
                raise self.fail(path, "a union may not directly contain a union")
            key = node.get("name", node["type"]) if node["type"] in NAMED | {"ref"} \
                else node["type"]
            if key in seen:
                raise self.fail(path, f"the union has two branches of type {key!r}")
            seen.add(key)
            out.append(node)
        if not out:
            raise self.fail(path, "a union needs at least one branch")
        return {"type": "union", "branches": out}

    def named_definition(self, kind: str, node: dict[str, Any], namespace: str, path: str,
                         depth: int) -> dict[str, Any]:
        full, namespace = self.fullname(node, namespace, path)
        aliases = node.get("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise self.fail(path, "\"aliases\" must be a list of names")
        out: dict[str, Any] = {"type": "record" if kind == "error" else kind, "name": full,
                               "aliases": [a if "." in a or not namespace
                                           else f"{namespace}.{a}" for a in aliases]}
        self.names[full] = out                         # before the fields: recursion
        if kind == "fixed":
            size = node.get("size")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise self.fail(path, f"fixed {full!r} needs a non-negative \"size\"")
            out["size"] = size
            if isinstance(node.get("logicalType"), str):
                out["logicalType"] = node["logicalType"]
        elif kind == "enum":
            symbols = node.get("symbols")
            if not isinstance(symbols, list) or not all(
                    isinstance(s, str) and _NAME.match(s) for s in symbols):
                raise self.fail(path, f"enum {full!r} needs \"symbols\", a list of names")
            if len(set(symbols)) != len(symbols):
                raise self.fail(path, f"enum {full!r} repeats a symbol")
            out["symbols"] = list(symbols)
            if "default" in node:
                if node["default"] not in symbols:
                    raise self.fail(path, f"enum {full!r}'s default {node['default']!r} "
                                          "is not one of its symbols")
                out["default"] = node["default"]
        else:
            fields = node.get("fields")
            if not isinstance(fields, list):
                raise self.fail(path, f"record {full!r} needs a \"fields\" list")
            out["fields"] = []
            seen: set[str] = set()
            for spec in fields:
                out["fields"].append(self.field(spec, namespace, path, depth, seen))
        return out

    def field(self, spec: Any, namespace: str, path: str, depth: int,
              seen: set[str]) -> dict[str, Any]:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise self.fail(path, "each field needs a \"name\"")
        name = spec["name"]
        where = f"{path}.{name}" if path else name
        if not _NAME.match(name):
            raise self.fail(where, f"{name!r} is not a valid field name")
        if name in seen:
            raise self.fail(where, f"field {name!r} appears twice")
        seen.add(name)
        if "type" not in spec:
            raise self.fail(where, f"field {name!r} needs a \"type\"")
        node = self.walk(spec["type"], namespace, where, depth + 1)
        out: dict[str, Any] = {"name": name, "type": node,
                               "aliases": list(spec.get("aliases", []))}
        if "default" in spec:
            problem = _default_problem(self.names, node, spec["default"])
            if problem:
                raise self.fail(where, f"the default {spec['default']!r} {problem}")
            out["default"] = spec["default"]
        return out


def _default_problem(names: dict[str, dict[str, Any]], node: dict[str, Any],
                     value: Any, depth: int = 0) -> str | None:
    """Why `value` is not a valid default for `node` (JSON encoding, as the spec says),
    or None. A union's default matches its first branch."""
    if depth > MAX_NESTING:
        return None
    node = names[node["name"]] if node["type"] == "ref" else node
    kind = node["type"]
    if kind == "union":
        return _default_problem(names, node["branches"][0], value, depth + 1) and \
            f"does not match the union's first branch {_kind_name(node['branches'][0])}"
    ok = {
        "null": lambda: value is None,
        "boolean": lambda: isinstance(value, bool),
        "int": lambda: _is_int(value) and INT_RANGE[0] <= value <= INT_RANGE[1],
        "long": lambda: _is_int(value) and LONG_RANGE[0] <= value <= LONG_RANGE[1],
        "float": lambda: _is_number(value),
        "double": lambda: _is_number(value),
        "bytes": lambda: isinstance(value, str),
        "string": lambda: isinstance(value, str),
        "fixed": lambda: isinstance(value, str) and len(value) == node["size"],
        "enum": lambda: value in node["symbols"],
        "array": lambda: isinstance(value, list) and not any(
            _default_problem(names, node["items"], v, depth + 1) for v in value),
        "map": lambda: isinstance(value, dict) and not any(
            _default_problem(names, node["values"], v, depth + 1) for v in value.values()),
        "record": lambda: isinstance(value, dict) and not any(
            (f["name"] not in value and "default" not in f) or
            (f["name"] in value and _default_problem(names, f["type"], value[f["name"]],
                                                     depth + 1))
            for f in node["fields"]),
    }[kind]()
    return None if ok else f"is not a valid {kind}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind_name(node: dict[str, Any]) -> str:
    return node.get("name", node["type"]) if node["type"] in NAMED | {"ref"} \
        else node["type"]


# ---- schema resolution -------------------------------------------------------------------

def check(reader: ParsedSchema, writer: ParsedSchema) -> list[Incompatibility]:
    out: list[Incompatibility] = []
    _Resolver(reader.model, writer.model, out).resolve(reader.model.root,
                                                       writer.model.root, "", 0)
    return out


def _short(name: str) -> str:
    return name.rpartition(".")[2]


class _Resolver:
    def __init__(self, reader: AvroModel, writer: AvroModel,
                 out: list[Incompatibility]) -> None:
        self.reader, self.writer, self.out = reader, writer, out
        self.seen: set[tuple[str, str]] = set()

    def add(self, rule: str, path: str, message: str) -> None:
        self.out.append(Incompatibility(rule, path, message))

    def readable(self, r: dict[str, Any], w: dict[str, Any], depth: int) -> bool:
        """Whether `r` reads `w`, without recording anything (union branch matching)."""
        probe = _Resolver(self.reader, self.writer, [])
        probe.seen = set(self.seen)
        probe.resolve(r, w, "", depth)
        return not probe.out

    def resolve(self, r: dict[str, Any], w: dict[str, Any], path: str, depth: int) -> None:
        if depth > MAX_NESTING:
            return
        r, w = self.reader.deref(r), self.writer.deref(w)
        if w["type"] == "union":
            for branch in w["branches"]:
                if r["type"] == "union" and not any(
                        self.readable(b, branch, depth + 1) for b in r["branches"]):
                    self.add("MISSING_UNION_BRANCH", path,
                             f"the writer's union branch {_kind_name(branch)} has no "
                             "branch in the reader's union that can read it")
                elif r["type"] != "union":
                    self.resolve(r, branch, path, depth + 1)
            return
        if r["type"] == "union":
            if not any(self.readable(b, w, depth + 1) for b in r["branches"]):
                self.add("MISSING_UNION_BRANCH", path,
                         f"the reader's union has no branch that reads the writer's "
                         f"{_kind_name(w)}")
            return
        rk, wk = r["type"], w["type"]
        if rk in PRIMITIVES and wk in PRIMITIVES:
            if rk != wk and (wk, rk) not in PROMOTIONS:
                self.add("TYPE_MISMATCH", path, f"the writer's {wk} cannot be read as "
                                                f"{rk} (no Avro promotion from {wk} to {rk})")
            return
        if rk != wk:
            self.add("TYPE_MISMATCH", path, f"the writer's {_kind_name(w)} cannot be read "
                                            f"as {_kind_name(r)}")
            return
        if rk in NAMED and not self.names_match(r, w, path):
            return
        if rk == "record":
            self.record(r, w, path, depth)
        elif rk == "enum":
            missing = [s for s in w["symbols"] if s not in r["symbols"]]
            if missing and "default" not in r:
                self.add("MISSING_ENUM_SYMBOLS", path,
                         f"the reader's enum {_short(r['name'])} lacks the writer's "
                         f"symbols {missing} and has no default")
        elif rk == "fixed":
            if r["size"] != w["size"]:
                self.add("FIXED_SIZE_MISMATCH", path,
                         f"fixed {_short(r['name'])} is {r['size']} bytes in the reader "
                         f"and {w['size']} in the writer")
        elif rk == "array":
            self.resolve(r["items"], w["items"], path + "[]", depth + 1)
        elif rk == "map":
            self.resolve(r["values"], w["values"], path + "{}", depth + 1)

    def names_match(self, r: dict[str, Any], w: dict[str, Any], path: str) -> bool:
        # The specification compares unqualified names; the reader's aliases also match.
        if _short(r["name"]) == _short(w["name"]) or w["name"] in r["aliases"] or \
                _short(w["name"]) in map(_short, r["aliases"]):
            return True
        self.add("NAME_MISMATCH", path, f"the writer's {w['type']} {w['name']} does not "
                                        f"match the reader's {r['name']} (names or aliases)")
        return False

    def record(self, r: dict[str, Any], w: dict[str, Any], path: str, depth: int) -> None:
        key = (r["name"], w["name"])
        if key in self.seen:                           # a recursive type, already checked
            return
        self.seen.add(key)
        writer_fields = {f["name"]: f for f in w["fields"]}
        for field in r["fields"]:
            where = f"{path}.{field['name']}" if path else field["name"]
            match = writer_fields.get(field["name"]) or next(
                (writer_fields[a] for a in field["aliases"] if a in writer_fields), None)
            if match is not None:
                self.resolve(field["type"], match["type"], where, depth + 1)
            elif "default" not in field:
                self.add("READER_FIELD_MISSING_DEFAULT_VALUE", where,
                         f"field {field['name']!r} is not in the writer's schema and has no "
                         "default in the reader's (give it a default)")


# ---- datum errors by path ----------------------------------------------------------------

def find_error(model: AvroModel, datum: Any) -> tuple[str, str] | None:
    """(dotted path, what is wrong) for the first part of `datum` that the schema does
    not accept, or None when this check finds nothing (fastavro's message then stands).
    Logical types accept their Python types (datetime, Decimal, UUID...) unchecked."""
    return _datum_error(model, model.root, datum, "", 0)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _datum_error(model: AvroModel, node: dict[str, Any], datum: Any, path: str,
                 depth: int) -> tuple[str, str] | None:
    if depth > MAX_NESTING:
        return None
    node = model.deref(node)
    kind = node["type"]
    if "logicalType" in node and not isinstance(datum, (int, float, str, bytes)):
        return None
    if kind == "union":
        if isinstance(datum, tuple) and len(datum) == 2:       # fastavro's (name, value)
            return None
        errors = [_datum_error(model, b, datum, path, depth + 1) for b in node["branches"]]
        if all(errors):
            deepest = max(errors, key=lambda e: len(e[0]))      # type: ignore[index]
            if deepest[0] != path:                              # type: ignore[index]
                return deepest
            kinds = ", ".join(_kind_name(b) for b in node["branches"])
            return path, f"{datum!r} matches none of the union's types ({kinds})"
        return None
    if kind == "record":
        if not isinstance(datum, dict):
            return path, f"expected a record ({node['name']}) as a dict, got " \
                         f"{type(datum).__name__}"
        for field in node["fields"]:
            where = _join(path, field["name"])
            if field["name"] not in datum:
                if "default" not in field:
                    return where, "is missing (the field has no default)"
                continue
            error = _datum_error(model, field["type"], datum[field["name"]], where,
                                 depth + 1)
            if error:
                return error
        return None
    if kind == "array":
        if not isinstance(datum, (list, tuple)):
            return path, f"expected an array (list), got {type(datum).__name__}"
        for i, item in enumerate(datum):
            error = _datum_error(model, node["items"], item, f"{path}[{i}]", depth + 1)
            if error:
                return error
        return None
    if kind == "map":
        if not isinstance(datum, dict):
            return path, f"expected a map (dict), got {type(datum).__name__}"
        for key, item in datum.items():
            if not isinstance(key, str):
                return f"{path}[{key!r}]", "map keys must be strings"
            error = _datum_error(model, node["values"], item, f"{path}[{key!r}]", depth + 1)
            if error:
                return error
        return None
    problem = _scalar_problem(node, datum)
    return (path, problem) if problem else None


def _scalar_problem(node: dict[str, Any], datum: Any) -> str | None:
    kind = node["type"]
    if kind == "null":
        return None if datum is None else f"expected null, got {datum!r}"
    if kind == "boolean":
        return None if isinstance(datum, bool) else f"expected a boolean, got {datum!r}"
    if kind in ("int", "long"):
        low, high = INT_RANGE if kind == "int" else LONG_RANGE
        if not _is_int(datum):
            return f"expected an {kind}, got {type(datum).__name__} {datum!r}"
        return None if low <= datum <= high else f"{datum} is out of range for an {kind}"
    if kind in ("float", "double"):
        return None if _is_number(datum) and not (kind == "float" and isinstance(
            datum, float) and math.isfinite(datum) and abs(datum) > 3.5e38) \
            else f"expected a {kind}, got {type(datum).__name__} {datum!r}"
    if kind == "string":
        return None if isinstance(datum, str) else \
            f"expected a string, got {type(datum).__name__} {datum!r}"
    if kind == "bytes":
        return None if isinstance(datum, (bytes, bytearray, memoryview)) else \
            f"expected bytes, got {type(datum).__name__}"
    if kind == "fixed":
        if not isinstance(datum, (bytes, bytearray)):
            return f"expected {node['size']} bytes (fixed), got {type(datum).__name__}"
        return None if len(datum) == node["size"] else \
            f"expected {node['size']} bytes (fixed), got {len(datum)}"
    if kind == "enum":
        return None if datum in node["symbols"] else \
            f"{datum!r} is not one of the enum's symbols {node['symbols']}"
    return None
