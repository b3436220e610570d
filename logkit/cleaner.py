"""Log compaction's decisions and its background thread (Kafka's LogCleaner).

Owns: the key -> latest-offset map of one pass (`OffsetMap`: one table of 24-byte
slots no bigger than `log.cleaner.dedupe.buffer.size`, as Kafka's SkimpyOffsetMap; its
C code in `_speedups`, the pure-Python twins here), which
record of a batch a pass keeps (`keep_records`: the latest of its key, tombstones until
their delete horizon, never a keyless record), the pass's report (`CleanReport`), the
dirty ratio that makes a partition due (`due`), and `LogCleaner`, the thread every
writable Broker runs. The pass itself — reading segments, writing `.cleaned` files and
swapping them in — is `log_clean.py`'s, a mixin of the partition log.

Invariant: a pass never changes an offset and never drops the latest record of a key
below the map's end; a tombstone goes only once `now` has passed the horizon stamped in
its batch by an earlier pass (KIP-534).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

from . import _native
from .config import is_compacted
from .records import Record, _read_varint, _varint

__all__ = ["CleanReport", "OffsetMap", "keep_records", "due", "LogCleaner",
           "ENTRY_BYTES", "murmur3_128"]

log = logging.getLogger(__name__)

ENTRY_BYTES = 24                  # Kafka's SkimpyOffsetMap: a 16-byte hash + an offset
_SHORT_KEY = 16                   # keys up to this long are kept as they are
_speedups = _native.speedups


class CleanReport(NamedTuple):
    """What one cleaning pass of one partition did. `first_dirty_offset` is the cleaner
    checkpoint after the pass (the offsets below it are clean)."""

    records_before: int
    records_after: int
    bytes_before: int
    bytes_after: int
    segments_before: int
    segments_after: int
    first_dirty_offset: int
    seconds: float


_M64 = (1 << 64) - 1
_C1, _C2 = 0x87C37B91114253D5, 0x4CF5AD432745937F
_TAG_DIGEST = 0x80                # a slot's tag: 1..17 a short key's length + 1
_OFFSET_MASK = (1 << 56) - 1      # a slot's word: tag << 56 | offset


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _M64
    return k ^ (k >> 33)


def murmur3_128(data: Any) -> bytes:
    """MurmurHash3 x64 128, seed 0 (from the algorithm's published description): h1
    then h2, little-endian. `_speedups.murmur3_128` is the compiled twin."""
    data = bytes(data)
    n = len(data)
    h1 = h2 = 0
    blocks = n // 16
    for i in range(0, blocks * 16, 16):
        k1 = int.from_bytes(data[i:i + 8], "little")
        k2 = int.from_bytes(data[i + 8:i + 16], "little")
        h1 ^= (_rotl((k1 * _C1) & _M64, 31) * _C2) & _M64
        h1 = ((_rotl(h1, 27) + h2) * 5 + 0x52DCE729) & _M64
        h2 ^= (_rotl((k2 * _C2) & _M64, 33) * _C1) & _M64
        h2 = ((_rotl(h2, 31) + h1) * 5 + 0x38495AB5) & _M64
    tail = data[blocks * 16:]
    if len(tail) > 8:
        h2 ^= (_rotl((int.from_bytes(tail[8:], "little") * _C2) & _M64, 33) * _C1) & _M64
    if tail:
        h1 ^= (_rotl((int.from_bytes(tail[:8], "little") * _C1) & _M64, 31) * _C2) & _M64
    h1 ^= n
    h2 ^= n
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    h1, h2 = _fmix(h1), _fmix(h2)
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    return h1.to_bytes(8, "little") + h2.to_bytes(8, "little")


def _ident(key: Any) -> tuple[bytes, int]:
    """The 16 bytes naming a key in the table, and its tag."""
    key = bytes(key)
    if len(key) <= _SHORT_KEY:
        return key.ljust(_SHORT_KEY, b"\0"), len(key) + 1
    return murmur3_128(key), _TAG_DIGEST


def _find(table: Any, slots: int, ident: bytes, tag: int) -> int:
    """The byte position of a key's slot, or of the empty slot where it would go."""
    h = _fmix(int.from_bytes(ident[:8], "little")
              ^ _rotl(int.from_bytes(ident[8:], "little"), 31) ^ tag)
    i = h % slots
    while True:
        at = i * ENTRY_BYTES
        word = int.from_bytes(table[at + 16:at + 24], "little")
        if word == 0 or (word >> 56 == tag and table[at:at + 16] == ident):
            return at
        i += 1
        if i == slots:
            i = 0


def _map_get_py(table: Any, slots: int, key: Any) -> int:
    """Pure-Python twin of `_speedups.map_get`."""
    ident, tag = _ident(key)
    at = _find(table, slots, ident, tag)
    word = int.from_bytes(table[at + 16:at + 24], "little")
    return word & _OFFSET_MASK if word else -1


def _section_records(buf: Any, pos: int, end: int, count: int) -> Iterator[tuple]:
    """(start, body, ts_end, record end, ts delta, offset delta, key or None, is a
    tombstone) of each record of an uncompressed section, as clean_records walks it."""
    for _ in range(count):
        start = pos
        length, pos = _read_varint(buf, pos)
        if length < 1 or length > end - pos:
            raise ValueError(f"record length field says {length}, {end - pos} bytes left")
        body, record_end = pos, pos + length
        ts_delta, pos = _read_varint(buf, pos + 1)
        ts_end = pos
        offset_delta, pos = _read_varint(buf, pos)
        key_length, pos = _read_varint(buf, pos)
        key = None
        if key_length >= 0:
            if key_length > record_end - pos:
                raise ValueError("key runs past the end of its record")
            key = bytes(buf[pos:pos + key_length])
            pos += key_length
        value_length, pos = _read_varint(buf, pos)
        if value_length > record_end - pos:
            raise ValueError("value runs past the end of its record")
        yield (start, body, ts_end, record_end, ts_delta, offset_delta, key,
               value_length < 0)
        pos = record_end
    if pos != end:
        raise ValueError(f"{end - pos} stray bytes after the last record")


def _map_put_py(buf: Any, pos: int, end: int, count: int, base_offset: int,
                min_offset: int, table: Any, slots: int, size: int) -> int:
    """Pure-Python twin of `_speedups.map_put`."""
    for _, _, _, _, _, delta, key, _ in _section_records(buf, pos, end, count):
        offset = base_offset + delta
        if key is None or offset < min_offset:
            continue
        if not 0 <= offset <= _OFFSET_MASK:
            raise ValueError("offset does not fit the key map's 56 bits")
        ident, tag = _ident(key)
        at = _find(table, slots, ident, tag)
        if table[at + 16:at + 24] == bytes(8):
            if size + 1 >= slots:
                raise ValueError("the key map is full")
            size += 1
            table[at:at + 16] = ident
        table[at + 16:at + 24] = (tag << 56 | offset).to_bytes(8, "little")
    return size


def _clean_records_py(buf: Any, pos: int, end: int, count: int, base_offset: int,
                      table: Any, slots: int, map_end: int, drop_tombstones: bool,
                      stamp_shift: int | None) -> tuple[bytes, int, bool, int | None]:
    """Pure-Python twin of `_speedups.clean_records` (see OffsetMap.clean_section)."""
    parts = []
    kept = 0
    tombstone = False
    max_delta = None
    for start, body, ts_end, record_end, ts_delta, delta, key, dead in \
            _section_records(buf, pos, end, count):
        if key is None:
            continue
        offset = base_offset + delta
        if offset < map_end and _map_get_py(table, slots, key) > offset:
            continue
        if dead:
            if drop_tombstones:
                continue
            tombstone = True
        if max_delta is None or ts_delta > max_delta:
            max_delta = ts_delta
        kept += 1
        parts.append((start, body, ts_end, record_end, ts_delta))
    out = []
    for start, body, ts_end, record_end, ts_delta in parts:
        if tombstone and stamp_shift:
            ts = _varint(ts_delta + stamp_shift)
            rest = bytes(buf[ts_end:record_end])
            out.append(_varint(1 + len(ts) + len(rest)) + bytes(buf[body:body + 1]) + ts
                       + rest)
        else:
            out.append(bytes(buf[start:record_end]))
    return b"".join(out), kept, tombstone, max_delta


if _speedups is not None:
    _map_get = _speedups.map_get
    _map_put = _speedups.map_put
    _clean_records = _speedups.clean_records
else:
    _map_get = _map_get_py
    _map_put = _map_put_py
    _clean_records = _clean_records_py


class OffsetMap:
    """Key -> the latest offset seen for it: Kafka's SkimpyOffsetMap. One bytearray of
    24-byte slots (16 bytes naming the key, 8 for its offset and a tag), open
    addressing with linear probing, so its memory is its slots and never more than
    `buffer_bytes` (log.cleaner.dedupe.buffer.size); it holds at most `capacity` keys
    (slots x load factor). A key of at most 16 bytes is named by itself (padded; its
    length in the tag), so short keys never collide; a longer one by its MurmurHash3
    x64 128 digest, as Kafka names every key by its MD5. `expected_keys` (an upper
    bound on the keys the pass can meet) sizes the table smaller than the buffer when
    the dirty range is small. The table's layout and probing are the same in C
    (`_speedups.map_put`, `map_get`, `clean_records`) and in the Python twins here."""

    def __init__(self, buffer_bytes: int, load_factor: float = 0.9,
                 expected_keys: int | None = None) -> None:
        slots = max(2, buffer_bytes // ENTRY_BYTES)
        if expected_keys is not None:
            slots = min(slots, max(16, int(expected_keys / load_factor) + 2))
        self.slots = slots
        self.capacity = max(1, min(int(slots * load_factor), slots - 1))
        self._table = bytearray(slots * ENTRY_BYTES)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def memory_bytes(self) -> int:
        """The bytes the table takes (at most the dedupe buffer)."""
        return len(self._table)

    def room(self) -> int:
        return self.capacity - self._size

    def put_all(self, records: Iterable[Record]) -> None:
        """Map each keyed record to its offset, in order (`Record`s decoded already)."""
        table, slots = self._table, self.slots
        for record in records:
            if record.key is None:
                continue
            if not 0 <= record.offset <= _OFFSET_MASK:
                raise ValueError("offset does not fit the key map's 56 bits")
            ident, tag = _ident(record.key)
            at = _find(table, slots, ident, tag)
            if table[at + 16:at + 24] == bytes(8):
                if self._size + 1 >= slots:
                    raise ValueError("the key map is full")
                self._size += 1
                table[at:at + 16] = ident
            table[at + 16:at + 24] = (tag << 56 | record.offset).to_bytes(8, "little")

    def put_section(self, buf: Any, pos: int, end: int, count: int, base_offset: int,
                    min_offset: int) -> None:
        """Map each keyed record of the uncompressed records section buf[pos:end] (a
        batch's `count` records from `base_offset`) at or past `min_offset`."""
        self._size = _map_put(buf, pos, end, count, base_offset, min_offset, self._table,
                              self.slots, self._size)

    def latest(self, key: Any) -> int:
        """The latest offset mapped for `key`, or -1."""
        return _map_get(self._table, self.slots, bytes(key))

    def clean_section(self, buf: Any, pos: int, end: int, count: int, base_offset: int,
                      map_end: int, drop_tombstones: bool, stamp_shift: int | None
                      ) -> tuple[bytes, int, bool, int | None]:
        """`keep_records` over the raw uncompressed section buf[pos:end]: (the kept
        records' bytes, how many, whether a tombstone is among them, the largest kept
        timestamp delta or None). Each kept record's bytes are copied as they are;
        when a tombstone is kept and `stamp_shift` is not None, it is added to every
        kept record's timestamp delta (the batch gets a delete horizon as its base
        timestamp)."""
        return _clean_records(buf, pos, end, count, base_offset, self._table, self.slots,
                              map_end, drop_tombstones, stamp_shift)


def keep_records(records: Sequence[Record], offset_map: OffsetMap, map_end: int, *,
                 now_ms: int, horizon_ms: int | None) -> list[Record]:
    """The records of one batch a pass keeps: a keyed record that is its key's latest
    (or past the map's end, which the map knows nothing of), less tombstones whose
    batch's delete horizon (`horizon_ms`, None when no pass stamped one yet) has passed.
    A keyless record is never kept (a compacted topic refuses them; one written before
    the topic became compacted goes at its first pass, as in Kafka)."""
    kept = []
    latest = offset_map.latest
    for record in records:
        if record.key is None:
            continue
        if record.offset < map_end and latest(record.key) > record.offset:
            continue                                   # a later record of its key
        if record.value is None and horizon_ms is not None and now_ms >= horizon_ms:
            continue                                   # a tombstone past its horizon
        kept.append(record)
    return kept


def due(partition: Any, now_ms: int) -> bool:
    """Whether a partition should be cleaned now: its uncleaned bytes are at least
    min.cleanable.dirty.ratio of its cleanable bytes, or its oldest uncleaned record
    is older than max.compaction.lag.ms (Kafka's LogCleanerManager rules)."""
    dirty, total, oldest_dirty_ms = partition.cleanable_bytes(now_ms)
    if dirty <= 0:
        return False
    config = partition.config
    if oldest_dirty_ms >= 0 and now_ms - oldest_dirty_ms >= config["max.compaction.lag.ms"]:
        return True
    return dirty / max(total, 1) >= config["min.cleanable.dirty.ratio"]


class LogCleaner:
    """The background cleaner of one Broker: a daemon thread that every
    `log.cleaner.backoff.ms` cleans each compacted partition that is due (see `due`)
    and that no other process is cleaning (the partition's cleaner lock, taken without
    waiting). `partitions` returns the broker's open partitions; errors are logged and
    the partition is tried again at the next round."""

    def __init__(self, partitions: Callable[[], Iterable[Any]], backoff_ms: int,
                 *, clock: Callable[[], int]) -> None:
        self._partitions = partitions
        self._backoff_s = backoff_ms / 1000
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="logkit-log-cleaner",
                                        daemon=True)
        self.passes = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self._backoff_s):
            self.run_once()

    def run_once(self) -> int:
        """One round over the partitions; returns the passes made."""
        made = 0
        for partition in list(self._partitions()):
            if self._stop.is_set():
                break
            try:
                if not is_compacted(partition.config) or not due(partition, self._clock()):
                    continue
                if partition.compact(block=False) is not None:
                    made += 1
            except Exception as exc:        # a closed or deleted partition, a full disk
                log.warning("log cleaner: %r not cleaned this round: %s", partition, exc)
        self.passes += made
        return made
