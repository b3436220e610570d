"""Shared fixtures: real directories, real brokers."""

from __future__ import annotations

import os
import sys

import pytest

import logkit

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture
def broker(tmp_path):
    """A broker on a fresh directory, closed after the test."""
    with logkit.Broker(tmp_path / "data") as b:
        yield b


# ---- Spark: one local session for the whole suite --------------------------------------

@pytest.fixture(scope="session")
def spark():
    """A real local[2] Spark session, shared by every Spark test (Java 17 required)."""
    pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master("local[2]").appName("logkit-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
               .config("spark.driver.memory", "1g")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
