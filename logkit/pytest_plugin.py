"""logkit's pytest plugin: fixtures that hand a test a broker, a producer, a consumer
and (once the protocol listener exists) a Kafka listener, in milliseconds.

Owns: the fixtures below. pytest loads this module through the `pytest11` entry point
that installing logkit declares, so a test needs no conftest.py:

    logkit_broker           a Broker on a fresh temporary directory, closed after the test
    logkit_broker_session   one Broker for the whole session (share it read-mostly)
    logkit_broker_config    {} — override this fixture to give logkit_broker a config
    logkit_producer         a Producer on logkit_broker (linger_ms=0: every send is prompt)
    logkit_consumer         a Consumer on logkit_broker, no group, no subscription yet,
                            auto_offset_reset="earliest": call subscribe() or assign()
    logkit_server           logkit_broker served on Kafka's wire protocol; its handle has
                            .bootstrap_servers (skipped while Broker.serve() is missing)
    aio_producer            a factory: aio_producer(**config) -> an AIOProducer on
                            logkit_broker, not started (`async with` it in the test)
    aio_consumer            a factory: aio_consumer(*topics, **config) -> an AIOConsumer
                            on logkit_broker (auto_offset_reset="earliest"), not started

The asyncio factories are plain fixtures (they work without pytest-asyncio or any
async plugin): the test starts the clients in its own loop (`asyncio.run`, or an async
test under a plugin); a client the test left running is stopped at teardown.

Invariant: every object a fixture makes is closed by that fixture, after the test, even
when the test fails; the directories are pytest's own tmp_path_factory ones. Brokers run
without their background thread (`background=False`), so nothing happens that a test did
not ask for: call `broker.enforce_retention()` to apply retention.

Helpers for the test bodies are in `logkit.testing`; docs/testing.md is the guide.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

import pytest

import logkit

log = logging.getLogger(__name__)

SERVE_MISSING = ("logkit_server needs Broker.serve() (the Kafka protocol listener), which "
                 "this version of logkit does not have")


def _open(directory: Any, config: Any) -> logkit.Broker:
    return logkit.Broker(directory, config=config or None, background=False)


@pytest.fixture
def logkit_broker_config() -> dict[str, Any]:
    """Broker settings for `logkit_broker` (Kafka's names, e.g. {"num.partitions": 3});
    override this fixture in a test module or conftest.py to change them."""
    return {}


@pytest.fixture
def logkit_broker(tmp_path_factory: pytest.TempPathFactory,
                  logkit_broker_config: dict[str, Any]) -> Iterator[logkit.Broker]:
    """A Broker on a fresh, empty temporary directory; closed after the test."""
    with _open(tmp_path_factory.mktemp("logkit"), logkit_broker_config) as broker:
        yield broker


@pytest.fixture(scope="session")
def logkit_broker_session(tmp_path_factory: pytest.TempPathFactory
                          ) -> Iterator[logkit.Broker]:
    """One Broker for the whole test session: topics made by one test are seen by the
    next, so give each test its own topic names (or use `logkit_broker`)."""
    with _open(tmp_path_factory.mktemp("logkit-session"), None) as broker:
        yield broker


@pytest.fixture
def logkit_producer(logkit_broker: logkit.Broker) -> Iterator[logkit.Producer]:
    """A Producer on `logkit_broker` with linger_ms=0; closed (and so flushed) after."""
    producer = logkit_broker.producer(linger_ms=0)
    try:
        yield producer
    finally:
        producer.close()


@pytest.fixture
def logkit_consumer(logkit_broker: logkit.Broker) -> Iterator[logkit.Consumer]:
    """A Consumer on `logkit_broker`: no group, no topics yet (call subscribe([...]) or
    assign([...])), reading from the earliest offset; closed after the test."""
    consumer = logkit_broker.consumer(auto_offset_reset="earliest",
                                      enable_auto_commit=False)
    try:
        yield consumer
    finally:
        consumer.close()


@pytest.fixture
def logkit_server(logkit_broker: logkit.Broker) -> Iterator[Any]:
    """`logkit_broker` served on Kafka's wire protocol on a free loopback port; point a
    Kafka client at `logkit_server.bootstrap_servers`. Closed after the test."""
    serve = getattr(logkit_broker, "serve", None)
    if serve is None:
        pytest.skip(SERVE_MISSING)
    server = serve(host="127.0.0.1", port=0)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def aio_producer(logkit_broker: logkit.Broker) -> Iterator[Any]:
    """A factory of `logkit.aio.AIOProducer`s on `logkit_broker` (linger_ms=0 unless
    given); each is stopped after the test if the test did not stop it."""
    from logkit.aio import AIOProducer
    made: list[AIOProducer] = []

    def make(**config: Any) -> AIOProducer:
        config.setdefault("linger_ms", 0)
        made.append(AIOProducer(logkit_broker, **config))
        return made[-1]
    yield make
    for client in made:
        client._stop_blocking()


@pytest.fixture
def aio_consumer(logkit_broker: logkit.Broker) -> Iterator[Any]:
    """A factory of `logkit.aio.AIOConsumer`s on `logkit_broker` (reading from the
    earliest offset unless told); each is stopped after the test if the test did not."""
    from logkit.aio import AIOConsumer
    made: list[AIOConsumer] = []

    def make(*topics: str, **config: Any) -> AIOConsumer:
        config.setdefault("auto_offset_reset", "earliest")
        made.append(AIOConsumer(logkit_broker, *topics, **config))
        return made[-1]
    yield make
    for client in made:
        client._stop_blocking()
