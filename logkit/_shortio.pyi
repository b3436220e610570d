"""Type stub of the optional C extension `logkit._shortio` (logkit/_shortio.c): the
append path's short system calls, made without releasing the GIL, and its common case
under the partition lock in one call. Import it through
`logkit._native`, which chooses once."""

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
