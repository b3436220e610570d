"""benchmarks/compaction.py's committed run: every figure has its goal and a sane value,
the run cleaned what it claims (one pass, every key's latest kept, on both sides), and
docs/benchmarks.md's compaction table is exactly what the JSON gives, so the page cannot
drift from the run it cites. Runs nothing (the benchmark needs Kafka and minutes;
`python -m benchmarks.compaction --quick` is its short form)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks import compaction as bench

ROOT = Path(__file__).resolve().parents[2]


def committed() -> dict:
    doc = json.loads(bench.JSON_PATH.read_text())
    doc["figures"] = bench.figures(doc)
    return doc


def test_every_figure_of_the_committed_run_is_sane_and_has_its_goal():
    doc = committed()
    names = [f["figure"] for f in doc["figures"]]
    assert len(names) == len(set(names)) == 8
    goals = {goal for goal, _ in bench.GOALS.values()}
    for f in doc["figures"]:
        assert f["goal"] in goals and math.isfinite(f["ratio"]) and f["ratio"] > 0, f
        assert f["met"] == (f["ratio"] >= f["goal"] if f["sense"] == ">="
                            else f["ratio"] <= f["goal"]), f


def test_the_committed_run_cleaned_the_same_records_on_both_sides():
    doc = committed()
    plan = doc["plan"]
    assert not plan["quick"]
    clean = doc["clean"]
    assert clean["passes"] == 1 and clean["reports"][0]["records_before"] == plan["records"]
    survivors = clean["reports"][0]["records_after"]
    assert survivors == doc["ideal"]["records"] <= plan["keys"]
    assert doc["clean_small_buffer"]["passes"] > 1        # the small buffer did not hold
    kafka = doc["kafka"]
    assert kafka["bytes_before"] > 0 and len(kafka["rounds"]) == plan["repeats"]
    for round_ in kafka["rounds"]:
        assert len(round_["passes"]) == 1                    # one pass, as logkit's
        end = next(line for line in round_["passes"][0]["summary"]
                   if line.startswith("End size:"))
        assert f"({survivors:,} messages)" in end


def test_the_benchmarks_page_shows_the_committed_runs_table():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    section = page.split("## Log compaction beside Kafka's cleaner", 1)[1].split("\n## ", 1)[0]
    for line in bench.markdown(committed()).splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            assert line in section, line
