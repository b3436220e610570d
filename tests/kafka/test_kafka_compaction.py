"""Issue 32, Kafka as the oracle of log compaction: the same keyed input — keys written
again and again, tombstones, empty values, headers, a whole segment that later records
overwrite — goes into a compacted topic on the real Kafka and into one on logkit (through
its listener, by the same confluent-kafka code), in the same segments. Kafka's cleaner
runs in the broker (its backoff lowered for the test, its dirty ratio 0.01); logkit's is
one `p.compact()`. In two rounds (the second on top of the cleaned first: keys of the
clean part written again, a segment that empties whole), below the active segment both
keep the same surviving (offset, key, value, headers, timestamp) records, each key's
latest, and tombstones are stamped by the first pass that sees them and removed by
the next (`delete.retention.ms` 0, KIP-534's delete horizon). Then Kafka's own
DumpLogSegments reads logkit's cleaned segments: every batch valid and walked to the
file's end, each segment ending where the next begins, each tombstone's batch carrying
the delete horizon the pass stamped, the records it prints the ones logkit reads,
every index sound.

How the segments match: Kafka rolls on `segment.ms` measured in the records' own
timestamps (the first batch's against the new one's), so each segment's records are
stamped 2 minutes after the previous segment's with `segment.ms` 1 minute, and each
segment is flushed before the next; logkit rolls where the test calls `p.roll()`.
Kafka's topic keeps `min.cleanable.dirty.ratio` at 1.0 (never due) while a round is
written and 0.01 until its cleaner checkpoint reaches the round's end, so it makes one
pass a round, as logkit does. A
record under the key "sentinel" opens the active segment at the end of each round on
both, so the cleaned range is exactly that round's input."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import logkit
from tests.helpers.kafka import create_topics, run_tool, skip_reason
from tests.helpers.kafka_ecosystem import kafka_rows, logkit_rows, unique, wait_for

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
pytest.importorskip("confluent_kafka")

PER_SEGMENT = 300
GAP_MS = 120_000                      # between segments' timestamps; > SEGMENT_MS
SEGMENT_MS = 60_000
BASE_MS = int(time.time() * 1000) - 3_600_000   # inside Kafka's timestamp bounds
# delete.retention.ms 0: a pass stamps the delete horizon (now) into the batches of the
# tombstones it sees first and keeps them; the next pass removes them (KIP-534)
TOPIC_CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
                "delete.retention.ms": "0",
                "index.interval.bytes": "256"}   # index entries in small segments
# Kafka cleans a log whose dirty ratio is above this: never at 1.0, at once at 0.01, so
# the test makes it clean once per round, as logkit's one p.compact() does
IDLE_RATIO, CLEAN_RATIO = "1.0", "0.01"
CLEANER_BACKOFF_MS = "100"
DEFAULT_CLEANER_BACKOFF_MS = "15000"  # Kafka's


def _key(n: int, segment: int, i: int) -> str:
    """Round one (segments 0-5): 97 hot keys; 20 keys written once, at the start;
    segment 2 writes 50 keys that segment 4 writes again, so none of segment 2's records
    survives. Round two (segments 7-8, after the first sentinel): the hot keys again,
    half the once-written keys again (in the cleaned part now), new keys, and the key of
    the first round's sentinel."""
    if segment == 0 and i < 20:
        return f"once-{i}"
    if segment == 2:
        return f"gone-{i % 50}"
    if segment == 4 and i < 50:
        return f"gone-{i}"
    if segment == 7 and i < 10:
        return f"once-{2 * i}"
    if segment == 8 and i == PER_SEGMENT - 1:
        return "sentinel"          # the first round's sentinel, alone in its segment, goes
    if segment == 8 and i % 3 == 0:
        return f"new-{i % 40}"
    return f"k{(n * 7919) % 97}"


def _record(n: int, segment: int, i: int):
    """Input record n, the i-th of its segment, stamped in its segment's time slot."""
    if n % 11 == 5:
        value = None                                   # a tombstone
    elif n % 13 == 0:
        value = b""
    else:
        value = f"v{n}-".encode() + b"x" * (n % 30)
    headers = [("n", str(n).encode())] if n % 4 == 0 else None
    return _key(n, segment, i).encode(), value, headers, BASE_MS + segment * GAP_MS + i


