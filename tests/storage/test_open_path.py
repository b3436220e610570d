"""Opening a partition: one directory listing decides the clean open and is the segment
list, and the one-pass file check agrees with `live_bases` + `leftovers` on every
directory state (issue 16, reopen cost)."""

from __future__ import annotations

import os
import random

import pytest

from logkit import loader
from logkit.config import BROKER, resolve, resolve_topic_config
from logkit.errors import StorageError
from logkit.loader import leftovers, live_bases, matching_bases
from logkit.log import PartitionLog
from logkit.segment import segment_file_name
from logkit.tail import BOOT_ID, TAIL_FILE, Tail, TailFile

CONFIG = resolve_topic_config({"segment.bytes": 4096, "segment.index.bytes": 1024 * 1024},
                              resolve(BROKER, None))


def _reference(names: set[str], tail: Tail) -> list[int] | None:
    """The check as it was written before the one-pass version (two passes over the
    listing: live_bases, then leftovers and the index test)."""
    bases = live_bases(names, tail)
    if any(name.endswith((".swap", ".cleaned")) and name[:20].isdigit() for name in names):
        return None                   # a cleaning pass's files: recovery decides them
    if not bases or bases[-1] != tail.active_base_offset or leftovers(names, bases):
        return None
    for base in bases:
        if (segment_file_name(base, ".index") not in names
                or segment_file_name(base, ".timeindex") not in names):
            return None
    return bases


def _tail(active: int, start: int) -> Tail:
    return Tail(BOOT_ID, start, active, active, 0, 0, 0, 1, active, -1, -1, active, -1,
                0, 0, -1, 0, 0)


NOISE = ["partition.metadata", "logkit.tail", "foo", "00000000000000000007.log.deleted",
         "00000000000000000007.index.deleted", "0000000000000000000x.log",
         "000000000000000000070.log", "00000000000000000007abc.index",
         "00000000000000000007.timeindex.tmp", "12.log", "00000000000000000007.swap",
         "00000000000000000003.log.swap", "00000000000000000003.index.cleaned"]


def test_one_pass_check_agrees_with_the_two_pass_one(tmp_path):
    rng = random.Random(16)
    candidates = [0, 3, 7, 12, 20]
    for case in range(400):
        directory = tmp_path / f"case{case}"
        directory.mkdir()
        names: set[str] = set()
        for base in rng.sample(candidates, rng.randint(0, len(candidates))):
            for suffix in (".log", ".index", ".timeindex"):
                if rng.random() < 0.85:
                    names.add(segment_file_name(base, suffix))
        names.update(rng.sample(NOISE, rng.randint(0, 3)))
        for name in names:
            (directory / name).write_bytes(b"")
        active = rng.choice(candidates)
        tail = _tail(active, rng.choice([0, 0, 3, 5, 7, 12, 20]))
        want = _reference(names, tail)
        assert matching_bases(str(directory), tail) == want, (sorted(names), tail)


def test_the_active_log_must_hold_the_committed_bytes(tmp_path):
    for suffix in (".log", ".index", ".timeindex"):
        (tmp_path / segment_file_name(0, suffix)).write_bytes(b"")
    tail = _tail(0, 0)._replace(active_size=10)
    assert matching_bases(str(tmp_path), tail) is None
    (tmp_path / segment_file_name(0, ".log")).write_bytes(b"x" * 10)
    assert matching_bases(str(tmp_path), tail) == [0]


def test_a_clean_open_lists_the_directory_once(tmp_path, monkeypatch):
    directory = str(tmp_path / "t-0")
    log = PartitionLog(directory, "t", 0, CONFIG)
    for _ in range(40):                          # a few segments
        log.append_records([(None, b"v" * 200, None, None)])
    log.close()
    listed: list[str] = []
    real = os.listdir

    def counting(path: str = ".") -> list[str]:
        listed.append(path)
        return real(path)

    monkeypatch.setattr(os, "listdir", counting)
    log = PartitionLog(directory, "t", 0, CONFIG)
    try:
        assert listed == [directory]
        assert log.last_recovery is None          # a clean open: no recovery ran
        assert len(log.segment_bases()) > 2
        assert [r.value for r in log.read(0, max_records=100)] == [b"v" * 200] * 40
    finally:
        log.close()


def test_an_open_that_needs_recovery_still_recovers(tmp_path):
    directory = tmp_path / "t-0"
    log = PartitionLog(str(directory), "t", 0, CONFIG)
    for _ in range(40):
        log.append_records([(None, b"v" * 200, None, None)])
    bases = log.segment_bases()
    log.close()
    # an index without its log (a roll interrupted between renames) forces recovery
    orphan = directory / segment_file_name(bases[-1] + 1000, ".index")
    orphan.write_bytes(b"")
    tail_file = TailFile(str(directory / TAIL_FILE), read_only=True)
    try:
        assert loader.clean_open(str(directory), tail_file) is None
    finally:
        tail_file.close()
    log = PartitionLog(str(directory), "t", 0, CONFIG)
    try:
        assert not orphan.exists()
        assert log.log_end_offset == 40
    finally:
        log.close()


def test_the_partition_directory_is_made_once_and_a_link_is_refused(tmp_path):
    made = tmp_path / "a" / "t-0"                 # parents made too
    PartitionLog(str(made), "t", 0, CONFIG).close()
    assert made.is_dir() and (made.stat().st_mode & 0o777) == 0o700
    link = tmp_path / "t-1"
    link.symlink_to(made)
    with pytest.raises(StorageError, match="symbolic link"):
        PartitionLog(str(link), "t", 1, CONFIG)
    with pytest.raises(StorageError):
        PartitionLog(str(tmp_path / "missing"), "t", 2, CONFIG, read_only=True)
