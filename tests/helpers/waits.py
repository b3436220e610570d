"""Test helper: wait until a thread is blocked in the wait a test means to interrupt.

A test that closes, appends or rings "while another thread waits" proves nothing when
that thread has not reached its wait yet: it then finds the state changed before it
looks and never waits at all. A sleep does not make it wait; this helper looks instead:
it reads every thread's Python stack (`sys._current_frames`, CPython) and finds those
inside `Doorbell.wait` (logkit/notify.py), the one place a logkit poll, iteration or
long-poll fetch sleeps, optionally below a named function (`fetch` for the listener's
handler). No hook in the code under test is needed: a thread in a futex wait, in the
C extension or through ctypes, still has `Doorbell.wait`'s frame on its stack.
"""

from __future__ import annotations

import os
import sys
import threading
import time

_NOTIFY = os.path.join("logkit", "notify.py")


def _stack_names(frame) -> list[tuple[str, str]]:
    names = []
    while frame is not None:
        names.append((frame.f_code.co_name, frame.f_code.co_filename))
        frame = frame.f_back
    return names


def in_doorbell_wait(thread_ids=None, under: str | None = None) -> set[int]:
    """The ids of the threads (of `thread_ids`, else all) now inside Doorbell.wait,
    below a frame of function `under` when given."""
    found = set()
    for ident, frame in sys._current_frames().items():
        if thread_ids is not None and ident not in thread_ids:
            continue
        names = _stack_names(frame)
        if not any(name == "wait" and path.endswith(_NOTIFY) for name, path in names):
            continue
        if under is not None and not any(name == under for name, _ in names):
            continue
        found.add(ident)
    return found


def wait_for_doorbell_wait(threads: list[threading.Thread] | None = None, *,
                           under: str | None = None, count: int = 1,
                           timeout_s: float = 20.0) -> None:
    """Return once each of `threads` (else `count` threads of this process) is blocked in
    Doorbell.wait; AssertionError naming what was seen after `timeout_s`."""
    ids = None if threads is None else {t.ident for t in threads}
    need = count if threads is None else len(threads)
    deadline = time.monotonic() + timeout_s
    while True:
        waiting = in_doorbell_wait(ids, under)
        if len(waiting) >= need:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"{need} thread(s) should be waiting on the doorbell "
                                 f"after {timeout_s} s; {len(waiting)} are")
        time.sleep(0.001)      # polling a state with a deadline, not a guess at a delay


def until(predicate, what: str, timeout_s: float = 20.0) -> None:
    """Return once predicate() is true (checked every millisecond); AssertionError
    naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.001)
