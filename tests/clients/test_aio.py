"""The asyncio clients (logkit.aio, docs/design.md §17): aiokafka's shapes over the
embedded broker — send futures and send_and_wait, getone/getmany/async for, commit of
what was delivered (not of what was prefetched), seek/position, pause/resume,
end_offsets, a full buffer that makes send() wait and then time out, stop() waking every
waiter, transactions through `async with producer.transaction()` skipped by a
read_committed AIOConsumer when aborted, teardown under asyncio.run with no task or
thread left, and the plugin's factories."""

from __future__ import annotations

import asyncio
import threading

import pytest

import logkit
from tests.helpers.aio_run import run_bounded
from logkit.testing import produce
from logkit.aio import AIOConsumer, AIOProducer

TP = logkit.TopicPartition
LIMIT_S = 30.0


def run(coro):
    return run_bounded(coro, LIMIT_S)


def aio_threads():
    return [t for t in threading.enumerate() if t.name.startswith("logkit-aio")]


@pytest.fixture
def broker(logkit_broker):
    logkit_broker.create_topic("t", 3)
    logkit_broker.create_topic("one", 1)
    return logkit_broker


def test_send_returns_a_future_of_record_metadata_and_consumers_read_it_back(broker):
    async def main():
        async with AIOProducer(broker, linger_ms=0) as producer:
            future = await producer.send("one", b"v0", key=b"k0",
                                         headers=[("h", b"x")])
            assert isinstance(future, asyncio.Future)
            first = await future
            second = await producer.send_and_wait("one", b"v1", partition=0)
            assert (first.topic, first.partition, first.offset) == ("one", 0, 0)
            assert second.offset == 1
        async with AIOConsumer(broker, "one", auto_offset_reset="earliest") as consumer:
            record = await consumer.getone()
            assert (record.key, record.value, record.headers) == (b"k0", b"v0",
                                                                 [("h", b"x")])
            assert await consumer.position(TP("one", 0)) == 1
            record = await consumer.getone()
            assert record.value == b"v1"
            assert await consumer.getmany(timeout_ms=0) == {}
    run(main())


def test_getmany_returns_records_by_partition_within_max_records(broker):
    produce(broker, "t", [{"value": b"%d" % i, "partition": i % 3}
                                         for i in range(30)])

    async def main():
        async with AIOConsumer(broker, auto_offset_reset="earliest") as consumer:
            consumer.assign([TP("t", p) for p in range(3)])
            got: dict = {}
            while sum(map(len, got.values())) < 30:
                batch = await consumer.getmany(timeout_ms=5000, max_records=7)
                assert 0 < sum(map(len, batch.values())) <= 7
                for tp, records in batch.items():
                    got.setdefault(tp, []).extend(records)
            for p in range(3):
                assert [r.value for r in got[TP("t", p)]] == \
                    [b"%d" % i for i in range(p, 30, 3)]
            ends = await consumer.end_offsets([TP("t", p) for p in range(3)])
            assert ends == {TP("t", p): 10 for p in range(3)}
            assert consumer.assignment() == {TP("t", p) for p in range(3)}
    run(main())


def test_a_waiting_getone_wakes_when_another_task_sends(broker):
    async def main():
        async with AIOConsumer(broker, "one", auto_offset_reset="earliest") as consumer, \
                AIOProducer(broker) as producer:
            waiting = asyncio.ensure_future(consumer.getone())
            await asyncio.sleep(0.05)        # let it reach the wait: no record exists
            assert not waiting.done()
            await producer.send_and_wait("one", b"late")
            record = await asyncio.wait_for(waiting, 5)
            assert record.value == b"late"
    run(main())


def test_commit_without_offsets_commits_what_was_delivered_not_what_was_prefetched(broker):
    produce(broker, "one", [b"%d" % i for i in range(100)])

    async def main():
        async with AIOConsumer(broker, "one", group_id="g", auto_offset_reset="earliest",
                               enable_auto_commit=False) as consumer:
            for i in range(10):
                assert (await consumer.getone()).offset == i
            await consumer.commit()
            assert await consumer.committed(TP("one", 0)) == 10
            await consumer.commit({TP("one", 0): 42})      # names the NEXT record
            assert await consumer.committed(TP("one", 0)) == 42
    run(main())
    assert broker.group("g").committed()[TP("one", 0)] == 42


