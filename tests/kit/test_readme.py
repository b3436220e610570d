"""The README as a newcomer follows it: its own code blocks, extracted from README.md
(no copy that could drift), run as written — the tour twice, the `logkit` commands after
it, the pytest file through the installed plugin, and the Spark snippet."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import logkit

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(CHECKOUT, "README.md")
BIN = os.path.dirname(sys.executable)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(language: str) -> list[str]:
    """The README's code blocks in `language`, in order."""
    with open(README, encoding="utf-8") as f:
        return [body for lang, body in FENCE.findall(f.read()) if lang == language]


def block(language: str, containing: str) -> str:
    found = [b for b in blocks(language) if containing in b]
    assert len(found) == 1, f"one {language} block with {containing!r}, found {len(found)}"
    return found[0]


def run_tour(capsys) -> list[str]:
    exec(compile(block("python", "logkit.Broker(\"data/\")"), "README tour", "exec"), {})
    return capsys.readouterr().out.splitlines()


def test_the_tour_runs_twice(tmp_path, monkeypatch, capsys):
    """The tour, run twice in one directory: the topic is reused (exist_ok=True), the
    second run's record follows the first, and the group goes on from its commit."""
    monkeypatch.chdir(tmp_path)
    first = run_tour(capsys)
    second = run_tour(capsys)
    assert first[0] == "1 0" and second[0] == "1 1"        # customer-7's partition
    assert first[1:] == ["0 b'customer-7' b'{\"total\": 42}'", "0 1 1"]
    assert second[1:] == ["1 b'customer-7' b'{\"total\": 42}'", "0 2 2"]


def test_the_cli_block_runs_after_the_tour(tmp_path, monkeypatch, capsys):
    """Every `logkit` line of the README exits 0 after the tour; `dump` shows records
    (it names the partition the tour wrote to)."""
    monkeypatch.chdir(tmp_path)
    run_tour(capsys)
    commands = [line for line in block("sh", "logkit topics").splitlines() if line.strip()]
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    script = "set -e\n" + "\n".join(f"{c}\necho '--- exit 0'" for c in commands)
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    outputs = proc.stdout.split("--- exit 0\n")
    assert len(outputs) == len(commands) + 1
    assert outputs[0] == "orders\n"
    assert '"key":"customer-7"' in outputs[1]
    assert "billing  orders  1" in outputs[3]
    assert "count: 1" in outputs[4] and "customer-7" in outputs[4]
    assert "all CRCs valid" in outputs[4]


def test_the_pytest_example_passes_through_the_installed_plugin(tmp_path):
    """The README's test file, saved as it is and run by pytest in a fresh process with
    no conftest: the plugin comes from logkit's pytest11 entry point."""
    source = block("python", "def test_")
    name = re.search(r"# (test_\w+\.py)", source).group(1)
    (tmp_path / name).write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           name], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


@pytest.mark.spark
def test_the_spark_snippet_writes_what_it_selects(spark, tmp_path, monkeypatch, capsys):
    """The Spark snippet after the tour, on the suite's Spark session (its
    `local_session()` returns that session): the write into the one-partition `copy`
    topic succeeds because the snippet selects the columns it means. Spark's workers
    run in the session's first working directory, so the block's "data/" is given as
    this test's directory; the next test runs the block exactly as written."""
    monkeypatch.chdir(tmp_path)
    run_tour(capsys)
    run_tour(capsys)
    source = block("python", "local_session").replace('"data/"', repr(str(tmp_path / "data")))
    exec(compile(source, "README spark", "exec"), {})
    with logkit.Broker(tmp_path / "data") as broker:
        copy = broker.topic("copy")
        assert copy.num_partitions == 1
        assert [r.key for r in copy.partition(0).read(0)] == [b"customer-7"] * 2


@pytest.mark.spark
def test_the_spark_snippet_runs_as_written_in_a_fresh_process(tmp_path):
    """The tour (twice) and the Spark snippet exactly as written, in a fresh process
    started from the directory a newcomer works in, with no PYSPARK_PYTHON set:
    `local_session()` points the workers at this interpreter. It starts a second JVM
    (20-60 s on a busy 2-core machine); LOGKIT_SLOW=1 allows it 10 minutes, else 5."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    script = tmp_path / "newcomer.py"
    script.write_text(block("python", 'logkit.Broker("data/")') + "\n"
                      + block("python", 'logkit.Broker("data/")') + "\n"
                      + block("python", "local_session") + "\nspark.stop()\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True,
                          timeout=600 if os.environ.get("LOGKIT_SLOW") == "1" else 300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with logkit.Broker(tmp_path / "data") as broker:
        copy = broker.topic("copy")
        assert copy.num_partitions == 1
        assert [r.key for r in copy.partition(0).read(0)] == [b"customer-7"] * 2


def test_the_kafka_client_snippet_runs_as_written(tmp_path):
    """The README's listener block: confluent-kafka produces and consumes through
    broker.serve() on the same directory, and the wire member shows embedded."""
    script = tmp_path / "wire.py"
    script.write_text(block("python", "broker.serve()"))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "b'hello'", proc.stdout
    assert lines[1] == "1", proc.stdout
    # Closing in the right order: librdkafka reports no broken connection on the way out.
    assert "FAIL" not in proc.stderr and "Disconnected" not in proc.stderr, proc.stderr


def test_the_replication_snippet_runs_as_written_twice(tmp_path):
    """The README's replication block: acks="all" completes once the follower holds
    the record, and after promote() the replica's directory takes the next offset. A
    newcomer runs it again in the same directory: it starts a fresh pair each time."""
    script = tmp_path / "replica.py"
    script.write_text(block("python", "logkit.Follower("))
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines() == ["0", "1"], proc.stdout
    with logkit.Broker(tmp_path / "replica-data", read_only=True) as broker:
        values = [r.value for r in broker.topic("payments").partition(0).read(0)]
    assert values == [b"paid", b"refund"]


def test_the_compaction_and_transactions_snippet_runs_as_written_twice(tmp_path):
    """The compacted, transactional topic: a pass keeps each key's latest committed
    record; run twice (it starts from a fresh directory each time)."""
    script = tmp_path / "ledger.py"
    script.write_text(block("python", "cleanup.policy"))
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines() == ["3 2", "[(b'bob', b'7'), (b'alice', b'90')]"]
