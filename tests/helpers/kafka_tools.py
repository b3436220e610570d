"""Test and benchmark helper: Kafka's own tools and the Java client pointed at a
Kafka-protocol broker (logkit's listener or the real Kafka), and what they print, parsed.

Owns `tool` (one of Kafka's tools in a JVM that starts quickly: a class-data archive
shared by the tools and the client compiler alone, for the tests' short runs; never for the benchmarks,
whose figures need the JVM as Kafka's scripts start it), `run_scenario`
(tools/kafka/src/ClientScenarios.java, the Java client with its defaults), `LogkitServe` (a `logkit serve` child process: the CLI as a user starts it) and
the parsers of the perf tools' summary lines, which tests/kafka/test_kafka_tools.py,
tests/kafka/test_kafka_java_client.py and benchmarks/kafka.py share. Built on
tests/helpers/kafka.py (classpath, `run_tool`, `java_command`), which it does not change.

Invariant: nothing here raises on a tool's failure by itself; each function returns the
finished process or the parsed figures, and a summary line that is not there raises
AssertionError naming the output (a tool that printed nothing useful is a failed check).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from tests.helpers.kafka import (CLASSES_DIR, RESOLVED_STAMP, ROOT_DIR, TOOL_TIMEOUT_S, TOOLS,
                                 compile_java, free_port, java_command)

SCENARIOS = "ClientScenarios"
SCENARIO_TIMEOUT_S = 120.0
SERVE_READY_TIMEOUT_S = 30.0
ARCHIVE_DIR = CLASSES_DIR / "cds"
# A short-lived JVM: C1 alone (no C2 compiler threads competing with the work) and the
# serial collector; a tool's start is then mostly class loading, which the archive saves.
# The JVM's own warnings (the archive's among them) go to stderr, not into what a tool prints.
QUICK_JVM_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xlog:disable",
                   "-Xlog:all=warning:stderr")

# "20000 records sent, 18670.6 records/sec (1.78 MB/sec), 433.01 ms avg latency,
#  1094.00 ms max latency, 266 ms 50th, 903 ms 95th, 917 ms 99th, 921 ms 99.9th."
_PRODUCER_SUMMARY = re.compile(
    r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99.9th")
# EndToEndLatency: "Percentiles: 50th = 2, 99th = 44, 99.9th = 329" and "Avg latency: 4.15 ms"
_E2E_PERCENTILES = re.compile(r"Percentiles: 50th = (\d+), 99th = (\d+), 99.9th = (\d+)")
_E2E_AVERAGE = re.compile(r"Avg latency: ([\d.]+) ms")


def _quick(command: list[str], name: str, *, timeout_s: float, input_text: str | None
           ) -> subprocess.CompletedProcess[str]:
    """Run a `java_command` list with QUICK_JVM_FLAGS and the class-data archive `name`
    (AppCDS, JDK 13+; one per classpath), which the first run writes at its exit; an
    archive older than the classpath's resolve is written again. A JVM that cannot map an archive runs
    without it, so the archive only ever saves time."""
    ARCHIVE_DIR.mkdir(parents=True, exist_ok=True)
    archive = ARCHIVE_DIR / f"{name}.jsa"
    fresh = archive.exists() and archive.stat().st_mtime >= RESOLVED_STAMP.stat().st_mtime
    writing = archive.with_name(f"{name}.{os.getpid()}.jsa.tmp")
    flag = (f"-XX:SharedArchiveFile={archive}" if fresh
            else f"-XX:ArchiveClassesAtExit={writing}")
    proc = subprocess.run([command[0], *QUICK_JVM_FLAGS, flag, *command[1:]],
                          capture_output=True, text=True, timeout=timeout_s, input=input_text,
                          stdin=None if input_text is not None else subprocess.DEVNULL)
    if not fresh and writing.exists():
        os.replace(writing, archive)
    return proc


def tool(name: str, *args: object, check: bool = True, input_text: str | None = None,
         timeout_s: float = TOOL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """tests.helpers.kafka.run_tool's twin in a quick JVM (QUICK_JVM_FLAGS and one archive
    for every tool, written by the first: the client library, logging and argument
    parsing they share are most of what each loads): the same output, AssertionError
    naming it when `check` and it failed."""
    proc = _quick(java_command(TOOLS.get(name, name), *map(str, args)), "tools",
                  timeout_s=timeout_s, input_text=input_text)
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} {' '.join(map(str, args))} {describe(proc)}")
    return proc


def run_scenario(*args: object, timeout_s: float = SCENARIO_TIMEOUT_S
                 ) -> subprocess.CompletedProcess[str]:
    """Run ClientScenarios (compiled when its source is newer) with `args` in a quick
    JVM; returns the finished process whatever its exit status (0 done, 2 a deadline
    passed, 3 an exception: the scenario prints which on stdout)."""
    return _quick(java_command(SCENARIOS, *map(str, args), extra_classpath=_scenarios_jar()),
                  SCENARIOS, timeout_s=timeout_s, input_text=None)


def _scenarios_jar() -> Path:
    """ClientScenarios' classes as a jar (a class-data archive cannot be written with a
    non-empty directory on the classpath), written again when the classes are newer."""
    classes = compile_java(SCENARIOS)
    built = sorted(classes.glob(f"{SCENARIOS}*.class"))
    ARCHIVE_DIR.mkdir(parents=True, exist_ok=True)
    jar = ARCHIVE_DIR / f"{SCENARIOS}.jar"
    if not jar.exists() or jar.stat().st_mtime < max(c.stat().st_mtime for c in built):
        writing = jar.with_name(f"{SCENARIOS}.{os.getpid()}.jar.tmp")
        with zipfile.ZipFile(writing, "w") as archive:
            for path in built:
                archive.write(path, path.name)
        os.replace(writing, jar)
    return jar


def scenario_lines(proc: subprocess.CompletedProcess[str], tag: str) -> list[list[str]]:
    """The words after `tag` on each stdout line that starts with it."""
    return [line.split()[1:] for line in proc.stdout.splitlines()
            if line.split()[:1] == [tag]]


def fields(words: list[str]) -> dict[str, str]:
    """`name=value` words as a dict (the scenario's MEMBER and RESTART lines)."""
    return dict(w.split("=", 1) for w in words if "=" in w)


def partitions(text: str) -> list[int]:
    """'[0,1]' -> [0, 1]."""
    inner = text.strip("[]")
    return [int(p) for p in inner.split(",")] if inner else []


def describe(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def parse_producer_perf(stdout: str) -> dict[str, float]:
    """ProducerPerformance's last summary line: records, records/s, MB/s and latencies
    in ms (avg, max, p50, p95, p99, p99.9)."""
    found = _PRODUCER_SUMMARY.findall(stdout)
    assert found, f"no summary line in kafka-producer-perf-test's output:\n{stdout[-2000:]}"
    names = ("records", "records_per_s", "mb_per_s", "latency_ms_avg", "latency_ms_max",
             "latency_ms_p50", "latency_ms_p95", "latency_ms_p99", "latency_ms_p999")
    return {name: float(value) for name, value in zip(names, found[-1])}


def parse_consumer_perf(stdout: str) -> dict[str, float]:
    """ConsumerPerformance's CSV row (after its header line): MB and records consumed,
    their rates over the whole run and over the fetch time alone, the rebalance time."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    header = next((i for i, line in enumerate(lines) if line.startswith("start.time")), None)
    assert header is not None and header + 1 < len(lines), (
        f"no result row in kafka-consumer-perf-test's output:\n{stdout[-2000:]}")
    names = [n.strip() for n in lines[header].split(",")]
    values = [v.strip() for v in lines[header + 1].split(",")]
    row = dict(zip(names, values))
    return {"mb": float(row["data.consumed.in.MB"]), "mb_per_s": float(row["MB.sec"]),
            "records": float(row["data.consumed.in.nMsg"]),
            "records_per_s": float(row["nMsg.sec"]),
            "rebalance_ms": float(row["rebalance.time.ms"]),
            "fetch_ms": float(row["fetch.time.ms"]),
            "fetch_records_per_s": float(row["fetch.nMsg.sec"])}


def parse_e2e_latency(stdout: str) -> dict[str, float]:
    """EndToEndLatency's average and percentiles, in ms (the tool rounds percentiles to
    whole milliseconds)."""
    found = _E2E_PERCENTILES.search(stdout)
    average = _E2E_AVERAGE.search(stdout)
    assert found and average, f"no latency lines in the end-to-end tool's output:\n{stdout}"
    return {"latency_ms_avg": float(average.group(1)),
            "latency_ms_p50": float(found.group(1)), "latency_ms_p99": float(found.group(2)),
            "latency_ms_p999": float(found.group(3))}


_STATUS_FIELDS = {"VmRSS:": "rss_mb", "VmHWM:": "peak_rss_mb", "RssAnon:": "anon_rss_mb",
                  "RssFile:": "file_rss_mb", "RssShmem:": "shmem_rss_mb"}


def rss_mb(pid: int) -> dict[str, float]:
    """A live process's resident set now (VmRSS), at its peak (VmHWM), and now split
    into anonymous memory (heap, stacks) and mapped files' pages (RssFile: the segments
    and indexes a process maps count here while they are in the page cache), in MiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name = _STATUS_FIELDS.get(line.split(":", 1)[0] + ":")
            if name is not None:
                out[name] = int(line.split()[1]) / 1024
    return out


class LogkitServe:
    """`logkit serve DIR --port N` in a child process, as a user runs it: `start()`
    returns once it prints its address (the CLI prints it after it listens) and records
    the seconds that took; `stop()` sends SIGTERM and waits (SIGKILL past a deadline);
    safe twice."""

    def __init__(self, directory: str | Path, *extra_args: str) -> None:
        self.directory = Path(directory)
        self.port = free_port()
        self.extra_args = extra_args
        self.proc: subprocess.Popen[str] | None = None
        self.start_seconds: float | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> LogkitServe:
        began = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "logkit.cli", "serve", str(self.directory),
             "--port", str(self.port), *self.extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            text=True, cwd=ROOT_DIR)
        line = self.proc.stdout.readline()       # the CLI's "serving ... at HOST:PORT"
        if not line.strip().endswith(self.bootstrap_servers):
            self.stop()
            raise AssertionError(f"logkit serve did not start: {line!r}")
        self.start_seconds = time.monotonic() - began
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        proc.stdout.close()

    def __enter__(self) -> LogkitServe:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
