"""The checker: `python -m tests.crashpoints.check ROOT LEDGER` (in a fresh process).

Phase 1 reopens ROOT and compares it with every ledger (LEDGER and LEDGER.2): each
acknowledged record exactly once at its offset with its key and value, offsets dense
(`Partition.check()`), a deleted topic not back with its records, group commits kept.
Phase 2 forces a roll on every partition, and appends one probe record to each, from
another fresh process (`--roll`), then phase 1 runs again and the probes are looked
for: a roll seals the active segment up to its file size, which is what exposes bytes
that were never acknowledged sealed into a segment.

Prints one JSON object: {"failures": [{"class": ..., "phase": ..., "detail": ...}]}.
Classes: "reopen-error" (opening raised), "wedge" (the LMDB store panicked or is
unusable), "integrity" (anything the ledger disagrees with).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import traceback

import logkit
from logkit.errors import MetadataStoreError
from logkit.topic import TopicPartition

from . import compaction, transactions
from .workload import GROUP, TEMP_TOPIC

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_ledgers(ledger: str) -> list[dict]:
    entries = []
    for path in sorted(glob.glob(ledger) + glob.glob(ledger + ".2")):
        with open(path, "rb") as f:
            for line in f:
                if line.endswith(b"\n"):          # a line cut by a kill was not acked
                    entries.append(json.loads(line))
    return entries


def tag_of(value: bytes | None) -> bytes:
    """`main:17` for a workload value (`main:17:<filler>`)."""
    return b":".join((value or b"").split(b":", 2)[:2])


def classify_open_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__} {exc} {exc.__cause__!r}"
    if isinstance(exc, MetadataStoreError) or "PanicError" in text or "lmdb" in text.lower():
        return "wedge"
    return "reopen-error"


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:400] + " | " + \
        traceback.format_exc().strip().splitlines()[-3][:200]



def records_of(partition):
    """Every record of a partition from its log start to its end, read in batches."""
    offset, end = partition.log_start_offset, partition.log_end_offset
    while offset < end:
        batch = partition.read(offset)
        if not batch:
            return
        yield from batch
        offset = batch[-1].offset + 1

class Checker:
    def __init__(self, root: str, ledger: str) -> None:
        self.root = root
        self.entries = read_ledgers(ledger)
        self.failures: list[dict] = []
        self.phase = "reopen"

    def fail(self, cls: str, detail: str) -> None:
        self.failures.append({"class": cls, "phase": self.phase, "detail": detail[:600]})

    # ---- phase 1 ---------------------------------------------------------------------

    def run(self, probes: dict | None = None) -> None:
        try:
            broker = logkit.Broker(self.root, background=False)
        except BaseException as exc:         # noqa: BLE001
            self.fail(classify_open_error(exc), "open: " + describe(exc))
            return
        try:
            self.check_all(broker, probes)
        finally:
            try:
                broker.close()
            except BaseException as exc:     # noqa: BLE001
                self.fail("reopen-error", "close after check: " + describe(exc))

    def check_all(self, broker, probes: dict | None) -> None:
        try:
            names = set(broker.topics())
        except BaseException as exc:         # noqa: BLE001
            self.fail(classify_open_error(exc), "topics(): " + describe(exc))
            return
        for name in sorted(names):
            try:
                broker.topic(name)
            except logkit.UnknownTopicError as exc:
                # listed, yet gone: a half-deleted topic (issue 36), whether or not
                # a deletion was started — the first open must finish it
                names.discard(name)
                self.fail("integrity", f"topic {name!r} is listed but opening it "
                          f"says: {exc}")
            except BaseException:            # noqa: BLE001 — reported below
                pass
        records: dict[tuple[str, int], list[dict]] = {}
        temp_events = []
        commits: dict[tuple[str, int], int] = {}
        created = set()
        for e in self.entries:
            if e["kind"] == "record":
                records.setdefault((e["topic"], e["partition"]), []).append(e)
            elif e["kind"] == "created":
                created.add(e["topic"])
            if e.get("topic") == TEMP_TOPIC and e["kind"] in ("created", "deleting",
                                                               "deleted", "record"):
                temp_events.append(e)
            if e["kind"] == "commit":
                key = (e["topic"], e["partition"])
                commits[key] = max(commits.get(key, -1), e["offset"])
        for name in created:
            if name != TEMP_TOPIC and name not in names:
                self.fail("integrity", f"topic {name!r} was created (acknowledged) "
                          f"but is gone; topics now {sorted(names)}")
        # the temp topic: which incarnation may exist, which records must not
        # dead: its delete returned, or a later incarnation's create returned (which
        # it cannot before the old one is gone, whatever the delete call said)
        created_inc = {e["incarnation"] for e in temp_events if e["kind"] == "created"}
        deleted_incarnations = {e["incarnation"] for e in temp_events
                                if e["kind"] == "deleted"} | {
            i for i in created_inc if any(j > i for j in created_inc)}
        # a deletion that started but did not return may have finished since
        deleting = {e["incarnation"] for e in temp_events if e["kind"] == "deleting"}
        stale_values = {e["value"] for e in temp_events if e["kind"] == "record"
                        and e["value"].startswith(tuple(f"tmp{i}:" for i in
                                                        deleted_incarnations))}
        maybe_gone = {e["value"] for e in temp_events if e["kind"] == "record"
                      and e["value"].startswith(tuple(f"tmp{i}:" for i in deleting))}
        for (topic, partition), expected in sorted(records.items()):
            if topic == TEMP_TOPIC:
                expected = [e for e in expected if e["value"] not in stale_values]
                if topic in names and expected and all(
                        e["value"] in maybe_gone for e in expected):
                    # gone and (in progress) re-created, or still there: all or none
                    if not self.holds_any(broker, topic, expected):
                        continue
                elif topic not in names and all(e["value"] in maybe_gone
                                                for e in expected):
                    continue
            if topic not in names:
                if expected:
                    self.fail("integrity", f"{topic}-{partition}: topic missing with "
                              f"{len(expected)} acknowledged records")
                continue
            self.check_partition(broker, topic, partition, expected)
        if TEMP_TOPIC in names:
            self.check_no_stale(broker, stale_values)
        for name in sorted(names):
            try:
                topic = broker.topic(name)
                for p in topic.partitions:
                    p.check()
            except BaseException as exc:     # noqa: BLE001
                self.fail("integrity", f"{name}: check(): {describe(exc)}")
        self.check_commits(broker, commits, names)
        if probes:
            self.check_probes(broker, probes)
        transactions.check_transactions(self, broker)    # the txn workload's, if it ran

    def check_partition(self, broker, topic: str, partition: int,
                        expected: list[dict]) -> None:
        if topic == compaction.TOPIC:        # the clean workload's: compaction.py's rules
            compaction.check_compacted(self, broker, partition, expected)
            return
        where = f"{topic}-{partition}"
        try:
            p = broker.topic(topic).partition(partition)
            start, end = p.log_start_offset, p.log_end_offset
        except BaseException as exc:         # noqa: BLE001
            self.fail("integrity", f"{where}: open: {describe(exc)}")
            return
        by_offset: dict[int, dict] = {}
        for e in expected:
            if e["offset"] in by_offset and by_offset[e["offset"]]["value"] != e["value"]:
                self.fail("integrity", f"{where}: offset {e['offset']} acknowledged twice: "
                          f"{by_offset[e['offset']]['value']} and {e['value']}")
            by_offset[e["offset"]] = e
        wanted = sorted(o for o in by_offset if o >= start)   # retention may delete
        if wanted and wanted[-1] >= end:
            self.fail("integrity", f"{where}: log end {end} but offset {wanted[-1]} "
                      "was acknowledged")
        seen: dict[int, tuple] = {}
        offset = max(start, wanted[0]) if wanted else end
        try:
            while offset < end:
                batch = p.read(offset, max_records=500)
                if not batch:
                    break
                for r in batch:
                    seen[r.offset] = (r.key, r.value)
                offset = batch[-1].offset + 1
        except BaseException as exc:         # noqa: BLE001
            self.fail("integrity", f"{where}: read at {offset}: {describe(exc)}")
        values_at: dict[bytes, list[int]] = {}
        for o, (_, v) in seen.items():
            values_at.setdefault(tag_of(v), []).append(o)
        for o in wanted:
            e = by_offset[o]
            got = seen.get(o)
            if got is None:
                self.fail("integrity", f"{where}: acknowledged offset {o} "
                          f"({e['value']}) missing (log {start}..{end})")
                continue
            key, value = got
            if key != e["key"].encode() or not value.startswith(e["value"].encode() + b":"):
                self.fail("integrity", f"{where}: offset {o}: expected {e['key']}="
                          f"{e['value']}, found {key!r}={value[:24]!r}")
            dup = values_at.get(e["value"].encode(), [])
            if len(dup) > 1:
                self.fail("integrity", f"{where}: {e['value']} stored {len(dup)} times "
                          f"at {sorted(dup)}")

    def holds_any(self, broker, topic: str, expected: list[dict]) -> bool:
        """Whether partition 0 of `topic` holds any of the expected values."""
        wanted = {e["value"].encode() for e in expected}
        try:
            return any(tag_of(r.value) in wanted
                       for r in records_of(broker.topic(topic).partition(0)))
        except BaseException:                # noqa: BLE001 — check_partition reports
            return True
        return False

    def check_no_stale(self, broker, stale_values: set[str]) -> None:
        try:
            for r in records_of(broker.topic(TEMP_TOPIC).partition(0)):
                tag = tag_of(r.value).decode()
                if tag in stale_values:
                    self.fail("integrity", f"{TEMP_TOPIC}: record {tag} of a deleted "
                              f"incarnation is back at offset {r.offset}")
                    return
        except BaseException as exc:         # noqa: BLE001
            self.fail("integrity", f"{TEMP_TOPIC}: read: {describe(exc)}")

    def check_commits(self, broker, commits: dict, names: set[str]) -> None:
        try:
            group = broker.group(GROUP)
            committed = group.committed()
        except BaseException as exc:         # noqa: BLE001
            self.fail(classify_open_error(exc) if "lmdb" in repr(exc).lower()
                      else "integrity", f"group committed(): {describe(exc)}")
            return
        for (topic, partition), offset in commits.items():
            got = committed.get(TopicPartition(topic, partition))
            if got is None or got < offset:
                self.fail("integrity", f"group {GROUP}: {topic}-{partition} committed "
                          f"{offset} (acknowledged), now {got}")

    def check_probes(self, broker, probes: dict) -> None:
        for key, offset in probes.items():
            topic, partition = key.rsplit("-", 1)
            try:
                records = broker.topic(topic).partition(int(partition)).read(offset, 1)
            except BaseException as exc:     # noqa: BLE001
                self.fail("integrity", f"{key}: probe at {offset}: {describe(exc)}")
                continue
            if not records or records[0].offset != offset or records[0].value != b"probe":
                self.fail("integrity", f"{key}: probe appended at {offset} not read back "
                          f"({records[:1]})")


def roll_everything(root: str) -> dict:
    """In a fresh process: roll every partition and append one probe record to each.
    Returns {"topic-partition": probe offset}; errors are reported as failures."""
    out: dict = {"probes": {}, "failures": []}
    try:
        broker = logkit.Broker(root, background=False)
    except BaseException as exc:             # noqa: BLE001
        out["failures"].append({"class": classify_open_error(exc), "phase": "roll",
                                "detail": "open: " + describe(exc)})
        return out
    try:
        for name in broker.topics():
            try:
                topic = broker.topic(name)
            except logkit.UnknownTopicError:
                continue
            for p in topic.partitions:
                try:
                    p._log.roll()
                    out["probes"][f"{name}-{p.partition}"] = p.append(
                        [(b"probe", b"probe", None, None)])
                except BaseException as exc:     # noqa: BLE001
                    out["failures"].append({"class": "integrity", "phase": "roll",
                                            "detail": f"{name}-{p.partition}: roll/probe:"
                                            f" {describe(exc)}"})
    finally:
        try:
            broker.close()
        except BaseException as exc:         # noqa: BLE001
            out["failures"].append({"class": "integrity", "phase": "roll",
                                    "detail": "close: " + describe(exc)})
    return out


def main(argv: list[str]) -> int:
    if argv[0] == "--roll":
        print(json.dumps(roll_everything(argv[1])))
        return 0
    root, ledger = argv
    checker = Checker(root, ledger)
    checker.run()
    if not any(f["class"] in ("reopen-error", "wedge") for f in checker.failures):
        env = dict(os.environ, PYTHONPATH=ROOT_DIR)
        proc = subprocess.run([sys.executable, "-m", "tests.crashpoints.check", "--roll",
                               root], capture_output=True, text=True, env=env, timeout=120)
        try:
            rolled = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            rolled = {"probes": {}, "failures": [{"class": "integrity", "phase": "roll",
                                                  "detail": "roll process: "
                                                  + proc.stderr[-500:]}]}
        checker.failures.extend(rolled["failures"])
        checker.phase = "after-roll"
        checker.run(probes=rolled["probes"])
    print(json.dumps({"failures": checker.failures, "acked": len(checker.entries)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
