"""The partition's append lock across threads and processes: a thread lock, then an
exclusive `flock` on the tail file, taken with a deadline.

Owns: taking and releasing both locks (`_locked`), reading the tail under them
(`_locked_tail`: a tail torn by a writer that died mid-update is repaired by recovery
first, the same way on every path), and the bounded wait for a lock another process
holds (polling `LOCK_NB` with growing sleeps up to `_LOCK_POLL_S`, never a blocking
flock, so a stalled holder costs a `LogkitTimeoutError`, not a hang). Invariant: every
mutation of a partition directory happens inside `_locked_tail()`.

A mixin of `PartitionLog` (log.py), which owns the state it reads and writes.
"""

from __future__ import annotations

import fcntl
import logging
import time
from contextlib import contextmanager
from typing import Iterator

from ._native import appendpath
from .errors import LogkitTimeoutError, ReadOnlyError, StorageError, storage_error
from .tail import Tail, TailFile

log = logging.getLogger("logkit.log")

LOCK_TIMEOUT_S = 30.0                 # default bound on waiting for the append lock
_LOCK_POLL_S = (0.00005, 0.005)       # first and longest sleep between flock tries
# A try for the flock and its release that keep the GIL (logkit/_appendpath.c): each
# GIL hand-over around a system call costs two context switches when another thread
# of the process is busy, as a producer's sender thread is.
_flock_now = fcntl.flock if appendpath is None else appendpath.flock


class _PartitionLock:
    """The append lock of `PartitionLog` (see the module docstring)."""

    def _acquire(self, timeout_s: float | None) -> None:
        """Take the append lock: this process's appenders queue on `_append_lock`, then
        the flock excludes other processes, then `_thread_lock` excludes our readers for
        the (short) mutation. Waits at most `timeout_s` (None: no bound) in all, then
        raises LogkitTimeoutError; the deleted flag is checked once the lock is held.
        On any error nothing stays held. `_release` undoes it."""
        self._check_usable()
        if self.read_only:
            raise ReadOnlyError(f"partition {self.name} is open read-only")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if not self._append_lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
            raise self._lock_timeout(timeout_s)
        try:
            self._flock(deadline, timeout_s)
            try:
                self._thread_lock.acquire()
                try:
                    self._check_usable()
                except BaseException:
                    self._thread_lock.release()
                    raise
            except BaseException:
                self._funlock()
                raise
        except BaseException:
            self._append_lock.release()
            raise

    def _release(self) -> None:
        """Release what `_acquire` took, innermost first."""
        try:
            self._thread_lock.release()
            self._funlock()
        finally:
            self._append_lock.release()

    @contextmanager
    def _locked(self, timeout_s: float | None = LOCK_TIMEOUT_S) -> Iterator[None]:
        """The append lock alone (recovery and opening use it; every other mutation
        uses `_locked_tail`)."""
        self._acquire(timeout_s)
        try:
            yield
        finally:
            self._release()

    @contextmanager
    def _locked_tail(self, operation: str,
                     timeout_s: float | None = LOCK_TIMEOUT_S) -> Iterator[Tail]:
        """The append lock, with the current tail (repaired first if torn) and the
        segment list refreshed to it: the prelude of every mutation. An I/O error in
        the prelude raises StorageError naming `operation`. (The append takes the
        prelude without this generator, which costs it a microsecond per batch.)"""
        tail = self._lock_tail(operation, timeout_s)
        try:
            yield tail
        finally:
            self._release()

    def _lock_tail(self, operation: str, timeout_s: float | None) -> Tail:
        """`_locked_tail`'s prelude: the lock taken, the tail read and the segment list
        refreshed; the caller `_release`s. On any error nothing stays held."""
        self._acquire(timeout_s)
        try:
            tail = self._tail_under_lock()
            self._refresh(tail)
        except BaseException as exc:
            self._release()
            if isinstance(exc, OSError):
                raise storage_error(exc, operation, self.directory) from exc
            raise
        return tail

    def _tail_under_lock(self) -> Tail:
        """The tail, read under the lock. No live writer can be mid-update, so a torn or
        invalid tail was left by a writer that died: recovery repairs it (the one way a
        torn tail is handled, whichever path meets it)."""
        tail = self._tail_file.read_locked()
        if tail is None:
            self._recover(full=not self._tail_file.valid())
            tail = self._tail_file.read_locked()
            if tail is None:    # recovery just published it, and we hold the lock
                raise StorageError(f"the tail state of {self.name} stays torn after "
                                   "recovery", operation="recover",
                                   path=self._tail_file.path)
        return tail

    def _lock_timeout(self, timeout_s: float | None) -> LogkitTimeoutError:
        return LogkitTimeoutError(f"the append lock of {self.name} was not free within "
                                  f"{timeout_s} s (another process holds it: "
                                  f"{self._tail_file.path})")

    def _flock(self, deadline: float | None, timeout_s: float | None) -> None:
        fd = self._tail_file.fd
        try:
            sleep_s = _LOCK_POLL_S[0]
            while True:
                try:
                    _flock_now(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # first: the common case
                    return
                except BlockingIOError:
                    pass
                if deadline is None:
                    fcntl.flock(fd, fcntl.LOCK_EX)                  # waits, GIL released
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._lock_timeout(timeout_s) from None
                time.sleep(min(sleep_s, left))
                sleep_s = min(sleep_s * 2, _LOCK_POLL_S[1])
        except LogkitTimeoutError:
            raise                         # a TimeoutError is an OSError: not an I/O fault
        except OSError as exc:
            raise storage_error(exc, "lock", self._tail_file.path) from exc

    def _funlock(self) -> None:
        """Release the flock. What was done under it is done: a failing unlock must not
        turn a stored append into an error, so fall back to closing the descriptor,
        which releases the lock with it, and reopen the tail file."""
        try:
            _flock_now(self._tail_file.fd, fcntl.LOCK_UN)
        except OSError as exc:
            log.warning("unlock of %s failed (%s); reopening it to release the lock",
                        self._tail_file.path, exc)
            old = self._tail_file
            self._arm(None)                   # it names the old handle
            try:
                self._tail_file = TailFile(old.path)
            except OSError:
                log.error("could not reopen %s; the partition is closed", old.path)
                self._closed = True
            old.close()
