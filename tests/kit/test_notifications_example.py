"""The notification example (examples/notifications/) runs as a user would run it: a
broker directory and its REST proxy, service A (aiohttp, SQLite, logkit.aio) and service
B (aiohttp, SQLite, the proxy's v2 consumer API) as separate processes on 127.0.0.1, and
updates sent to A over HTTP. Every wait is on a state with a deadline."""

from __future__ import annotations

import importlib.util
import os
import selectors
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

import logkit

pytest.importorskip("aiohttp")

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_PY = os.path.join(CHECKOUT, "examples", "notifications", "run.py")

UPDATES = 50
SETTLED = 20          # updates B has handled and committed before anything goes wrong
STUCK = 5             # updates B has fetched but not committed when it is killed
DEADLINE_S = 30

def load_run() -> object:
    """examples/notifications/run.py, imported under a name no other test uses."""
    spec = importlib.util.spec_from_file_location("notifications_run", RUN_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def account_for(n: int) -> str:
    """Updates 0-19 touch acct-0..9; the STUCK ones acct-5..9; the rest only acct-0..4.
    So a lost notification among the stuck ones stays visible in B's copy at the end."""
    if n < SETTLED:
        return f"acct-{n % 10}"
    if n < SETTLED + STUCK:
        return f"acct-{5 + n % 5}"
    return f"acct-{n % 5}"


def test_the_example_runs_as_documented(tmp_path):
    """run.py's flow: B's copy ends equal to A's records."""
    run = load_run()
    result = run.run(str(tmp_path), updates=20)
    assert result["a"] == result["b"] and len(result["a"]) == 10
    assert sum(r["version"] for r in result["a"].values()) == 20


def test_b_killed_mid_batch_resumes_from_its_committed_offsets(tmp_path):
    """50 updates to A over HTTP. B is killed (SIGKILL) holding fetched, uncommitted
    notifications (A hung — SIGSTOP — while B read it), then restarted: it processes
    exactly the notifications after its group's committed offsets, and its copy
    converges to A's records — no update lost."""
    run = load_run()
    work = str(tmp_path)
    data_dir = os.path.join(work, "log")
    accounts = sorted({account_for(n) for n in range(UPDATES)})
    with logkit.Broker(data_dir) as broker, broker.serve_rest() as rest:
        group = broker.group("service-b")

        def no_lag() -> bool:
            lag = group.lag()
            return bool(lag) and not any(lag.values())

        a = run.start_a(data_dir, work)
        b = None
        try:
            b = run.start_b(rest.url, a.url, work)
            for n in range(SETTLED):
                run.update(a, account_for(n), 1000 + n)
            run.wait_until(no_lag, DEADLINE_S, "B committed the first updates")

            b.process.send_signal(signal.SIGSTOP)   # B fetches nothing while A publishes
            for n in range(SETTLED, SETTLED + STUCK):
                run.update(a, account_for(n), 1000 + n)
            a.process.send_signal(signal.SIGSTOP)   # A hangs: B's reads of A never answer
            b.process.send_signal(signal.SIGCONT)

            def stuck() -> bool:
                stats = run.call("GET", f"{b.url}/stats")
                return stats["fetched"] > stats["processed"]

            run.wait_until(stuck, DEADLINE_S, "B holding fetched, unhandled notifications")
            b.kill()
            a.process.send_signal(signal.SIGCONT)
            # B is dead: its group's committed offsets stay as they are from here on.
            resume_from = sum(group.committed().values())
            assert resume_from == SETTLED

            for n in range(SETTLED + STUCK, UPDATES):
                run.update(a, account_for(n), 1000 + n)
            b = run.start_b(rest.url, a.url, work)
            want = wait_b_caught_up(run, broker, a, b, accounts)
            stats = run.call("GET", f"{b.url}/stats")
        finally:
            a.process.send_signal(signal.SIGCONT)
            if b is not None and b.process.poll() is None:
                b.stop()
            a.stop()

        logged = sum(p.log_end_offset for p in broker.topic(run.TOPIC).partitions)
    assert logged == UPDATES                             # one notification per update
    assert sum(r["version"] for r in want.values()) == UPDATES and len(want) == 10
    assert stats["processed"] == UPDATES - resume_from   # from the committed offsets on


def wait_b_caught_up(run, broker, a, b, accounts) -> dict:
    """Wait until B's copy equals A's records and the group service-b has committed
    every notification (the copy can be equal before the last ones are handled: B reads
    A's latest record); returns A's records."""
    want = run.a_records(a, accounts)
    run.wait_until(lambda: run.b_copies(b) == want, DEADLINE_S,
                   "B's copy equal to A's records")
    group = broker.group("service-b")
    run.wait_until(lambda: (lag := group.lag()) and not any(lag.values()),
                   DEADLINE_S, "no lag for the group service-b")
    return want


def hold_b_mid_batch(run, a, b, first: int, count: int) -> None:
    """B handles updates [0, first), then fetches `count` more it cannot handle yet: A is
    paused (SIGSTOP) before B sees them, so B's read of A hangs. A stays stopped."""
    for n in range(first):
        run.update(a, account_for(n), 1000 + n)
    run.wait_until(lambda: run.call("GET", f"{b.url}/stats")["processed"] == first,
                   DEADLINE_S, "B handled the first updates")
    b.process.send_signal(signal.SIGSTOP)
    for n in range(first, first + count):
        run.update(a, account_for(n), 1000 + n)
    a.process.send_signal(signal.SIGSTOP)
    b.process.send_signal(signal.SIGCONT)

    def stuck() -> bool:
        stats = run.call("GET", f"{b.url}/stats")
        return stats["fetched"] > stats["processed"]

    run.wait_until(stuck, DEADLINE_S, "B holding fetched, unhandled notifications")


def test_b_retries_its_batch_while_a_restarts(tmp_path):
    """A dies (SIGKILL) while B holds a fetched batch and is reading A; A restarts on its
    port. B keeps the batch and retries it rather than fetching past it: its copy ends
    equal to A's records."""
    run = load_run()
    work = str(tmp_path)
    data_dir = os.path.join(work, "log")
    accounts = sorted({account_for(n) for n in range(UPDATES)})
    with logkit.Broker(data_dir) as broker, broker.serve_rest() as rest:
        a = run.start_a(data_dir, work)
        port = int(a.url.rsplit(":", 1)[1])
        b = run.start_b(rest.url, a.url, work)
        try:
            hold_b_mid_batch(run, a, b, SETTLED, STUCK)
            a.kill()
            run.wait_until(lambda: b_retrying(work), DEADLINE_S, "B failing to read A")
            a = run.start_a(data_dir, work, port=port)
            for n in range(SETTLED + STUCK, UPDATES):
                run.update(a, account_for(n), 1000 + n)
            want = wait_b_caught_up(run, broker, a, b, accounts)
            stats = run.call("GET", f"{b.url}/stats")
        finally:
            if a.process.poll() is None:
                a.process.send_signal(signal.SIGCONT)
                a.stop()
            b.stop()
    assert len(want) == 10 and sum(r["version"] for r in want.values()) == UPDATES
    assert stats["processed"] == UPDATES


def b_retrying(work: str) -> bool:
    """B's log shows a failed call it is retrying."""
    with open(os.path.join(work, "b.log"), encoding="utf-8") as f:
        return "retrying" in f.read()


def test_b_joins_again_when_its_consumer_instance_is_gone(tmp_path):
    """The proxy loses B's consumer instance (deleted behind B's back, as its idle timeout
    would) while B holds a batch: B's commit gets 40403, B creates the instance again and
    goes on from the group's committed offsets; its copy ends equal to A's records."""
    run = load_run()
    work = str(tmp_path)
    data_dir = os.path.join(work, "log")
    accounts = sorted({account_for(n) for n in range(UPDATES)})
    with logkit.Broker(data_dir) as broker, broker.serve_rest() as rest:
        a = run.start_a(data_dir, work)
        b = run.start_b(rest.url, a.url, work)
        try:
            hold_b_mid_batch(run, a, b, SETTLED, STUCK)
            gone = urllib.request.Request(
                f"{rest.url}/consumers/service-b/instances/service-b-1", method="DELETE",
                headers={"Content-Type": "application/vnd.kafka.v2+json"})
            with urllib.request.urlopen(gone, timeout=30) as reply:
                assert reply.status == 204
            a.process.send_signal(signal.SIGCONT)
            for n in range(SETTLED + STUCK, UPDATES):
                run.update(a, account_for(n), 1000 + n)
            want = wait_b_caught_up(run, broker, a, b, accounts)
        finally:
            a.process.send_signal(signal.SIGCONT)
            b.stop()
            a.stop()
    assert len(want) == 10 and sum(r["version"] for r in want.values()) == UPDATES


def test_the_manual_setup_with_logkit_serve(tmp_path):
    """The README's setup by hand: `logkit serve DIR --rest-port` as its own process (the
    proxy and the broker directory), A and B against it; B's copy follows A's updates."""
    run = load_run()
    work = str(tmp_path)
    data_dir = os.path.join(work, "log")
    logkit_cli = os.path.join(os.path.dirname(sys.executable), "logkit")
    serve = subprocess.Popen([logkit_cli, "serve", data_dir, "--port", "0", "--rest-port", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        rest_url = read_rest_url(serve)
        a = run.start_a(data_dir, work)
        b = run.start_b(rest_url, a.url, work)
        try:
            for n in range(SETTLED):
                run.update(a, account_for(n), 1000 + n)
            want = run.a_records(a, sorted({account_for(n) for n in range(SETTLED)}))
            run.wait_until(lambda: run.b_copies(b) == want, DEADLINE_S,
                           "B's copy equal to A's records")
        finally:
            assert b.stop() == 0 and a.stop() == 0      # each shuts down cleanly
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0
        serve.stdout.close()
    assert len(want) == 10 and all(r["version"] == 2 for r in want.values())


def read_rest_url(serve: subprocess.Popen) -> str:
    """The URL `logkit serve` prints for its REST proxy, read with a deadline."""
    deadline = time.monotonic() + DEADLINE_S
    with selectors.DefaultSelector() as selector:
        selector.register(serve.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(deadline - time.monotonic()):
                break
            line = serve.stdout.readline()
            if not line:
                break
            if "REST proxy at " in line:
                return line.rsplit(" ", 1)[1].strip()
    raise TimeoutError(f"logkit serve printed no REST proxy URL (exit {serve.poll()})")


def test_the_timing_script_runs(tmp_path):
    """measure.py (the source of docs/web.md's timings) runs end to end on a few updates."""
    measure_py = os.path.join(os.path.dirname(RUN_PY), "measure.py")
    out = subprocess.run([sys.executable, measure_py, "5"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("PUT p50 ") and "5 PUTs back to back" in out.stdout
