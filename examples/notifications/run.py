"""Run the notification example: the REST proxy, service A and service B, then updates.

Owns: starting the three parts on 127.0.0.1 (the proxy here, over a fresh broker
directory; A and B as separate processes on free ports), sending updates to A over
HTTP, and waiting — with a deadline, on the state itself — until B's copy equals A's
records. tests/kit/test_notifications_example.py drives the same helpers and also kills
B half-way.

Run: python examples/notifications/run.py [UPDATES]
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import logkit

HERE = os.path.dirname(os.path.abspath(__file__))
TOPIC = "account-updated"
ACCOUNTS = 10


class Service:
    """One service process; `url` is where it serves, read from its first stdout line."""

    def __init__(self, name: str, args: list[str], log_path: str,
                 timeout: float = 30.0) -> None:
        self.name = name
        self._log = open(log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(HERE, f"service_{name}.py"), *args],
            stdout=subprocess.PIPE, stderr=self._log)
        self.url = self._read_url(timeout)

    def _read_url(self, timeout: float) -> str:
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout):
                self.kill()
                raise TimeoutError(f"service {self.name} did not start in {timeout} s")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"service {self.name} exited with {self.process.wait()}; "
                               f"see {self._log.name}")
        return json.loads(line)["url"]

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, and wait: the service closes its consumer instance and its files."""
        self.process.send_signal(signal.SIGTERM)
        return self._reap(timeout)

    def kill(self) -> int:
        """SIGKILL: nothing of the service's shutdown runs."""
        self.process.kill()
        return self._reap(30.0)

    def _reap(self, timeout: float) -> int:
        code = self.process.wait(timeout)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()
        return code


def start_a(data_dir: str, work_dir: str, port: int = 0) -> Service:
    return Service("a", [data_dir, os.path.join(work_dir, "a.sqlite"), "--port", str(port)],
                   os.path.join(work_dir, "a.log"))


def start_b(rest_url: str, a_url: str, work_dir: str) -> Service:
    return Service("b", [rest_url, a_url, os.path.join(work_dir, "b.sqlite")],
                   os.path.join(work_dir, "b.log"))


def call(method: str, url: str, body: Any = None) -> Any:
    """One JSON request; returns the decoded answer, or None for a 404."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def update(a: Service, account: str, balance: int) -> dict[str, Any]:
    """PUT one account's balance to A; A answers after its write and its publish."""
    return call("PUT", f"{a.url}/accounts/{account}", {"balance": balance})


def a_records(a: Service, accounts: list[str]) -> dict[str, dict[str, Any]]:
    return {i: r for i in accounts if (r := call("GET", f"{a.url}/accounts/{i}")) is not None}


def b_copies(b: Service) -> dict[str, dict[str, Any]]:
    return call("GET", f"{b.url}/copies")


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `condition` until it holds; raise TimeoutError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached in {timeout} s")
        time.sleep(0.02)                             # a poll interval, not a synchronisation


def run(work_dir: str, updates: int = 20) -> dict[str, Any]:
    """The whole flow once; returns A's records and B's copies."""
    data_dir = os.path.join(work_dir, "log")
    accounts = [f"acct-{i}" for i in range(ACCOUNTS)]
    with logkit.Broker(data_dir) as broker, broker.serve_rest() as rest:
        a = start_a(data_dir, work_dir)
        try:
            b = start_b(rest.url, a.url, work_dir)
            try:
                for n in range(updates):
                    update(a, accounts[n % ACCOUNTS], 100 * n)
                want = a_records(a, accounts)
                wait_until(lambda: b_copies(b) == want, 30, "B's copy equal to A's records")
                got = b_copies(b)
            finally:
                b.stop()
        finally:
            a.stop()
    return {"a": want, "b": got, "proxy": rest.url}


def main() -> None:
    updates = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    work_dir = tempfile.mkdtemp(prefix="logkit-notifications-")
    try:
        result = run(work_dir, updates)
    finally:
        shutil.rmtree(work_dir)
    print(f"REST proxy at {result['proxy']}; A holds {len(result['a'])} accounts after "
          f"{updates} updates; B's copy is "
          f"{'in sync' if result['a'] == result['b'] else 'STALE'}")
    for account, record in result["b"].items():
        print(f"  {account}: balance {record['balance']}, version {record['version']}")


if __name__ == "__main__":
    main()
