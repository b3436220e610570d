"""benchmarks.transactions (its own command line) runs its --quick size without Apache
Kafka and writes its JSON: every case measured, positive, the goals' ratios computed
from the rows, the recovery bounded by the transaction timeout; speed is not asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_transactions_quick_runs_and_writes_its_json(tmp_path):
    out = tmp_path / "transactions.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.transactions", "--quick",
                           "--no-kafka", "--dir", str(tmp_path), "--json", str(out)],
                          cwd=CHECKOUT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    for name in ("non-idempotent", "idempotent", "transactional"):
        assert doc["produce"][name]["records_per_s"] > 0, name
    for level in ("read_uncommitted", "read_committed"):
        assert doc["consume"]["committed"][level]["records_returned"] == 10_000
    aborted = doc["consume"]["one in ten aborted"]["read_committed"]["records_returned"]
    assert aborted == 9_000
    for name in ("logkit embedded", "confluent-kafka -> logkit"):
        row = doc["commit"][name]
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"], (name, row)
    ratios = doc["ratios"]
    assert ratios["idempotent_vs_plain"]["ratio"] == round(
        doc["produce"]["idempotent"]["records_per_s"]
        / doc["produce"]["non-idempotent"]["records_per_s"], 3)
    assert ratios["transactional_vs_idempotent"]["goal"] == 0.7
    recovery = doc["recovery"]
    assert 0 < recovery["by_next_init_s"]["median"]
    assert 0 < recovery["by_timeout_s"]["median"] < \
        recovery["transaction_timeout_ms"] / 1000 + 10       # the timeout + the thread
    assert "| produce, transactional (100 per transaction) |" in proc.stdout
    assert not list(tmp_path.glob("logkit-bench-txn-*"))          # cleaned up
