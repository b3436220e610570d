"""JSON Schema: parsing and the reader/writer rules Confluent's registry applies.

Owns: the JSON Schema half of compatibility. A reader can read a writer's data when
every document valid under the writer is valid under the reader, so `check` walks both
schemas and reports each place where the reader accepts less. The rule names are
Confluent's: TYPE_NARROWED, REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL,
PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL (an object open to extra properties may already
hold the new property with any value), PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL,
ADDITIONAL_PROPERTIES_REMOVED/NARROWED, ENUM_ARRAY_NARROWED, MAX_LENGTH_DECREASED and
the other bound changes, SUM_TYPE_NARROWED for anyOf/oneOf.

Invariant: the check is conservative: when it cannot prove the reader accepts what the
writer accepts (an unsupported keyword changed) it reports it; it never reports a change
that only widens the reader. `$ref`s to local definitions are followed, once per pair.
Validation of the schema itself uses the `jsonschema` package when it is installed.
"""

from __future__ import annotations

import logging
import json
from typing import Any, Sequence

from . import MAX_NESTING, Incompatibility, ParsedSchema
from .errors import InvalidSchemaError

__all__ = ["parse", "check"]

log = logging.getLogger(__name__)

# Keywords where a larger value in the reader accepts less, and smaller accepts less.
LOWER_BOUNDS = {"minimum": "MINIMUM", "exclusiveMinimum": "EXCLUSIVE_MINIMUM",
                "minLength": "MIN_LENGTH", "minItems": "MIN_ITEMS",
                "minProperties": "MIN_PROPERTIES"}
UPPER_BOUNDS = {"maximum": "MAXIMUM", "exclusiveMaximum": "EXCLUSIVE_MAXIMUM",
                "maxLength": "MAX_LENGTH", "maxItems": "MAX_ITEMS",
                "maxProperties": "MAX_PROPERTIES"}
JSON_TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")


def parse(text: str, references: Sequence[ParsedSchema] = ()) -> ParsedSchema:
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise InvalidSchemaError(f"JSON Schema is not JSON: {exc}") from None
    if not isinstance(document, (dict, bool)):
        raise InvalidSchemaError("a JSON Schema must be an object or a boolean")
    _check_schema(document)
    title = document.get("title") if isinstance(document, dict) else None
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return ParsedSchema("JSON", text, canonical, title if isinstance(title, str) else None,
                        document)


def _check_schema(document: Any) -> None:
    try:
        from jsonschema import exceptions, validators
    except ImportError:                 # registration still works; only JSON is checked
        return
    cls = validators.validator_for(document, default=validators.Draft7Validator)
    try:
        cls.check_schema(document)
    except exceptions.SchemaError as exc:
        where = ".".join(str(p) for p in exc.absolute_path) or "<root>"
        raise InvalidSchemaError(f"invalid JSON Schema at {where}: {exc.message}") from None


def check(reader: ParsedSchema, writer: ParsedSchema) -> list[Incompatibility]:
    out: list[Incompatibility] = []
    _Walker(reader.model, writer.model, out).compare(reader.model, writer.model, "", 0)
    return out


