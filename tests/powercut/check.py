"""The promise after a power cut, checked on one materialised directory.

Owns `durable_entries` (which acknowledgements a cut must keep) and `check` (the crash
checker of tests/crashpoints/check.py on those, plus what only a power cut can break).
Phase 1 opens the directory and checks it; then every partition is rolled and gets a
probe record, in a new Broker (a roll seals the active segment up to its size, which
exposes bytes that were never acknowledged), and phase 1 runs again.

Durable, and so checked to be present: a record acknowledged by a `flush.messages=1`
topic (`t` in the `flush1` workload); every record acknowledged before a
`broker.flush()` started, once it returned (`syncing`, then `synced`), or before a
`close()` started, once it returned (the main close; the second writer's `closing`,
then `closed`, for the partitions of `t` it appended to); every
record of a partition below the base in a `rolled` entry (a roll synced it); group
commits (an LMDB commit, synced before it returns); created and deleted topics
(`create_topic` ends with a syncfs; a deletion is durable once it returned); a
transaction whose `commit_transaction()` or `abort_transaction()` returned (the
embedded producer: the coordinator syncs every partition it wrote a marker to before
`Complete*`, docs/powercut.md), checked by tests/crashpoints/transactions.py's
`check_transactions` (all or nothing under read_committed, offsets with the records).
Anything else may be lost, but never corrupted or reordered.

Failure classes: `lost` (a durable acknowledgement is missing), `integrity` (any other
disagreement of the crash checker: a check() failure, a wrong record, a deleted topic
back), `foreign` (a record no one wrote at that offset, or stored twice),
`commit-past-end` (a group's committed offset past the partition's log end),
`hanging` (a partition holds an open transaction of a producer the coordinator has no
`Ongoing` transaction for, once the open finished the prepared ones: nothing will ever
write its marker, and the last stable offset stays below it),
`reopen-error` and `wedge` (the directory does not open without repair).
"""

from __future__ import annotations

import os
import re

import logkit
from tests.crashpoints import check as cp
from tests.crashpoints import compaction, transactions
from tests.crashpoints.workload import GROUP

CLASSES = ("lost", "integrity", "foreign", "commit-past-end", "hanging", "reopen-error",
           "wedge")
_TAG = re.compile(rb"^((main|ret|tmp\d+|w2|src):\d+|tx\d+:\d+:\d+)$")
_LOST = ("topic missing", "is gone", "acknowledged offset", "was acknowledged",
         "committed (acknowledged) but",
         "(acknowledged), now")


def durable_entries(acks: list[dict], variant: str) -> list[dict]:
    """The acknowledgements a power cut must not take back, in ledger order. A sync
    covers what was acknowledged before it started (its `syncing`/`closing` entry):
    another process's appends acknowledged while it ran may be after it."""
    out, unsynced = [], []
    covering: dict[str, list[dict]] = {}       # a sync under way -> what it covers
    for e in acks:
        kind, who = e["kind"], e.get("who", "main")
        if kind == "record":
            if variant == "flush1" and e["topic"] == "t":
                out.append(e)
            else:
                unsynced.append(e)
        elif kind in ("syncing", "closing"):
            # the second writer's close syncs the partitions it appended to: t's
            covering[who] = [u for u in unsynced if who == "main" or u["topic"] == "t"]
        elif kind == "synced" or (kind == "closed" and who == "writer2"):
            done = covering.pop(who, [])
            out.extend(done)
            unsynced = [u for u in unsynced if u not in done]
        elif kind == "closed":                 # the main close, after the writer exited
            out.extend(unsynced)
            unsynced = []
        elif kind == "rolled":
            below = [u for u in unsynced if (u["topic"], u["partition"]) == (
                e["topic"], e["partition"]) and u["offset"] < e["below"]]
            out.extend(below)
            unsynced = [u for u in unsynced if u not in below]
        else:
            out.append(e)
    return out


