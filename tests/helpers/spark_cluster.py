"""Test helper: a Spark standalone cluster on 127.0.0.1 — a master and two workers, each
its own JVM started from PySpark's own jars (`$SPARK_HOME/bin/spark-class`, SPARK_HOME
being the pyspark package directory), 1 core and 1 GiB per worker, web UIs on free ports.

`SparkCluster.start()` waits, with a deadline, for the master's "I have been elected
leader" and each worker's "Successfully registered with master" log lines; `stop()`
ends the three JVMs it started (by their process handles). `skip_reason()` says why the
cluster cannot run here (no java, no pyspark), else None.

The driver runs in its own process (`main`, started by `Driver`): a test process may
already hold a local SparkContext, and one process has one. It warms its executors,
waits for a jobs file, runs the jobs (`run_jobs`: batch reads, expected errors, a
stream followed until it has the rows expected; the benchmarks' timed scans and lag)
and writes their results as JSON.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any

START_TIMEOUT_S = 60.0
DRIVER_WAIT_S = 90.0         # the driver's wait for jobs, a test's for results
WORKERS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _without_store_settings() -> dict[str, str]:
    """This environment less AWS's and fsspec's variables: the cluster's JVMs, its
    executors and the driver see none, so a read works from its `fs.*` options alone."""
    return {k: v for k, v in os.environ.items()
            if not k.upper().startswith(("AWS_", "FSSPEC_"))}


def spark_home() -> str:
    import pyspark
    return os.path.dirname(os.path.abspath(pyspark.__file__))


def skip_reason() -> str | None:
    if shutil.which("java") is None:
        return "no java on PATH: the standalone Spark cluster needs a JVM"
    try:
        spark_home()
    except ImportError:
        return "pyspark is not installed (the spark extra)"
    return None


class SparkCluster:
    """A master and WORKERS workers as separate JVMs on loopback."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        self.logs: list[str] = []
        self.master_url = ""

    def _env(self) -> dict[str, str]:
        home = spark_home()
        return {**_without_store_settings(), "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_LOCAL_DIRS": os.path.join(self.workdir, "local"),
                "SPARK_WORKER_DIR": os.path.join(self.workdir, "work"),
                "SPARK_LOG_DIR": os.path.join(self.workdir, "logs"),
                "PYSPARK_PYTHON": sys.executable, "SPARK_DAEMON_MEMORY": "256m",
                "SPARK_NO_DAEMONIZE": "1"}

    def _spawn(self, name: str, args: list[str]) -> None:
        log = os.path.join(self.workdir, f"{name}.log")
        self.logs.append(log)
        with open(log, "wb") as out:
            self.procs.append(subprocess.Popen(
                [os.path.join(spark_home(), "bin", "spark-class"), *args],
                env=self._env(), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL))

    def _wait_for(self, log: str, text: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            with open(log, errors="replace") as f:
                if text in f.read():
                    return
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a cluster JVM exited with {proc.returncode}: "
                                       f"{self.tail()}")
            time.sleep(0.1)
        raise RuntimeError(f"{text!r} not seen in {log} within {START_TIMEOUT_S} s: "
                           f"{self.tail()}")

    def tail(self) -> str:
        out = []
        for log in self.logs:
            with open(log, errors="replace") as f:
                out.append(f"--- {log}\n{f.read()[-1500:]}")
        return "\n".join(out)

    def start(self) -> "SparkCluster":
        for sub in ("local", "work", "logs"):
            os.makedirs(os.path.join(self.workdir, sub), exist_ok=True)
        port = _free_port()
        self.master_url = f"spark://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host",
                               "127.0.0.1", "--port", str(port), "--webui-port", "0"])
        try:
            self._wait_for(self.logs[0], "I have been elected leader", deadline)
            for i in range(WORKERS):
                self._spawn(f"worker{i}", ["org.apache.spark.deploy.worker.Worker",
                                           "--host", "127.0.0.1", "--webui-port", "0",
                                           "--cores", "1", "--memory", "1g",
                                           self.master_url])
            for log in self.logs[1:]:
                self._wait_for(log, "Successfully registered with master", deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def session(self, app_name: str = "logkit-cluster", **confs: str) -> Any:
        """A SparkSession on this cluster: one 1-core executor per worker, 512 MiB
        each, executors running this interpreter, the JVM reader's jar left off (the
        object-store path is the Python source's)."""
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession
        builder = (SparkSession.builder.master(self.master_url).appName(app_name)
                   .config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.executor.memory", "512m")
                   .config("spark.executor.cores", "1")
                   .config("spark.cores.max", str(WORKERS))
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.shuffle.partitions", "2")
                   .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
                   .config("spark.pyspark.python", sys.executable))
        for key, value in confs.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        return spark

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []


class CountingProxy:
    """A TCP forwarder on 127.0.0.1 to `target`, counting the bytes the target sends
    back (what the store served)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.served = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pump, args=(client, upstream, False),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True),
                             daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, count: bool) -> None:
        try:
            while True:
                data = source.recv(1 << 16)
                if not data:
                    break
                if count:
                    with self._lock:
                        self.served += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self._listener.close()


# ---- the driver: a separate process, so its SparkContext is the cluster's --------------

def _rows(df: Any) -> list[list[Any]]:
    out = []
    for row in df.collect():
        d = row.asDict()
        item = [d["topic"], d["partition"], d["offset"],
                None if d["key"] is None else bytes(d["key"]).hex(),
                None if d["value"] is None else bytes(d["value"]).hex(),
                d["timestamp"].isoformat(), d["timestampType"]]
        if "headers" in d:
            item.append([[h["key"], None if h["value"] is None else bytes(h["value"]).hex()]
                         for h in d["headers"] or []])
        out.append(item)
    return sorted(out, key=lambda r: (r[0], r[1], r[2]))


def _stream(spark: Any, job: dict[str, Any], status: str, on_batch: Any, trigger: str,
            collected: list[Any]) -> None:
    """Run the job's streaming query, `on_batch` taking each micro-batch into
    `collected`, until `job["expect"]` items are in, the query fails, or
    `job["timeout"]` seconds pass; `status` says "streaming" once it runs."""
    query = (spark.readStream.format("logkit").options(**job["options"]).load()
             .writeStream.foreachBatch(on_batch)
             .option("checkpointLocation", job["checkpoint"])
             .trigger(processingTime=trigger).start())
    with open(status, "w") as f:
        f.write("streaming")
    deadline = time.monotonic() + job["timeout"]
    while len(collected) < job["expect"] and time.monotonic() < deadline:
        if query.exception() is not None:
            break
        time.sleep(0.1)
    query.stop()


def run_jobs(spark: Any, jobs: list[dict[str, Any]], status: str) -> list[Any]:
    """Each job: {"kind": "batch"|"error"|"stream", "options": {...}}; a stream job
    also has "expect" (rows) and "timeout" (s), and writes "streaming" to `status`
    once its query runs."""
    results: list[Any] = []
    for job in jobs:
        if job["kind"] == "batch":
            results.append(_rows(spark.read.format("logkit").options(**job["options"])
                                 .load()))
        elif job["kind"] == "error":
            try:
                spark.read.format("logkit").options(**job["options"]).load().collect()
                results.append(None)
            except Exception as exc:          # noqa: BLE001 - the message is the result
                results.append(str(exc))
        elif job["kind"] == "scan":             # benchmarks: timed full scans
            times = []
            for _ in range(job["repeats"]):
                began = time.perf_counter()
                spark.read.format("logkit").options(**job["options"]).load() \
                    .selectExpr("sum(length(value))", "count(*)").collect()
                times.append(time.perf_counter() - began)
            results.append(times)
        elif job["kind"] == "lag":              # benchmarks: produce time to the sink
            lags: list[float] = []

            def arrived(df: Any, _batch: int) -> None:
                now_ms = time.time() * 1000
                lags.extend(now_ms - r[0].timestamp() * 1000
                            for r in df.select("timestamp").collect())
            _stream(spark, job, status, arrived, "100 milliseconds", lags)
            results.append(lags)
        elif job["kind"] == "stream":
            seen: list[list[Any]] = []

            def collect(df: Any, _batch: int) -> None:
                seen.extend(_rows(df))
            _stream(spark, job, status, collect, "200 milliseconds", seen)
            results.append(sorted(seen, key=lambda r: (r[0], r[1], r[2])))
    return results


def main(argv: list[str]) -> int:
    """python spark_cluster.py MASTER_URL WORKDIR: start a session on the cluster, warm
    its executors' Python workers, write WORKDIR/ready, wait for WORKDIR/jobs.json, run
    the jobs, write WORKDIR/results.json."""
    import json
    master, workdir = argv
    cluster = SparkCluster("")
    cluster.master_url = master
    spark = cluster.session(**{"spark.task.maxFailures": "1"})
    try:
        spark.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).collect()
        with open(os.path.join(workdir, "ready"), "w") as f:
            f.write("ready")
        jobs_file = os.path.join(workdir, "jobs.json")
        deadline = time.monotonic() + DRIVER_WAIT_S
        while not os.path.exists(jobs_file):
            if time.monotonic() > deadline:
                raise SystemExit(f"no {jobs_file} within {DRIVER_WAIT_S} s")
            time.sleep(0.1)
        with open(jobs_file) as f:
            jobs = json.load(f)
        results = run_jobs(spark, jobs, os.path.join(workdir, "status"))
    finally:
        spark.stop()
    results_file = os.path.join(workdir, "results.json")
    with open(results_file + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(results_file + ".tmp", results_file)
    return 0


class Driver:
    """The cluster driver process (`main`), started early so its executors warm up
    while a test prepares its data; `submit(jobs)` hands it the jobs (written whole,
    then renamed into place), `results()` waits for the answers."""

    def __init__(self, cluster: SparkCluster, workdir: str) -> None:
        self.workdir = workdir
        os.makedirs(workdir, exist_ok=True)
        self.log = os.path.join(workdir, "driver.log")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), cluster.master_url, workdir],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**_without_store_settings(), "PYSPARK_PYTHON": sys.executable})

    def path(self, name: str) -> str:
        return os.path.join(self.workdir, name)

    def submit(self, jobs: list[dict[str, Any]]) -> None:
        import json
        with open(self.path("jobs.json.tmp"), "w") as f:
            json.dump(jobs, f)
        os.replace(self.path("jobs.json.tmp"), self.path("jobs.json"))

    def wait_for(self, name: str, timeout: float = DRIVER_WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.path(name)):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the cluster driver ended with {self.proc.returncode} "
                                   f"before {name}: {self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster driver wrote no {name} within "
                                   f"{timeout} s: {self.tail()}")
            time.sleep(0.1)

    def results(self, timeout: float = DRIVER_WAIT_S) -> list[Any]:
        import json
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"the cluster driver ran past {timeout} s: {self.tail()}")
        if code != 0:
            raise RuntimeError(f"the cluster driver ended with {code}: {self.tail()}")
        with open(self.path("results.json")) as f:
            return json.load(f)

    def tail(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()



if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
