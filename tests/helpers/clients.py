"""Test helper: read everything a consumer can get until it stays idle."""

from __future__ import annotations


def drain(consumer, idle_ms=300):
    """Poll until one poll of idle_ms returns nothing; returns every record seen."""
    out = []
    while True:
        batch = consumer.poll(timeout_ms=idle_ms)
        if not batch:
            return out
        out += batch
