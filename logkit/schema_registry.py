"""The embedded schema registry: subjects, versions and global ids in the broker's LMDB.

Owns: the `schemas` sub-database of the metadata store (meta.py) and Confluent Schema
Registry's semantics over it:
- a schema gets a global id the first time any subject registers it; the same schema
  (same type, same canonical form, same references) under another subject gets the
  same id; ids are never reused, not even after a permanent delete;
- each subject holds versions 1, 2, ...; registering a schema the subject already holds
  (live) returns its id and adds no version; a schema differing only by a default is a
  new version;
- a soft delete hides versions from lookups but keeps their ids resolvable (so records
  written with them still decode) and lists the subject under `subjects(deleted=True)`;
  a permanent delete (allowed only after a soft delete) removes the versions; an id
  that no version (live or soft-deleted) uses any more is then not found;
- compatibility levels per subject and globally (default BACKWARD), checked against the
  subject's live versions by the rules in logkit.compat, at registration;
- subject name strategies (TopicName, RecordName, TopicRecordName) as functions.

Storage (keys in the `schemas` sub-database; values are JSON, as everywhere in meta):
| key                                   | value                                        |
|---------------------------------------|----------------------------------------------|
| `n`                                   | {"next_id": int}                             |
| `i` + id (uint32 BE)                  | {"schema", "schemaType", "references", "fingerprint", "uses"} |
| `h` + fingerprint (64 hex chars)      | {"id": int}                                  |
| `v` + subject + NUL + version (u32 BE) | {"id": int, "deleted": bool}                |
| `c` + subject                         | {"compatibility": level}                     |
| `g`                                   | {"compatibility": level} (global)            |
`uses` counts the version entries (live or soft-deleted) that point at the id.

Invariant: every change is one LMDB write transaction (meta.write), so processes that
share the directory see a registration whole or not at all, and two processes racing
to register get distinct ids and versions. The new schema is parsed, and checked
against the subject's live versions, inside that transaction (its references and the
versions it is checked against are what the transaction reads); parsed schemas are
cached by id, since an id's schema never changes.
Thread-safety: any thread may call any method; the parse cache has its own lock.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from . import compat
from .compat import DEFAULT_LEVEL, LEVELS, ParsedSchema, normalize_level, normalize_type
from .compat.errors import (IncompatibleSchemaError, InvalidSchemaError, InvalidSubjectError,
                            InvalidVersionError, SchemaNotFoundError, SchemaRegistryError,
                            SubjectConfigNotFoundError, SubjectNotFoundError,
                            SubjectNotSoftDeletedError, SubjectSoftDeletedError,
                            VersionNotFoundError, VersionNotSoftDeletedError,
                            VersionSoftDeletedError)
from .meta import decode

__all__ = [
    "SchemaRegistry", "RegisteredSchema", "Schema", "Reference", "LEVELS",
    "subject_name", "topic_name_strategy", "record_name_strategy",
    "topic_record_name_strategy", "SUBJECT_NAME_STRATEGIES", "MAX_SUBJECT_BYTES",
]

log = logging.getLogger(__name__)

DB = "schemas"
MAX_SUBJECT_BYTES = 255             # plus prefix and version, well inside LMDB's 511
MAX_VERSION = (1 << 31) - 1
MAX_REFERENCES = 256
MAX_REFERENCE_DEPTH = 16
PARSE_CACHE_ENTRIES = 1024
_U32 = struct.Struct(">I")
NEXT_ID_KEY, GLOBAL_CONFIG_KEY = b"n", b"g"


class Reference(NamedTuple):
    """A schema reference: `name` as the referring schema writes it (an Avro full
    name, a Protobuf import path), resolved to `subject` at `version`."""
    name: str
    subject: str
    version: int


class Schema(NamedTuple):
    """A schema as stored: its text, type and references."""
    schema: str
    schema_type: str = "AVRO"
    references: tuple[Reference, ...] = ()


class RegisteredSchema(NamedTuple):
    """One version of a subject."""
    subject: str
    version: int
    schema_id: int
    schema: str
    schema_type: str
    references: tuple[Reference, ...]
    deleted: bool = False


# ---- subject name strategies -------------------------------------------------------------

def topic_name_strategy(topic: str, is_key: bool, record_name: str | None) -> str:
    """Confluent's default: `<topic>-key` or `<topic>-value`."""
    return f"{topic}-{'key' if is_key else 'value'}"


