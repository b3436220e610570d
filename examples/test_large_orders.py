"""Tests of the stream job in large_orders.py, written as a user of logkit writes them:
no conftest.py, the fixtures come from the plugin that installing logkit installs.

Run: .venv/bin/python -m pytest examples/test_large_orders.py
"""

from __future__ import annotations

import json
import threading

import pytest

from large_orders import DEAD_LETTERS, GROUP, SINK, SOURCE, LargeOrders
from logkit.testing import assert_topic, produce, read_all, wait_for_no_lag


@pytest.fixture
def topics(logkit_broker):
    """The job's topics, one partition each, so the output order is the input order."""
    for name in (SOURCE, SINK, DEAD_LETTERS):
        logkit_broker.create_topic(name, 1)
    return logkit_broker


@pytest.fixture
def running_job(topics):
    """The job on a thread, as it would run in production; stopped after the test."""
    job = LargeOrders(topics, threshold_cents=10_000)
    stop = threading.Event()
    thread = threading.Thread(target=job.run, args=(stop,), daemon=True)
    thread.start()
    yield job
    stop.set()
    thread.join(timeout=30)
    job.close()


def order(total_cents):
    return json.dumps({"total_cents": total_cents}).encode()


def test_large_orders_are_routed_in_order_with_their_keys(topics, running_job):
    produce(topics, SOURCE, [(b"ada", order(25_000)), (b"bob", order(500)),
                             (b"cy", order(10_000))])
    wait_for_no_lag(topics, GROUP, timeout=30)
    assert [(r.key, json.loads(r.value)["total_cents"]) for r in read_all(topics, SINK)] \
        == [(b"ada", 25_000), (b"cy", 10_000)]
    assert_topic(topics, DEAD_LETTERS, [])


def test_records_that_are_not_orders_go_to_the_dead_letter_topic(topics, running_job):
    produce(topics, SOURCE, [(b"x", b"not json"), (b"y", b'{"total": 1}'),
                             {"key": b"z", "value": order(99_999),
                              "headers": [("trace", b"1")]}])
    wait_for_no_lag(topics, GROUP, timeout=30)
    assert_topic(topics, DEAD_LETTERS, [(b"x", b"not json"), (b"y", b'{"total": 1}')])
    assert [r.headers for r in read_all(topics, DEAD_LETTERS)] == \
        [[("error", b"not a JSON order with total_cents")]] * 2
    assert [r.key for r in read_all(topics, SINK)] == [b"z"]


def test_a_restarted_job_goes_on_from_its_commit(topics):
    """Stepping the job by hand (no thread): what one instance committed, the next does
    not handle again."""
    produce(topics, SOURCE, [(b"a", order(20_000))])
    first = LargeOrders(topics)
    while first.step() == 0:
        pass
    first.close()
    produce(topics, SOURCE, [(b"b", order(30_000))])
    second = LargeOrders(topics)
    while second.step() == 0:
        pass
    second.close()
    assert [r.key for r in read_all(topics, SINK)] == [b"a", b"b"]
