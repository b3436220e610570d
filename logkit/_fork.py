"""Process identity, for fork safety.

Owns: the pid of the running process as seen by every logkit object. A `Broker` and
everything opened from it (topics, partitions, producers, consumers, groups) records
`owner_pid()` when it is made and calls `check_owner()` before touching a file; in a
process forked after that, the check raises `ForkedProcessError` and nothing is
touched. The inherited flock belongs to the parent's open file description and copied
thread locks may be held by threads that do not exist in the child, so an inherited
object can never be used safely: the child opens its own `Broker`.

`os.register_at_fork` keeps the pid current without a system call per check, and runs
the after-fork hooks other modules register with `at_fork_in_child` (for example the
metadata store dropping the parent's LMDB handles, which LMDB forbids using after fork).
"""

from __future__ import annotations

import os
from typing import Callable

from .errors import ForkedProcessError

__all__ = ["owner_pid", "check_owner", "at_fork_in_child"]

_pid = os.getpid()
_hooks: list[Callable[[], None]] = []


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()
    for hook in _hooks:
        hook()


os.register_at_fork(after_in_child=_after_fork_in_child)


def owner_pid() -> int:
    """The current process's pid (kept current across forks without a syscall)."""
    return _pid


def check_owner(pid: int, what: str) -> None:
    """Raise ForkedProcessError when `pid` (an object's creator) is not this process."""
    if pid != _pid:
        raise ForkedProcessError(
            f"{what} was opened in process {pid} and cannot be used in the forked process "
            f"{_pid}; open a new logkit.Broker(path) in the child")


def at_fork_in_child(hook: Callable[[], None]) -> None:
    """Run `hook()` in every child right after a fork (after the pid is updated)."""
    _hooks.append(hook)
