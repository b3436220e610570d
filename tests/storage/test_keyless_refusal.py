"""A compacted topic refuses a record without a key with one error (log_append.py's
`_keyless_refused`), whichever append path the record takes: the encoding
`append_records` (Partition.append) and the verified `append_batch` raise the same
InvalidRecordError, with the same message, and store nothing."""

from __future__ import annotations

import pytest

import logkit
from logkit.errors import InvalidRecordError


def test_both_append_paths_refuse_a_keyless_record_with_the_same_error(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("c", 1, config={"cleanup.policy": "compact,delete"})
        p = broker.topic("c").partition(0)
        p.append([(b"k", b"kept", None, None)])
        with pytest.raises(InvalidRecordError) as by_records:
            p.append([(b"k", b"v", None, None), (None, b"orphan", None, None)])
        batch = logkit.BatchBuilder()
        batch.append(b"k", b"v")
        batch.append(None, b"orphan")
        with pytest.raises(InvalidRecordError) as by_batch:
            p.append_batch(batch.build())
        expected = ("topic 'c' is compacted (cleanup.policy=compact,delete): every "
                    "record needs a key")
        for refused in (by_records.value, by_batch.value):
            assert str(refused).startswith(expected), str(refused)
            assert refused.path == p.directory and refused.position == 0
        assert str(by_records.value) == str(by_batch.value)
        assert [r.value for r in p.read(0)] == [b"kept"]
