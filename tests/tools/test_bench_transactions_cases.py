"""benchmarks.transactions --cases re-runs a subset and merges it into an existing JSON:
the cases not run keep their figures, the re-run ones are replaced and stamped with
their time and load, and the ratios come from the merged rows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_cases_consume_replaces_only_consume_in_the_json(tmp_path):
    out = tmp_path / "transactions.json"
    shutil.copy(os.path.join(CHECKOUT, "benchmarks", "transactions.json"), out)
    before = json.loads(out.read_text())
    proc = subprocess.run([sys.executable, "-m", "benchmarks.transactions", "--quick",
                           "--cases", "consume", "--dir", str(tmp_path), "--json",
                           str(out)], cwd=CHECKOUT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    for case in ("produce", "commit", "recovery", "date", "machine"):
        assert doc[case] == before[case], case
    consume = doc["consume"]
    assert consume["one in ten aborted"]["read_committed"]["records_returned"] == 9_000
    assert consume["committed"]["read_committed"]["records_returned"] == 10_000
    stamp = doc["reruns"]["consume"]
    assert stamp["quick"] is True and stamp["utc"].endswith("Z") and stamp["load_1m"]
    # the other cases' earlier re-run stamps are kept as they were
    others = {k: v for k, v in doc["reruns"].items() if k != "consume"}
    assert others == {k: v for k, v in before.get("reruns", {}).items() if k != "consume"}
    c = consume["committed"]
    assert doc["ratios"]["read_committed_vs_uncommitted"]["ratio"] == round(
        c["read_committed"]["offsets_per_s"] / c["read_uncommitted"]["offsets_per_s"], 3)
    assert doc["ratios"]["idempotent_vs_plain"] == before["ratios"]["idempotent_vs_plain"]
    assert "| consume (one in ten aborted), read_committed |" in proc.stdout
    assert not list(tmp_path.glob("logkit-bench-txn-*"))          # cleaned up


def test_cases_refuses_a_name_it_does_not_know():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.transactions", "--cases",
                           "consume,fetch"], cwd=CHECKOUT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--cases takes names among" in proc.stderr
