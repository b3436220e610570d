"""One consumer's membership of its group (Kafka's `ConsumerCoordinator`).

Owns: joining, re-joining after an eviction, and leaving the group; the heartbeat
thread; learning a new generation on poll (revoke, release, acquire in the group
record) and calling the rebalance listeners (`on_revoke`, `on_assign`); commits —
explicit ones, auto-commit every `auto_commit_interval_ms`, and the commit of revoked
partitions during a rebalance. The group record itself (members, generations,
assignments, committed offsets in LMDB) is group.py's `GroupCoordinator`, used here
as `self.group`; what the consumer reads (assignment, owned partitions, positions) is
the `SubscriptionState` it shares with the consumer (logkit/subscription.py).

Invariant: this member fetches only partitions it holds in the group record — a
partition enters `subscriptions.owned` only once `group.acquire` granted it and leaves
it before (or as) `group.release` gives it up; a commit is refused
(`CommitFailedError`) once the member is fenced, and never re-joins to succeed.

Rebalance listeners: an exception from `on_revoke` / `on_assign` does not stop the
rebalance — revoked partitions are still committed (auto-commit), released and no longer
fetched, new ones still acquired — and is raised from that `poll()` afterwards.

Errors that are not raised: auto-commits are best effort, as Kafka's are — a refused one
(fenced, busy group) is logged at INFO/DEBUG, a failed one at WARNING; a heartbeat that
fails with a `LogkitError` is logged and retried next interval (the next poll sees an
eviction); any other error in the heartbeat thread is logged and ends the thread.

Thread-safety: the consumer's thread calls every method (under the consumer's lock);
the heartbeat thread only reads `member_id` and sets `fenced`. `closed` is set by
`Consumer.close()` from any thread, before anything else.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from ._threads import start_thread
from .errors import ClosedError, CommitFailedError, LogkitError
from .group import GroupCoordinator, OffsetAndMetadata, committed_offset
from .subscription import SubscriptionState
from .topic import TopicPartition

__all__ = ["ConsumerCoordinator"]

log = logging.getLogger(__name__)

# A member reads its group's generation from LMDB on a poll only when the doorbell's
# rebalance or metadata counter moved since its last read, or this long passed (a hint
# can be missed: a process killed between its commit and its bump).
GENERATION_RECHECK_S = 0.05


class ConsumerCoordinator:
    """The group side of one `Consumer` with a `group_id`."""

    def __init__(self, broker: Any, group_id: str, subscriptions: SubscriptionState, *,
                 strategy: str, session_timeout_ms: int, max_poll_interval_ms: int,
                 heartbeat_interval_ms: int, client_id: str,
                 enable_auto_commit: bool, auto_commit_interval_ms: int,
                 on_assign: Callable | None, on_revoke: Callable | None) -> None:
        self.broker = broker
        self.group_id = group_id
        self.subscriptions = subscriptions
        self.group = GroupCoordinator(
            broker, group_id, strategy=strategy, session_timeout_ms=session_timeout_ms,
            max_poll_interval_ms=max_poll_interval_ms, client_id=client_id)
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.auto_commit = enable_auto_commit
        self.auto_commit_interval_s = auto_commit_interval_ms / 1000
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self.generation = -1
        self.fenced = False              # evicted (seen by the heartbeat): re-join on poll
        self.closed = False
        self.last_poll_ms = int(time.time() * 1000)
        # The doorbell counters (see _changes) at the last complete sync, and when the
        # generation must be read again whatever they say.
        self._synced_changes: int | None = None
        self._recheck_at = 0.0
        self.last_commit = time.monotonic()
        self.listener_errors: list[BaseException] = []
        self.heartbeat_stop = threading.Event()
        self.heartbeat: threading.Thread | None = None

    @property
    def member_id(self) -> str | None:
        """This member's id in the group record, None when not a member."""
        return self.group.member_id

    # ---- membership ------------------------------------------------------------------

    def subscribe(self, was_subscribed: bool) -> None:
        """The subscription changed: tell the group (a member) or join it."""
        if was_subscribed and self.group.member_id is not None:
            self.group.update_subscription(self.subscriptions.topics)
        else:
            self.group.join(self.subscriptions.topics)
            try:
                self._start_heartbeat()
            except LogkitError:
                self.group.leave()         # no member without its heartbeat
                raise

    def leave(self, *, autocommit: bool) -> None:
        """Commit the owned positions (if auto-commit and asked) and leave the group."""
        if self.group.member_id is not None:
            if autocommit and self.auto_commit:
                self.commit_quietly(set(self.subscriptions.owned))
            self.group.leave()

    def _start_heartbeat(self) -> None:
        if self.heartbeat is None:
            heartbeat = threading.Thread(target=self._run_heartbeat,
                                         name="logkit-heartbeat", daemon=True)
            start_thread(heartbeat, "the consumer's heartbeat thread")
            self.heartbeat = heartbeat

    def _run_heartbeat(self) -> None:
        interval = self.heartbeat_interval_ms / 1000
        group = self.group
        while not self.heartbeat_stop.wait(interval):
            if group.member_id is None:
                continue
            try:
                if not group.heartbeat(self.last_poll_ms):
                    self.fenced = True
            except Exception as exc:
                if self.heartbeat_stop.is_set() or self.closed or self.broker.closed:
                    return               # closing under us: nothing to report
                if not isinstance(exc, LogkitError):   # a bug: said, and the thread ends
                    log.exception("the heartbeat thread of group %r stops", self.group_id)
                    raise
                # a store error: retried next interval; eviction shows on the next poll
                log.warning("heartbeat of %s in group %r failed (retried in %d ms): %s",
                            group.member_id, self.group_id, self.heartbeat_interval_ms,
                            exc)

    def stop_heartbeat(self) -> None:
        self.heartbeat_stop.set()

    def join_heartbeat(self) -> None:
        """Wait (bounded) for the heartbeat thread to end, unless it is this thread."""
        if self.heartbeat is not None and self.heartbeat is not threading.current_thread():
            self.heartbeat.join(timeout=10)

    # ---- rebalance -------------------------------------------------------------------

    def _changes(self) -> int | None:
        """The doorbell's rebalance and metadata counters as one number (None without
        a doorbell: a read-only broker, where every sync reads the generation)."""
        doorbell = self.broker.doorbell
        if doorbell is None:
            return None
        return doorbell.groups_version() << 32 | doorbell.metadata_version()

    def sync(self) -> None:
        """Learn a new generation: revoke, release, acquire, call back (on poll).

        The steady state costs no LMDB read: when nothing is pending (every assigned
        partition owned, not fenced) and the doorbell's counters have not moved since
        the last complete sync, the generation cannot have changed through any
        committed rebalance — apart from a missed hint, which the re-read every
        GENERATION_RECHECK_S catches."""
        subscriptions, group = self.subscriptions, self.group
        if not subscriptions.topics:
            return
        changes = self._changes()          # read before the generation, never after
        if changes is not None and changes == self._synced_changes and not self.fenced \
                and group.member_id is not None \
                and len(subscriptions.owned) == len(subscriptions.assigned) \
                and time.monotonic() < self._recheck_at:
            return
        self._sync()
        self._synced_changes = changes
        self._recheck_at = time.monotonic() + GENERATION_RECHECK_S

    def _sync(self) -> None:
        subscriptions, group = self.subscriptions, self.group
        if self.fenced or group.member_id is None:
            # Evicted (session or poll timeout): our partitions may belong to others now.
            lost = subscriptions.lose_all()
            if lost and self.on_revoke is not None:
                self._call_listener(self.on_revoke, lost)
            self.fenced = False
            if self.closed:                    # closed from a listener: no re-join
                raise ClosedError("consumer is closed")
            group.join(subscriptions.topics)
        generation = group.generation()
        if generation != self.generation:
            state = group.state()
            if group.member_id not in state["members"]:
                self.fenced = True             # evicted: rejoin on this same sync
                return self._sync()
            self.generation = state["generation"]
            new = group.assignment(state)
            owned, assigned = subscriptions.owned, subscriptions.assigned
            eager = group.is_eager(state)
            revoked = set(owned) if eager else owned - new
            revoked |= assigned - new - owned
            if revoked:
                if self.on_revoke is not None:
                    self._call_listener(self.on_revoke, revoked)
                if self.auto_commit:
                    self.commit_quietly(revoked & subscriptions.owned)
                group.release(revoked & subscriptions.owned)
                subscriptions.revoke(revoked)
            added = new if eager else new - subscriptions.assigned
            subscriptions.set_assignment(new, owned=False)
            if added and self.on_assign is not None:
                self._call_listener(self.on_assign, added)
        pending = subscriptions.assigned - subscriptions.owned
        if pending:
            subscriptions.acquired(group.acquire(pending))

    def _call_listener(self, listener: Callable, tps: set[TopicPartition]) -> None:
        """Run a rebalance listener; its exception is kept for poll() to raise once the
        rebalance is complete (released, acquired), not raised in the middle of it."""
        try:
            listener(sorted(tps))
        except Exception as exc:
            self.listener_errors.append(exc)

    def raise_listener_error(self) -> None:
        errors, self.listener_errors = self.listener_errors, []
        if errors:
            raise errors[0]

    # ---- commits ---------------------------------------------------------------------

    def committed(self, tp: TopicPartition) -> int | None:
        return committed_offset(self.broker.meta, self.group_id, tp)

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        """Store `offsets` in the group record. A subscribed member commits as itself
        (CommitFailedError once fenced; no re-join here: a zombie's commit must fail,
        not succeed under a fresh membership — the next poll re-joins); a consumer with
        a manual assignment commits to an empty group."""
        manual = self.subscriptions.manual
        member = None if manual else self.group.member_id
        if not manual and member is None:
            raise CommitFailedError("this consumer is not a member of its group")
        self.group.commit(offsets, member_id=member)
        self.last_commit = time.monotonic()

    def commit_quietly(self, tps: set[TopicPartition]) -> None:
        """Best effort (auto-commit): commit the positions of `tps` as this member; a
        refusal is logged at INFO, a failure at WARNING."""
        positions = self.subscriptions.positions
        offsets = {tp: OffsetAndMetadata(positions[tp]) for tp in tps   # type: ignore
                   if positions.get(tp) is not None}
        if offsets:
            try:
                self.group.commit(offsets, member_id=self.group.member_id)
            except CommitFailedError as exc:   # fenced meanwhile: the next owner resumes
                log.info("auto-commit in group %r refused: %s", self.group_id, exc)
            except LogkitError as exc:         # best effort, as Kafka's auto-commit is
                log.warning("auto-commit in group %r failed: %s", self.group_id, exc)

    def maybe_auto_commit(self) -> None:
        """Auto-commit the owned positions if `auto_commit_interval_ms` has passed."""
        if not self.auto_commit or \
                time.monotonic() - self.last_commit < self.auto_commit_interval_s:
            return
        self.last_commit = time.monotonic()
        if not self.subscriptions.manual:
            self.commit_quietly(set(self.subscriptions.owned))
            return
        try:
            self.commit({tp: OffsetAndMetadata(offset) for tp, offset
                         in self.subscriptions.committable().items()})
        except CommitFailedError as exc:       # a busy group: try next interval
            log.debug("auto-commit in group %r refused: %s", self.group_id, exc)
        except LogkitError as exc:             # best effort, as Kafka's auto-commit is
            log.warning("auto-commit in group %r failed: %s", self.group_id, exc)
