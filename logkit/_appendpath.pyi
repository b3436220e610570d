"""Type stub of the optional C extension `logkit._appendpath` (logkit/_appendpath.c): the
append path's short system calls, made without releasing the GIL, its common case
under the partition lock in one call, and the whole uncontended append (`Appender`).
Import it through `logkit._native`, which chooses once."""

from typing import Any

HELD_WRITE_MAX: int

def pwrite(fd: int, data: Any, offset: int) -> int:
    """os.pwrite; the GIL is kept for writes of at most HELD_WRITE_MAX bytes."""

def flock(fd: int, operation: int) -> None:
    """fcntl.flock for LOCK_UN or a non-blocking lock request (LOCK_NB); a blocking
    request raises ValueError."""

def append_common(tail: Any, batch: bytearray, fd: int, index: Any, index_reserved: int,
                  timeindex: Any, timeindex_reserved: int, active_base: int,
                  segments_version: int, boot_id: bytes, segment_bytes: int,
                  segment_ms: int, index_interval_bytes: int, flush_messages: int) -> int:
    """The partition log's common append under its lock: the base offset, or -1 with
    nothing changed when the Python append must decide; OSError when the write fails
    or is short, with nothing published."""


class Appender:
    """A partition log's whole append for one active segment in one call, when it is
    uncontended and needs no decision (PartitionLog._arm makes it)."""

    appended: int
    handed_back: int

    def __init__(self, pid: int, append_lock: Any, thread_lock: Any, tail_fd: int,
                 tail: Any, fd: int, index: Any, index_reserved: int, timeindex: Any,
                 timeindex_reserved: int, active_base: int, segments_version: int,
                 boot_id: bytes, segment_bytes: int, segment_ms: int,
                 index_interval_bytes: int, flush_messages: int, max_message_bytes: int,
                 codec: int, doorbell: Any, change_offset: int, cut_back: Any,
                 unlock: Any) -> None: ...

    def append(self, batch: Any, expect_end: int = -1) -> int:
        """The base offset, the locks taken and let go and the doorbell rung; -1 with
        nothing taken or changed when the Python append must decide (a batch naming a
        producer id: also unless the log ends at `expect_end`); OSError after
        `cut_back(position)` ran under the lock when the write failed."""
