"""Cross-process wake-ups: a broker-wide doorbell that appenders ring and pollers wait on.

Owns: `<root>/doorbell`, a 4 KiB file mmap'd by every process with the broker open. Its
first 32-bit word is a counter: an appender bumps it after publishing a batch and wakes
every process sleeping on it with a Linux futex (a shared-memory wait queue; the same
syscall that backs pthread mutexes). A poller reads the counter, checks its partitions,
and sleeps until the counter changes or its timeout passes, so a blocked `poll()` costs
no CPU and wakes within microseconds of an append in any process.

Invariant: a waiter never sleeps past its timeout, and never longer than
`MAX_SLEEP_S` at a time: two appenders in different processes can bump the counter to the
same value (the bump is not atomic across processes), and the cap bounds the cost of that
rare missed change. Where futexes are unavailable (not Linux, unknown architecture),
waiting falls back to short sleeps.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import struct
import time

__all__ = ["Doorbell"]

DOORBELL_FILE = "doorbell"
MAX_SLEEP_S = 0.005
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(
    platform.machine().lower())
_WORD = struct.Struct("<I")


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


class Doorbell:
    """The doorbell of one broker root. Thread-safe; `close()` is safe twice."""

    def __init__(self, root: str) -> None:
        path = os.path.join(root, DOORBELL_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < mmap.PAGESIZE:
                os.ftruncate(fd, mmap.PAGESIZE)
            self._mm: mmap.mmap | None = mmap.mmap(fd, mmap.PAGESIZE)
        finally:
            os.close(fd)
        self._word = ctypes.c_uint32.from_buffer(self._mm)
        self._address = ctypes.addressof(self._word)

    def value(self) -> int:
        return self._word.value

    def ring(self) -> None:
        """Announce new data to every waiting process."""
        word = self._word
        word.value = (word.value + 1) & 0xFFFFFFFF
        if _syscall is not None:
            _syscall(_SYS_FUTEX, ctypes.c_void_p(self._address), _FUTEX_WAKE, 0x7FFFFFFF,
                     None, None, 0)

    def wait(self, seen: int, timeout_s: float) -> None:
        """Sleep until the counter differs from `seen`, or timeout_s (capped) passes."""
        timeout_s = min(timeout_s, MAX_SLEEP_S)
        if timeout_s <= 0:
            return
        if _syscall is None:
            time.sleep(min(timeout_s, 0.0002))
            return
        seconds = int(timeout_s)
        spec = _Timespec(seconds, int((timeout_s - seconds) * 1e9))
        _syscall(_SYS_FUTEX, ctypes.c_void_p(self._address), _FUTEX_WAIT,
                 ctypes.c_uint32(seen), ctypes.byref(spec), None, 0)

    def close(self) -> None:
        if self._mm is not None:
            del self._word
            self._mm.close()
            self._mm = None
