"""The `logkit` PySpark data source: Spark reads and writes logkit topics the way it
reads and writes Kafka.

PySpark (4.x) discovers this package by its `pyspark_` name prefix and registers
`DefaultSource` under its name, so `spark.read.format("logkit")` works with no set-up;
`register(spark)` does it explicitly. Options and schema mirror Spark's Kafka source;
see docs/spark.md.

With the JVM reader's jar (`jars/logkit-spark.jar`, built when a JDK is present) on the
session's classpath — `local_session()` adds it, or `spark.jars=<jar_path()>` — the name
`logkit` resolves to the JVM source (`logkit.spark.LogkitProvider`), which reads batch
queries itself and hands everything else to this Python source. A package built
without the jar (no JDK, or no Spark jars, where it was built) says so in one WARNING
when a session would have used it: `local_session()` and `register()` then set up the
Python source, which reads several times slower.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from pyspark.sql.datasource import DataSource

from .brokers import broker_for
from .options import LogkitSparkError, SourceOptions, split_options
from .objectstore import StoreBatchReader, StoreStreamReader
from .reader import LogkitBatchReader, LogkitStreamReader, resolve_typed, schema
from .typed import arrow_type
from .writer import LogkitBatchWriter, LogkitStreamWriter, SinkOptions

__all__ = ["DefaultSource", "LogkitDataSource", "LogkitSparkError", "register",
           "python_for_workers", "local_session", "jar_path", "jvm_reader"]

JAR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jars", "logkit-spark.jar")
JVM_PROVIDER = "logkit.spark.LogkitProvider"

log = logging.getLogger(__name__)
_warned_no_jar = False


class LogkitDataSource(DataSource):
    """format("logkit"): batch and streaming reads and writes of logkit topics."""

    @classmethod
    def name(cls) -> str:
        return "logkit"

    def schema(self) -> Any:
        include = str(self.options.get("includeHeaders", "false")).lower() == "true"
        types = {}
        if split_options(self.options)[1]:
            # typed key/value columns: their types come from the schema chosen now
            options = SourceOptions(self.options, streaming=False)
            if options.store:
                StoreBatchReader(options)       # refuses typed columns, saying why
            broker = broker_for(options.path)
            types = {side: arrow_type(broker, spec)
                     for side, spec in resolve_typed(options).items()}
        return schema(include, types)

    def reader(self, schema: Any) -> Any:
        options = SourceOptions(self.options, streaming=False)
        if options.store:                       # a shipped object store (DESIGN §18)
            return StoreBatchReader(options)
        return LogkitBatchReader(options, schema)

    def streamReader(self, schema: Any) -> Any:
        options = SourceOptions(self.options, streaming=True)
        if options.store:
            return StoreStreamReader(options)
        return LogkitStreamReader(options, schema)

    def writer(self, schema: Any, overwrite: bool) -> LogkitBatchWriter:
        if overwrite:
            raise LogkitSparkError("logkit: topics are append-only; use mode('append')")
        return LogkitBatchWriter(SinkOptions(self.options, schema, streaming=False))

    def streamWriter(self, schema: Any, overwrite: bool) -> LogkitStreamWriter:
        return LogkitStreamWriter(SinkOptions(self.options, schema, streaming=True))


DefaultSource = LogkitDataSource


def register(spark: Any) -> None:
    """Register the source on a session explicitly (auto-discovery also works). With the
    JVM reader on the classpath the name is already the JVM source's, which hands what it
    does not read itself to this one: nothing to do."""
    if jvm_reader(spark):
        return
    if jar_path() is None:
        _warn_no_jar()
    spark.dataSource.register(LogkitDataSource)


def jar_path() -> str | None:
    """The JVM reader's jar shipped in this package, None when it was not built."""
    return JAR if os.path.isfile(JAR) else None


def _warn_no_jar() -> None:
    """Once per process: this install has no JVM reader, so the Python source reads."""
    global _warned_no_jar
    if not _warned_no_jar:
        _warned_no_jar = True
        log.warning("logkit: this install of pyspark_logkit has no JVM reader jar (%s "
                    "is missing: it was built without a JDK, or without Spark's jars "
                    "and Maven), so Spark reads logkit topics through the Python data "
                    "source, several times slower. Build it with `python "
                    "spark/jvm/build_jar.py` in a checkout, or reinstall logkit where "
                    "javac and mvn are present.", JAR)


def jvm_reader(spark: Any) -> bool:
    """Whether format("logkit") resolves to the JVM reader on this session: its jar is
    in the session's `spark.jars` (or the driver's extra class path) and
    `spark.logkit.jvm.enabled` is not false."""
    places = ",".join(spark.conf.get(key, "") or "" for key in
                      ("spark.jars", "spark.driver.extraClassPath"))
    if os.path.basename(JAR) not in places:
        return False
    return spark.conf.get("spark.logkit.jvm.enabled", "true").lower() != "false"


def python_for_workers() -> str:
    """Point Spark's Python workers at this interpreter (so they import logkit)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return os.environ["PYSPARK_PYTHON"]


def local_session(app_name: str = "logkit", *, log4j_config: str | None = None,
                  jvm_reader: bool = True, **confs: str) -> Any:
    """A local[2] SparkSession set up for logkit: workers run this interpreter, the UI
    and console progress are off, 2 shuffle partitions, JVM logging at ERROR, and the
    JVM reader's jar on the classpath when it was built (`jvm_reader=False` leaves it
    off). `log4j_config` names a log4j2 properties file; `confs` are extra Spark
    settings."""
    python_for_workers()
    from pyspark.sql import SparkSession
    builder = (SparkSession.builder.master("local[2]").appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2"))
    if jvm_reader and jar_path() and "spark.jars" not in confs:
        builder = builder.config("spark.jars", jar_path())
    elif jvm_reader and jar_path() is None:
        _warn_no_jar()
    if log4j_config:
        builder = builder.config("spark.driver.extraJavaOptions",
                                 f"-Dlog4j2.configurationFile={log4j_config}")
    for key, value in confs.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
