"""Type stubs for the optional C extension logkit._doorbell (logkit/_doorbell.c)."""

from typing import Any

HAVE_FUTEX: int

def ring(buffer: Any, offset: int) -> None: ...
def wait(buffer: Any, offset: int, seen: int, timeout_s: float, spin_s: float) -> int: ...
