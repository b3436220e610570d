"""read_committed against a brute-force reference (log_txn.py's `_drop_aborted`): several
transactional producers whose aborted transactions interleave with committed ones, with
plain records and across many small segments; every read starting at every offset, cut
by `max_records` and `stop_offset` inside aborted and committed batches, returns exactly
what a reference computed in the test from the batch headers and markers says."""

from __future__ import annotations

import random

import pytest

import logkit
from logkit.log_txn import READ_COMMITTED_ROUNDS
from logkit.records import CONTROL_ABORT, control_record_type, encode_batch, iter_batches

PRODUCERS = (11, 12, 13, 14)


def write_interleaved(p, rng, steps):
    """Random steps of four transactional producers and a plain writer: a producer's
    batch of 1-4 records (opening its transaction), a COMMIT or ABORT of one, or a plain
    record. Every transaction ends, then one opens late so the LSO is below the end."""
    sequences = dict.fromkeys(PRODUCERS, 0)
    open_ = set()
    for step in range(steps):
        pid = rng.choice(PRODUCERS)
        roll = rng.random()
        if roll < 0.15:
            p.append([(b"k", b"plain%d" % step, None, None)])
        elif roll < 0.35 and pid in open_:
            p.append_control(pid, 0, commit=rng.random() < 0.5)
            open_.discard(pid)
        else:
            n = rng.randint(1, 4)
            p.append_batch(encode_batch([(b"k", b"%d-%d" % (pid, step), None, None)] * n,
                                        producer_id=pid, producer_epoch=0,
                                        base_sequence=sequences[pid], transactional=True))
            sequences[pid] += n
            open_.add(pid)
    for pid in sorted(open_):
        p.append_control(pid, 0, commit=rng.random() < 0.5)
    p.append([(b"k", b"last-plain", None, None)])
    p.append_batch(encode_batch([(b"k", b"open", None, None)] * 2, producer_id=PRODUCERS[0],
                                producer_epoch=0, base_sequence=sequences[PRODUCERS[0]],
                                transactional=True))
    p.append([(b"k", b"past-the-lso", None, None)])


def reference(p):
    """From every batch header and marker, by brute force: the record offsets of
    committed transactions and plain batches (visible), the aborted transactions as
    (producer, first offset, marker offset), and the last stable offset."""
    data = p.batches_since(0, max_bytes=10**8)
    visible, aborted, open_first, pending = set(), [], {}, {}
    for pos, h in iter_batches(data, 0, len(data)):
        pid = h.producer_id
        if h.is_control:
            first = open_first.pop(pid)
            offsets = pending.pop(pid)
            if control_record_type(data, pos, h) == CONTROL_ABORT:
                aborted.append((pid, first, h.base_offset))
            else:
                visible.update(offsets)
        elif pid < 0:
            visible.update(range(h.base_offset, h.last_offset + 1))
        else:
            open_first.setdefault(pid, h.base_offset)
            pending.setdefault(pid, []).extend(range(h.base_offset, h.last_offset + 1))
    lso = min([*open_first.values(), p.high_watermark])
    return visible, aborted, lso


def reference_read(offsets, visible, start, max_records, end):
    """read()'s contract with read_committed: the first window of `max_records` records
    from `start` below `end` that keeps a visible record, its visible records; a window
    all aborted moves the read past it (at most READ_COMMITTED_ROUNDS windows)."""
    position = start
    for _ in range(READ_COMMITTED_ROUNDS):
        window = [o for o in offsets if position <= o < end][:max_records]
        if not window:
            return []
        kept = [o for o in window if o in visible]
        if kept:
            return kept
        position = window[-1] + 1
    return []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_read_committed_matches_a_brute_force_reference_from_every_offset(tmp_path, seed):
    rng = random.Random(seed)
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 1024})
        p = broker.topic("t").partition(0)
        write_interleaved(p, rng, 160)
        visible, aborted, lso = reference(p)
        assert aborted and len({pid for pid, _, _ in aborted}) > 1    # the mix it is for
        assert len(p.segment_base_offsets()) > 5
        offsets = [r.offset for r in p.read(0, max_records=10**6)]
        assert p.last_stable_offset == lso
        ends = sorted({lso, *rng.sample(range(1, lso), 12)})
        for start in range(0, lso + 1):
            for max_records in (1, 2, 3, 5, 8, 10**6):
                for stop in (None, *[e for e in ends if e > start][:3]):
                    end = lso if stop is None else min(stop, lso)
                    got = [r.offset for r in p.read(
                        start, max_records=max_records, stop_offset=stop,
                        isolation_level="read_committed")]
                    assert got == reference_read(offsets, visible, start, max_records,
                                                 end), (start, max_records, stop)
        # a reader that follows next_offset gets each visible record below the LSO once
        for max_records in (1, 3, 7):
            position, seen = 0, []
            for _ in range(10 * lso):
                fetched = p.fetch_records(position, max_records=max_records,
                                          isolation_level="read_committed")
                seen += [r.offset for r in fetched.records]
                if fetched.next_offset == position:
                    break
                position = fetched.next_offset
            assert seen == sorted(o for o in visible if o < lso)
            assert position == lso
        # the Fetch response's list: the aborted transactions overlapping the range
        for start in range(0, lso, 7):
            for end in (start + 1, start + 9, lso):
                assert p.aborted_transactions(start, end) == [
                    (pid, first) for pid, first, marker in aborted
                    if marker >= start and first < end]
