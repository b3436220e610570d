"""Schema compatibility: the rules Confluent's Schema Registry applies, per format.

Owns: the seven compatibility levels, the parsed-schema record every format returns,
and the one dispatch from a schema type ("AVRO", "JSON", "PROTOBUF") to its parser and
its reader/writer checker (avro.py, json_schema.py, protobuf.py).

A checker answers one question: can a consumer holding schema `reader` read every
record written with schema `writer`? Levels are built from it, as Confluent does:

| level      | the new schema is checked            | against                      |
|------------|--------------------------------------|------------------------------|
| NONE       | not at all                           |                              |
| BACKWARD   | as reader, the old one as writer     | the latest live version      |
| FORWARD    | as writer, the old one as reader     | the latest live version      |
| FULL       | both ways                            | the latest live version      |
| *_TRANSITIVE | as above                           | every live version           |

Invariant: checkers are pure functions of two parsed schemas; they return every rule
broken (an empty list means compatible), each naming the dotted field path and the rule,
and they never raise for two valid schemas. Parsers raise `InvalidSchemaError` (422)
for text that is not a schema of its type. Nothing here touches storage.

Bounded: a schema's text is at most `MAX_SCHEMA_BYTES`, its JSON (Avro, JSON Schema)
nests at most `MAX_SCHEMA_DEPTH` deep, so no parser or checker recurses past Python's
limit; a deeper schema is an `InvalidSchemaError`, never a RecursionError.
"""

from __future__ import annotations

import json
import logging
import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .errors import InvalidCompatibilityLevelError, InvalidSchemaError

__all__ = ["LEVELS", "DEFAULT_LEVEL", "SCHEMA_TYPES", "MAX_SCHEMA_BYTES", "MAX_SCHEMA_DEPTH",
           "Incompatibility", "ParsedSchema", "parse", "check_compatibility", "check_level",
           "normalize_level", "load_json", "deeper_than"]

log = logging.getLogger(__name__)

LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE",
          "FULL", "FULL_TRANSITIVE")
DEFAULT_LEVEL = "BACKWARD"             # Confluent's default
SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
MAX_SCHEMA_BYTES = 1 << 20             # schema text, UTF-8; Confluent has no tighter bound
MAX_NESTING = 64                       # schema depth a checker or validator walks
MAX_SCHEMA_DEPTH = 128                 # JSON nesting of a schema's text: 64 JSON Schema
                                       # levels of "properties", 42 nested Avro records


@dataclass(frozen=True)
class Incompatibility:
    """One rule broken: `rule` is Confluent's name for it, `path` the dotted field path
    ("" for the whole schema), `message` says what changed and how to fix it."""
    rule: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '<root>'}: {self.rule}: {self.message}"


@dataclass(frozen=True)
class ParsedSchema:
    """A schema parsed by its format's parser.

    `canonical` identifies the schema: two texts with the same canonical form are the
    same schema (same id); it ignores whitespace and attribute order, keeps defaults and
    docs. `record_name` is the name the RecordName strategy uses (Avro's full name, a
    JSON Schema's title, the first Protobuf message's full name), or None. `model` is
    the format's own representation, read only by that format's checker."""
    schema_type: str
    text: str
    canonical: str
    record_name: str | None
    model: Any = field(compare=False, repr=False)

    @property
    def fingerprint(self) -> str:
        """SHA-256 of type and canonical form: the registry's identity key."""
        return hashlib.sha256(f"{self.schema_type}\0{self.canonical}".encode()).hexdigest()


def deeper_than(document: Any, limit: int) -> bool:
    """Whether the parsed JSON `document` nests more than `limit` arrays and objects
    deep. Iterative, so it is safe on any depth `json.loads` returned."""
    if not isinstance(document, (dict, list)):
        return False
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (dict, list)))
    return False