def test_seek_is_a_plain_call_and_the_next_record_is_at_the_offset(broker):
    produce(broker, "one", [b"%d" % i for i in range(50)])

    async def main():
        async with AIOConsumer(broker, auto_offset_reset="earliest") as consumer:
            consumer.assign([TP("one", 0)])
            assert (await consumer.getone()).offset == 0
            assert consumer.seek(TP("one", 0), 40) is None
            assert await consumer.position(TP("one", 0)) == 40
            assert [(await consumer.getone()).offset for _ in range(3)] == [40, 41, 42]
            consumer.seek(TP("one", 0), 5)
            assert (await consumer.getone()).offset == 5
    run(main())


def test_a_paused_partition_delivers_nothing_until_resumed(broker):
    produce(broker, "t", [{"value": b"p%d" % p, "partition": p}
                                         for p in range(3)])

    async def main():
        async with AIOConsumer(broker, auto_offset_reset="earliest") as consumer:
            consumer.assign([TP("t", p) for p in range(3)])
            consumer.pause(TP("t", 1))
            assert consumer.paused() == {TP("t", 1)}
            seen = set()
            while len(seen) < 2:
                for tp in (await consumer.getmany(timeout_ms=5000)):
                    seen.add(tp)
            assert seen == {TP("t", 0), TP("t", 2)}
            assert await consumer.getmany(timeout_ms=100) == {}
            consumer.resume(TP("t", 1))
            record = await consumer.getone()
            assert (record.partition, record.value) == (1, b"p1")
    run(main())


def test_async_for_reads_in_order_and_stop_ends_it(broker):
    produce(broker, "one", [b"%d" % i for i in range(20)])

    async def main():
        consumer = AIOConsumer(broker, "one", auto_offset_reset="earliest")
        await consumer.start()
        seen, stopping = [], []

        async def read():
            async for record in consumer:
                seen.append(record.offset)
                if len(seen) == 20:
                    stopping.append(asyncio.ensure_future(consumer.stop()))
        await read()            # ends: stop() ends async for instead of raising
        assert seen == list(range(20))
        await stopping[0]
    run(main())


def test_stop_wakes_every_waiter_with_closed_error(broker):
    async def main():
        consumer = AIOConsumer(broker, "one", auto_offset_reset="earliest")
        await consumer.start()
        waiters = [asyncio.ensure_future(consumer.getone()) for _ in range(5)]
        waiters += [asyncio.ensure_future(consumer.getmany(timeout_ms=60_000))
                    for _ in range(3)]
        ended = []

        async def iterate():
            async for record in consumer:
                ended.append(record)
            ended.append("end")
        waiters.append(asyncio.ensure_future(iterate()))
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiters)
        await consumer.stop()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(r, logkit.ClosedError) for r in results[:8]), results
        assert ended == ["end"]
        with pytest.raises(logkit.ClosedError):
            await consumer.getone()
        await consumer.stop()                  # safe twice
    run(main())


def test_teardown_under_asyncio_run_leaves_no_task_and_no_thread(broker):
    async def main():
        producer = AIOProducer(broker)
        consumer = AIOConsumer(broker, "one", auto_offset_reset="earliest")
        await producer.start()
        await consumer.start()
        assert len(aio_threads()) == 2
        await producer.send_and_wait("one", b"x")
        assert (await consumer.getone()).value == b"x"
        pending_get = asyncio.ensure_future(consumer.getone())
        await asyncio.sleep(0)
        await producer.stop()
        await consumer.stop()
        with pytest.raises(logkit.ClosedError):
            await pending_get
        assert asyncio.all_tasks() == {asyncio.current_task()}
        assert aio_threads() == []
    asyncio.run(main())      # no wrapper task: all_tasks() is main's alone
    assert aio_threads() == []


def test_a_full_buffer_makes_send_wait_then_time_out(broker):
    gate = threading.Event()

    def held(value):            # the worker serializes: it stalls here until the gate
        gate.wait(LIMIT_S)
        return value

    async def main():
        producer = AIOProducer(broker, buffer_memory=2048, batch_size=512,
                               max_block_ms=200, value_serializer=held)
        await producer.start()
        try:
            futures = []
            with pytest.raises(logkit.LogkitTimeoutError):
                for i in range(100):
                    futures.append(await producer.send("one", b"x" * 200))
            assert 0 < len(futures) < 100
            # a send waiting for room goes on once records are stored
            waiting = asyncio.ensure_future(producer.send("one", b"y" * 200))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            gate.set()
            stored = await asyncio.wait_for(await waiting, 10)
            assert stored.offset == len(futures)
        finally:
            gate.set()
            await producer.stop()
    run(main())
    assert broker.topic("one").partition(0).log_end_offset == \
        len(broker.topic("one").partition(0).read(0, max_records=1000))


