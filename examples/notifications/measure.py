"""Time the notification example: one PUT to A, one update's trip to B's copy, a burst.

Owns nothing but its printout (the figures in docs/web.md come from it). Starts the
proxy, A and B as run.py does, then: N single updates, each timed from the PUT to A
until B's `GET /copies/{id}` shows its version (B's copy read in a tight loop, so the
figure includes one such read); then N updates sent back to back, and the time from
the last PUT until B's copy equals A's records.

Run: python examples/notifications/measure.py [N]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import logkit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (run.py beside this file)


def quantile_ms(seconds: list[float], q: float) -> float:
    return sorted(seconds)[int(q * (len(seconds) - 1))] * 1000


def measure(work: str, n: int) -> str:
    data_dir = os.path.join(work, "log")
    accounts = [f"acct-{i}" for i in range(run.ACCOUNTS)]
    with logkit.Broker(data_dir) as broker, broker.serve_rest() as rest:
        a = run.start_a(data_dir, work)
        b = run.start_b(rest.url, a.url, work)
        try:
            puts, trips = [], []
            for i in range(n):
                start = time.perf_counter()
                version = run.update(a, "single", i)["version"]
                puts.append(time.perf_counter() - start)
                while (run.call("GET", f"{b.url}/copies/single") or {}).get("version") != version:
                    pass
                trips.append(time.perf_counter() - start)
            start = time.perf_counter()
            for i in range(n):
                run.update(a, accounts[i % run.ACCOUNTS], i)
            sent = time.perf_counter()
            want = run.a_records(a, accounts)
            run.wait_until(lambda: {k: run.b_copies(b).get(k) for k in want} == want, 60,
                           "B's copy equal to A's records")
            converged = time.perf_counter()
        finally:
            b.stop()
            a.stop()
    return (f"PUT p50 {quantile_ms(puts, .5):.1f} ms, p99 {quantile_ms(puts, .99):.1f} ms; "
            f"PUT to B's copy p50 {quantile_ms(trips, .5):.1f} ms, "
            f"p99 {quantile_ms(trips, .99):.1f} ms; {n} PUTs back to back "
            f"{n / (sent - start):.0f}/s, B's copy equal "
            f"{(converged - sent) * 1000:.0f} ms after the last")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    work = tempfile.mkdtemp(prefix="logkit-notifications-")
    try:
        print(measure(work, n))
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
