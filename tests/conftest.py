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
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from pyspark_logkit import local_session
    session = local_session(
        "logkit-tests", **{"spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
                           "spark.driver.memory": "1g"})
    yield session
    session.stop()


# ---- Apache Kafka: one real broker for the whole suite (tests/helpers/kafka.py) --------

@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """A real single-node KRaft Kafka on 127.0.0.1, shared by every Kafka test; skips
    with the reason when java, mvn or the resolved classpath (`make kafka`) is absent."""
    from tests.helpers.kafka import KafkaBroker, skip_reason
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.stop()
