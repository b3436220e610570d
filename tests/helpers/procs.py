"""Test helper: group-member processes (tests/helpers/group_worker.py) driven from a
test, their stdout collected by a thread; and a bounded wait for liveness."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "group_worker.py")


class Worker:
    """A group member process whose stdout lines are collected by a thread."""

    def __init__(self, root, group, topic, mode):
        self.proc = subprocess.Popen([sys.executable, WORKER, str(root), group, topic, mode],
                                     stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": ROOT_DIR})
        self.lines: list[str] = []
        assert self.proc.stdout.readline().strip() == "ready"
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def owned(self):
        latest = [line for line in self.lines if line.startswith("owned")]
        if not latest:
            return set()
        body = latest[-1][len("owned "):]
        return {tuple(x.split("/")) for x in body.split(",") if x}

    def records(self):
        return [tuple(map(int, line.split()[1:])) for line in self.lines
                if line.startswith("rec ")]

    def kill(self):
        """SIGKILL: no cleanup, no leave, no commit."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.reader.join(timeout=10)

    def stop(self):
        """SIGTERM, then collect every line it printed."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.reader.join(timeout=10)


def wait_until(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