def record_name_strategy(topic: str, is_key: bool, record_name: str | None) -> str:
    """The record's full name: one subject per record type, across topics."""
    if not record_name:
        raise InvalidSubjectError("the RecordName strategy needs a named record (an Avro "
                                  "record, a JSON Schema with a title, a Protobuf message)")
    return record_name


def topic_record_name_strategy(topic: str, is_key: bool, record_name: str | None) -> str:
    """`<topic>-<record full name>`: one subject per record type per topic."""
    return f"{topic}-{record_name_strategy(topic, is_key, record_name)}"


SUBJECT_NAME_STRATEGIES: dict[str, Callable[[str, bool, str | None], str]] = {
    "topic": topic_name_strategy, "TopicNameStrategy": topic_name_strategy,
    "TopicName": topic_name_strategy,
    "record": record_name_strategy, "RecordNameStrategy": record_name_strategy,
    "RecordName": record_name_strategy,
    "topic_record": topic_record_name_strategy,
    "TopicRecordNameStrategy": topic_record_name_strategy,
    "TopicRecordName": topic_record_name_strategy,
}


def subject_name(strategy: str | Callable[[str, bool, str | None], str], topic: str,
                 is_key: bool, record_name: str | None) -> str:
    """The subject for a topic's keys or values under `strategy` (a name from
    SUBJECT_NAME_STRATEGIES or a function (topic, is_key, record_name) -> subject)."""
    if callable(strategy):
        return strategy(topic, is_key, record_name)
    try:
        return SUBJECT_NAME_STRATEGIES[strategy](topic, is_key, record_name)
    except KeyError:
        from .errors import ConfigError
        raise ConfigError(f"unknown subject name strategy {strategy!r}; one of "
                          "'topic', 'record', 'topic_record' (or Confluent's class "
                          "names), or a function") from None


# ---- checks on input ---------------------------------------------------------------------

