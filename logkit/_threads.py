"""Starting logkit's background threads.

Owns: `start_thread`, the one way logkit starts a thread: a process at its thread limit
(or out of memory) gets a named `ResourceError` instead of Python's bare RuntimeError,
so a caller can tell "no thread to be had" from a bug.
"""

from __future__ import annotations

from typing import Any

from .errors import ResourceError

__all__ = ["start_thread"]


def start_thread(thread: Any, what: str) -> None:
    """`thread.start()`, with Python's RuntimeError for a thread that cannot be had
    raised as ResourceError naming `what` (the cause kept)."""
    try:
        thread.start()
    except RuntimeError as exc:
        raise ResourceError(f"could not start {what}: {exc} (the process is at its "
                            "thread limit or out of memory)") from exc
