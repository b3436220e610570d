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

from ..broker import Broker
from ..config import resolve_broker_config, resolve_config
from .._threads import start_thread
from ..errors import (ConfigError, CorruptRecordError, IllegalStateError, LogkitError,
                      LogkitTimeoutError, NotLeaderError, OffsetOutOfRangeError,
                      ResourceError, UnknownTopicError)
from ..records import iter_batches
from .._files import open_file
from ..topic import Partition, Topic, TopicPartition
from .epochs import (EpochEntry, assign, divergence_offset, epochs_from_headers,
                     read_checkpoint, truncate_from_end, write_checkpoint)
from .directory import DirectorySource
from .leader import Progress, ReplicaState, _Report, in_sync_replicas
from .lease import renew as renew_lease
from .lease import read_lease, replica_id
from .source import PartitionInfo, ReplicaSource, TopicInfo

__all__ = ["Follower", "STATE_FILE", "LOCK_FILE", "MAX_CORRUPT_FETCHES"]

log = logging.getLogger(__name__)

STATE_FILE = "follower.json"
LOCK_FILE = "follower.lock"
MAX_CORRUPT_FETCHES = 3            # refused fetches in a row before the follower stops
METADATA_INTERVAL_S = 1.0          # topics, configs and group offsets re-read this often
REPORT_INTERVAL_S = 1.0            # progress: at once when it moves; when idle, at
                                   # least every replica.fetch.wait.max.ms, capped here
STOP_CHECK_S = 0.1                 # the longest wait between two looks at stop()
LEASE_CHECK_S = 0.1                # the longest wait between two looks at the lease
_DEFAULTS = resolve_config("topic", None)