class PowerCutChecker(cp.Checker):
    """The crash checker on the durable entries, plus the power-cut checks."""

    foreign_class = "foreign"     # the class compaction's checker gives a foreign record

    def __init__(self, root: str, durable: list[dict], written: list[dict]) -> None:
        self.root = root
        self.entries = durable
        self.failures = []
        self.phase = "reopen"
        # every value acknowledged at each offset over the whole run (the workload is
        # deterministic: a record that survives holds the value the run gave it)
        self.values: dict[tuple[str, int, int], set[bytes]] = {}
        for e in written:
            if e["kind"] == "record" and e["value"] is not None:     # not a tombstone
                self.values.setdefault((e["topic"], e["partition"], e["offset"]),
                                       set()).add(e["value"].encode())

    def fail(self, cls: str, detail: str) -> None:
        if cls == "integrity" and any(word in detail for word in _LOST):
            cls = "lost"
        super().fail(cls, detail)

    def check_all(self, broker, probes) -> None:
        super().check_all(broker, probes)
        ends = {}
        for name in sorted(broker.topics()):
            try:
                topic = broker.topic(name)
            except logkit.UnknownTopicError:
                continue
            except BaseException:            # noqa: BLE001 — the crash checker reported
                continue
            for p in topic.partitions:
                where = f"{name}-{p.partition}"
                if name == compaction.TOPIC:     # gaps and tombstones: compaction.py checks
                    ends[(name, p.partition)] = p.log_end_offset
                    continue
                try:
                    ends[(name, p.partition)] = p.log_end_offset
                    seen: dict[bytes, int] = {}
                    for r in cp.records_of(p):
                        if r.value == b"probe" and probes:
                            continue
                        tag = cp.tag_of(r.value)
                        if tag.startswith(b"tx"):     # tx3:1:0, one record each
                            tag = transactions.tag3(r.value).encode()
                        known = self.values.get((name, p.partition, r.offset))
                        if not _TAG.match(tag) or (known is not None and tag not in known
                                                   and name != "tmp"):
                            self.fail("foreign", f"{where}: offset {r.offset} holds "
                                      f"{tag[:40]!r}, written there: {sorted(known or ())}")
                            break
                        if tag in seen:
                            self.fail("foreign", f"{where}: {tag!r} at {seen[tag]} and "
                                      f"again at {r.offset}")
                            break
                        seen[tag] = r.offset
                except BaseException as exc:  # noqa: BLE001
                    self.fail("integrity", f"{where}: read: {cp.describe(exc)}")
        self.check_hanging(broker)
        for group in (GROUP, transactions.GROUP):
            try:
                committed = broker.group(group).committed()
            except BaseException:            # noqa: BLE001 — the crash checker reported
                continue
            for tp, offset in sorted(committed.items()):
                offset = getattr(offset, "offset", offset)
                end = ends.get((tp.topic, tp.partition))
                if end is not None and offset is not None and offset > end:
                    self.fail("commit-past-end", f"group {group}: {tp.topic}-"
                              f"{tp.partition} committed {offset}, log end {end}")

    def check_hanging(self, broker) -> None:
        """No partition holds an open transaction the coordinator does not hold open:
        the open has run complete_prepared, so nothing would write its marker."""
        try:
            coordinator = broker.transaction_coordinator
            ongoing = {t.producer_id for t in coordinator.list_transactions(
                states=["Ongoing"])}
            for name in sorted(broker.topics()):
                for p in broker.topic(name).partitions:
                    for pid, first in sorted(p.open_transactions().items()):
                        if pid not in ongoing:
                            self.fail("hanging", f"{name}-{p.partition}: producer {pid}'s "
                                      f"transaction open from {first}, the coordinator "
                                      f"holds none (last stable offset "
                                      f"{p.last_stable_offset}, high watermark "
                                      f"{p.high_watermark})")
        except BaseException as exc:          # noqa: BLE001
            self.fail("integrity", f"open transactions: {cp.describe(exc)}")


def check(root: str, durable: list[dict], written: list[dict]) -> list[dict]:
    """Every failure of the promise on the directory `root` (changed: rolled, probed)."""
    checker = PowerCutChecker(root, durable, written)
    checker.run()
    if not any(f["class"] in ("reopen-error", "wedge") for f in checker.failures):
        rolled = cp.roll_everything(root)
        checker.failures.extend(rolled["failures"])
        checker.phase = "after-roll"
        checker.run(probes=rolled["probes"])
    return checker.failures


def main(argv: list[str]) -> int:          # pragma: no cover — a debugging aid
    import json
    import sys
    root, ledger, variant = argv
    entries = cp.read_ledgers(ledger)
    json.dump(check(os.path.abspath(root), durable_entries(entries, variant), entries),
              sys.stdout)
    return 0
