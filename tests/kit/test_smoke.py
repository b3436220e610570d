"""The quickstart path works end to end on a real directory."""

import logkit


def test_create_append_read_reopen(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        topic = broker.create_topic("orders", partitions=3)
        base = topic.partition(1).append([(b"k", b"v1", [("h", b"x")], 1000),
                                          (None, b"v2", None, 1001)])
        assert base == 0
    with logkit.Broker(tmp_path) as broker:
        records = broker.topic("orders").partition(1).read(0)
        assert [(r.offset, r.key, r.value, list(r.headers)) for r in records] == [
            (0, b"k", b"v1", [("h", b"x")]), (1, None, b"v2", [])]
        assert broker.topics() == ["orders"]
