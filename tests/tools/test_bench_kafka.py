"""benchmarks/kafka.py's committed run: every figure has its goal and a sane value, and
docs/benchmarks.md's "Beside Apache Kafka" tables are exactly what the JSON gives, so the
page cannot drift from the run it cites. Runs nothing (the benchmark needs Kafka and
minutes; `python -m benchmarks.kafka --quick` is its short form)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks import kafka as bench

ROOT = Path(__file__).resolve().parents[2]


def committed() -> dict:
    doc = json.loads(bench.JSON_PATH.read_text())
    doc["figures"] = bench.figures(doc)
    return doc


def test_every_figure_of_the_committed_run_is_sane_and_has_its_goal():
    doc = committed()
    names = [f["figure"] for f in doc["figures"]]
    assert len(names) == len(set(names))
    for f in doc["figures"]:
        assert f["goal"] in bench.GOALS.values(), f
        assert f["logkit"] >= 0 and f["kafka"] >= 0 and math.isfinite(f["ratio"]), f
        assert f["met"] == (f["ratio"] >= f["goal"]), f
    plan = doc["plan"]
    produce = [c for c in doc["cases"] if "produce" in c]
    assert len(produce) == len(plan["sizes"]) * len(plan["partitions"]) * len(plan["acks"])
    for case in produce:
        for system in ("logkit", "kafka"):
            assert case["produce"][system]["records"] == case["records"]


def test_the_benchmarks_page_shows_the_committed_runs_tables():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    section = page.split("## Beside Apache Kafka", 1)[1].split("\n## ", 1)[0]
    for line in bench.markdown(committed()).splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            assert line in section, line
