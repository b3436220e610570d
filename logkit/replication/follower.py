"""`logkit.Follower`: a broker directory that copies a leader, batch for batch, through a
`ReplicaSource`, and can be promoted to be the leader.

Owns: the follower's side of Kafka's replication protocol over a follower root —
creating the topics it discovers and copying their configs, copying committed group
offsets, and per partition: truncating a tail that diverged from the leader's (leader
epochs, KIP-101/KIP-279, checked again before every fetch as KIP-320 does), following
the leader's log start, fetching whole batches from the log end and appending them as
shipped (`Partition.append_replicated`: CRC-checked first, base offsets and
partitionLeaderEpoch kept, segments rolled where the leader's roll), and keeping the
partition's `leader-epoch-checkpoint` equal to the leader's over the copied prefix.
Also `follower.json` (its id, the leader's topic ids and configs it applied, the newest
leader epoch seen per partition) and `follower.lock` (an exclusive flock: one follower
per directory) in the root, and `promote()`: it takes the leader's lease at the
source first (lease.py; NotLeaderError while another holder's is valid, so of two
racing promotions one wins), then stamps the next epoch. A running follower promotes
itself the same way once the leader's lease goes unrenewed for its TTL while the
follower is in the leader's ISR as leader.py defines it (an assigned replica caught up
within `replica.lag.time.max.ms`; with several, the first in assignment order goes
first; through a source whose ISR it cannot read, the same rule over its own
progress), unless `auto_promote=False`; `follower.promoted` (an Event) is set then.

The class is put together from its jobs, one module each: `partition_copy.py` (per
partition: truncation where the histories diverge, fetching and appending batches, the
epoch checkpoint), `metadata_sync.py` (topics, configs, group offsets, the leader's
listener) and `election.py` (the lease, the ISR rank, promotion). This module keeps the
lifecycle (open, the loop, stop), the state file and lock, progress reports, and
`catch_up()`.

Invariant: each partition's log is a prefix of the leader's, batch for batch, whenever
the follower's lock is released — a SIGKILL at any moment leaves a prefix (appends are
kill-safe, and a batch is appended only after every batch of its fetch checked out), and
the next start truncates whatever no longer matches the leader's epochs. Nothing is
appended that did not pass its CRC.

Threads: `start()` runs the loop on one background thread; `run()` runs it in the
caller's. `catch_up()` may be called from any thread; one sync cycle runs at a time
(`_driver`). `stop()` is idempotent and releases the directory and the source.

Errors: a source that cannot be read just now (the leader is down or mid-recovery) or a
local I/O failure is retried after `replica.fetch.backoff.ms`, logged at WARNING the
first time; a shipped batch that fails its checks is refused and fetched again, and
after `MAX_CORRUPT_FETCHES` in a row the follower stops with the CorruptRecordError;
a directory that holds another history than the leader's stops it with
IllegalStateError. `catch_up()` raises the error that stopped the follower.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
import uuid
from typing import Any, Mapping

from .._files import open_file
from .._threads import start_thread
from ..broker import Broker
from ..config import resolve_broker_config
from ..errors import (ConfigError, CorruptRecordError, IllegalStateError, LogkitError,
                      LogkitTimeoutError, ResourceError, UnknownTopicError)
from ..topic import Topic, TopicPartition
from .election import _Election
from ..leader.epochs import EpochEntry
from ..leader.replicas import Progress
from ..leader.lease import replica_id
from .metadata_sync import _MetadataSync
from .partition_copy import MAX_CORRUPT_FETCHES, _PartitionCopy, _tp_name
from .source import ReplicaSource

__all__ = ["Follower", "STATE_FILE", "LOCK_FILE", "MAX_CORRUPT_FETCHES"]

log = logging.getLogger(__name__)

STATE_FILE = "follower.json"
LOCK_FILE = "follower.lock"
METADATA_INTERVAL_S = 1.0          # topics, configs and group offsets re-read this often
REPORT_INTERVAL_S = 1.0            # progress: at once when it moves; when idle, at
                                   # least every replica.fetch.wait.max.ms, capped here
STOP_CHECK_S = 0.1                 # the longest wait between two looks at stop()
LEASE_CHECK_S = 0.1                # the longest wait between two looks at the lease
class Follower(_Election, _MetadataSync, _PartitionCopy):
    """`logkit.Follower(path, source, *, config=None)`: keep the broker root `path` a
    copy of the leader that `source` (a `logkit.ReplicaSource`) reads.

    `config` takes broker settings (Kafka names), among them `replica.fetch.max.bytes`,
    `replica.fetch.wait.max.ms` and `replica.fetch.backoff.ms`. Use it as a context
    manager (start on enter, stop on exit), or `start()`/`stop()`, or `run()` in the
    foreground; `catch_up(timeout)` waits until the copy holds everything the leader
    had when it was called; `promote()` turns the directory into the leader."""

    def __init__(self, path: str | os.PathLike[str], source: ReplicaSource, *,
                 config: Mapping[str, Any] | None = None,
                 auto_promote: bool = True) -> None:
        if not isinstance(source, ReplicaSource):
            raise ConfigError(f"Follower takes a logkit.ReplicaSource (DirectorySource, "
                              f"...), got {type(source).__name__}")
        self.path = os.fspath(path)
        self.source = source
        self.config = resolve_broker_config(config)
        self._broker: Broker | None = None
        self._lock_fd = -1
        self._state: dict[str, Any] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._cond = threading.Condition()
        self._driver = threading.RLock()             # one sync cycle at a time
        self._error: BaseException | None = None     # what stopped the loop
        self._last_error: BaseException | None = None  # the latest retried failure
        self._warned: set[str] = set()
        self.auto_promote = auto_promote
        self.promoted = threading.Event()            # set by an automatic promotion
        self._lease_check_s = min(LEASE_CHECK_S,
                                  self.config["broker.session.timeout.ms"] / 10000)
        # the Kafka listener (serve()): the leader's, as the source names it; ours,
        # reported with the progress; the leader broker opened for ours on promotion
        self.leader_listener: Any = None             # protocol.cluster.Node or None
        self._server: Any = None
        self._listener_body: dict[str, Any] | None = None
        self.leading_broker: Broker | None = None
        self._reset_run_state()

    def _reset_run_state(self) -> None:
        self._partitions: list[TopicPartition] = []
        self._topics: dict[str, Topic] = {}
        self._ends: dict[TopicPartition, int] = {}
        self._epochs: dict[TopicPartition, list[EpochEntry]] = {}
        self._checked: set[TopicPartition] = set()
        self._corrupt: dict[TopicPartition, int] = {}
        self._metadata_asked = 1       # metadata rounds asked for, and done
        self._metadata_done = 0
        self._next_metadata = 0.0
        self._reported: dict[TopicPartition, int] = {}
        self._reported_at = 0.0
        self._leader_ends: dict[TopicPartition, int] = {}     # as last read
        self._next_lease_check = 0.0
        self._caught_up_ms: dict[TopicPartition, int] = {}   # Kafka's lastCaughtUpTimeMs
        # a compacted log's copy of the leader's cleaning (partition_copy.py)
        self._clean_pending: dict[TopicPartition, Any] = {}  # a segment copied in part
        self._clean_mismatches: dict[TopicPartition, int] = {}
        self._local_digests: dict[TopicPartition, Any] = {}

    def __repr__(self) -> str:
        return f"Follower({self.path!r}, {self.source.describe()})"

    def __enter__(self) -> "Follower":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- facts ---------------------------------------------------------------------

    @property
    def follower_id(self) -> str | None:
        """This directory's follower id (made at the first start; kept in
        follower.json), None before that."""
        return self._state.get("follower_id") or self._read_state().get("follower_id")

    @property
    def running(self) -> bool:
        """Whether the background thread is copying."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def error(self) -> BaseException | None:
        """The error that stopped the loop, None while it runs or after a clean stop."""
        return self._error

    def log_end_offsets(self) -> dict[TopicPartition, int]:
        """The log end offset of each partition copied so far."""
        return dict(self._ends)

    def seen_leader_epoch(self, tp: TopicPartition) -> int:
        """The newest leader epoch seen from the leader for `tp` (0 before any)."""
        return int(self._state.get("leader_epochs", {}).get(_tp_name(tp), 0))

    def wire_topic_id(self, topic: str) -> str | None:
        """The id Kafka clients know `topic` by (the leader's; its first leader's if it
        was promoted itself), None before the topic was copied."""
        return self._state.get("wire_ids", {}).get(topic)

    def caught_up_ms(self, tp: TopicPartition) -> int | None:
        """When `tp` last held the leader's log end (Kafka's lastCaughtUpTimeMs)."""
        return self._caught_up_ms.get(tp)

    # ---- the Kafka listener ----------------------------------------------------------

    def serve(self, host: str = "127.0.0.1", port: int = 0, **options: Any) -> Any:
        """Serve this follower's directory over Kafka's wire protocol on host:port (0:
        a free port), as `Broker.serve` does (the same options; docs/kafka-protocol.md,
        "Replicas on the wire"). Until promoted, its Metadata names the leader (the
        source's `leader_listener()`) and its Produce, Fetch, group and admin answers
        send clients there (NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR, NOT_CONTROLLER);
        the follower reports the listener with its progress, so the leader's Metadata
        names it too. Once promoted (by `promote()` or automatically) the listener
        answers as the leader with the new epoch, over a Broker this follower opens on
        its directory (`leading_broker`). Call after `start()` (or `catch_up()`); the
        handle's `close()` also closes the brokers it used."""
        from ..protocol.cluster import FollowerView, node_id_for
        from ..protocol.server import KafkaServer
        if self._server is not None and not self._server.closed:
            raise IllegalStateError(f"{self!r} already serves on "
                                    f"{self._server.bootstrap_servers}")
        reader = Broker(self.path, read_only=True)
        try:
            server = KafkaServer(reader, host, port,
                                 node_id=node_id_for(self.path, self.config),
                                 view=lambda node: FollowerView(self, node), **options)
        except BaseException:
            reader.close()
            raise
        server.on_close.append(reader.close)
        server.on_close.append(self._listener_closed)
        self._server = server
        self._listener_body = server.node._asdict()
        self._reported_at = 0.0                      # report it at the next cycle
        self._metadata_asked += 1
        if self.promoted.is_set() or self._state.get("role") == "leader":
            self._lead_listener()
        return server

    def _listener_closed(self) -> None:
        self._server, self._listener_body = None, None
        broker, self.leading_broker = self.leading_broker, None
        if broker is not None:
            broker.close()

    def _lead_listener(self) -> None:
        """After a promotion: open the directory as the leader and hand it to the
        listener, which answers as the leader from then on."""
        server = self._server
        if server is None or server.closed or self.leading_broker is not None:
            return
        try:
            broker = Broker(self.path, config=self.config)
        except (LogkitError, OSError) as exc:
            log.error("%s: promoted, but the listener cannot open the directory as the "
                      "leader (%s): it goes on answering as a follower", self.path, exc)
            return
        self.leading_broker = broker
        server.lead(broker)
        log.info("%s: the Kafka listener on %s now answers as the leader", self.path,
                 server.bootstrap_servers)

    @staticmethod
    def recorded_source(path: str | os.PathLike[str]) -> str | None:
        """The `describe()` of the source a Follower last used on `path`, as kept in
        its follower.json ("DirectorySource('/data')", "TcpSource('host:9093')", ...);
        None when `path` is not a follower's directory."""
        try:
            fd = open_file(os.path.join(os.fspath(path), STATE_FILE), os.O_RDONLY)
            with open(fd, encoding="utf-8") as f:
                found = json.load(f).get("source")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{os.path.join(os.fspath(path), STATE_FILE)} is "
                              f"unreadable ({exc})") from None
        return found if isinstance(found, str) else None

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Open the directory (creating it) and copy on a background thread. Raises
        IllegalStateError when another Follower holds the directory. A no-op while
        running."""
        with self._driver:
            if self.running:
                return
            self._error = None
            self._stopping.clear()
            opened = self._broker is None
            if opened:
                self._open()
            self._thread = threading.Thread(target=self._thread_main,
                                            name=f"logkit-follower {self.path}", daemon=True)
            try:
                start_thread(self._thread, f"the follower thread of {self.path}")
            except ResourceError:
                self._thread = None
                if opened:                    # as it was: the directory not held
                    self._close()
                raise

    def run(self) -> None:
        """Copy in the calling thread until `stop()` is called from another thread;
        raises the error that stops it (the directory is released either way)."""
        with self._driver:
            if self.running:
                raise IllegalStateError(f"{self!r} is already running in the background")
            self._stopping.clear()
            self._error = None
            opened = self._broker is None
            if opened:
                self._open()
        try:
            self._loop()
        finally:
            if opened:
                with self._driver:
                    self._close()

    def stop(self) -> None:
        """Stop copying, release the directory (its broker and lock) and close the
        source (sources reopen on their next use). Safe to call twice, and from a
        `run()` in another thread."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._thread = None
        with self._driver:
            self._close()
        with self._cond:
            self._cond.notify_all()

    close = stop

    def _open(self) -> None:
        """Open the follower's broker and take the directory's follower lock."""
        # The leader's cleaning is copied (partition_copy.py): no cleaner of its own.
        broker = Broker(self.path, config={**self.config, "log.cleaner.enable": False})
        assert broker._lease is not None
        broker._lease.follow()            # a follower's broker writes what the leader wrote
        try:
            fd = os.open(os.path.join(self.path, LOCK_FILE),
                         os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            broker.close()
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            broker.close()
            raise IllegalStateError(f"{self.path} is held by another Follower (its "
                                    f"{LOCK_FILE} is locked); stop that one first") from None
        self._broker, self._lock_fd = broker, fd
        self._reset_run_state()
        state = self._read_state()
        state.setdefault("follower_id", replica_id(self.path) or uuid.uuid4().hex[:16])
        for key in ("topics", "configs", "leader_epochs", "clean_counts"):
            state.setdefault(key, {})
        state.setdefault("groups", [])
        state["source"] = self.source.describe()
        state["role"] = "follower"
        self._state = state
        self._save_state()
        log.info("%s: following %s as %s", self.path, self.source.describe(),
                 state["follower_id"])

    def _close(self) -> None:
        broker, self._broker = self._broker, None
        fd, self._lock_fd = self._lock_fd, -1
        try:
            if broker is not None:
                broker.close()
        finally:
            if fd >= 0:
                os.close(fd)                    # releases the flock
            self.source.close()

    def _read_state(self) -> dict[str, Any]:
        try:
            fd = open_file(os.path.join(self.path, STATE_FILE), os.O_RDONLY)
            with open(fd, encoding="utf-8") as f:
                state = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{os.path.join(self.path, STATE_FILE)} is unreadable "
                              f"({exc}); remove it to start the follower afresh") from None
        return state if isinstance(state, dict) else {}

    def _save_state(self) -> None:
        path = os.path.join(self.path, STATE_FILE)
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            json.dump(self._state, f, sort_keys=True, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    # ---- the loop ------------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            self._loop()
        except BaseException as exc:          # kept for catch_up() and `error`
            self._error = exc
            if isinstance(exc, LogkitError):
                log.error("%s: follower stopped: %s", self.path, exc)
            else:
                log.exception("%s: follower stopped by a bug", self.path)
        finally:
            with self._cond:
                self._cond.notify_all()

    def _loop(self) -> None:
        backoff_s = self.config["replica.fetch.backoff.ms"] / 1000
        wait_s = min(self.config["replica.fetch.wait.max.ms"] / 1000, STOP_CHECK_S)
        while not self._stopping.is_set():
            if self._promoted_itself():
                return
            try:
                with self._driver:
                    if self._broker is None:       # stopped meanwhile
                        return
                    copied = self._cycle()
            except (LogkitError, OSError) as exc:
                if self._fatal(exc):
                    raise
                self._retrying(exc)
                self._pause(backoff_s)
                continue
            if not copied:
                self.source.wait(wait_s)

    def _pause(self, seconds: float) -> None:
        """Wait `seconds` (a backoff), looking at stop() and, with auto-promotion, at
        the lease in between: an expired one ends the wait."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self._stopping.wait(min(left, self._lease_check_s)):
                return
            if self.auto_promote and self._lease_expired() is not None:
                return

    def _fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, (IllegalStateError, ConfigError)) or (
            isinstance(exc, CorruptRecordError) and getattr(exc, "fatal", False))

    def _retrying(self, exc: BaseException) -> None:
        self._last_error = exc
        kind = f"{type(exc).__name__}: {exc}"
        if kind not in self._warned and len(self._warned) < 100:
            self._warned.add(kind)
            log.warning("%s: copying from %s failed, retrying after "
                        "replica.fetch.backoff.ms: %s", self.path, self.source.describe(),
                        kind)
        else:
            log.debug("%s: retrying: %s", self.path, kind)

    def _cycle(self) -> bool:
        """One pass: metadata when due, then each partition; returns whether any
        batch was copied."""
        now = time.monotonic()
        if self._metadata_done < self._metadata_asked or now >= self._next_metadata:
            asked = self._metadata_asked
            self._sync_metadata()
            self._metadata_done = max(self._metadata_done, asked)
            self._next_metadata = now + METADATA_INTERVAL_S
        copied = False
        for tp in list(self._partitions):
            try:
                copied = self._sync_partition(tp) or copied
            except UnknownTopicError as exc:          # deleted here or there meanwhile
                log.debug("%s: %s-%d: %s", self.path, tp.topic, tp.partition, exc)
                self._metadata_asked += 1
            except CorruptRecordError as exc:
                self._refused(tp, exc)
            except (LogkitError, OSError) as exc:
                if self._fatal(exc):
                    raise
                self._retrying(exc)
        self._report()
        with self._cond:
            self._cond.notify_all()
        return copied

    def _report(self) -> None:
        """Progress goes to the leader at once when a log end moved (acks="all" and the
        high watermark wait on it), and at least every replica.fetch.wait.max.ms while
        idle, which refreshes the caught-up times that keep this follower in the ISR
        (keep replica.lag.time.max.ms well above it, as Kafka asks)."""
        now = time.monotonic()
        idle_s = min(REPORT_INTERVAL_S, self.config["replica.fetch.wait.max.ms"] / 1000)
        if self._ends == self._reported and now - self._reported_at < idle_s:
            return
        self.source.report_progress(self._state["follower_id"],
                                    Progress(self._ends, self._caught_up_ms,
                                             self._listener_body))
        self._reported = dict(self._ends)
        self._reported_at = now

    # ---- metadata: topics, configs, committed offsets ------------------------------

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    # ---- partitions ----------------------------------------------------------------

    def _require_broker(self) -> Broker:
        broker = self._broker
        if broker is None:
            raise IllegalStateError(f"{self!r} is not started")
        return broker

    # ---- catch_up and promote ------------------------------------------------------

    def catch_up(self, timeout: float = 30.0) -> None:
        """Return once every partition's log end is at least the leader's as of this
        call, and the topics, configs and committed offsets the leader had then are
        copied. Runs the copy itself when the follower is not started (opening and
        releasing the directory). A running follower that promotes itself
        (`auto_promote`) through a source that keeps a lease also waits until it can
        see the leader's lease, so a leader that stops the moment this returns is
        replaced once that lease expires (a leader takes it once a follower has
        reported, lease.py). Raises LogkitTimeoutError after `timeout` seconds (saying
        what lags and the last retried error), or the error that stopped the
        follower."""
        deadline = time.monotonic() + timeout
        opened = False
        with self._driver:
            if self._broker is None:
                self._open()
                opened = True
        try:
            targets = self._targets_by(deadline)
            with self._driver:
                self._metadata_asked += 1
                asked = self._metadata_asked
            if self.running:
                self._wait_for(targets, asked, deadline)
                if self.auto_promote and self.source.keeps_lease:
                    self._wait_for_lease(deadline)
            else:
                self._drive_to(targets, asked, deadline)
        finally:
            if opened and not self.running:
                with self._driver:
                    self._close()

    def _targets_by(self, deadline: float) -> dict[TopicPartition, tuple[int, int]]:
        """The leader's (log end offset, clean count) per partition now; a source that
        fails is asked again after replica.fetch.backoff.ms until `deadline`."""
        backoff_s = self.config["replica.fetch.backoff.ms"] / 1000
        while True:
            try:
                with self._driver:
                    return {TopicPartition(name, n): (p.log_end_offset, p.clean_count)
                            for name, info in self.source.topics().items()
                            for n in range(info.partitions)
                            for p in (self.source.partition(name, n),)}
            except (LogkitError, OSError) as exc:
                if self._fatal(exc):
                    raise
                self._retrying(exc)
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._timeout({})
            time.sleep(min(backoff_s, left))

    def _reached(self, targets: Mapping[TopicPartition, tuple[int, int]], asked: int
                 ) -> bool:
        """The metadata round `asked` is done, and each partition holds the target's
        log end and, with a clean count, the leader's cleaning as of that count
        (partition_copy.py)."""
        cleaned = self._state.get("clean_counts", {})
        return self._metadata_done >= asked and all(
            self._ends.get(tp, -1) >= end and (
                count == 0 or cleaned.get(_tp_name(tp), 0) >= count)
            for tp, (end, count) in targets.items())

    def _wait_for(self, targets: Mapping[TopicPartition, tuple[int, int]], asked: int,
                  deadline: float) -> None:
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if self._reached(targets, asked):
                    return
                if not self.running:
                    raise IllegalStateError(f"{self!r} stopped while catching up")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._timeout(targets)
                self._cond.wait(min(left, STOP_CHECK_S))

    def _drive_to(self, targets: Mapping[TopicPartition, tuple[int, int]], asked: int,
                  deadline: float) -> None:
        backoff_s = self.config["replica.fetch.backoff.ms"] / 1000
        while True:
            copied = False
            try:
                with self._driver:
                    copied = self._cycle()
            except (LogkitError, OSError) as exc:
                if self._fatal(exc):
                    raise
                self._retrying(exc)
                time.sleep(max(0.0, min(backoff_s, deadline - time.monotonic())))
            if self._reached(targets, asked):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._timeout(targets)
            if not copied:
                self.source.wait(min(left, STOP_CHECK_S))

    def _timeout(self, targets: Mapping[TopicPartition, tuple[int, int]]
                 ) -> LogkitTimeoutError:
        behind = {_tp_name(tp): (self._ends.get(tp), end)
                  for tp, (end, _) in targets.items() if self._ends.get(tp, -1) < end}
        cleaned = self._state.get("clean_counts", {})
        uncleaned = sorted(_tp_name(tp) for tp, (_, count) in targets.items()
                           if count and cleaned.get(_tp_name(tp), 0) < count)
        shown = ", ".join([f"{name} at {have} of {want}"
                           for name, (have, want) in sorted(behind.items())[:5]] +
                          [f"{name} not yet holding the leader's cleaning"
                           for name in uncleaned[:5]])
        last = f"; last error: {self._last_error}" if self._last_error else ""
        if not targets:
            shown = "the leader's log end offsets could not be read"
        return LogkitTimeoutError(f"{self!r} did not catch up in time: "
                                  f"{shown or 'metadata not copied yet'}{last}")

