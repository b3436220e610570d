"""The follower's part in leader election: noticing an expired lease, its rank in the
leader's ISR, and promotion (`Follower.promote()`, and the automatic one).

Owns: reading the leader's lease through the source and deciding whether this follower
may take over (an assigned replica caught up within `replica.lag.time.max.ms`, the
first in assignment order first; through a source whose ISR it cannot read, the same
rule over its own progress), taking the lease by a conditional write at the source
(lease.py: of two racing promotions one wins), and stamping the next leader epoch in
every partition's `leader-epoch-checkpoint`. Invariant: a follower writes as leader
only after it holds the lease in a newer epoch than the one it followed.

A mixin of `Follower` (follower.py), which owns the state it reads and writes; only
Follower's own methods call these.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..errors import IllegalStateError, LogkitError, LogkitTimeoutError, NotLeaderError
from ..topic import TopicPartition
from .directory import DirectorySource
from ..leader.epochs import assign, write_checkpoint
from ..leader.replicas import ReplicaState, _Report, in_sync_replicas
from ..leader.lease import read_lease
from ..leader.lease import renew as renew_lease
from .partition_copy import _tp_name

log = logging.getLogger("logkit.replication.follower")

class _Election:
    """Leader election for `Follower` (see the module docstring)."""

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