def _segments():
    """Every segment of the input, each a list of (key, value, headers, timestamp):
    segments 6 and 9 are a single record under the key "sentinel" that opens the
    active segment at the end of each round (the second one removes the first)."""
    n = 0
    out = []
    for s in range(10):
        if s in (6, 9):
            out.append([(b"sentinel", f"round {s // 6}".encode(), None,
                         BASE_MS + s * GAP_MS)])
            n += 1
            continue
        out.append([_record(n + i, s, i) for i in range(PER_SEGMENT)])
        n += PER_SEGMENT
    return out


INPUT = _segments()
ROUNDS = (INPUT[:7], INPUT[7:])
# each round's active segment: its sentinel's offset
ENDS = (sum(map(len, INPUT[:6])), sum(map(len, INPUT[:9])))


def _produce(bootstrap: str, topic: str, segments, roll) -> None:
    """One round of the input, one flushed segment at a time; roll() runs between two
    segments (logkit rolls there; Kafka rolls on the timestamps by itself)."""
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "enable.idempotence": True})
    for s, rows in enumerate(segments):
        if s:
            roll()
        for key, value, headers, timestamp in rows:
            producer.produce(topic, value, key, partition=0, headers=headers,
                             timestamp=timestamp)
        assert producer.flush(30) == 0


def _latest_per_key(end: int, seen_before: int):
    """What compaction must leave below `end`: each key's last record at its offset,
    less the tombstones below `seen_before`, which an earlier pass saw (and stamped)."""
    last = {}
    rows = (r for s in INPUT for r in s)
    for offset, (key, value, headers, timestamp) in zip(range(end), rows):
        last[key] = (offset, (key, value, tuple(headers or ()), timestamp))
    return sorted((offset, row) for offset, row in last.values()
                  if row[1] is not None or offset >= seen_before)


def _kafka_checkpoint(kafka, topic: str) -> int | None:
    """The first dirty offset Kafka's cleaner checkpointed for topic-0, or None."""
    path = kafka.data_dir / "cleaner-offset-checkpoint"
    if not path.exists():
        return None
    for line in path.read_text().splitlines()[2:]:
        name, partition, offset = line.rsplit(" ", 2)
        if name == topic and partition == "0":
            return int(offset)
    return None


def _config_value(admin, kind: str, name: str, config: str) -> str | None:
    """`config`'s value as the broker's DescribeConfigs shows it now."""
    from confluent_kafka.admin import ConfigResource
    resource = ConfigResource(kind, name)
    entries = admin.describe_configs([resource])[resource].result(timeout=30)
    return entries[config].value if config in entries else None


def _alter_config(admin, kind: str, name: str, config: str, value: str | None,
                  applied: str) -> None:
    """IncrementalAlterConfigs SET `value` (DELETE when None) of a topic's or the
    broker's config, then wait until the broker shows `applied`: KRaft answers once the
    controller committed the change and the broker applies it a moment later, so a
    cleaner pass in that moment would still run on the old value (an extra pass)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
    resource = ConfigResource(kind, name, incremental_configs=[
        ConfigEntry(config, value or "", incremental_operation=op)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    wait_for(lambda: _config_value(admin, kind, name, config) == applied,
             f"the broker to apply {config}={applied} on {kind} {name}", timeout_s=60)


def _set_topic_config(admin, topic: str, name: str, value: str) -> None:
    _alter_config(admin, "TOPIC", topic, name, value, value)


def _set_cleaner_backoff(admin, value: str | None) -> None:
    """log.cleaner.backoff.ms on the session's broker (a dynamic broker config; None
    deletes it, back to Kafka's default)."""
    _alter_config(admin, "BROKER", "1", "log.cleaner.backoff.ms", value,
                  value or DEFAULT_CLEANER_BACKOFF_MS)


@dataclass
class Cleaned:
    """Both sides after each round's cleaning: the surviving rows below that round's
    active segment; logkit's reports, and its partition as the second round left it."""
    kafka_rows: list = field(default_factory=list)      # one list per round
    logkit_rows: list = field(default_factory=list)
    reports: list = field(default_factory=list)
    directory: Path | None = None
    bases: list[int] = field(default_factory=list)
    logkit_records: list = field(default_factory=list)


