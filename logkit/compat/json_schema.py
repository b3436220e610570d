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

Regexes: a schema's `pattern` and `patternProperties` are untrusted input, so the
registry runs them with RE2 (the `google-re2` package), whose matching is linear in the
text and releases the GIL, never with Python's backtracking `re`, which can spend
minutes on one match while holding the GIL (and so the whole process). A pattern RE2
cannot run (a backreference, a lookaround) is refused at `parse` with
`UnsupportedPatternError`. Without `google-re2` installed, patterns are not evaluated
at all and the check stays conservative (a name a writer's pattern may cover counts as
not covered).
"""

from __future__ import annotations

import functools
import logging
import json
import re
from typing import Any, Iterator, Sequence

from . import MAX_NESTING, Incompatibility, ParsedSchema, load_json
from .errors import InvalidSchemaError, UnsupportedPatternError

try:
    import re2 as _re2
except ImportError:                     # patterns are then never evaluated (see above)
    _re2 = None

__all__ = ["parse", "check", "compile_pattern", "schema_patterns", "linear_time_validator"]

log = logging.getLogger(__name__)

# Keywords where a larger value in the reader accepts less, and smaller accepts less.
LOWER_BOUNDS = {"minimum": "MINIMUM", "exclusiveMinimum": "EXCLUSIVE_MINIMUM",
                "minLength": "MIN_LENGTH", "minItems": "MIN_ITEMS",
                "minProperties": "MIN_PROPERTIES"}
UPPER_BOUNDS = {"maximum": "MAXIMUM", "exclusiveMaximum": "EXCLUSIVE_MAXIMUM",
                "maxLength": "MAX_LENGTH", "maxItems": "MAX_ITEMS",
                "maxProperties": "MAX_PROPERTIES"}
JSON_TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")
# Keywords whose values are data, not schemas: a "pattern" key inside them is no regex.
DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# Keywords whose values map names (chosen by the schema's author) to schemas.
NAME_MAPS = frozenset({"properties", "patternProperties", "definitions", "$defs",
                       "dependentSchemas", "dependencies"})
PATTERN_CACHE_ENTRIES = 256             # compiled programs kept across checks
MAX_PATTERN_SEARCHES = 100_000          # per compatibility check (property name x pattern)
RE2_MAX_MEM_BYTES = 1 << 20             # per program and its DFA cache; RE2 falls back
                                        # to its (still linear) NFA past it
# ECMA-262 writes a code unit as \u and four hex digits, RE2 as \x{...} around the
# same digits; every other escape passes through as it is.
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)


def parse(text: str, references: Sequence[ParsedSchema] = ()) -> ParsedSchema:
    document = load_json(text, "JSON Schema")
    if not isinstance(document, (dict, bool)):
        raise InvalidSchemaError("a JSON Schema must be an object or a boolean")
    for pattern in schema_patterns(document):
        compile_pattern(pattern)
    _check_schema(document)
    title = document.get("title") if isinstance(document, dict) else None
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return ParsedSchema("JSON", text, canonical, title if isinstance(title, str) else None,
                        document)


def schema_patterns(document: Any) -> Iterator[str]:
    """Every `pattern` value and `patternProperties` key in the schema (not inside
    `const`, `enum`, `default` or `examples`, which hold data; a property *named*
    "pattern" or "default" is a schema like any other)."""
    stack: list[tuple[Any, bool]] = [(document, False)]    # (node, is a map of names)
    while stack:
        node, names = stack.pop()
        if isinstance(node, list):
            stack.extend((item, False) for item in node)
        elif isinstance(node, dict) and names:
            stack.extend((value, False) for value in node.values())
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in DATA_KEYWORDS:
                    continue
                if key == "pattern" and isinstance(value, str):
                    yield value
                elif key == "patternProperties" and isinstance(value, dict):
                    yield from value
                stack.append((value, key in NAME_MAPS))


@functools.lru_cache(maxsize=PATTERN_CACHE_ENTRIES)
def compile_pattern(pattern: str) -> Any:
    """The RE2 program for a JSON Schema regex (ECMA-262 syntax), or None when
    `google-re2` is not installed. Raises UnsupportedPatternError for a regex RE2
    cannot run in linear time."""
    if _re2 is None:
        return None
    options = _re2.Options()
    options.log_errors = False          # the error is raised, not printed to stderr
    options.max_mem = RE2_MAX_MEM_BYTES
    try:
        return _re2.compile(_ESCAPE.sub(_re2_escape, pattern), options)
    except _re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and \
            isinstance(exc.args[0], bytes) else str(exc)
        raise UnsupportedPatternError(
            f"pattern {json.dumps(pattern[:200])} cannot be run in linear time ({reason}); "
            "the registry evaluates patterns with RE2, which has no backreferences or "
            "lookarounds", pattern=pattern) from None


def _re2_escape(escape: re.Match[str]) -> str:
    """One escape of an ECMA-262 regex in RE2's syntax: only the \\u form differs."""
    code = escape.group(1)
    return "\\x{" + code[1:] + "}" if len(code) == 5 else escape.group(0)


