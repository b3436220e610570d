"""Type stub of the optional C extension `logkit._shortio` (logkit/_shortio.c): the
append path's short system calls, made without releasing the GIL. Import it through
`logkit._native`, which chooses once."""

from typing import Any

HELD_WRITE_MAX: int

def pwrite(fd: int, data: Any, offset: int) -> int:
    """os.pwrite; the GIL is kept for writes of at most HELD_WRITE_MAX bytes."""

def flock(fd: int, operation: int) -> None:
    """fcntl.flock for LOCK_UN or a non-blocking lock request (LOCK_NB); a blocking
    request raises ValueError."""