def _clean_on_kafka(kafka, out: Cleaned) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    _set_cleaner_backoff(admin, CLEANER_BACKOFF_MS)
    try:
        topic = unique("compacted")
        config = {**TOPIC_CONFIG, "segment.ms": str(SEGMENT_MS),
                  "min.cleanable.dirty.ratio": IDLE_RATIO}
        create_topics(kafka.bootstrap_servers, [NewTopic(topic, 1, 1, config=config)])
        for segments, end in zip(ROUNDS, ENDS, strict=True):
            _produce(kafka.bootstrap_servers, topic, segments, lambda: None)
            _set_topic_config(admin, topic, "min.cleanable.dirty.ratio", CLEAN_RATIO)
            wait_for(lambda: _kafka_checkpoint(kafka, topic) == end,
                     "Kafka's cleaner checkpoint at the active segment", timeout_s=60)
            _set_topic_config(admin, topic, "min.cleanable.dirty.ratio", IDLE_RATIO)
            bases = sorted(int(p.stem) for p in kafka.partition_dir(topic, 0).glob("*.log"))
            assert bases[-1] == end                     # the sentinel alone is active
            rows = kafka_rows(kafka.bootstrap_servers, topic)[0]
            out.kafka_rows.append([r for r in rows if r[0] < end])
    finally:
        _set_cleaner_backoff(admin, None)


def _clean_on_logkit(root: Path, out: Cleaned) -> None:
    with logkit.Broker(root / "data", config={"log.cleaner.enable": False}) as broker, \
            broker.serve() as server:
        broker.create_topic("compacted", 1, config=TOPIC_CONFIG)
        partition = broker.topic("compacted").partition(0)
        for segments, end in zip(ROUNDS, ENDS, strict=True):
            if partition.high_watermark:
                partition.roll()
            _produce(server.bootstrap_servers, "compacted", segments, partition.roll)
            assert partition.segment_base_offsets()[-1] == end
            out.reports.append(partition.compact())
            out.logkit_rows.append([r for r in logkit_rows(broker, "compacted")[0]
                                    if r[0] < end])
        out.directory = Path(partition.directory)
        out.bases = partition.segment_base_offsets()
        out.logkit_records = partition.read(0, max_records=100_000)


@pytest.fixture(scope="module")
def cleaned(kafka, tmp_path_factory) -> Cleaned:
    out = Cleaned()
    _clean_on_kafka(kafka, out)
    _clean_on_logkit(tmp_path_factory.mktemp("compaction"), out)
    return out


@pytest.mark.parametrize("round_", [0, 1])
def test_kafka_and_logkit_keep_the_same_records_below_the_active_segment(cleaned, round_):
    expected = _latest_per_key(ENDS[round_], 0 if round_ == 0 else ENDS[0])
    assert cleaned.kafka_rows[round_] == expected              # Kafka's cleaner, the oracle
    assert cleaned.logkit_rows[round_] == cleaned.kafka_rows[round_]
    # the shapes the input was chosen to have: gaps, survivors from the first segment,
    # tombstones and empty values kept, segment 2 emptied
    offsets = [offset for offset, _ in cleaned.logkit_rows[round_]]
    assert offsets[0] < PER_SEGMENT
    assert not [o for o in offsets if 2 * PER_SEGMENT <= o < 3 * PER_SEGMENT]
    assert any(row[1] is None for _, row in cleaned.logkit_rows[round_])
    assert any(row[1] == b"" for _, row in cleaned.logkit_rows[round_])
    if round_ == 1:       # the first sentinel, alone in its segment, was written again
        assert ENDS[0] not in offsets and ENDS[1] - 1 in offsets
        # the first round's pass stamped its tombstones' horizon; this one removed them
        assert not {o for o, row in cleaned.logkit_rows[0] if row[1] is None} & set(offsets)


def test_logkits_clean_reports_count_what_survived(cleaned):
    first, second = cleaned.reports
    assert first.records_before == ENDS[0]
    assert first.records_after == len(cleaned.logkit_rows[0])
    assert first.bytes_after < first.bytes_before
    assert first.first_dirty_offset == ENDS[0]
    assert second.first_dirty_offset == ENDS[1]
    assert second.records_after == len(cleaned.logkit_rows[1])


