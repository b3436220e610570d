"""Every example runs and does what it says."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "examples")
sys.path.insert(0, EXAMPLES)


def test_quickstart_runs(tmp_path):
    """The README's quickstart example appends and reads back five records."""
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, "quickstart.py"),
                          str(tmp_path)], check=True, capture_output=True, text=True).stdout
    assert "appended 5 records" in out and "log end offset 5" in out


def test_queue_vs_pubsub(tmp_path):
    """One group shares the records; two groups each get them all."""
    import queue_vs_pubsub
    result = queue_vs_pubsub.run(str(tmp_path))
    a, b = result["queue"]
    assert not set(a) & set(b) and sorted(a + b) == list(range(90))
    assert all(sorted(got) == list(range(90)) for got in result["pubsub"])


def test_notification(tmp_path):
    """Service B, another process, ends with a copy equal to service A's records."""
    import notification
    result = notification.run(str(tmp_path))
    assert result["exit_code"] == 0
    assert result["a"] == result["b"] and len(result["a"]) == 5


@pytest.mark.spark
def test_stream_processing(spark, tmp_path):
    """Spark aggregates events from logkit into logkit; the dashboard matches the truth."""
    import stream_processing
    result = stream_processing.run(str(tmp_path), events=3000, spark=spark)
    assert result["spark_rows_in"] == 3000
    assert result["dashboard"] == result["truth"]


def test_schema_evolution(tmp_path):
    """Old and new consumers each read every record in their own schema; v3 is refused
    at registration and at send."""
    pytest.importorskip("fastavro")
    import schema_evolution
    result = schema_evolution.run(str(tmp_path))
    assert [v["note"] for v in result["old"]] == ["gift wrap", "", ""]
    assert [v["currency"] for v in result["new"]] == ["EUR", "USD", "EUR"]
    assert [where for where, _ in result["refusals"]] == ["register", "send"]
    assert all("id: TYPE_MISMATCH" in message for _, message in result["refusals"])
    assert result["versions"] == [1, 2] and result["records"] == 3
