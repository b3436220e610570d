"""`make demo` as a user runs it: the Makefile's own recipe (read with `make -n demo`, so
the test follows the Makefile), in a fresh process with its own Spark JVM. By default a
bounded run (3,000 events into a temporary directory); LOGKIT_SLOW=1 runs the recipe
exactly as written (50,000 events into data/demo)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

import pytest

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLOW = os.environ.get("LOGKIT_SLOW") == "1"


def _recipe() -> str:
    """The command `make demo` runs (the last line `make -n` prints: an install step that
    would run first, when the venv is stale, is printed before it, not run)."""
    # --no-print-directory: under `make test` this make is nested and would add its
    # "Entering directory" lines around the recipe
    proc = subprocess.run(["make", "--no-print-directory", "-n", "demo"], cwd=CHECKOUT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    command = proc.stdout.strip().splitlines()[-1]
    assert "examples/demo.py" in command, proc.stdout
    return command


@pytest.mark.spark
def test_make_demo_counts_every_page_view_exactly_once(tmp_path):
    """The demo's Spark job reads the produced page views from logkit, writes the counts
    back, and the dashboard's consumer group reads counts equal to the events produced
    (the demo's exit code says so, and its last line)."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    command = _recipe()
    if not SLOW:
        command += f" {shlex.quote(str(tmp_path / 'demo'))} 3000"
    proc = subprocess.run(["bash", "-c", command], cwd=CHECKOUT, capture_output=True,
                          text=True, timeout=600 if SLOW else 300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    events = 50000 if SLOW else 3000
    lines = proc.stdout.splitlines()
    assert lines[1].startswith(f"produced {events:,} page views"), proc.stdout
    assert lines[2].startswith(f"Spark streamed {events:,} records"), proc.stdout
    assert "counts match the events produced: yes" in lines[-1], proc.stdout
