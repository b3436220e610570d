"""Test helper: a real Apache Kafka, started by the tests themselves, as the oracle.

Owns the single-node KRaft broker (broker and controller in one JVM) that the Kafka
tests compare logkit with, and the way to run Kafka's command-line tools by class name.
Both run from the classpath directory that `make kafka` fills from tools/kafka/pom.xml
(tools/kafka/lib/); nothing here downloads anything.

Invariant: a `KafkaBroker` listens on 127.0.0.1 only, on ports picked free at start, and
keeps every file (config, data, logs) under the directory it was given; `stop()` leaves
no JVM behind (SIGTERM for a controlled shutdown, then SIGKILL past a deadline) and is
safe twice, and where util-linux's `setpriv` is found the JVM is also sent SIGTERM when
the thread that started it ends (so start it from a thread that outlives its use). `skip_reason()` is the one place that says why these tests cannot run here.

Kafka (KRaft) applies metadata asynchronously: CreateTopics and AlterConfigs are answered
once the controller has committed them, and the broker's metadata cache (what Metadata,
DescribeConfigs and DescribeTopics answer from) learns of them a moment later, as it
learns of partition leaders after a restart. `create_topics` and `wait_until_known` are
the one way the tests wait for that state (polled, with a deadline), never a sleep.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT_DIR = Path(__file__).resolve().parents[2]
KAFKA_DIR = ROOT_DIR / "tools" / "kafka"
LIB_DIR = KAFKA_DIR / "lib"
SPARK_LIB_DIR = KAFKA_DIR / "spark-lib"
RESOLVED_STAMP = LIB_DIR / ".resolved"
JAVA_SRC_DIR = KAFKA_DIR / "src"
CLASSES_DIR = KAFKA_DIR / "classes"

# Kafka's tools by their short script names (bin/kafka-*.sh in a Kafka distribution).
TOOLS = {
    "kafka-dump-log": "org.apache.kafka.tools.DumpLogSegments",
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-configs": "kafka.admin.ConfigCommand",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "kafka-delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "kafka-producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "kafka-consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    "kafka-e2e-latency": "org.apache.kafka.tools.EndToEndLatency",
    "kafka-storage": "kafka.tools.StorageTool",
}

# librdkafka's logger while the broker starts: connection refusals are expected there.
_QUIET = logging.getLogger("tests.helpers.kafka.wait")
_QUIET.setLevel(logging.CRITICAL)
_QUIET.propagate = False

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
# a deadline on a metadata state the broker reaches in milliseconds when idle; generous
# because a CI-like machine runs several JVMs on two cores (load average 6-10)
METADATA_TIMEOUT_S = 60.0
TOOL_TIMEOUT_S = 120.0
BROKER_HEAP = "-Xmx512m"
TOOL_HEAP = "-Xmx256m"

# Tools log warnings and errors to stderr only, so their stdout is what they print.
_TOOLS_LOG4J = """\
status = error
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = err
"""

# The broker logs INFO to a file in its directory; the test shows its tail on failure.
_BROKER_LOG4J = """\
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
"""


def skip_reason() -> str | None:
    """Why the Kafka tests cannot run on this machine, or None when they can."""
    if shutil.which("java") is None:
        return "java is not installed (the Kafka tests need a JDK 17+)"
    if not RESOLVED_STAMP.exists():
        if shutil.which("mvn") is None:
            return "mvn is not installed, so `make kafka` cannot resolve Apache Kafka"
        return f"{LIB_DIR.relative_to(ROOT_DIR)} is absent: run `make kafka`"
    return None


def classpath(lib_dir: Path = LIB_DIR) -> str:
    return f"{lib_dir}/*"


def _tools_log4j() -> Path:
    """The tools' log4j2 configuration, written once beside the classpath directory."""
    path = LIB_DIR / "log4j2-tools.properties"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(_TOOLS_LOG4J)
        os.replace(tmp, path)
    return path


def java_command(main_class: str, *args: str, heap: str = TOOL_HEAP,
                 log4j: Path | None = None, extra_classpath: Path | None = None) -> list[str]:
    config = log4j or _tools_log4j()
    path = classpath() if extra_classpath is None else f"{extra_classpath}:{classpath()}"
    return ["java", heap, "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={config}",
            "-cp", path, main_class, *map(str, args)]


