"""The notification example (examples/notifications/) runs as a user would run it: a
broker directory and its REST proxy, service A (aiohttp, SQLite, logkit.aio) and service
B (aiohttp, SQLite, the proxy's v2 consumer API) as separate processes on 127.0.0.1, and
updates sent to A over HTTP. Every wait is on a state with a deadline."""

from __future__ import annotations

import importlib.util
import os
import signal

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
            want = run.a_records(a, accounts)
            run.wait_until(lambda: run.b_copies(b) == want, DEADLINE_S,
                           "B's copy equal to A's records")
            run.wait_until(no_lag, DEADLINE_S, "no lag for the group service-b")
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
