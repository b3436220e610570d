"""Cross-process wake-ups: a broker-wide doorbell that appenders ring and pollers wait on.

Owns: `<root>/doorbell`, a 4 KiB file mmap'd by every process with the broker open. Its
first 32-bit word is a counter: an appender bumps it after publishing a batch and wakes
every process sleeping on it with a Linux futex (a shared-memory wait queue; the same
syscall that backs pthread mutexes). A poller reads the counter, checks its partitions,
and sleeps until the counter changes or its timeout passes, so a blocked `poll()` costs
no CPU and wakes within microseconds of an append in any process.

Invariant: a waiter never sleeps past its timeout, and never longer than
`MAX_SLEEP_S` at a time (after at most `MAX_SPIN_S` of spinning): two appenders in
different processes can bump the counter to the same value (the ctypes path's bump is
not atomic across processes; the C path's is), and the cap bounds the cost of that
rare missed change. Where futexes are unavailable (not Linux, unknown architecture),
waiting falls back to short sleeps.

A second word, at `METADATA_WORD_OFFSET` (its own cache line), counts topic metadata
changes (a topic's partitions grown: `Broker.create_partitions`): bumped after the
change commits, read by producers once per batch to learn a new partition count
without a metadata read per record. It is a hint, not the truth: a reader that sees it
move reads the topic records; one that misses a bump (two bumps racing to one value,
a writer killed between its commit and its bump) learns at its periodic re-read.
A third, at `GROUPS_WORD_OFFSET`, counts rebalances (a group's members or assignment
changed: group.py bumps it after the write commits), so a polling group member reads
its generation from LMDB only when it moved — a hint too, with a periodic re-read
behind it (logkit/coordinator.py).

Which partitions changed: the rest of the page, from `CHANGES_OFFSET`, is a table of
`CHANGE_SLOTS` 32-bit counters. An appender bumps its partition's slot
(`change_slot(topic, partition)`, a hash: partitions may share one) after publishing and
before ringing; a ring that names no partition (a follower's progress, a rebalance)
bumps slot 0, which means "anything may have changed". A poller snapshots the table
(`changes()`) before it reads its partitions; when the ring word has moved, the slots
that differ from its previous snapshot (`changed_slots`) name the only partitions worth
reading again, so a poll after an append to one partition of 3,000 reads that one, not
all of them. A bump is not atomic across processes; two racing bumps of one slot may
leave it one step on instead of two, which still differs from every snapshot taken
before both, and each bumper published before it read the slot, so a snapshot taken
after that read already sees both appends.

The futex calls go through `logkit._doorbell` (C: no ctypes conversion per call, the
GIL released, the ring word bumped atomically) when it is built; otherwise through
ctypes, which behaves the same. `wait()` can spin on the word for a bounded time
before it sleeps (`spin_s`, at most `MAX_SPIN_S`; the consumer's `poll_spin_us`): a
change seen while spinning skips the sleeping process's wake-up, at the price of the
CPU spent spinning.

The file is opened without following links (a link planted at the path raises
`StorageError` naming it) and allocated for real before it is mapped, so a full disk
raises `DiskFullError` at open instead of SIGBUS at the first ring.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import platform
import stat
import struct
import time
import zlib
from typing import Collection

from . import _native
from .errors import StorageError, storage_error

__all__ = ["Doorbell", "change_slot", "changed_slots", "CHANGE_SLOTS"]

log = logging.getLogger(__name__)

DOORBELL_FILE = "doorbell"
MAX_SLEEP_S = 0.005
MAX_SPIN_S = 0.01                  # the longest spin wait() does before it sleeps
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(
    platform.machine().lower())
_WORD = struct.Struct("<I")
METADATA_WORD_OFFSET = 64          # the metadata-change counter, apart from the ring word
GROUPS_WORD_OFFSET = 128           # the group-membership change counter
CHANGES_OFFSET = 256               # the per-partition change slots, to the page's end
CHANGE_SLOTS = (4096 - CHANGES_OFFSET) // 4    # slot 0: "anything may have changed"
_CHUNK = 64                        # changed_slots compares this many bytes at a time


def change_slot(topic: str, partition: int) -> int:
    """The change slot of partition `partition` of `topic` (1..CHANGE_SLOTS-1): the
    same in every process."""
    return 1 + zlib.crc32(f"{topic}-{partition}".encode()) % (CHANGE_SLOTS - 1)


def change_offset(slot: int) -> int:
    """Where change slot `slot`'s counter sits in the doorbell page (slot 0's for any
    slot out of range): what `Doorbell.ring` adds one to, and the C append with it."""
    return CHANGES_OFFSET + 4 * (slot if 0 <= slot < CHANGE_SLOTS else 0)


def changed_slots(before: bytes, after: bytes,
                  among: Collection[int] | None = None) -> list[int] | None:
    """The slots whose counters differ between two `changes()` snapshots, or None when
    slot 0 moved (a ring that named no partition: anything may have changed). `among`:
    only these slots matter (a poller's), checked one by one when they are few."""
    if before == after:
        return []
    if before[:4] != after[:4]:
        return None
    if among is not None and len(among) <= CHANGE_SLOTS // 16:
        return [slot for slot in among
                if before[4 * slot:4 * slot + 4] != after[4 * slot:4 * slot + 4]]
    out = []
    for start in range(0, len(after), _CHUNK):
        end = start + _CHUNK
        if before[start:end] != after[start:end]:
            out.extend(i // 4 for i in range(start, end, 4)
                       if before[i:i + 4] != after[i:i + 4])
    return out


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_syscall():
    if _SYS_FUTEX is None or not platform.system() == "Linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
        syscall.restype = ctypes.c_long
        return syscall
    except (OSError, AttributeError):
        return None


_syscall = _load_syscall()


def _load_extension():
    """logkit._doorbell as logkit/_native.py chose it, when it has the futex."""
    if _native.doorbell is None:
        log.debug("logkit._doorbell is not loaded: the doorbell's futex calls go "
                  "through ctypes")
        return None
    return _native.doorbell if _native.doorbell.HAVE_FUTEX else None


_cdoorbell = _load_extension()        # tests set it to None to run the ctypes path


class Doorbell:
    """The doorbell of one broker root. Thread-safe; `close()` is safe twice, and safe
    while other threads wait or ring: after it, `wait()` returns at once, `ring()` does
    nothing and `value()` reads 0.

    Closing unmaps the page only when no other thread is using it: `ring()`, `value()`
    and `wait()` hold a reference to the mapped word for the duration of the call (which
    pins the mapping: `mmap.close()` refuses while a buffer is exported), so a close
    that races them leaves the unmap to the garbage collector instead of pulling the
    page from under a store or a futex wait. In a forked child the inherited page is the
    parent's shared mapping; closing it there unmaps it in the child only."""

    def __init__(self, root: str) -> None:
        path = os.path.join(root, DOORBELL_FILE)
        try:
            # O_NOFOLLOW: a link planted at the path must not redirect our writes.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StorageError(f"refusing to open the doorbell {path}: it is a "
                                   "symbolic link", operation="open doorbell", path=path,
                                   errno=exc.errno) from exc
            raise storage_error(exc, "open doorbell", path) from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StorageError(f"refusing to open the doorbell {path}: not a regular "
                                   "file", operation="open doorbell", path=path)
            # Real blocks, not a sparse hole: a full disk fails here with ENOSPC rather
            # than with SIGBUS at the first store into the mapped page.
            os.posix_fallocate(fd, 0, mmap.PAGESIZE)
            mm = mmap.mmap(fd, mmap.PAGESIZE)
        except OSError as exc:
            raise storage_error(exc, "open doorbell", path) from exc
        finally:
            os.close(fd)
        self._mm: mmap.mmap | None = mm
        self._word: ctypes.c_uint32 | None = ctypes.c_uint32.from_buffer(mm)
        self._metadata: ctypes.c_uint32 | None = ctypes.c_uint32.from_buffer(
            mm, METADATA_WORD_OFFSET)
        self._groups: ctypes.c_uint32 | None = ctypes.c_uint32.from_buffer(
            mm, GROUPS_WORD_OFFSET)
        self._address = ctypes.addressof(self._word)

    @property
    def closed(self) -> bool:
        return self._word is None

    def value(self) -> int:
        word = self._word
        return 0 if word is None else word.value

    def metadata_version(self) -> int:
        """The topic-metadata change counter (0 once closed)."""
        word = self._metadata
        return 0 if word is None else word.value

    def metadata_changed(self) -> None:
        """Announce a committed topic metadata change to every process (nothing once
        closed); nobody sleeps on this word, so no wake-up is sent."""
        word = self._metadata
        if word is not None:
            word.value = (word.value + 1) & 0xFFFFFFFF

    def groups_version(self) -> int:
        """The rebalance counter (0 once closed)."""
        word = self._groups
        return 0 if word is None else word.value

    def groups_changed(self) -> None:
        """Announce a committed rebalance to every process (nothing once closed), and
        ring the data word too: a member waiting in `poll()` sleeps on that word, so it
        wakes and runs the rebalance now rather than at the end of its sleep slice."""
        word = self._groups
        if word is not None:
            word.value = (word.value + 1) & 0xFFFFFFFF
            self.ring()

    def changes(self) -> bytes | None:
        """A snapshot of the change slots (None once closed); see the module docstring."""
        mm = self._mm
        if mm is None:
            return None
        try:
            return mm[CHANGES_OFFSET:CHANGES_OFFSET + 4 * CHANGE_SLOTS]
        except ValueError:                     # closed meanwhile
            return None

    def ring(self, slot: int = 0) -> None:
        """Announce new data to every waiting process (nothing once closed): in
        partition slot `slot` (`change_slot`), or anywhere (0)."""
        word = self._word                      # pins the page for this call
        if word is None:
            return
        extension, mm = _cdoorbell, self._mm
        if mm is not None:
            offset = change_offset(slot)
            try:
                _WORD.pack_into(mm, offset,
                                (_WORD.unpack_from(mm, offset)[0] + 1) & 0xFFFFFFFF)
            except ValueError:                 # closed meanwhile: nothing to ring
                return
        if extension is not None and mm is not None:
            try:
                extension.ring(mm, 0)          # holds the mapping for the call itself
            except ValueError:                 # closed meanwhile: nothing to ring
                pass
            return
        word.value = (word.value + 1) & 0xFFFFFFFF
        if _syscall is not None:
            _syscall(_SYS_FUTEX, ctypes.c_void_p(self._address), _FUTEX_WAKE, 0x7FFFFFFF,
                     None, None, 0)

    def wait(self, seen: int, timeout_s: float, spin_s: float = 0.0) -> None:
        """Sleep until the counter differs from `seen`, or timeout_s (capped at
        MAX_SLEEP_S) passes; first spin on the counter for up to spin_s (capped at
        MAX_SPIN_S and at timeout_s). Returns at once once closed."""
        spin_s = max(min(spin_s, MAX_SPIN_S, timeout_s), 0.0)
        timeout_s = min(timeout_s, spin_s + MAX_SLEEP_S)     # the sleep's cap after it
        word = self._word                      # pins the page across the futex wait
        if timeout_s <= 0 or word is None:
            return
        extension, mm = _cdoorbell, self._mm
        if extension is not None and mm is not None:
            try:
                extension.wait(mm, 0, seen, timeout_s, spin_s)
            except ValueError:                 # closed meanwhile: return at once
                pass
            return
        if spin_s > 0:
            end = time.monotonic() + spin_s
            while word.value == seen:
                if time.monotonic() >= end:
                    break
            else:
                return
            timeout_s -= spin_s
        if _syscall is None:
            time.sleep(min(timeout_s, 0.0002))
            return
        seconds = int(timeout_s)
        spec = _Timespec(seconds, int((timeout_s - seconds) * 1e9))
        _syscall(_SYS_FUTEX, ctypes.c_void_p(self._address), _FUTEX_WAIT,
                 ctypes.c_uint32(seen), ctypes.byref(spec), None, 0)

    def close(self) -> None:
        mm, self._mm = self._mm, None
        self._word = self._metadata = self._groups = None     # from here on: no-ops
        if mm is None:
            return
        try:
            mm.close()
        except BufferError:
            pass    # another thread is in ring()/wait(): the GC unmaps after it returns