@functools.cache
def linear_time_validator(cls: Any) -> Any:
    """The `jsonschema` validator class `cls` with `pattern`, `patternProperties` and
    `additionalProperties` matched by RE2 (compile_pattern) instead of Python's `re`, so
    validating a value costs time linear in it whatever the schema's regexes (the
    serdes validate every record). `cls` itself without `google-re2`. Not covered:
    `unevaluatedProperties` (drafts 2019-09 and 2020-12) still matches with `re`."""
    if _re2 is None:
        return cls
    from jsonschema import validators
    return validators.extend(cls, {"pattern": _pattern_keyword,
                                   "patternProperties": _pattern_properties_keyword,
                                   "additionalProperties": _additional_keyword})


def _matches(pattern: str, text: str) -> bool:
    return compile_pattern(pattern).search(text) is not None


def _pattern_keyword(validator: Any, pattern: str, instance: Any, schema: Any
                     ) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _matches(pattern, instance):
        from jsonschema.exceptions import ValidationError
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties_keyword(validator: Any, patterns: dict[str, Any], instance: Any,
                                schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for name, value in instance.items():
            if _matches(pattern, name):
                yield from validator.descend(value, subschema, path=name,
                                             schema_path=pattern)


def _additional_keyword(validator: Any, additional: Any, instance: Any, schema: Any
                        ) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    known = schema.get("properties") or {}
    patterns = list(schema.get("patternProperties") or {})
    extras = [name for name in instance if name not in known
              and not any(_matches(pattern, name) for pattern in patterns)]
    if validator.is_type(additional, "object"):
        for name in extras:
            yield from validator.descend(instance[name], additional, path=name)
    elif additional is False and extras:
        from jsonschema.exceptions import ValidationError
        listed = ", ".join(repr(name) for name in sorted(extras))
        verb = "was" if len(extras) == 1 else "were"       # jsonschema's own wording
        yield ValidationError(f"Additional properties are not allowed ({listed} {verb} "
                              "unexpected)" + (f"; none matches the patterns "
                                               f"{sorted(patterns)!r}" if patterns else ""))


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


class _Searches:
    """One check's pattern searches, shared by its walkers: each regex compiled once,
    at most MAX_PATTERN_SEARCHES searches (property names times patterns could
    otherwise reach billions, inside the registry's write transaction)."""

    def __init__(self) -> None:
        self.left = MAX_PATTERN_SEARCHES
        self.programs: dict[str, Any] = {}

    def found(self, pattern: str, name: str) -> bool:
        """Whether `pattern` matches `name`; False when it cannot tell (no RE2, or the
        searches are spent), the conservative answer for the check."""
        if self.left <= 0:
            return False
        self.left -= 1
        if pattern not in self.programs:
            self.programs[pattern] = compile_pattern(pattern)
        program = self.programs[pattern]
        return program is not None and program.search(name) is not None


class _Walker:
    def __init__(self, reader_root: Any, writer_root: Any,
                 out: list[Incompatibility], searches: _Searches | None = None) -> None:
        self.roots = (reader_root, writer_root)
        self.out = out
        self.seen: set[tuple[int, int]] = set()
        self.searches = _Searches() if searches is None else searches

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
        probe = _Walker(*self.roots, [], self.searches)
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
        """Whether a writer's patternProperties regex matches `name` (RE2, linear time;
        see _Searches for when it cannot tell)."""
        for pattern in w.get("patternProperties") or {}:
            if self.searches.left <= 0:
                return False
            if self.searches.found(pattern, name):
                return True
        return False

    def arrays(self, r: dict[str, Any], w: dict[str, Any], path: str, depth: int) -> None:
        r_items, w_items = r.get("items"), w.get("items")
        if r_items is None or isinstance(r_items, list) or isinstance(w_items, list):
            if r_items != w_items and r_items is not None:
                self.add("ITEMS_CHANGED", path + "[]", "the reader's tuple items changed")
            return
        self.compare(r_items, True if w_items is None else w_items, path + "[]", depth + 1)