def _overrides(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a resolved topic config that differ from Kafka's defaults."""
    return {k: v for k, v in config.items() if _DEFAULTS.get(k) != v}


def _tp_name(tp: TopicPartition) -> str:
    return f"{tp.topic}-{tp.partition}"


class Follower:
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
        broker = Broker(self.path, config=self.config)
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
        for key in ("topics", "configs", "leader_epochs"):
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

    def _lease_expired(self) -> Any:
        """The leader's lease when it has expired (None otherwise, or when the source
        keeps none or cannot be read just now)."""
        try:
            lease = self.source.lease()
        except (LogkitError, OSError) as exc:
            log.debug("%s: the leader's lease cannot be read: %s", self.path, exc)
            return None
        if lease is None or lease.valid() or lease.holder == self._state.get("follower_id"):
            return None
        return lease

    def _promoted_itself(self) -> bool:
        """Automatic promotion (at most every LEASE_CHECK_S): the leader's lease has
        gone unrenewed for its TTL and this follower is in the leader's ISR
        (`_isr_rank`), so promote as promote() does. Returns True when it did (the
        loop ends; `promoted` is set); a promotion another replica won leaves this one
        following."""
        now = time.monotonic()
        if not self.auto_promote or now < self._next_lease_check:
            return False
        self._next_lease_check = now + self._lease_check_s
        lease = self._lease_expired()
        if lease is None:
            return False
        rank, why = self._isr_rank()
        if rank is None:
            self._warn_once("out of sync", "%s: the leader's lease expired but this "
                            "follower does not promote itself: %s", self.path, why)
            return False
        # Kafka's preferred order: the k-th assigned follower in the ISR lets the ones
        # before it try first (k x TTL/2 more); the lease's lock decides a race anyway.
        if int(time.time() * 1000) < lease.expires_ms + rank * lease.ttl_ms // 2:
            return False
        log.warning("%s: the leader's lease (replica %s, epoch %d) went unrenewed for "
                    "broker.session.timeout.ms=%d: promoting this follower", self.path,
                    lease.holder, lease.epoch, lease.ttl_ms)
        with self._driver:
            self._close()
            try:
                self._promote_locked(unclean=False)
            except (LogkitError, OSError) as exc:
                log.warning("%s: automatic promotion failed, following on: %s",
                            self.path, exc)
                self._open()
                return False
        self._stopping.set()
        self.promoted.set()
        self._lead_listener()
        return True

    def _isr_rank(self) -> tuple[int | None, str]:
        """This follower's place among the in-sync followers of the leader's ISR, by the
        leader's own definition (leader.in_sync_replicas over the progress files and the
        replica assignment in the leader's root): (rank, "") when it is in the ISR of
        every partition, else (None, why). A topic with a replication factor above 1
        counts only its assigned followers (one beyond the factor never promotes
        itself); for a topic of factor 1 (no assignment: every copy is extra) the
        follower counts as its only candidate. The rank is its highest position
        among the in-sync assigned followers of any partition. A source other than a
        directory: `_own_isr_rank`."""
        me = self._state["follower_id"]
        lag_ms = self.config["replica.lag.time.max.ms"]
        if not isinstance(self.source, DirectorySource):
            return self._own_isr_rank(me, lag_ms)
        state = ReplicaState(self.source.path, lag_time_max_ms=lag_ms, writable=False)
        rank = 0
        try:
            topics = self.source.topics()
            reports = state.reports()
            now_ms = int(time.time() * 1000)
            for name, info in sorted(topics.items()):
                assigned = [me] if info.replication_factor <= 1 else \
                    state.assigned(name, info.topic_id, info.replication_factor)
                if me not in assigned:
                    return None, (f"it is not among the assigned replicas of topic {name} "
                                  f"(replication factor {info.replication_factor}: "
                                  f"{assigned})")
                for n in range(info.partitions):
                    end = self._leader_end(TopicPartition(name, n))
                    isr = in_sync_replicas(assigned, reports, f"{name}-{n}", end, now_ms,
                                           lag_ms)
                    if me not in isr:
                        return None, (f"it is not in the ISR of {name}-{n} (not caught "
                                      f"up to the leader's log end {end} within "
                                      f"replica.lag.time.max.ms={lag_ms})")
                    rank = max(rank, [f for f in assigned if f in isr].index(me))
        except (LogkitError, OSError) as exc:
            return None, f"the leader's ISR cannot be read ({exc})"
        finally:
            state.close()
        return rank, ""

    def _own_isr_rank(self, me: str, lag_ms: int) -> tuple[int | None, str]:
        """For a source whose leader's ISR this follower cannot read (an object store,
        TCP): the same rule (leader.in_sync_replicas) over this follower's own
        progress — every partition caught up within replica.lag.time.max.ms. Nothing
        tells it the replica assignment, so a follower beyond the factor counts too."""
        if self._metadata_done < 1 or not self._partitions:
            return None, "it has not copied the leader's partitions yet"
        now_ms = int(time.time() * 1000)
        own = _Report(now_ms, {_tp_name(tp): end for tp, end in self._ends.items()},
                      {_tp_name(tp): ms for tp, ms in self._caught_up_ms.items()})
        for tp in self._partitions:
            end = self._leader_ends.get(tp)
            if end is None or me not in in_sync_replicas([me], {me: own}, _tp_name(tp),
                                                         end, now_ms, lag_ms):
                return None, (f"it was not caught up on {_tp_name(tp)} within "
                              f"replica.lag.time.max.ms={lag_ms}")
        return 0, ""

    def _leader_end(self, tp: TopicPartition) -> int:
        """The leader's log end of `tp` now, or as last read when its partition cannot
        be read: a leader killed mid-update leaves a torn tail that only a read-write
        open repairs, and a dead leader's follower must still be able to take over."""
        try:
            return self.source.partition(tp.topic, tp.partition).log_end_offset
        except (LogkitError, OSError) as exc:
            if tp not in self._leader_ends:
                raise
            log.debug("%s: %s: the leader's partition cannot be read (%s); its log end "
                      "as last read is %d", self.path, _tp_name(tp), exc,
                      self._leader_ends[tp])
            return self._leader_ends[tp]

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

    def _refused(self, tp: TopicPartition, exc: CorruptRecordError) -> None:
        count = self._corrupt.get(tp, 0) + 1
        self._corrupt[tp] = count
        log.warning("%s: %s: refused a fetch from %s (%d in a row): %s", self.path,
                    _tp_name(tp), self.source.describe(), count, exc)
        if count >= MAX_CORRUPT_FETCHES:
            exc.fatal = True                          # type: ignore[attr-defined]
            raise exc

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

    def _sync_metadata(self) -> None:
        broker = self._require_broker()
        self._topics.clear()
        leader = self.source.topics()
        state = self._state
        before = json.dumps(state, sort_keys=True)
        local = set(broker.topics())
        for name, info in sorted(leader.items()):
            known = state["topics"].get(name)
            if name in local and known is not None and known != info.topic_id:
                log.warning("%s: topic %s was deleted and re-created on the leader; "
                            "deleting its copy", self.path, name)
                broker.delete_topic(name)
                local.discard(name)
                self._forget(name)
            if name not in local:
                broker.create_topic(name, info.partitions, config=info.config,
                                    replication_factor=info.replication_factor)
                local.add(name)
                log.info("%s: created topic %s (%d partition(s)) from the leader",
                         self.path, name, info.partitions)
            else:
                self._sync_config(broker, name, info)
            state["topics"][name] = info.topic_id
            state["configs"][name] = info.config
            state.setdefault("wire_ids", {})[name] = info.wire_topic_id or info.topic_id
        for name in sorted(local - leader.keys()):
            if name in state["topics"]:
                log.warning("%s: topic %s is gone from the leader; deleting its copy",
                            self.path, name)
                broker.delete_topic(name)
                self._forget(name)
        partitions = []
        for name, info in sorted(leader.items()):
            have = broker.topic(name).num_partitions
            if have < info.partitions:                  # grown on the leader
                have = broker.create_partitions(name, info.partitions).num_partitions
            partitions += [TopicPartition(name, n) for n in range(min(have, info.partitions))]
        self._partitions = partitions
        self._sync_offsets(broker, set(partitions))
        if json.dumps(state, sort_keys=True) != before:
            self._save_state()
        if self._server is not None:
            self._note_leader_listener()

    def _note_leader_listener(self) -> None:
        """The leader's Kafka listener as the source names it (kept when it names
        none: a leader killed, or between two looks)."""
        from ..protocol.cluster import keep_cluster_id, parse_node
        try:
            found = self.source.leader_listener()
            if found and isinstance(found.get("cluster_id"), str):
                keep_cluster_id(self.path, found["cluster_id"])
        except (LogkitError, OSError) as exc:
            log.debug("%s: the leader's listener cannot be read: %s", self.path, exc)
            return
        node = parse_node(found) if found else None
        if node is not None and node != self.leader_listener:
            log.info("%s: the leader's Kafka listener is node %d at %s:%d", self.path,
                     node.node_id, node.host, node.port)
            self.leader_listener = node

    def _sync_config(self, broker: Broker, name: str, info: TopicInfo) -> None:
        applied = self._state["configs"].get(name)
        if applied is None:                 # a topic this directory had already
            applied = _overrides(broker.topic(name).config)
        if applied == info.config:
            return
        changes: dict[str, Any] = {k: None for k in applied if k not in info.config}
        changes.update(info.config)
        broker.alter_topic_config(name, changes)
        log.info("%s: topic %s config overrides now %s, as on the leader", self.path,
                 name, info.config)

    def _forget(self, name: str) -> None:
        self._state["topics"].pop(name, None)
        self._state["configs"].pop(name, None)
        for tp in [tp for tp in self._epochs if tp.topic == name]:
            self._epochs.pop(tp, None)
            self._checked.discard(tp)
            self._ends.pop(tp, None)
            self._caught_up_ms.pop(tp, None)
            self._state["leader_epochs"].pop(_tp_name(tp), None)

    def _sync_offsets(self, broker: Broker, partitions: set[TopicPartition]) -> None:
        leader = self.source.committed_offsets()
        copied = set(self._state["groups"])
        for group, offsets in sorted(leader.items()):
            wanted = {tp: o for tp, o in offsets.items() if tp in partitions}
            if not wanted:
                continue
            handle = broker.group(group)
            current = handle.committed()
            changed = {tp: o for tp, o in wanted.items() if current.get(tp) != o}
            if changed:
                try:
                    handle.reset_offsets(changed)
                except IllegalStateError as exc:      # a member consumes from the copy
                    self._warn_once(f"group {group}", "%s: committed offsets of group %s "
                                    "not copied: %s", self.path, group, exc)
                    continue
            copied.add(group)
        for group in sorted(copied - leader.keys()):
            try:
                broker.group(group).delete()
            except IllegalStateError as exc:
                self._warn_once(f"group {group}", "%s: group %s is gone from the leader "
                                "but not deleted here: %s", self.path, group, exc)
                continue
            copied.discard(group)
        self._state["groups"] = sorted(copied & leader.keys())

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

    def _local_partition(self, tp: TopicPartition) -> Partition:
        """The follower's partition; topic handles are kept until the next metadata
        sync (only this follower changes the directory's topics)."""
        topic = self._topics.get(tp.topic)
        if topic is None:
            topic = self._topics[tp.topic] = self._require_broker().topic(tp.topic)
        return topic.partition(tp.partition)

    def _sync_partition(self, tp: TopicPartition) -> bool:
        """Align one partition with its leader and copy one fetch; returns whether
        anything was appended."""
        p = self._local_partition(tp)
        if tp not in self._epochs:
            self._epochs[tp] = self._load_epochs(p)
        asked_ms = int(time.time() * 1000)         # the leader's log end as of now:
        info = self.source.partition(tp.topic, tp.partition)
        self._leader_ends[tp] = info.log_end_offset
        self._note_leader_epoch(tp, info)
        end = self._align(tp, p, info)
        if tp not in self._checked:
            self._check_same_history(tp, p)
            self._checked.add(tp)
            end = p.log_end_offset
        self._ends[tp] = end
        if end >= info.log_end_offset:
            self._caught_up_ms[tp] = asked_ms      # ... reached: caught up at asked_ms
            self._mirror_epochs(tp, p, info, end)
            return False
        data = self.source.fetch(tp.topic, tp.partition, end,
                                 max_bytes=self.config["replica.fetch.max.bytes"])
        if not data:
            return False
        where = f"a fetch of {_tp_name(tp)} from {self.source.describe()}"
        headers = [h for _, h in iter_batches(data, 0, len(data), where)]
        first, new_end = headers[0].base_offset, headers[-1].last_offset + 1
        if first != end:
            end = self._restart_at(tp, p, first, end)
        # Batches the leader had published when `info` was read had their segments
        # published too: ask again only for the segment bases of newer ones.
        after = info if new_end <= info.log_end_offset else \
            self.source.partition(tp.topic, tp.partition)
        self._mirror_epochs(tp, p, after, new_end)
        p.append_replicated(data, segment_base_offsets=after.segment_base_offsets)
        if p.log_start_offset < after.log_start_offset:
            p.increase_log_start_offset(after.log_start_offset)
        self._corrupt.pop(tp, None)
        self._ends[tp] = p.log_end_offset
        if self._ends[tp] >= info.log_end_offset:
            self._caught_up_ms[tp] = asked_ms
        return True

    def _load_epochs(self, p: Partition) -> list[EpochEntry]:
        """The partition's epochs: its checkpoint file, else what its batches carry
        (one scan), without entries past the log end (a kill between the checkpoint
        write and the append it announced)."""
        entries = read_checkpoint(p.directory)
        if entries is None:
            entries = epochs_from_headers(p.batch_headers(p.log_start_offset))
        end = p.log_end_offset
        return [e for e in entries if e.start_offset <= end]

    def _note_leader_epoch(self, tp: TopicPartition, info: PartitionInfo) -> None:
        """Remember the newest leader epoch seen, so a promotion never reuses it."""
        if info.epochs:
            key = _tp_name(tp)
            newest = info.epochs[-1].epoch
            if newest > self._state["leader_epochs"].get(key, -1):
                self._state["leader_epochs"][key] = newest
                self._save_state()

    def _align(self, tp: TopicPartition, p: Partition, info: PartitionInfo) -> int:
        """Make the local log a prefix of the leader's and its start no lower than
        the leader's; returns the log end offset."""
        epochs = self._epochs[tp]
        end = p.log_end_offset
        cut = divergence_offset(epochs, end, info.epochs, info.log_end_offset)
        if cut < end:
            log.warning("%s: %s: the log (end %d, latest epochs %s) diverges from the "
                        "leader's (end %d, latest epochs %s) at offset %d: truncating",
                        self.path, _tp_name(tp), end, epochs[-3:], info.log_end_offset,
                        list(info.epochs[-3:]), cut)
            if cut < p.log_start_offset:
                p.truncate_fully_and_start_at(max(cut, info.log_start_offset))
            else:
                p.truncate_to(cut)
            end = p.log_end_offset
            self._save_epochs(tp, p, truncate_from_end(epochs, end))
        if end < info.log_start_offset:
            log.warning("%s: %s: the log ends at %d, below the leader's log start %d: "
                        "starting over there", self.path, _tp_name(tp), end,
                        info.log_start_offset)
            p.truncate_fully_and_start_at(info.log_start_offset)
            end = p.log_end_offset
            self._save_epochs(tp, p, [])
        elif p.log_start_offset < info.log_start_offset:
            p.increase_log_start_offset(info.log_start_offset)
        return end

    def _restart_at(self, tp: TopicPartition, p: Partition, first: int, end: int) -> int:
        """The leader's batch holding offset `end` starts at `first` < `end`: this log
        ends inside one of the leader's batches (it began at a log start inside a batch,
        or holds other bytes). Start again at that batch."""
        if first > end:
            raise CorruptRecordError(f"{_tp_name(tp)}: the leader answered a fetch at "
                                     f"{end} with batches from {first}", expected=end,
                                     actual=first)
        if p.log_start_offset == end:             # nothing here yet: start at the batch
            p.truncate_fully_and_start_at(first)
        else:
            log.warning("%s: %s: the log ends at %d, inside the leader's batch at %d: "
                        "truncating to it", self.path, _tp_name(tp), end, first)
            p.truncate_to(first)
        new_end = p.log_end_offset
        if new_end != first:
            raise IllegalStateError(f"{_tp_name(tp)}: cannot line the log up with the "
                                    f"leader's batch at {first} (the log ends at "
                                    f"{new_end}); this directory holds another history")
        self._save_epochs(tp, p, truncate_from_end(self._epochs[tp], new_end))
        return new_end

    def _check_same_history(self, tp: TopicPartition, p: Partition) -> None:
        """Once per start: the last local batch must be the leader's batch at that
        offset, byte for byte (a directory copied from elsewhere, or a second leader
        that wrote in the same epoch, fails here rather than mixing histories)."""
        end = p.log_end_offset
        if end <= p.log_start_offset:
            return
        last = p.batch_headers(end - 1)
        if not last:
            return
        base = last[-1].base_offset
        mine = p.batches_since(base, upto=end, max_bytes=1)
        try:
            theirs = self.source.fetch(tp.topic, tp.partition, base, max_bytes=1)
        except OffsetOutOfRangeError:
            return                                # gone by retention there: nothing to compare
        if theirs[:len(mine)] != mine:
            raise IllegalStateError(
                f"{self.path}: {_tp_name(tp)} is not a copy of {self.source.describe()}: "
                f"the batch at offset {base} differs from the leader's (this directory "
                "holds another history; follow into an empty directory)")

    def _mirror_epochs(self, tp: TopicPartition, p: Partition, info: PartitionInfo,
                       end: int) -> None:
        """Keep the checkpoint equal to the leader's entries that start at or below
        `end` (the local log being a prefix of the leader's, they are its history)."""
        wanted = [e for e in info.epochs if e.start_offset <= end]
        if wanted != self._epochs.get(tp):
            self._save_epochs(tp, p, wanted)

    def _save_epochs(self, tp: TopicPartition, p: Partition,
                     entries: list[EpochEntry]) -> None:
        write_checkpoint(p.directory, entries)
        self._epochs[tp] = entries

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

    def _targets_by(self, deadline: float) -> dict[TopicPartition, int]:
        """The leader's log end offsets now; a source that fails is asked again after
        replica.fetch.backoff.ms until `deadline`."""
        backoff_s = self.config["replica.fetch.backoff.ms"] / 1000
        while True:
            try:
                with self._driver:
                    return {TopicPartition(name, n):
                            self.source.partition(name, n).log_end_offset
                            for name, info in self.source.topics().items()
                            for n in range(info.partitions)}
            except (LogkitError, OSError) as exc:
                if self._fatal(exc):
                    raise
                self._retrying(exc)
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._timeout({})
            time.sleep(min(backoff_s, left))

    def _reached(self, targets: Mapping[TopicPartition, int], asked: int) -> bool:
        return self._metadata_done >= asked and all(
            self._ends.get(tp, -1) >= end for tp, end in targets.items())

    def _wait_for(self, targets: Mapping[TopicPartition, int], asked: int,
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

    def _drive_to(self, targets: Mapping[TopicPartition, int], asked: int,
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

    def _wait_for_lease(self, deadline: float) -> None:
        """Return once the source shows a lease naming the leader (valid or expired:
        either way this follower sees it lapse); LogkitTimeoutError at `deadline`."""
        me = self._state.get("follower_id")
        while True:
            if self._error is not None:
                raise self._error
            try:
                with self._driver:
                    lease = self.source.lease()
                if lease is not None and lease.holder != me:
                    return
            except (LogkitError, OSError) as exc:
                self._retrying(exc)
            left = deadline - time.monotonic()
            if left <= 0:
                raise LogkitTimeoutError(
                    f"{self!r} caught up, but {self.source.describe()} shows no leader's "
                    "lease yet: a leader takes it once a follower has reported, from its "
                    "background chores (a Broker opened with background=False takes "
                    "none), and until then an automatic promotion could not tell a "
                    "stopped leader (Follower(..., auto_promote=False) does not wait)")
            if not self.running:
                raise IllegalStateError(f"{self!r} stopped while catching up")
            self._stopping.wait(min(left, self._lease_check_s))

    def _timeout(self, targets: Mapping[TopicPartition, int]) -> LogkitTimeoutError:
        behind = {_tp_name(tp): (self._ends.get(tp), end) for tp, end in targets.items()
                  if self._ends.get(tp, -1) < end}
        shown = ", ".join(f"{name} at {have} of {want}"
                          for name, (have, want) in sorted(behind.items())[:5])
        last = f"; last error: {self._last_error}" if self._last_error else ""
        if not targets:
            shown = "the leader's log end offsets could not be read"
        return LogkitTimeoutError(f"{self!r} did not catch up in time: "
                                  f"{shown or 'metadata not copied yet'}{last}")

    def promote(self, *, unclean: bool = False) -> None:
        """Make this directory the leader: stop following (a running follower stops
        first), take the leader's lease at the source by its conditional write, then in
        every partition stamp later appends with the next leader epoch — one above every
        epoch it holds or has seen from the leader — and write `(that epoch, log end)`
        to its leader-epoch-checkpoint, and hold the lease of this root. `Broker(path)`
        then opens it as the leader.

        Raises NotLeaderError, changing nothing, while another replica's lease is valid
        (of two racing promotions, one wins), or when the source cannot be reached to
        take the lease: `unclean=True` promotes anyway (like Kafka's
        `unclean.leader.election.enable`: an old leader that is still alive is then not
        fenced). A source that keeps no lease promotes unfenced. Takes the directory's
        follower lock (IllegalStateError while another Follower holds it)."""
        self.stop()
        with self._driver:
            self._promote_locked(unclean=unclean)
        self._lead_listener()

    def _promote_locked(self, *, unclean: bool) -> None:
        self._open()
        try:
            broker = self._require_broker()
            seen = self._state["leader_epochs"]
            plan = []
            for name in broker.topics():
                for p in broker.topic(name).partitions:
                    entries = self._load_epochs(p)
                    newest = max([e.epoch for e in entries]
                                 + [p.leader_epoch,
                                    seen.get(_tp_name(p.topic_partition), -1)])
                    plan.append((p, entries, newest + 1))
            own = read_lease(self.path)
            lease_epoch = self._take_lease(
                max([epoch for _, _, epoch in plan] + [own.epoch + 1 if own else 1]),
                unclean)
            for p, entries, epoch in plan:
                p.set_leader_epoch(epoch)        # first: a kill leaves no
                write_checkpoint(p.directory,    # entry the log does not use
                                 assign(entries, epoch, p.log_end_offset))
                log.info("%s: %s promoted: leader epoch %d from offset %d",
                         self.path, _tp_name(p.topic_partition), epoch, p.log_end_offset)
            renew_lease(self.path, self._state["follower_id"], lease_epoch,
                        ttl_ms=self.config["broker.session.timeout.ms"])
            # Kafka clients keep knowing each topic by the id the old leader gave it
            wire = self._state.get("wire_ids", {})
            self._state["wire_topic_ids"] = {
                broker.topic(name).topic_id: wire[name]
                for name in broker.topics() if name in wire}
            self._state["role"] = "leader"
            self._save_state()
        finally:
            self._close()

    def _take_lease(self, min_epoch: int, unclean: bool) -> int:
        """The source's lease for this replica; returns the lease epoch."""
        me = self._state["follower_id"]
        try:
            taken = self.source.take_lease(
                me, ttl_ms=self.config["broker.session.timeout.ms"], min_epoch=min_epoch)
        except NotLeaderError:
            raise
        except (LogkitError, OSError) as exc:
            if not unclean:
                raise NotLeaderError(
                    f"{self.path}: cannot take the leader's lease at "
                    f"{self.source.describe()} ({exc}); with the old leader's side out "
                    "of reach a promotion may leave two leaders: promote(unclean=True) "
                    "(`logkit promote --unclean`) takes over anyway") from exc
            log.warning("%s: unclean promotion: the lease at %s cannot be taken (%s); "
                        "the old leader is not fenced", self.path, self.source.describe(),
                        exc)
            return min_epoch
        if taken is None:
            log.info("%s: %s keeps no lease: promoting without fencing the old leader",
                     self.path, self.source.describe())
            return min_epoch
        return taken.epoch