# ---- Kafka's DumpLogSegments over logkit's cleaned segments --------------------------

FIELD = re.compile(r"(\w+): (\S+)")
RECORD = re.compile(
    r"^\| offset: (?P<offset>\d+) (?:CreateTime|LogAppendTime): (?P<ts>-?\d+) "
    r"keySize: (?P<key_size>-?\d+) valueSize: (?P<value_size>-?\d+) "
    r"sequence: (?P<sequence>-?\d+) headerKeys: \[(?P<header_keys>[^\]]*)\]"
    r"(?: key: (?P<key>\S*))?(?: payload: (?P<payload>.*))?$")


def _dump(files: list[Path], *flags: str) -> tuple[dict[Path, list[str]], str]:
    """DumpLogSegments' output over `files`, split per file; and all of it."""
    out = run_tool("kafka-dump-log", *flags, "--files", ",".join(map(str, files))).stdout
    reports: dict[Path, list[str]] = {}
    current: list[str] | None = None
    for line in out.splitlines():
        if line.startswith("Dumping "):
            current = reports.setdefault(Path(line[len("Dumping "):]), [])
        elif current is not None:
            current.append(line)
    assert set(reports) == set(files), out[:2000]
    return reports, out


def test_kafkas_dump_tool_reads_logkits_cleaned_segments_as_logkit_does(cleaned):
    sealed = cleaned.bases[:-1]
    files = [cleaned.directory / f"{base:020d}.log" for base in sealed]
    reports, _ = _dump(files, "--deep-iteration", "--print-data-log")
    printed = []
    stamped_tombstones = 0
    for f, next_base in zip(files, cleaned.bases[1:], strict=True):
        lines = reports[f]
        assert not [line for line in lines if "exception" in line.lower()
                    or "error" in line.lower()], f
        position, last_offset = 0, int(f.stem) - 1
        batch: dict[str, str] = {}
        for line in lines:
            if line.startswith("baseOffset: "):
                batch = dict(FIELD.findall(line))
                assert batch["isvalid"] == "true" and batch["magic"] == "2"
                assert int(batch["position"]) == position
                assert int(batch["baseOffset"]) > last_offset
                position += int(batch["size"])
                last_offset = int(batch["lastOffset"])
            elif (m := RECORD.match(line)) is not None:
                printed.append(m.groupdict())
                if m["value_size"] == "-1":
                    # a tombstone's batch carries the horizon the pass stamped (KIP-534)
                    assert re.fullmatch(r"OptionalLong\[\d+\]", batch["deleteHorizonMs"]), \
                        batch
                    stamped_tombstones += 1
        assert position == f.stat().st_size            # Kafka walked every byte
        assert last_offset + 1 == next_base             # the segment ends where the next begins
    assert stamped_tombstones > 0
    mine = [r for r in cleaned.logkit_records if r.offset < ENDS[1]]
    assert [(int(p["offset"]), int(p["ts"]), p["key"], p["payload"]) for p in printed] == \
        [(r.offset, r.timestamp, r.key.decode(),
          None if r.value is None else r.value.decode()) for r in mine]


def test_kafka_finds_logkits_cleaned_indexes_sound(cleaned):
    indexes = [cleaned.directory / f"{base:020d}{suffix}"
               for base in cleaned.bases[:-1] for suffix in (".index", ".timeindex")]
    reports, out = _dump(indexes, "--verify-index-only")
    assert not [line for line in out.splitlines()
                if line.startswith(("Mismatches in", "The following indexed offsets",
                                    "Found ", "Index offset", "Indexed offset"))], out
    reports, _ = _dump(indexes, "--index-sanity-check")
    # a cleaned segment smaller than index.interval.bytes has no offset index entry
    assert {f: [line for line in lines if line.strip()] for f, lines in reports.items()} == \
        {f: [f"{f} passed sanity check." if f.stat().st_size else f"{f} is empty."]
         for f in indexes}
    assert any(f.stat().st_size for f in indexes if f.suffix == ".index")