def _types(schema: dict[str, Any]) -> set[str] | None:
    kind = schema.get("type")
    if kind is None:
        return None
    kinds = set(kind) if isinstance(kind, list) else {kind}
    if "number" in kinds:
        kinds.add("integer")            # every integer is a number
    return kinds


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class _Walker:
    def __init__(self, reader_root: Any, writer_root: Any,
                 out: list[Incompatibility]) -> None:
        self.roots = (reader_root, writer_root)
        self.out = out
        self.seen: set[tuple[int, int]] = set()

    def add(self, rule: str, path: str, message: str) -> None:
        self.out.append(Incompatibility(rule, path, message))

    def deref(self, schema: Any, root: Any) -> Any:
        for _ in range(MAX_NESTING):
            if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)
                    and schema["$ref"].startswith("#")):
                return schema
            target = root
            for part in schema["$ref"][1:].split("/")[1:]:
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    return schema           # an unresolvable ref compares as written
                target = target[part]
            schema = target
        return schema

    def accepts_all(self, r: Any, w: Any, depth: int) -> bool:
        probe = _Walker(*self.roots, [])
        probe.seen = set(self.seen)
        probe.compare(r, w, "", depth)
        return not probe.out

    def compare(self, r: Any, w: Any, path: str, depth: int) -> None:
        if depth > MAX_NESTING:
            return
        r, w = self.deref(r, self.roots[0]), self.deref(w, self.roots[1])
        if w is False or r is True or r == {} or r == w:
            return
        if r is False:
            self.add("TYPE_NARROWED", path, "the reader accepts nothing here (false)")
            return
        if w is True:
            w = {}
        key = (id(r), id(w))
        if key in self.seen:
            return
        self.seen.add(key)
        if self.combinators(r, w, path, depth):
            return
        self.types(r, w, path)
        self.values(r, w, path)
        self.bounds(r, w, path)
        self.objects(r, w, path, depth)
        self.arrays(r, w, path, depth)

    def combinators(self, r: dict[str, Any], w: dict[str, Any], path: str,
                    depth: int) -> bool:
        """anyOf/oneOf/allOf. True when the comparison is complete."""
        w_branches = w.get("anyOf") or w.get("oneOf")
        if w_branches:
            rest = {k: v for k, v in w.items() if k not in ("anyOf", "oneOf")}
            for branch in w_branches:
                self.compare(r, {**rest, **branch} if isinstance(branch, dict) else branch,
                             path, depth + 1)
            return True
        for keyword in ("anyOf", "oneOf"):
            if r.get(keyword):
                rest = {k: v for k, v in r.items() if k != keyword}
                if rest and not self.accepts_all(rest, w, depth + 1):
                    self.compare(rest, w, path, depth + 1)
                if not any(self.accepts_all(b, w, depth + 1) for b in r[keyword]):
                    self.add("SUM_TYPE_NARROWED", path,
                             f"no branch of the reader's {keyword} accepts everything "
                             "the writer's schema allows")
                return True
        if r.get("allOf"):
            for branch in r["allOf"]:
                self.compare(branch, w, path, depth + 1)
            rest = {k: v for k, v in r.items() if k != "allOf"}
            if rest:
                self.compare(rest, w, path, depth + 1)
            return True
        if w.get("allOf"):
            rest = {k: v for k, v in w.items() if k != "allOf"}
            # The writer's documents satisfy every branch: one branch that the reader
            # accepts entirely is enough.
            if not any(self.accepts_all(r, {**rest, **b} if isinstance(b, dict) else b,
                                        depth + 1) for b in w["allOf"]):
                self.compare(r, rest, path, depth + 1)
            return True
        if "not" in r and r.get("not") != w.get("not"):
            self.add("NOT_TYPE_EXTENDED", path, "the reader's \"not\" changed")
        return False

    def types(self, r: dict[str, Any], w: dict[str, Any], path: str) -> None:
        reader_types, writer_types = _types(r), _types(w)
        if reader_types is None:
            return
        if writer_types is None:
            self.add("TYPE_NARROWED", path, f"the reader restricts the type to "
                                            f"{sorted(reader_types)}; the writer allows any")
        elif not writer_types <= reader_types:
            lost = sorted(writer_types - reader_types)
            rule = "TYPE_CHANGED" if not writer_types & reader_types else "TYPE_NARROWED"
            self.add(rule, path, f"the reader does not accept the writer's type(s) {lost}")

    def values(self, r: dict[str, Any], w: dict[str, Any], path: str) -> None:
        if "enum" in r:
            writer_values = w["enum"] if "enum" in w else ([w["const"]] if "const" in w
                                                           else None)
            if writer_values is None or any(v not in r["enum"] for v in writer_values):
                self.add("ENUM_ARRAY_NARROWED", path, "the reader's enum lacks values the "
                                                      "writer allows")
        if "const" in r and not ("const" in w and w["const"] == r["const"]) and not (
                "enum" in w and w["enum"] == [r["const"]]):
            self.add("ENUM_ARRAY_NARROWED", path, f"the reader requires the value "
                                                  f"{r['const']!r}")
        if "pattern" in r and r["pattern"] != w.get("pattern"):
            rule = "PATTERN_ADDED" if "pattern" not in w else "PATTERN_CHANGED"
            self.add(rule, path, f"the reader requires the pattern {r['pattern']!r}")
        if "multipleOf" in r:
            writer = w.get("multipleOf")
            if writer is None or (writer / r["multipleOf"]) % 1:
                rule = "MULTIPLE_OF_ADDED" if writer is None else "MULTIPLE_OF_CHANGED"
                self.add(rule, path, f"the reader requires multiples of {r['multipleOf']}")
        if r.get("uniqueItems") and not w.get("uniqueItems"):
            self.add("UNIQUE_ITEMS_ADDED", path, "the reader requires unique items")

    def bounds(self, r: dict[str, Any], w: dict[str, Any], path: str) -> None:
        for keyword, rule in LOWER_BOUNDS.items():
            value = r.get(keyword)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            writer = w.get(keyword)
            if writer is None or (isinstance(writer, (int, float)) and writer < value):
                suffix = "ADDED" if writer is None else "INCREASED"
                self.add(f"{rule}_{suffix}", path, f"the reader requires {keyword} "
                                                   f"{value} (the writer: {writer})")
        for keyword, rule in UPPER_BOUNDS.items():
            value = r.get(keyword)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            writer = w.get(keyword)
            if writer is None or (isinstance(writer, (int, float)) and writer > value):
                suffix = "ADDED" if writer is None else "DECREASED"
                self.add(f"{rule}_{suffix}", path, f"the reader requires {keyword} "
                                                   f"{value} (the writer: {writer})")

    def objects(self, r: dict[str, Any], w: dict[str, Any], path: str, depth: int) -> None:
        r_props, w_props = r.get("properties") or {}, w.get("properties") or {}
        r_extra, w_extra = r.get("additionalProperties", True), \
            w.get("additionalProperties", True)
        w_required = set(w.get("required") or [])
        for name in r.get("required") or []:
            if name not in w_required:
                rule = "REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL" \
                    if w_extra is not True else "REQUIRED_ATTRIBUTE_ADDED"
                self.add(rule, _join(path, name), f"property {name!r} is required by the "
                                                  "reader but optional or absent in the writer")
        for name, schema in r_props.items():
            where = _join(path, name)
            if name in w_props:
                self.compare(schema, w_props[name], where, depth + 1)
            elif w_extra is True and not self.covered_by_patterns(name, w):
                if not self.accepts_all(schema, True, depth + 1):
                    self.add("PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL", where,
                             f"property {name!r} is new, and the writer's schema lets "
                             "objects carry it with any value (close the writer with "
                             "\"additionalProperties\": false, or make the new property "
                             "accept anything)")
            elif isinstance(w_extra, dict):
                self.compare(schema, w_extra, where, depth + 1)
        for name, schema in w_props.items():
            if name in r_props:
                continue
            where = _join(path, name)
            if r_extra is False:
                self.add("PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL", where,
                         f"property {name!r} was removed and the reader does not allow "
                         "additional properties")
            elif isinstance(r_extra, dict):
                if not self.accepts_all(r_extra, schema, depth + 1):
                    self.add("PROPERTY_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
                             where, f"property {name!r} was removed and the reader's "
                                    "additionalProperties does not accept its values")
        if r_extra is not True and r_extra != w_extra:
            if r_extra is False and w_extra is not False:
                self.add("ADDITIONAL_PROPERTIES_REMOVED", path,
                         "the reader no longer allows additional properties")
            elif isinstance(r_extra, dict):
                self.compare(r_extra, {} if w_extra is True else w_extra, path + "{}",
                             depth + 1)

    def covered_by_patterns(self, name: str, w: dict[str, Any]) -> bool:
        import re
        return any(re.search(p, name) for p in (w.get("patternProperties") or {}))

    def arrays(self, r: dict[str, Any], w: dict[str, Any], path: str, depth: int) -> None:
        r_items, w_items = r.get("items"), w.get("items")
        if r_items is None or isinstance(r_items, list) or isinstance(w_items, list):
            if r_items != w_items and r_items is not None:
                self.add("ITEMS_CHANGED", path + "[]", "the reader's tuple items changed")
            return
        self.compare(r_items, True if w_items is None else w_items, path + "[]", depth + 1)
