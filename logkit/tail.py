"""The shared tail state of one partition directory: the `logkit.tail` file, its seqlock,
which it opens by the rules of `_files.py`.

Owns: the `Tail` record (log start/end offsets, the active segment's committed size and
index entry counts, the high watermark, the recovery point, a segment-list version, the
flush bookkeeping, the leader epoch and the deleted flag) and `TailFile`, the small
mmap'd file that holds it. Several processes map the same file. A writer (holding the
partition's append lock: see log.py) bumps the sequence number to odd, writes the body,
then bumps it to even; a reader takes no lock and retries until it reads the same even
number before and after the body. An odd number seen *under the lock* can only be a
writer that died mid-update, or a truncation that died before its recovery published
(`publish_torn`): the partition log then repairs the tail by recovery.

Invariant: a snapshot returned by `TailFile.read()` is one that a writer published whole;
the body is never half old, half new.

Layout (little-endian; 4096 bytes, preallocated):

    off  field
    0    magic b"LKT1" (4s), version 1 (uint32)
    8    sequence number (uint64): odd while a writer is mid-update
    16   body: `Tail`'s fields in order (`_BODY`): `deleted`, then the cleaner's
         checkpoint and pass count (zero in a file written before compaction existed)
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import struct
import time
from typing import NamedTuple

from ._files import FILE_MODE, check_directory, open_file, raise_descriptor_limit  # noqa: F401
from .errors import StorageError

__all__ = ["Tail", "TailFile", "BOOT_ID", "TAIL_FILE", "open_file", "check_directory"]

log = logging.getLogger(__name__)

TAIL_FILE = "logkit.tail"
TAIL_MAGIC = b"LKT1"
TAIL_VERSION = 1
TAIL_FILE_BYTES = 4096
SEQLOCK_SPINS = 10000                 # reader retries before suspecting a dead writer
SEQLOCK_SPINS_BEFORE_SLEEP = 100


class Tail(NamedTuple):
    """The shared tail state (see module docstring). Offsets are logical record numbers;
    sizes and positions are bytes."""

    boot_id: bytes
    log_start_offset: int
    log_end_offset: int
    active_base_offset: int
    active_size: int
    index_entries: int
    timeindex_entries: int
    segments_version: int
    high_watermark: int
    max_timestamp: int           # of the active segment
    max_timestamp_offset: int
    recovery_point: int          # offsets below it are fsynced
    roll_time_ms: int            # wall-clock time of the active segment's first append
    clean: int                   # 1: fsynced at a clean close, nothing appended since
    unflushed_messages: int
    first_unflushed_ms: int
    leader_epoch: int
    deleted: int = 0             # 1: the topic was deleted; every use raises
    cleaned_offset: int = 0      # the cleaner checkpoint: its first dirty offset
    clean_count: int = 0         # cleaning passes that swapped segments in (cleaner.py)


_MAGIC = struct.Struct("<4sI")
_SEQ = struct.Struct("<Q")
_SEQ_OFFSET = _MAGIC.size
_MAGIC_SEQ = struct.Struct("<4sIQ")                  # both, in one unpack
_BODY_UP_TO_DELETED = "<16sqqqqqqQqqqqqqqqqq"       # ... up to and including `deleted`
_BODY = struct.Struct(_BODY_UP_TO_DELETED + "qq")    # + the cleaner's two fields
_BODY_OFFSET = _SEQ_OFFSET + _SEQ.size
_DELETED = struct.Struct("<q")
_DELETED_OFFSET = _BODY_OFFSET + struct.calcsize(_BODY_UP_TO_DELETED) - _DELETED.size
assert len(_BODY.unpack(bytes(_BODY.size))) == len(Tail._fields)
assert _BODY_OFFSET + _BODY.size <= TAIL_FILE_BYTES


def _boot_id() -> bytes:
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return bytes.fromhex(f.read().strip().decode().replace("-", ""))[:16]
    except (OSError, ValueError):
        return b"\0" * 16        # unknown: every unclean open then runs recovery


BOOT_ID = _boot_id()


class TailFile:
    """The mmap'd tail state file and its seqlock. Writes need the partition lock;
    reads take none."""

    def __init__(self, path: str, *, read_only: bool = False) -> None:
        self.path = path
        self.fd = open_file(path, os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT)
        try:
            self.created = os.fstat(self.fd).st_size < TAIL_FILE_BYTES
            if read_only:
                if self.created:
                    raise StorageError(f"{path} is not a complete tail file; open the "
                                       "directory read-write once to recover it",
                                       operation="open", path=path)
                self.mm = mmap.mmap(self.fd, TAIL_FILE_BYTES, access=mmap.ACCESS_READ)
                return
            if self.created:      # real blocks, so a full disk fails here, not as SIGBUS
                os.posix_fallocate(self.fd, 0, TAIL_FILE_BYTES)
            self.mm = mmap.mmap(self.fd, TAIL_FILE_BYTES)
        except BaseException:
            os.close(self.fd)
            raise

    def deleted(self) -> bool:
        return bool(_DELETED.unpack_from(self.mm, _DELETED_OFFSET)[0])

    def valid(self) -> bool:
        magic, version = _MAGIC.unpack_from(self.mm, 0)
        return magic == TAIL_MAGIC and version == TAIL_VERSION

    def torn(self) -> bool:
        """True when the sequence number is odd: a writer is mid-update, or (seen under
        the partition lock) one died between the two halves of its update."""
        return bool(_SEQ.unpack_from(self.mm, _SEQ_OFFSET)[0] & 1)

    def read(self) -> Tail | None:
        """A consistent snapshot, or None when the tail stays torn: after
        SEQLOCK_SPINS_BEFORE_SLEEP torn reads in a row while nobody holds the partition
        lock (its writer died mid-update: the caller repairs it under the lock, at
        once rather than after a second of spinning), else after SEQLOCK_SPINS."""
        mm = self.mm
        for spin in range(SEQLOCK_SPINS):
            seq = _SEQ.unpack_from(mm, _SEQ_OFFSET)[0]
            if not seq & 1:
                body = _BODY.unpack_from(mm, _BODY_OFFSET)
                if _SEQ.unpack_from(mm, _SEQ_OFFSET)[0] == seq:
                    return Tail._make(body)
            if spin == SEQLOCK_SPINS_BEFORE_SLEEP and not self._writer_alive():
                return None
            if spin > SEQLOCK_SPINS_BEFORE_SLEEP:
                time.sleep(0.0001)
        return None

    def _writer_alive(self) -> bool:
        """Whether some thread or process holds the partition lock now. Probed through
        a descriptor of its own: flock locks belong to an open file description, so a
        probe on `fd` would succeed against (and its unlock release) a lock this
        process's own appender holds on it."""
        try:
            probe = open_file(self.path, os.O_RDONLY)
        except OSError:
            return True                      # cannot tell: keep waiting, as before
        try:
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False                     # free: nobody is mid-update
        except OSError:
            return True
        finally:
            os.close(probe)                  # releases the probe's lock with it

    def read_locked(self) -> Tail | None:
        """The tail as the lock holder sees it: no writer can be mid-update, so a body
        is whole unless the file is invalid or a dead writer left it torn (None: the
        caller repairs it). One unpack of the header; no spinning."""
        magic, version, seq = _MAGIC_SEQ.unpack_from(self.mm, 0)
        if magic != TAIL_MAGIC or version != TAIL_VERSION or seq & 1:
            return None
        return Tail._make(_BODY.unpack_from(self.mm, _BODY_OFFSET))

    def read_torn(self) -> Tail:
        """The fields as a writer that died mid-update left them (each old or new)."""
        return Tail._make(_BODY.unpack_from(self.mm, _BODY_OFFSET))

    def write(self, tail: Tail | tuple) -> None:
        """Publish `tail` under the seqlock (caller holds the partition lock)."""
        _SEQ.pack_into(self.mm, _SEQ_OFFSET, self._write_torn(tail) + 1)

    def _write_torn(self, tail: Tail | tuple) -> int:
        """The first half of a publish: the sequence number made odd (an odd one a dead
        writer left stays), the header and the body written; returns the odd number."""
        mm = self.mm
        seq = _SEQ.unpack_from(mm, _SEQ_OFFSET)[0] | 1
        _SEQ.pack_into(mm, _SEQ_OFFSET, seq)
        _MAGIC.pack_into(mm, 0, TAIL_MAGIC, TAIL_VERSION)
        _BODY.pack_into(mm, _BODY_OFFSET, *tail)
        return seq

    def publish(self, tail: Tail) -> None:
        """Write `tail` stamped with this boot's id (every publish does)."""
        self.write((BOOT_ID, *tail[1:]))

    def publish_torn(self, tail: Tail) -> None:
        """`publish`'s first half alone: `tail` written, the sequence number left odd as
        a writer that died mid-update leaves it (caller holds the partition lock).
        Until recovery publishes a whole tail, every other reader waits for the lock
        and every other lock holder recovers first — also when this process dies
        before that. For a change of files that no single publish can describe (a
        truncation's swap of the active segment); recovery reads the body, recovery
        point included."""
        self._write_torn((BOOT_ID, *tail[1:]))

    def sync(self) -> None:
        self.mm.flush()

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)