def check_subject(subject: Any) -> bytes:
    """The subject's UTF-8 bytes; raises InvalidSubjectError."""
    if not isinstance(subject, str) or not subject:
        raise InvalidSubjectError(f"a subject must be a non-empty string, got {subject!r}")
    raw = subject.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_SUBJECT_BYTES:
        raise InvalidSubjectError(f"subject {subject[:64]!r}... is {len(raw)} bytes; the "
                                  f"limit is {MAX_SUBJECT_BYTES}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in subject):
        raise InvalidSubjectError(f"subject {subject!r} holds a control character")
    return raw


def check_version(version: Any) -> int | None:
    """A version number, or None for "latest" (and Confluent's -1)."""
    if version in ("latest", -1, "-1"):
        return None
    if isinstance(version, str) and version.isdigit():
        version = int(version)
    if isinstance(version, bool) or not isinstance(version, int) or \
            not 1 <= version <= MAX_VERSION:
        raise InvalidVersionError(f"invalid version {version!r}: a version is 1.."
                                  f"{MAX_VERSION}, -1 or 'latest'")
    return version


def _references(references: Iterable[Any] | None) -> tuple[Reference, ...]:
    out = []
    for ref in references or ():
        if isinstance(ref, Mapping):
            ref = Reference(ref.get("name"), ref.get("subject"), ref.get("version"))
        elif not isinstance(ref, Reference):
            ref = Reference(*ref)
        if not isinstance(ref.name, str) or not ref.name:
            raise InvalidSchemaError(f"a reference needs a name: {ref!r}")
        check_subject(ref.subject)
        version = check_version(ref.version)
        if version is None:
            raise InvalidSchemaError(f"reference {ref.name!r} needs a version number")
        out.append(Reference(ref.name, ref.subject, version))
    if len(out) > MAX_REFERENCES:
        raise InvalidSchemaError(f"{len(out)} references; the limit is {MAX_REFERENCES}")
    return tuple(out)


def _schema_text(schema: Any) -> str:
    if isinstance(schema, (dict, list)):
        return json.dumps(schema)
    if isinstance(schema, bool):
        return json.dumps(schema)
    if not isinstance(schema, str):
        raise InvalidSchemaError(f"a schema is text (or a dict), got "
                                 f"{type(schema).__name__}")
    return schema


def _version_key(subject_bytes: bytes, version: int) -> bytes:
    return b"v" + subject_bytes + b"\0" + _U32.pack(version)


def _split_version_key(key: bytes) -> tuple[str, int]:
    """(subject, version) of a version key: the last five bytes are NUL + version."""
    return key[1:-5].decode("utf-8", "surrogatepass"), _U32.unpack(key[-4:])[0]


def _id_key(schema_id: int) -> bytes:
    return b"i" + _U32.pack(schema_id)


# ---- the registry ------------------------------------------------------------------------

_instances: "weakref.WeakKeyDictionary[Any, SchemaRegistry]" = weakref.WeakKeyDictionary()
_instances_lock = threading.Lock()


class SchemaRegistry:
    """The registry stored in a broker's metadata. `broker.schema_registry()` returns
    one per broker; `SchemaRegistry(broker)` also works."""

    def __init__(self, broker: Any) -> None:
        self._broker = broker
        self._meta = broker.meta
        self._cache: OrderedDict[int, tuple[Schema, ParsedSchema]] = OrderedDict()
        self._cache_lock = threading.Lock()

    @classmethod
    def for_broker(cls, broker: Any) -> "SchemaRegistry":
        """The broker's one registry object (its parse cache is shared by its serdes)."""
        with _instances_lock:
            registry = _instances.get(broker)
            if registry is None:
                registry = _instances[broker] = cls(broker)
            return registry

    def __repr__(self) -> str:
        return f"SchemaRegistry({self._meta.path!r})"

    @property
    def read_only(self) -> bool:
        """True on a broker opened read-only: reads work, changes raise ReadOnlyError."""
        return bool(self._meta.read_only)

    # -- transactions --

    def _read(self, body: Callable[[Any], Any], operation: str) -> Any:
        return self._meta.read(body, operation=f"schema registry: {operation}")

    def _write(self, body: Callable[[Any], Any], operation: str) -> Any:
        return self._meta.write(body, operation=f"schema registry: {operation}")

    def _get(self, txn: Any, key: bytes) -> Any:
        raw = txn.get(key, db=self._meta.db(DB))
        return None if raw is None else decode(raw)

    def _put(self, txn: Any, key: bytes, value: Any) -> None:
        self._meta.put(txn, DB, key, value)

    def _scan(self, txn: Any, prefix: bytes) -> list[tuple[bytes, Any]]:
        cursor = txn.cursor(db=self._meta.db(DB))
        out = []
        if cursor.set_range(prefix):
            for key, raw in cursor:
                if not key.startswith(prefix):
                    break
                out.append((key, decode(raw)))
        return out

    def _entries(self, txn: Any, subject_bytes: bytes) -> list[tuple[int, dict[str, Any]]]:
        """(version, {"id", "deleted"}) of a subject, oldest first."""
        prefix = b"v" + subject_bytes + b"\0"
        return [(_U32.unpack(key[len(prefix):])[0], value)
                for key, value in self._scan(txn, prefix)]

    # -- parsing, cached by id (an id's schema never changes) --

    def _record(self, txn: Any, schema_id: int) -> dict[str, Any] | None:
        return self._get(txn, _id_key(schema_id))

    def _load(self, txn: Any, schema_id: int, depth: int = 0) -> tuple[Schema, ParsedSchema]:
        with self._cache_lock:
            hit = self._cache.get(schema_id)
            if hit is not None:
                self._cache.move_to_end(schema_id)
                return hit
        record = self._record(txn, schema_id)
        if record is None:
            raise SchemaNotFoundError(f"schema {schema_id} not found")
        schema = Schema(record["schema"], record["schemaType"],
                        tuple(Reference(*r) for r in record["references"]))
        parsed = compat.parse(schema.schema_type, schema.schema,
                              self._resolve(txn, schema.references, depth + 1))
        with self._cache_lock:
            self._cache[schema_id] = (schema, parsed)
            while len(self._cache) > PARSE_CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return schema, parsed

    def _resolve(self, txn: Any, references: Sequence[Reference],
                 depth: int = 0) -> list[ParsedSchema]:
        if depth > MAX_REFERENCE_DEPTH:
            raise InvalidSchemaError(f"references nest deeper than {MAX_REFERENCE_DEPTH}")
        out = []
        for ref in references:
            entry = self._get(txn, _version_key(check_subject(ref.subject), ref.version))
            if entry is None:
                raise InvalidSchemaError(f"reference {ref.name!r}: subject {ref.subject!r} "
                                         f"has no version {ref.version}")
            out.append(self._load(txn, entry["id"], depth)[1])
        return out

    def _parse_new(self, txn: Any, schema: Any, schema_type: str | None,
                   references: Any) -> tuple[Schema, ParsedSchema, str]:
        text = _schema_text(schema)
        kind = normalize_type(schema_type)
        refs = _references(references)
        parsed = compat.parse(kind, text, self._resolve(txn, refs))
        identity = json.dumps([parsed.fingerprint, [list(r) for r in refs]])
        fingerprint = hashlib.sha256(identity.encode()).hexdigest()
        return Schema(text, kind, refs), parsed, fingerprint

    # -- registration --

    def register(self, subject: str, schema: Any, schema_type: str = "AVRO", *,
                 references: Iterable[Any] | None = None) -> int:
        """Register `schema` (text, or a dict for Avro and JSON Schema) under `subject`;
        returns its global id. Raises IncompatibleSchemaError (naming the field and the
        rule) when the subject's compatibility level refuses it, InvalidSchemaError when
        it does not parse."""
        return self.register_version(subject, schema, schema_type,
                                     references=references).schema_id

    def register_version(self, subject: str, schema: Any, schema_type: str = "AVRO", *,
                         references: Iterable[Any] | None = None) -> RegisteredSchema:
        """As register(), returning the version too."""
        subject_bytes = check_subject(subject)

        def register(txn: Any) -> RegisteredSchema:
            new, parsed, fingerprint = self._parse_new(txn, schema, schema_type, references)
            entries = self._entries(txn, subject_bytes)
            known = self._get(txn, b"h" + fingerprint.encode())
            if known is not None:
                for version, entry in reversed(entries):
                    if entry["id"] == known["id"] and not entry["deleted"]:
                        return self._registered(subject, version, known["id"], new)
            live = [(v, self._load(txn, e["id"])[1]) for v, e in entries
                    if not e["deleted"]]
            level = self._level(txn, subject_bytes)
            problems = compat.check_level(level, parsed, live)
            if problems:
                raise IncompatibleSchemaError(
                    f"Schema being registered is incompatible with an earlier schema for "
                    f"subject {subject!r}: {problems[0]}"
                    + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                    problems)
            if known is not None:
                schema_id = known["id"]
                record = self._record(txn, schema_id)
                record["uses"] += 1
            else:
                counter = self._get(txn, NEXT_ID_KEY) or {"next_id": 1}
                schema_id = counter["next_id"]
                self._put(txn, NEXT_ID_KEY, {"next_id": schema_id + 1})
                self._put(txn, b"h" + fingerprint.encode(), {"id": schema_id})
                record = {"schema": new.schema, "schemaType": new.schema_type,
                          "references": [list(r) for r in new.references],
                          "fingerprint": fingerprint, "uses": 1}
            self._put(txn, _id_key(schema_id), record)
            version = entries[-1][0] + 1 if entries else 1
            if version > MAX_VERSION:
                raise InvalidVersionError(f"subject {subject!r} has no versions left")
            self._put(txn, _version_key(subject_bytes, version),
                      {"id": schema_id, "deleted": False})
            stored = Schema(record["schema"], record["schemaType"],
                            tuple(Reference(*r) for r in record["references"]))
            return self._registered(subject, version, schema_id, stored)

        result = self._write(register, f"register under {subject!r}")
        log.debug("registered schema %d as %s version %d", result.schema_id, subject,
                  result.version)
        return result

    @staticmethod
    def _registered(subject: str, version: int, schema_id: int, schema: Schema,
                    deleted: bool = False) -> RegisteredSchema:
        return RegisteredSchema(subject, version, schema_id, schema.schema,
                                schema.schema_type, schema.references, deleted)

    def check(self, subject: str, schema: Any, schema_type: str = "AVRO", *,
              references: Iterable[Any] | None = None, version: Any = None) -> bool:
        """Whether `schema` may be registered under `subject` (or, with `version`, is
        compatible with that one version under the subject's level)."""
        return not self.incompatibilities(subject, schema, schema_type,
                                          references=references, version=version)

    def incompatibilities(self, subject: str, schema: Any, schema_type: str = "AVRO", *,
                          references: Iterable[Any] | None = None,
                          version: Any = None) -> list[str]:
        """Every rule `schema` breaks under the subject's level, each message naming the
        version, the field path and the rule; empty when compatible. Without `version`
        the versions the level compares (latest, or all for *_TRANSITIVE); with one,
        only it (VersionNotFoundError when absent). A subject without versions accepts
        anything."""
        subject_bytes = check_subject(subject)
        wanted = None if version is None else (check_version(version) or "latest")

        def run(txn: Any) -> list[str]:
            _, parsed, _ = self._parse_new(txn, schema, schema_type, references)
            entries = [(v, e) for v, e in self._entries(txn, subject_bytes)
                       if not e["deleted"]]
            if wanted is not None:
                if not entries:
                    raise SubjectNotFoundError(f"subject {subject!r} not found")
                chosen = entries[-1] if wanted == "latest" else \
                    next((item for item in entries if item[0] == wanted), None)
                if chosen is None:
                    raise VersionNotFoundError(f"subject {subject!r} has no version "
                                               f"{wanted}")
                entries = [chosen]
            level = self._level(txn, subject_bytes)
            if wanted is not None and level.endswith("_TRANSITIVE"):
                level = level[:-len("_TRANSITIVE")]
            return compat.check_level(level, parsed,
                                      [(v, self._load(txn, e["id"])[1]) for v, e in entries])

        return self._read(run, f"check against {subject!r}")

    # -- reads --

    def schema(self, schema_id: int) -> Schema:
        """The schema with global id `schema_id`; SchemaNotFoundError when no version
        (live or soft-deleted) uses it."""
        return self.get(schema_id)[0]

    def get(self, schema_id: int) -> tuple[Schema, ParsedSchema]:
        """(stored schema, parsed schema) of id `schema_id` (serdes use this)."""
        if isinstance(schema_id, bool) or not isinstance(schema_id, int):
            raise SchemaNotFoundError(f"schema id must be an integer, got {schema_id!r}")

        def run(txn: Any) -> tuple[Schema, ParsedSchema]:
            record = self._record(txn, schema_id)
            if record is None or record["uses"] <= 0:
                raise SchemaNotFoundError(f"schema {schema_id} not found")
            return self._load(txn, schema_id)

        with self._cache_lock:
            hit = self._cache.get(schema_id)
        if hit is not None:
            return hit
        return self._read(run, f"schema {schema_id}")

    def subjects(self, *, deleted: bool = False, prefix: str = "") -> list[str]:
        """Subjects with a live version (with `deleted`, also fully soft-deleted ones),
        sorted."""
        def run(txn: Any) -> list[str]:
            seen: dict[str, bool] = {}
            for key, entry in self._scan(txn, b"v"):
                name = _split_version_key(key)[0]
                seen[name] = seen.get(name, False) or not entry["deleted"]
            return sorted(name for name, live in seen.items()
                          if (live or deleted) and name.startswith(prefix))
        return self._read(run, "list subjects")

    def versions(self, subject: str, *, deleted: bool = False) -> list[int]:
        """The subject's version numbers; SubjectNotFoundError when it has none."""
        subject_bytes = check_subject(subject)
        entries = self._read(lambda txn: self._entries(txn, subject_bytes),
                             f"versions of {subject!r}")
        out = [v for v, e in entries if deleted or not e["deleted"]]
        if not out:
            raise SubjectNotFoundError(f"subject {subject!r} not found")
        return out

    def version(self, subject: str, version: Any = "latest", *,
                deleted: bool = False) -> RegisteredSchema:
        """One version of a subject ("latest" or -1: the newest live one)."""
        subject_bytes = check_subject(subject)
        number = check_version(version)

        def run(txn: Any) -> RegisteredSchema:
            entries = self._entries(txn, subject_bytes)
            visible = [(v, e) for v, e in entries if deleted or not e["deleted"]]
            if not visible:
                raise SubjectNotFoundError(f"subject {subject!r} not found")
            if number is None:
                chosen = visible[-1]
            else:
                chosen = next((item for item in visible if item[0] == number), None)
                if chosen is None:
                    raise VersionNotFoundError(f"subject {subject!r} has no version "
                                               f"{number}")
            schema, _ = self._load(txn, chosen[1]["id"])
            return self._registered(subject, chosen[0], chosen[1]["id"], schema,
                                    chosen[1]["deleted"])

        return self._read(run, f"version {version} of {subject!r}")

    def latest(self, subject: str) -> RegisteredSchema:
        return self.version(subject, "latest")

    def lookup(self, subject: str, schema: Any, schema_type: str = "AVRO", *,
               references: Iterable[Any] | None = None,
               deleted: bool = False) -> RegisteredSchema:
        """The version of `subject` holding `schema`: SubjectNotFoundError without the
        subject, SchemaNotFoundError when it does not hold the schema."""
        subject_bytes = check_subject(subject)

        def run(txn: Any) -> RegisteredSchema:
            new, _, fingerprint = self._parse_new(txn, schema, schema_type, references)
            entries = [(v, e) for v, e in self._entries(txn, subject_bytes)
                       if deleted or not e["deleted"]]
            if not entries:
                raise SubjectNotFoundError(f"subject {subject!r} not found")
            known = self._get(txn, b"h" + fingerprint.encode())
            for version, entry in reversed(entries):
                if known is not None and entry["id"] == known["id"]:
                    stored, _ = self._load(txn, entry["id"])
                    return self._registered(subject, version, entry["id"], stored,
                                            entry["deleted"])
            raise SchemaNotFoundError(f"schema not found under subject {subject!r}")

        return self._read(run, f"look up under {subject!r}")

    def usages(self, schema_id: int, *, deleted: bool = False) -> list[tuple[str, int]]:
        """(subject, version) pairs that hold id `schema_id`, sorted."""
        def run(txn: Any) -> list[tuple[str, int]]:
            out = []
            for key, entry in self._scan(txn, b"v"):
                if entry["id"] == schema_id and (deleted or not entry["deleted"]):
                    out.append(_split_version_key(key))
            return out
        found = self._read(run, f"usages of schema {schema_id}")
        if not found and not deleted:
            self.schema(schema_id)               # SchemaNotFoundError when unknown
        return found

    def referenced_by(self, subject: str, version: Any) -> list[int]:
        """Ids of schemas whose references name this subject version."""
        chosen = self.version(subject, version, deleted=True)

        def run(txn: Any) -> list[int]:
            return sorted(_U32.unpack(key[1:])[0] for key, record in self._scan(txn, b"i")
                          if record["uses"] > 0 and any(
                              r[1] == subject and r[2] == chosen.version
                              for r in record["references"]))
        return self._read(run, f"references to {subject!r}")

    # -- deletes --

    def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        """Soft delete every live version (or, with `permanent`, remove every version,
        which must be soft-deleted first); returns the versions."""
        subject_bytes = check_subject(subject)

        def run(txn: Any) -> list[int]:
            entries = self._entries(txn, subject_bytes)
            if not entries:
                raise SubjectNotFoundError(f"subject {subject!r} not found")
            if not permanent:
                live = [(v, e) for v, e in entries if not e["deleted"]]
                if not live:
                    raise SubjectSoftDeletedError(
                        f"subject {subject!r} was soft deleted; set permanent=true to "
                        "delete it permanently")
                for version, entry in live:
                    self._put(txn, _version_key(subject_bytes, version),
                              {"id": entry["id"], "deleted": True})
                return [v for v, _ in live]
            if any(not e["deleted"] for _, e in entries):
                raise SubjectNotSoftDeletedError(
                    f"subject {subject!r} must be soft deleted before it is permanently "
                    "deleted")
            for version, entry in entries:
                self._drop(txn, subject_bytes, version, entry["id"])
            txn.delete(b"c" + subject_bytes, db=self._meta.db(DB))
            return [v for v, _ in entries]

        return self._write(run, f"delete subject {subject!r}")

    def delete_version(self, subject: str, version: Any, *, permanent: bool = False) -> int:
        """Soft delete one version ("latest": the newest live one), or with `permanent`
        remove a soft-deleted one; returns its number."""
        subject_bytes = check_subject(subject)
        number = check_version(version)

        def run(txn: Any) -> int:
            entries = self._entries(txn, subject_bytes)
            if not entries:
                raise SubjectNotFoundError(f"subject {subject!r} not found")
            if number is None:
                pool = entries if permanent else [x for x in entries if not x[1]["deleted"]]
                if not pool:
                    raise VersionNotFoundError(f"subject {subject!r} has no live version")
                chosen = pool[-1]
            else:
                chosen = next((x for x in entries if x[0] == number), None)
                if chosen is None:
                    raise VersionNotFoundError(f"subject {subject!r} has no version "
                                               f"{number}")
            found, entry = chosen
            if not permanent:
                if entry["deleted"]:
                    raise VersionSoftDeletedError(
                        f"version {found} of subject {subject!r} was soft deleted; set "
                        "permanent=true to delete it permanently")
                self._put(txn, _version_key(subject_bytes, found),
                          {"id": entry["id"], "deleted": True})
            else:
                if not entry["deleted"]:
                    raise VersionNotSoftDeletedError(
                        f"version {found} of subject {subject!r} must be soft deleted "
                        "before it is permanently deleted")
                self._drop(txn, subject_bytes, found, entry["id"])
            return found

        return self._write(run, f"delete version {version} of {subject!r}")

    def _drop(self, txn: Any, subject_bytes: bytes, version: int, schema_id: int) -> None:
        txn.delete(_version_key(subject_bytes, version), db=self._meta.db(DB))
        record = self._record(txn, schema_id)
        if record is not None:
            record["uses"] = max(0, record["uses"] - 1)
            self._put(txn, _id_key(schema_id), record)
        with self._cache_lock:                  # the id may be "not found" from now on
            self._cache.pop(schema_id, None)

    # -- compatibility levels --

    def _level(self, txn: Any, subject_bytes: bytes | None) -> str:
        if subject_bytes is not None:
            own = self._get(txn, b"c" + subject_bytes)
            if own is not None:
                return own["compatibility"]
        default = self._get(txn, GLOBAL_CONFIG_KEY)
        return DEFAULT_LEVEL if default is None else default["compatibility"]

    def compatibility(self, subject: str | None = None, *,
                      default_to_global: bool = True) -> str:
        """The level that applies to `subject` (its own, else the global one), or the
        global level. With `default_to_global=False` a subject without a level of its
        own raises SubjectConfigNotFoundError (Confluent's 40408)."""
        subject_bytes = None if subject is None else check_subject(subject)

        def run(txn: Any) -> str:
            if subject_bytes is not None and not default_to_global and \
                    self._get(txn, b"c" + subject_bytes) is None:
                raise SubjectConfigNotFoundError(
                    f"subject {subject!r} has no compatibility level of its own")
            return self._level(txn, subject_bytes)

        return self._read(run, "read compatibility")

    def set_compatibility(self, level: str, subject: str | None = None) -> str:
        """Set the global level, or `subject`'s own; returns the level."""
        level = normalize_level(level)
        key = GLOBAL_CONFIG_KEY if subject is None else b"c" + check_subject(subject)
        self._write(lambda txn: self._put(txn, key, {"compatibility": level}),
                    "set compatibility")
        return level

    def delete_compatibility(self, subject: str | None = None) -> str:
        """Drop `subject`'s own level (it follows the global one again), or reset the
        global level to BACKWARD; returns the level that was set."""
        key = GLOBAL_CONFIG_KEY if subject is None else b"c" + check_subject(subject)

        def run(txn: Any) -> str:
            old = self._get(txn, key)
            if old is None:
                if subject is not None:
                    raise SubjectNotFoundError(f"subject {subject!r} has no compatibility "
                                               "level of its own")
                return DEFAULT_LEVEL
            txn.delete(key, db=self._meta.db(DB))
            return old["compatibility"]

        return self._write(run, "delete compatibility")


__all__ += ["SchemaRegistryError"]
