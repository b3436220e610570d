"""Leader epochs: Kafka's `leader-epoch-checkpoint` file and the truncation rule built on
it (KIP-101, KIP-279).

Owns: the file's text format and its atomic rewrite, the pure functions over a list of
`EpochEntry` that Kafka's `LeaderEpochFileCache` provides (`assign`, `truncate_from_end`,
`end_offset_for`), and `divergence_offset`, the offset a follower must truncate to so its
log is a prefix of its leader's.

The file, in each partition directory (as Kafka writes it):

    0                  version
    2                  number of entries
    0 0                epoch startOffset: epoch 0 wrote from offset 0
    1 150              epoch 1 (a new leader) wrote from offset 150

Invariant: entries are sorted, epochs strictly increasing, start offsets
non-decreasing. A file on disk is always whole: it is written to a temporary name,
fsynced, renamed over the old one, and the directory is fsynced. A malformed file raises
CorruptRecordError naming it and the line; it is never half-read.

Who calls it: the follower (its own directories and promotion) and the sources (the
leader's directories). Pure functions take and return plain lists; nothing here holds
state.
"""

from __future__ import annotations

import logging
import os
from typing import Iterable, NamedTuple, Sequence

from ..errors import CorruptRecordError

__all__ = ["EpochEntry", "CHECKPOINT_FILE", "read_checkpoint", "write_checkpoint",
           "epochs_from_headers", "assign", "truncate_from_end", "end_offset_for",
           "divergence_offset", "UNDEFINED_EPOCH", "UNDEFINED_OFFSET"]

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "leader-epoch-checkpoint"
CHECKPOINT_VERSION = 0
MAX_ENTRIES = 100000           # a file claiming more is corrupt, not a long history
MAX_FILE_BYTES = 64 * MAX_ENTRIES
UNDEFINED_EPOCH = -1           # Kafka's sentinels in an end-offset answer
UNDEFINED_OFFSET = -1
MAX_TRUNCATION_ROUNDS = 10000  # each round drops at least one local entry


class EpochEntry(NamedTuple):
    """Epoch `epoch` wrote the records from `start_offset` on (until the next entry)."""

    epoch: int
    start_offset: int


# ---- the file ---------------------------------------------------------------------------

def read_checkpoint(directory: str) -> list[EpochEntry] | None:
    """The entries of `<directory>/leader-epoch-checkpoint`, None when there is no file.
    Raises CorruptRecordError (path, line number as position) on a malformed file."""
    path = os.path.join(directory, CHECKPOINT_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        raw = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    return parse_checkpoint(raw, path)


def parse_checkpoint(raw: bytes, path: str = CHECKPOINT_FILE) -> list[EpochEntry]:
    """The entries of a checkpoint file's bytes (see the module docstring)."""
    def bad(line: int, why: str) -> CorruptRecordError:
        return CorruptRecordError(f"malformed leader epoch checkpoint: {why}", path=path,
                                  position=line)

    if len(raw) > MAX_FILE_BYTES:
        raise bad(0, f"more than {MAX_FILE_BYTES} bytes")
    try:
        lines = raw.decode("ascii").split("\n")
    except UnicodeDecodeError:
        raise bad(0, "not ASCII text") from None
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2:
        raise bad(len(lines), "no version and count lines")
    try:
        version, count = int(lines[0]), int(lines[1])
    except ValueError:
        raise bad(0, "version or count is not a number") from None
    if version != CHECKPOINT_VERSION:
        raise bad(0, f"version {version}, expected {CHECKPOINT_VERSION}")
    if not 0 <= count <= MAX_ENTRIES or len(lines) != count + 2:
        raise bad(1, f"count {count} does not match {len(lines) - 2} entry line(s)")
    entries = []
    for number, line in enumerate(lines[2:], start=2):
        fields = line.split(" ")
        try:
            epoch, start = int(fields[0]), int(fields[1])
        except (ValueError, IndexError):
            raise bad(number, f"entry {line!r} is not 'epoch startOffset'") from None
        if len(fields) != 2 or epoch < 0 or start < 0:
            raise bad(number, f"entry {line!r} is not 'epoch startOffset'")
        if entries and (epoch <= entries[-1].epoch or start < entries[-1].start_offset):
            raise bad(number, f"entry {line!r} does not follow {entries[-1]}")
        entries.append(EpochEntry(epoch, start))
    return entries


def format_checkpoint(entries: Sequence[EpochEntry]) -> bytes:
    """The file's bytes for `entries`."""
    lines = [str(CHECKPOINT_VERSION), str(len(entries))]
    lines += [f"{e.epoch} {e.start_offset}" for e in entries]
    return ("\n".join(lines) + "\n").encode("ascii")


def write_checkpoint(directory: str, entries: Sequence[EpochEntry]) -> None:
    """Replace `<directory>/leader-epoch-checkpoint` atomically and durably: temporary
    file, fsync, rename, fsync of the directory."""
    _check_sorted(entries)
    path = os.path.join(directory, CHECKPOINT_FILE)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        data = format_checkpoint(entries)
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"{tmp}: short write ({written} of {len(data)} bytes)")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _check_sorted(entries: Sequence[EpochEntry]) -> None:
    for before, after in zip(entries, entries[1:]):
        assert after.epoch > before.epoch and after.start_offset >= before.start_offset, \
            f"epoch entries out of order: {before} then {after}"


