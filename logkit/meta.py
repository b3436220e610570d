"""The broker's metadata store: one LMDB environment under `<root>/meta/`.

Owns: opening the environment once per process (LMDB forbids two handles on one file in
a process, so handles are shared and reference-counted), the named sub-databases, and
the topic records. Other modules keep their own keys in their own sub-database:
`groups` and `offsets` (group.py), `replication` (replication), `spark` (the Spark sink).

Invariant: every multi-key change is one LMDB write transaction, so processes sharing
the directory see all of it or none of it. Values are JSON (readable with any LMDB tool).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Iterator

import lmdb

from .errors import ClosedError, TopicExistsError, UnknownTopicError

__all__ = ["MetaStore", "DATABASES"]

DATABASES = ("topics", "groups", "offsets", "members", "replication", "spark")
MAP_SIZE_BYTES = 1 << 30          # address space, not disk: LMDB files grow as needed
MAX_READERS = 1024

_registry_lock = threading.Lock()
_registry: dict[tuple[str, int], list[Any]] = {}     # (realpath, pid) -> [env, refcount]


def _open_env(path: str) -> lmdb.Environment:
    key = (os.path.realpath(path), os.getpid())       # a forked child opens its own
    with _registry_lock:
        entry = _registry.get(key)
        if entry is None:
            os.makedirs(path, exist_ok=True)
            env = lmdb.open(path, map_size=MAP_SIZE_BYTES, max_dbs=len(DATABASES) + 2,
                            max_readers=MAX_READERS, subdir=True, lock=True)
            entry = _registry[key] = [env, 0]
        entry[1] += 1
        return entry[0]


def _release_env(path: str) -> None:
    key = (os.path.realpath(path), os.getpid())
    with _registry_lock:
        entry = _registry.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            entry[0].close()
            del _registry[key]


def encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def decode(raw: bytes) -> Any:
    return json.loads(raw)


class MetaStore:
    """A handle on `<root>/meta`. `close()` is safe twice."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.env = _open_env(path)
        self.dbs = {name: self.env.open_db(name.encode()) for name in DATABASES}
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _release_env(self.path)

    def _check(self) -> None:
        if self._closed:
            raise ClosedError("metadata store is closed")

    def begin(self, *, write: bool = False) -> lmdb.Transaction:
        self._check()
        return self.env.begin(write=write)

    def db(self, name: str) -> Any:
        return self.dbs[name]

    # ---- topics ----------------------------------------------------------------------

    def create_topic(self, name: str, record: dict[str, Any],
                     before_commit: Any = None) -> None:
        """Store a topic record; raises TopicExistsError. `before_commit` runs inside the
        write transaction (it creates the partition directories)."""
        with self.begin(write=True) as txn:
            if txn.get(name.encode(), db=self.dbs["topics"]) is not None:
                raise TopicExistsError(f"topic {name!r} already exists")
            if before_commit is not None:
                before_commit()
            txn.put(name.encode(), encode(record), db=self.dbs["topics"])

    def get_topic(self, name: str) -> dict[str, Any] | None:
        with self.begin() as txn:
            raw = txn.get(name.encode(), db=self.dbs["topics"])
        return None if raw is None else decode(raw)

    def delete_topic(self, name: str) -> dict[str, Any]:
        with self.begin(write=True) as txn:
            raw = txn.pop(name.encode(), db=self.dbs["topics"])
            if raw is None:
                raise UnknownTopicError(f"topic {name!r} does not exist")
        return decode(raw)

    def topic_names(self) -> list[str]:
        with self.begin() as txn:
            return [key.decode() for key, _ in txn.cursor(db=self.dbs["topics"])]

    def items(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, Any]]:
        """(key, decoded value) pairs of a sub-database whose keys start with prefix."""
        with self.begin() as txn:
            cursor = txn.cursor(db=self.dbs[db])
            if not cursor.set_range(prefix):
                return
            for key, raw in cursor:
                if not key.startswith(prefix):
                    break
                yield key, decode(raw)