def test_a_read_committed_aio_consumer_skips_an_aborted_transaction(broker):
    class Abort(Exception):
        pass

    async def main():
        async with AIOProducer(broker, transactional_id="tx") as producer:
            async with producer.transaction():
                await producer.send("one", b"c0")
            with pytest.raises(Abort):
                async with producer.transaction():
                    for i in range(5):
                        await producer.send("one", b"a%d" % i)
                    await producer.flush()
                    raise Abort
            async with producer.transaction():
                await producer.send("one", b"c1")
        async with AIOConsumer(broker, "one", auto_offset_reset="earliest",
                               isolation_level="read_committed") as committed, \
                AIOConsumer(broker, "one", auto_offset_reset="earliest") as everything:
            assert [(await committed.getone()).value for _ in range(2)] == [b"c0", b"c1"]
            assert await committed.getmany(timeout_ms=100) == {}
            values = [(await everything.getone()).value for _ in range(7)]
            assert values == [b"c0"] + [b"a%d" % i for i in range(5)] + [b"c1"]
    run(main())


def test_calls_before_start_and_after_stop_raise_named_errors(broker):
    async def main():
        producer = AIOProducer(broker)
        with pytest.raises(logkit.IllegalStateError):
            await producer.send("one", b"x")
        await producer.start()
        await producer.stop()
        with pytest.raises(logkit.ClosedError):
            await producer.send("one", b"x")
        consumer = AIOConsumer(broker, "one")
        with pytest.raises(logkit.IllegalStateError):
            await consumer.getone()
        await consumer.start()
        with pytest.raises(logkit.ConfigError):
            await consumer.getmany(max_records=0)
        await consumer.stop()
    run(main())


def test_an_unknown_topic_fails_the_send_future(tmp_path):
    async def main(broker):
        async with AIOProducer(broker) as producer:
            with pytest.raises(logkit.UnknownTopicError):
                await (await producer.send("missing", b"x"))
            assert (await producer.send_and_wait("known", b"ok")).offset == 0
    with logkit.Broker(tmp_path, config={"auto.create.topics.enable": False},
                       background=False) as broker:
        broker.create_topic("known", 1)
        run(main(broker))


def test_the_plugin_factories_make_clients_on_logkit_broker(broker, aio_producer,
                                                             aio_consumer):
    async def main():
        async with aio_producer() as producer:
            await producer.send_and_wait("one", b"f")
        async with aio_consumer("one") as consumer:
            assert (await consumer.getone()).value == b"f"
        leaked = aio_consumer("one")       # started, never stopped: the fixture stops it
        await leaked.start()
    run(main())


def test_the_example_in_docs_web_md_runs():
    import pathlib
    import re
    import subprocess
    import sys
    text = (pathlib.Path(__file__).parents[2] / "docs" / "web.md").read_text()
    section = text.split("## The asyncio clients (logkit.aio)", 1)[1].split("\n## ", 1)[0]
    [script] = re.findall(r"```python\n(.*?)```", section, re.S)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1 more; 2 in the partition"


def test_subscribe_with_a_listener_runs_its_async_hooks_on_the_loop(broker):
    produce(broker, "t", [{"value": b"x", "partition": p} for p in range(3)])

    async def main():
        loop = asyncio.get_running_loop()
        calls = []

        class Listener:
            async def on_partitions_revoked(self, revoked):
                calls.append(("revoked", revoked, asyncio.get_running_loop() is loop))

            async def on_partitions_assigned(self, assigned):
                calls.append(("assigned", assigned, asyncio.get_running_loop() is loop))

        async with AIOConsumer(broker, group_id="listening",
                               auto_offset_reset="earliest") as consumer:
            consumer.subscribe(["t"], listener=Listener())
            assert consumer.subscription() == {"t"}
            record = await consumer.getone()
            assert record.value == b"x"
            assert ("assigned", {TP("t", p) for p in range(3)}, True) in calls
            assert consumer.assignment() == {TP("t", p) for p in range(3)}
    run(main())
