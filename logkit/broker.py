"""The embedded broker: one root directory, its topics, its metadata and its chores.

Owns: `logkit.json` (the format version; an unknown major version is refused), the
metadata store, the cache of open topics, topic create/open/list/delete, and the
background scheduler that runs retention (`log.retention.check.interval.ms`) and the
`flush.ms` policy. Several processes may open the same root at once; everything they
share lives in files (see log.py and meta.py), never in this object.

Invariant: a topic's partition directories exist before its metadata record commits,
and a deleted topic's record is gone before its directories are renamed away.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
from typing import Any, Mapping

from .config import LONG_MAX, overrides_only, resolve_broker_config, resolve_topic_config
from .errors import (ClosedError, ConfigError, IncompatibleFormatError, UnknownTopicError)
from .log import PartitionLog
from .meta import MetaStore
from .notify import Doorbell
from .topic import MAX_PARTITIONS, Topic, validate_topic_name

__all__ = ["Broker", "FORMAT_VERSION"]

FORMAT_VERSION = "1.0"
FORMAT_FILE = "logkit.json"


def _check_format(root: str) -> None:
    path = os.path.join(root, FORMAT_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
        version = str(info["format_version"])
        major = int(version.split(".")[0])
    except FileNotFoundError:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"format_version": FORMAT_VERSION, "created_by": "logkit"}, f)
            f.write("\n")
        os.replace(tmp, path)          # atomic: a concurrent opener sees all or nothing
        return
    except (ValueError, KeyError, TypeError) as exc:
        raise IncompatibleFormatError(f"{path} is not a logkit format file: {exc}") from None
    if major != int(FORMAT_VERSION.split(".")[0]):
        raise IncompatibleFormatError(
            f"{path} has format version {version}; this logkit reads "
            f"{FORMAT_VERSION.split('.')[0]}.x")


def partition_dir(root: str, topic: str, partition: int) -> str:
    return os.path.join(root, f"{topic}-{partition}")


class Broker:
    """`with logkit.Broker("data/") as broker:` — create or open a root directory."""

    def __init__(self, path: str | os.PathLike[str], *,
                 config: Mapping[str, Any] | None = None,
                 background: bool = True) -> None:
        self.path = os.fspath(path)
        self.config = resolve_broker_config(config)
        os.makedirs(self.path, exist_ok=True)
        _check_format(self.path)
        self.meta = MetaStore(os.path.join(self.path, "meta"))
        self.doorbell = Doorbell(self.path)
        self._topics: dict[str, Topic] = {}
        self._lock = threading.RLock()
        self._closed = False
        self._clients: list[Any] = []
        self._stop = threading.Event()
        self._scheduler: threading.Thread | None = None
        if background:
            self._scheduler = threading.Thread(target=self._run_scheduler,
                                               name="logkit-scheduler", daemon=True)
            self._scheduler.start()

    def __repr__(self) -> str:
        return f"Broker({self.path!r})"

    def __enter__(self) -> "Broker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"broker {self.path!r} is closed")

    # ---- topics ----------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int | None = None, *,
                     config: Mapping[str, Any] | None = None) -> Topic:
        """Create a topic with `partitions` (default num.partitions) and config overrides."""
        self._check_open()
        validate_topic_name(name)
        if partitions is None:
            partitions = self.config["num.partitions"]
        if isinstance(partitions, bool) or not isinstance(partitions, int) \
                or not 1 <= partitions <= MAX_PARTITIONS:
            raise ConfigError(f"partitions must be an integer in 1..{MAX_PARTITIONS}, "
                              f"got {partitions!r}")
        overrides = overrides_only(config)
        resolve_topic_config(overrides, self.config)            # validates the whole set
        record = {"name": name, "partitions": partitions, "config": overrides,
                  "topic_id": uuid.uuid4().hex, "created_ms": int(time.time() * 1000)}

        def make_dirs() -> None:
            for number in range(partitions):
                os.makedirs(partition_dir(self.path, name, number), exist_ok=True)

        with self._lock:
            self.meta.create_topic(name, record, before_commit=make_dirs)
        return self.topic(name)

    def topic(self, name: str) -> Topic:
        """Open an existing topic (UnknownTopicError if there is none)."""
        self._check_open()
        validate_topic_name(name)
        with self._lock:
            record = self.meta.get_topic(name)
            cached = self._topics.get(name)
            if record is None:
                if cached is not None:
                    self._topics.pop(name).close()
                raise UnknownTopicError(f"topic {name!r} does not exist in {self.path}")
            if cached is not None and cached.topic_id == record["topic_id"]:
                return cached
            if cached is not None:                    # deleted and re-created elsewhere
                self._topics.pop(name).close()
            config = resolve_topic_config(record["config"], self.config)
            logs = [PartitionLog(partition_dir(self.path, name, n), name, n, config,
                                 doorbell=self.doorbell)
                    for n in range(record["partitions"])]
            topic = Topic(name, logs, config, record["topic_id"])
            self._topics[name] = topic
            return topic

    def get_or_create_topic(self, name: str) -> Topic:
        """The topic, auto-created with num.partitions when auto.create.topics.enable."""
        try:
            return self.topic(name)
        except UnknownTopicError:
            if not self.config["auto.create.topics.enable"]:
                raise
        try:
            return self.create_topic(name)
        except Exception as exc:                       # another process won the race
            from .errors import TopicExistsError
            if isinstance(exc, TopicExistsError):
                return self.topic(name)
            raise

    def topics(self) -> list[str]:
        self._check_open()
        return sorted(self.meta.topic_names())

    def delete_topic(self, name: str) -> None:
        """Delete a topic's metadata, then its directories (renamed away first)."""
        self._check_open()
        validate_topic_name(name)
        with self._lock:
            record = self.meta.delete_topic(name)
            cached = self._topics.pop(name, None)
            if cached is not None:
                cached.close()
            tag = uuid.uuid4().hex
            for number in range(record["partitions"]):
                directory = partition_dir(self.path, name, number)
                if os.path.isdir(directory):
                    doomed = f"{directory}.{tag}-delete"
                    os.rename(directory, doomed)
                    shutil.rmtree(doomed, ignore_errors=True)

    # ---- chores ----------------------------------------------------------------------

    def _open_topics(self) -> list[Topic]:
        topics = []
        for name in self.topics():
            try:
                topics.append(self.topic(name))
            except UnknownTopicError:
                pass                                   # deleted meanwhile
        return topics

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Apply retention.ms / retention.bytes to every topic; returns segments deleted."""
        self._check_open()
        return sum(p._log.enforce_retention(now_ms)
                   for topic in self._open_topics() for p in topic.partitions)

    def flush(self) -> None:
        """fsync every partition of every open topic."""
        self._check_open()
        with self._lock:
            topics = list(self._topics.values())
        for topic in topics:
            for partition in topic.partitions:
                partition.flush()

    def _run_scheduler(self) -> None:
        retention_s = self.config["log.retention.check.interval.ms"] / 1000
        flush_s = self.config["log.flush.scheduler.interval.ms"] / 1000
        next_retention = time.monotonic() + retention_s
        while not self._stop.wait(min(flush_s, retention_s)):
            try:
                with self._lock:
                    topics = list(self._topics.values())
                for topic in topics:
                    if topic.config["flush.ms"] < LONG_MAX:
                        for partition in topic.partitions:
                            partition._log.maybe_flush()
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + retention_s
                    self.enforce_retention()
            except ClosedError:
                return
            except Exception as exc:   # a chore must not kill the thread; report it
                import warnings
                warnings.warn(f"logkit background task failed: {exc!r}", RuntimeWarning)

    # ---- clients ---------------------------------------------------------------------

    def producer(self, **options: Any) -> Any:
        from .producer import Producer
        self._check_open()
        producer = Producer(self, **options)
        self._clients.append(producer)
        return producer

    def consumer(self, *topics: str, **options: Any) -> Any:
        from .consumer import Consumer
        self._check_open()
        consumer = Consumer(self, *topics, **options)
        self._clients.append(consumer)
        return consumer

    def group(self, group_id: str) -> Any:
        from .group import ConsumerGroup
        self._check_open()
        return ConsumerGroup(self, group_id)

    # ---- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Close clients, stop chores, flush and mark logs clean. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for client in reversed(self._clients):
            try:
                client.close()
            except Exception:   # closing must go on to release the files
                pass
        self._clients.clear()
        self._stop.set()
        if self._scheduler is not None and self._scheduler is not threading.current_thread():
            self._scheduler.join(timeout=10)
        with self._lock:
            for topic in self._topics.values():
                topic.close()
            self._topics.clear()
        self.meta.close()
        self.doorbell.close()