def load_json(text: str, what: str) -> Any:
    """`text` as JSON nested at most MAX_SCHEMA_DEPTH deep; else InvalidSchemaError
    naming `what` ("Avro schema", "JSON Schema")."""
    try:
        document = json.loads(text)
    except RecursionError:               # json's decoder refused the depth itself
        document = None
        too_deep = True
    except ValueError as exc:
        raise InvalidSchemaError(f"{what} is not JSON: {exc}") from None
    else:
        too_deep = deeper_than(document, MAX_SCHEMA_DEPTH)
    if too_deep:
        raise InvalidSchemaError(f"{what} nests deeper than {MAX_SCHEMA_DEPTH} arrays "
                                 "and objects")
    return document


def _formats() -> dict[str, tuple[Callable[..., ParsedSchema],
                                   Callable[[ParsedSchema, ParsedSchema],
                                            list[Incompatibility]]]]:
    from . import avro, json_schema, protobuf
    return {"AVRO": (avro.parse, avro.check), "JSON": (json_schema.parse, json_schema.check),
            "PROTOBUF": (protobuf.parse, protobuf.check)}


def normalize_type(schema_type: str | None) -> str:
    """"AVRO" when None or empty (Confluent's default); else one of SCHEMA_TYPES."""
    name = (schema_type or "AVRO").upper()
    if name not in SCHEMA_TYPES:
        raise InvalidSchemaError(f"unknown schema type {schema_type!r}; one of "
                                 f"{', '.join(SCHEMA_TYPES)}")
    return name


def parse(schema_type: str | None, text: str,
          references: Sequence[ParsedSchema] = ()) -> ParsedSchema:
    """Parse `text` as a schema of `schema_type`. `references` are the parsed schemas it
    names (Avro named types, Protobuf imports). Raises InvalidSchemaError."""
    name = normalize_type(schema_type)
    if not isinstance(text, str):
        raise InvalidSchemaError(f"schema must be a string, got {type(text).__name__}")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SCHEMA_BYTES:
        raise InvalidSchemaError(f"schema is {size} bytes; the limit is "
                                 f"{MAX_SCHEMA_BYTES}")
    parser, _ = _formats()[name]
    try:
        return parser(text, references)
    except RecursionError:               # a backstop: every format bounds its depth
        raise InvalidSchemaError(f"the {name} schema nests too deeply to parse") from None


def check_compatibility(reader: ParsedSchema, writer: ParsedSchema
                        ) -> list[Incompatibility]:
    """Every rule broken when a consumer with `reader` reads data written with `writer`.
    Schemas of different types are never compatible."""
    if reader.schema_type != writer.schema_type:
        return [Incompatibility("SCHEMA_TYPE_CHANGED", "",
                                f"the schema type changed from {writer.schema_type} to "
                                f"{reader.schema_type}")]
    _, checker = _formats()[reader.schema_type]
    return checker(reader, writer)


def normalize_level(level: str) -> str:
    """The level in upper case; raises InvalidCompatibilityLevelError."""
    name = level.upper() if isinstance(level, str) else level
    if name not in LEVELS:
        raise InvalidCompatibilityLevelError(
            f"invalid compatibility level {level!r}; one of {', '.join(LEVELS)}")
    return name


def check_level(level: str, new: ParsedSchema,
                previous: Sequence[tuple[int, ParsedSchema]]) -> list[str]:
    """Messages for every rule `new` breaks under `level`, against `previous` (live
    versions as (version, schema), oldest first). Empty when compatible. Each message
    says the direction, the version, the field path and the rule."""
    level = normalize_level(level)
    if level == "NONE" or not previous:
        return []
    against = previous if level.endswith("_TRANSITIVE") else previous[-1:]
    backward = level.startswith(("BACKWARD", "FULL"))
    forward = level.startswith(("FORWARD", "FULL"))
    messages: list[str] = []
    for version, old in reversed(against):          # newest first: the likeliest cause
        if backward:
            messages += [f"{level}: the new schema cannot read data written with version "
                         f"{version}: {problem}" for problem in check_compatibility(new, old)]
        if forward:
            messages += [f"{level}: version {version} cannot read data written with the "
                         f"new schema: {problem}" for problem in check_compatibility(old, new)]
    return messages
