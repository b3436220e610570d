"""Test helpers for clients: drain a consumer; pin a producer to one send path."""

from __future__ import annotations

import logkit
from logkit import producer as producer_module

SEND_PATHS = ["python"] + (["compiled"] if producer_module._CSender is not None else [])


def use_path(producer, path):
    """Pin a producer's send() to one implementation: the compiled fast path (with the
    Python method behind it) or the Python method alone."""
    if path == "python":
        producer.send = logkit.Producer.send.__get__(producer)
    else:
        assert isinstance(producer.send, producer_module._CSender)
    return producer


def drain(consumer, idle_ms=300):
    """Poll until one poll of idle_ms returns nothing; returns every record seen."""
    out = []
    while True:
        batch = consumer.poll(timeout_ms=idle_ms)
        if not batch:
            return out
        out += batch