# ---- the cache's operations (Kafka's LeaderEpochFileCache) --------------------------------

def epochs_from_headers(headers: Iterable[object]) -> list[EpochEntry]:
    """The entries a log's batches imply: one per change of partitionLeaderEpoch, at
    the base offset of the first batch of each epoch (batches with no epoch, -1, are
    skipped). For a directory without a checkpoint file. `headers` are BatchHeaders."""
    entries: list[EpochEntry] = []
    for header in headers:
        epoch = header.leader_epoch                           # type: ignore[attr-defined]
        if epoch >= 0 and (not entries or epoch > entries[-1].epoch):
            entries.append(EpochEntry(epoch, header.base_offset))   # type: ignore
    return entries


def assign(entries: Sequence[EpochEntry], epoch: int, start_offset: int) -> list[EpochEntry]:
    """`entries` with `epoch` starting at `start_offset` (Kafka's assign): entries of
    that epoch or later, or starting at or after that offset, give way to it."""
    out = [e for e in entries if e.epoch < epoch and e.start_offset < start_offset]
    if out and out[-1] == EpochEntry(epoch, start_offset):
        return out
    out.append(EpochEntry(epoch, start_offset))
    return out


def truncate_from_end(entries: Sequence[EpochEntry], end_offset: int) -> list[EpochEntry]:
    """`entries` of a log cut to end at `end_offset`: those starting at or past it go."""
    return [e for e in entries if e.start_offset < end_offset]


def end_offset_for(entries: Sequence[EpochEntry], epoch: int,
                   log_end_offset: int) -> tuple[int, int]:
    """(the largest epoch <= `epoch`, the offset where it ended): Kafka's answer to
    OffsetsForLeaderEpoch. The latest epoch ends at the log end. An epoch older than
    every entry is answered with itself and the first entry's start; a newer one, or
    UNDEFINED_EPOCH, with (UNDEFINED_EPOCH, UNDEFINED_OFFSET)."""
    if epoch == UNDEFINED_EPOCH or not entries:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    if entries[-1].epoch == epoch:
        return epoch, log_end_offset
    higher = next((e for e in entries if e.epoch > epoch), None)
    if higher is None:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    floor = [e for e in entries if e.epoch <= epoch]
    if not floor:
        return epoch, higher.start_offset
    return floor[-1].epoch, higher.start_offset


def divergence_offset(local: Sequence[EpochEntry], local_end: int,
                      leader: Sequence[EpochEntry], leader_end: int) -> int:
    """The offset a follower (epochs `local`, log end `local_end`) truncates to so that
    its log is a prefix of its leader's (`leader`, `leader_end`): `local_end` when it
    already is. KIP-279's exchange, run here in full because both epoch lists are at
    hand: ask the leader where the follower's latest epoch ended; if the leader answers
    with an older epoch, cut to where that one ended locally and ask again.

    Records the follower holds in an epoch newer than every leader epoch (a leader that
    was never told of its successor's successor) are cut too, from that epoch's start.
    A follower without epochs truncates to at most the leader's end."""
    entries = list(local)
    end = local_end
    for _ in range(MAX_TRUNCATION_ROUNDS):
        if not entries:
            return min(end, leader_end)
        latest = entries[-1].epoch
        leader_epoch, leader_epoch_end = end_offset_for(leader, latest, leader_end)
        if leader_epoch_end == UNDEFINED_OFFSET:
            if not leader:
                return min(end, leader_end)
            # an epoch the leader never had: everything written in it goes
            end = min(end, entries[-1].start_offset)
            entries = truncate_from_end(entries, end)
            continue
        own_epoch, own_end = end_offset_for(entries, leader_epoch, end)
        if own_epoch == leader_epoch:
            return min(own_end, leader_epoch_end, end)
        if own_epoch == UNDEFINED_EPOCH:      # nothing local that old: keep what fits
            return min(leader_epoch_end, end)
        end = min(own_end, end)               # an epoch the follower never saw
        entries = truncate_from_end(entries, end)
    raise AssertionError("divergence_offset did not converge")   # entries shrink each round
