"""The schema registry's error tree, with Confluent's error codes.

Owns: the named errors the embedded registry (schema_registry.py), the rule checkers
(this package) and the REST front end (registry_http.py) raise. Invariant: each class
carries the `error_code` and `http_status` Confluent's Schema Registry answers with for
the same condition, so the REST layer maps an error to a response without a table of
its own, and clients that switch on Confluent's codes keep working.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import LogkitError

__all__ = [
    "SchemaRegistryError", "SubjectNotFoundError", "VersionNotFoundError",
    "SchemaNotFoundError", "SubjectSoftDeletedError", "SubjectNotSoftDeletedError",
    "VersionSoftDeletedError", "VersionNotSoftDeletedError", "SubjectConfigNotFoundError",
    "IncompatibleSchemaError", "InvalidSchemaError", "InvalidVersionError",
    "InvalidCompatibilityLevelError", "InvalidSubjectError", "UnsupportedPatternError",
]

log = logging.getLogger(__name__)


class SchemaRegistryError(LogkitError):
    """Base of the registry's errors: `error_code` and `http_status` are Confluent's."""

    error_code = 50001
    http_status = 500

    def __init__(self, message: str, *, error_code: int | None = None) -> None:
        super().__init__(message)
        if error_code is not None:
            self.error_code = error_code

    def to_dict(self) -> dict[str, Any]:
        """The REST error body: `{"error_code", "message"}`."""
        return {"error_code": self.error_code, "message": str(self)}


class SubjectNotFoundError(SchemaRegistryError):
    """No such subject (or only soft-deleted versions when those are not asked for)."""
    error_code, http_status = 40401, 404


class VersionNotFoundError(SchemaRegistryError):
    """The subject has no such version."""
    error_code, http_status = 40402, 404


class SchemaNotFoundError(SchemaRegistryError):
    """No schema with this id, or this schema is not registered under the subject."""
    error_code, http_status = 40403, 404


class SubjectSoftDeletedError(SchemaRegistryError):
    """A soft delete of a subject that is soft-deleted already."""
    error_code, http_status = 40404, 404


class SubjectNotSoftDeletedError(SchemaRegistryError):
    """A permanent delete of a subject that was not soft-deleted first."""
    error_code, http_status = 40405, 404


class VersionSoftDeletedError(SchemaRegistryError):
    """A soft delete of a version that is soft-deleted already."""
    error_code, http_status = 40406, 404


class VersionNotSoftDeletedError(SchemaRegistryError):
    """A permanent delete of a version that was not soft-deleted first."""
    error_code, http_status = 40407, 404


class SubjectConfigNotFoundError(SchemaRegistryError):
    """The subject has no compatibility level of its own (and the global one was not
    asked for)."""
    error_code, http_status = 40408, 404


class IncompatibleSchemaError(SchemaRegistryError):
    """The schema breaks the subject's compatibility level. `incompatibilities` lists
    every rule broken; the message names the first field and rule."""
    error_code, http_status = 409, 409

    def __init__(self, message: str, incompatibilities: list[Any] | None = None) -> None:
        super().__init__(message)
        self.incompatibilities = list(incompatibilities or [])


class InvalidSchemaError(SchemaRegistryError, ValueError):
    """Schema text that does not parse as its type, or is larger than the limit."""
    error_code, http_status = 42201, 422


class UnsupportedPatternError(InvalidSchemaError):
    """A JSON Schema `pattern` or `patternProperties` regex the registry's linear-time
    engine (RE2) cannot run: a backreference, a lookaround, a repetition above 1000.
    `pattern` is the regex as written."""

    def __init__(self, message: str, *, pattern: str = "") -> None:
        super().__init__(message)
        self.pattern = pattern


class InvalidVersionError(SchemaRegistryError, ValueError):
    """A version that is neither 1..2^31-1, -1 nor "latest"."""
    error_code, http_status = 42202, 422


class InvalidCompatibilityLevelError(SchemaRegistryError, ValueError):
    """A compatibility level other than Confluent's seven."""
    error_code, http_status = 42203, 422


class InvalidSubjectError(SchemaRegistryError, ValueError):
    """A subject name that is empty, too long, or holds a control character."""
    error_code, http_status = 42208, 422