def compile_java(name: str) -> Path:
    """Compile tools/kafka/src/<name>.java against Kafka's classpath into
    tools/kafka/classes (again only when the source is newer than its class); returns
    the classes directory, for `run_java(name, ...)`."""
    source = JAVA_SRC_DIR / f"{name}.java"
    compiled = CLASSES_DIR / f"{name}.class"
    if compiled.exists() and compiled.stat().st_mtime >= source.stat().st_mtime:
        return CLASSES_DIR
    CLASSES_DIR.mkdir(exist_ok=True)
    proc = subprocess.run(["javac", "-d", str(CLASSES_DIR), "-cp", classpath(), str(source)],
                          capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    if proc.returncode != 0:
        raise AssertionError(f"javac {source} failed:\n{proc.stdout}{proc.stderr}")
    return CLASSES_DIR


def run_java(name: str, *args: str, timeout_s: float = TOOL_TIMEOUT_S
             ) -> subprocess.CompletedProcess[str]:
    """Run the main method of tools/kafka/src/<name>.java (compiled when needed) with
    Kafka's classpath; AssertionError with its output when it exits non-zero."""
    classes = compile_java(name)
    proc = subprocess.run(java_command(name, *args, extra_classpath=classes),
                          capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise AssertionError(f"{name} exited {proc.returncode}\nstdout:\n"
                             f"{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def run_tool(tool: str, *args: str, timeout_s: float = TOOL_TIMEOUT_S, check: bool = True,
             input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's command-line tools: `tool` is a script name from TOOLS
    (`kafka-dump-log`) or a fully qualified main class. Returns the finished process
    (text stdout and stderr); raises AssertionError naming both when `check` and it
    exited non-zero."""
    main_class = TOOLS.get(tool, tool)
    proc = subprocess.run(java_command(main_class, *args), capture_output=True, text=True,
                          timeout=timeout_s, input=input_text,
                          stdin=None if input_text is not None else subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"{tool} {' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def wait_until_known(admin, topic: str, partitions: int, *,
                     timeout_s: float = METADATA_TIMEOUT_S) -> None:
    """Return once `admin`'s (a confluent-kafka AdminClient's) Metadata answer shows
    `topic` with `partitions` partitions, each with a leader; AssertionError naming what
    it last saw after `timeout_s`. KRaft answers CreateTopics once its controller has
    committed the topic; until the broker's metadata cache learns of it, DescribeConfigs
    gets UNKNOWN_TOPIC_OR_PART and kafka-topics --describe says it does not exist."""
    deadline = time.monotonic() + timeout_s
    seen: object = None
    while True:
        try:
            seen = admin.list_topics(topic=topic, timeout=max(deadline - time.monotonic(),
                                                              1.0)).topics.get(topic)
        except Exception as exc:        # KafkaException: a timeout under load, ask again
            seen = exc
        else:
            if seen is not None and seen.error is None \
                    and len(seen.partitions) == partitions \
                    and all(p.error is None and p.leader >= 0
                            for p in seen.partitions.values()):
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic} with {partitions} partition(s), each with a "
                                 f"leader, not in the metadata after {timeout_s} s; "
                                 f"last seen: {seen!r}")
        time.sleep(0.05)            # polling a state with a deadline, not a guess at a delay


def create_topics(bootstrap_servers: str, new_topics: list, *,
                  timeout_s: float = METADATA_TIMEOUT_S) -> None:
    """CreateTopics of `new_topics` (confluent-kafka NewTopic objects), then wait until
    the broker's metadata shows each of them (`wait_until_known`)."""
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    for future in admin.create_topics(new_topics, operation_timeout=timeout_s).values():
        future.result(timeout=timeout_s)
    for new in new_topics:
        wait_until_known(admin, new.topic, new.num_partitions, timeout_s=timeout_s)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def random_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's
    Uuid.toString); Kafka refuses ids that start with '-', so those are drawn again."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


class KafkaBroker:
    """One Apache Kafka node, broker and KRaft controller in one JVM, on 127.0.0.1.

    Layout under `root`: server.properties, log4j2.properties, server.log (the broker's
    log), stdout.log (the JVM's own output) and data/ (log.dirs: one directory per
    partition, `<topic>-<partition>`, as Kafka names them). `start()` formats data/ the
    first time, starts the JVM and returns once a metadata request is answered;
    `stop()` ends it; `start()` again reuses the same directory and ports."""

    def __init__(self, root: str | os.PathLike[str], *,
                 config: dict[str, object] | None = None) -> None:
        self.root = Path(root)
        self.data_dir = self.root / "data"
        self.port = free_port()
        self.controller_port = free_port()
        self.config = dict(config or {})
        self.cluster_id = random_cluster_id()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_seconds: float | None = None   # how long the last start() took
        self._formatted = False

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    def _write_config(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        settings: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
                         f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            # One node: the internal topics cannot have Kafka's default three replicas.
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 1,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            **self.config,
        }
        path = self.root / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        log4j = self.root / "log4j2.properties"
        log4j.write_text(_BROKER_LOG4J.format(log_file=self.root / "server.log"))
        return path

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        began = time.monotonic()
        properties = self._write_config()
        if not self._formatted:
            run_tool("kafka-storage", "format", "--config", str(properties),
                     "--cluster-id", self.cluster_id, "--ignore-formatted")
            self._formatted = True
        command = java_command("kafka.Kafka", str(properties), heap=BROKER_HEAP,
                               log4j=self.root / "log4j2.properties")
        if shutil.which("setpriv"):
            # SIGTERM to the JVM when the thread that started it dies, even by SIGKILL:
            # a killed test run leaves no broker behind
            command = ["setpriv", "--pdeathsig", "TERM", *command]
        with open(self.root / "stdout.log", "ab") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready(began + timeout_s)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began

    def _wait_ready(self, deadline: float) -> None:
        """Until a metadata request is answered (the broker is registered with its
        controller and serving) and shows a leader for every partition (after a restart
        the controller elects them once the broker is unfenced, a moment after it
        serves), the JVM exits, or the deadline passes."""
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers,
                             "logger": _QUIET})
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise AssertionError(f"Kafka exited before it answered:\n{self.log_tail()}")
            try:
                metadata = admin.list_topics(timeout=2)
            except Exception:   # KafkaException while it starts: ask again
                time.sleep(0.2)
                continue
            if metadata.brokers and all(
                    t.error is None and all(p.error is None and p.leader >= 0
                                            for p in t.partitions.values())
                    for t in metadata.topics.values()):
                return
            time.sleep(0.2)
        raise AssertionError(f"Kafka did not answer within the deadline:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        parts = []
        for name in ("stdout.log", "server.log"):
            path = self.root / name
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Controlled shutdown (SIGTERM), then SIGKILL past `timeout_s`; safe twice."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)

    @contextmanager
    def stopped(self) -> Iterator[KafkaBroker]:
        """The broker stopped for the block (its files closed and flushed, as Kafka
        leaves them at a clean shutdown), then started again on the same directory."""
        self.stop()
        try:
            yield self
        finally:
            self.start()

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

