"""Test helper: wait until a transaction the Kafka listener answered is complete.

The listener answers EndTxn once PrepareCommit/PrepareAbort is durable, as Kafka does;
the markers, the group offsets and CompleteX follow on the coordinator's completion
thread (logkit/transactions.py). A test that reads right after a wire commit waits on
that state with a deadline — never a sleep — instead of assuming it.
"""

from __future__ import annotations

import time

PREPARED = ("PrepareCommit", "PrepareAbort")
_POLL_S = 0.005


def wait_completed(broker, transactional_id: str, timeout_s: float = 30.0) -> str:
    """Wait until `transactional_id` is past Prepare* on `broker`; its state then."""
    coordinator = broker.transaction_coordinator
    deadline = time.monotonic() + timeout_s
    while (state := coordinator.state(transactional_id)) in PREPARED:
        if time.monotonic() > deadline:
            raise AssertionError(f"transaction {transactional_id!r} still {state} after "
                                 f"{timeout_s} s")
        time.sleep(_POLL_S)
    return state


def wait_stable(broker, topic: str, timeout_s: float = 30.0) -> None:
    """Wait until every partition of `topic` has its last stable offset at its high
    watermark (no transaction left open there, every marker written)."""
    deadline = time.monotonic() + timeout_s
    for p in broker.topic(topic).partitions:
        while p.last_stable_offset < p.high_watermark:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}-{p.partition}: last stable offset "
                                     f"{p.last_stable_offset} < high watermark "
                                     f"{p.high_watermark} after {timeout_s} s")
            time.sleep(_POLL_S)


def wait_all_completed(broker, timeout_s: float = 30.0) -> None:
    """Wait until no transaction of `broker` is Prepare* (its markers and its group
    offsets written)."""
    coordinator = broker.transaction_coordinator
    deadline = time.monotonic() + timeout_s
    while (left := coordinator.list_transactions(states=PREPARED)):
        if time.monotonic() > deadline:
            raise AssertionError(f"still prepared after {timeout_s} s: {left}")
        time.sleep(_POLL_S)
