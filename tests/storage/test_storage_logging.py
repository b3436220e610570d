"""The storage modules log what they do to the data (docs/design.md §5): a WARNING naming
`topic-partition` and the bytes cut when recovery cuts a torn tail, INFO for segments
that retention deletes, DEBUG for rolls; and no module installs a handler."""

from __future__ import annotations

import importlib
import logging
import os

import logkit
from tests.helpers.tailpoke import simulate_reboot

STORAGE_MODULES = ["log", "tail", "loader", "segment", "index", "records", "crc",
                   "compression", "columns", "notify", "murmur2", "_native"]


def test_recovery_that_cuts_a_torn_tail_warns_with_partition_and_bytes(tmp_path, caplog):
    """A partial batch after a crash is cut, and the WARNING says where and how much."""
    with logkit.Broker(tmp_path) as broker:
        p = broker.create_topic("orders", 2).partition(1)
        p.append([(b"k", b"v%d" % i, None, None) for i in range(10)])
        directory = p.directory
    log_path = os.path.join(directory, "00000000000000000000.log")
    good = os.path.getsize(log_path)
    with open(log_path, "ab") as f:
        f.write(b"\x00" * 7 + b"\x0a" + b"\x00\x00\x01\x00" + b"torn!")     # 17 bytes
    simulate_reboot(directory)
    with caplog.at_level(logging.DEBUG, logger="logkit"):
        with logkit.Broker(tmp_path) as broker:
            p = broker.topic("orders").partition(1)
            assert p.log_end_offset == 10
    assert os.path.getsize(log_path) == good
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and r.name.startswith("logkit.")]
    assert warnings, "no WARNING for the cut"
    cut = [r.getMessage() for r in warnings if "orders-1" in r.getMessage()
           and "17 bytes" in r.getMessage()]
    assert cut, [r.getMessage() for r in warnings]
    assert any(log_path in message for message in cut)


def test_a_clean_reopen_logs_no_warning(tmp_path, caplog):
    """Opening a cleanly closed partition is not news: nothing at WARNING."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 1).partition(0).append([(None, b"x", None, None)])
    with caplog.at_level(logging.DEBUG, logger="logkit"):
        with logkit.Broker(tmp_path) as broker:
            assert broker.topic("t").partition(0).log_end_offset == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING
                and r.name.startswith("logkit.")]


def test_rolls_log_debug_and_retention_logs_what_it_deletes(tmp_path, caplog):
    """A roll is a DEBUG line; retention names the partition and the new log start."""
    with caplog.at_level(logging.DEBUG, logger="logkit"):
        with logkit.Broker(tmp_path, background=False) as broker:
            p = broker.create_topic("t", 1, config={"segment.bytes": 2048,
                                                    "retention.bytes": 4096}).partition(0)
            for n in range(40):
                p.append([(None, b"v" * 100, None, None)])
            assert p.enforce_retention() > 0
            start = p.log_start_offset
    rolls = [r for r in caplog.records if r.name == "logkit.log"
             and r.levelno == logging.DEBUG and "rolled" in r.getMessage()]
    assert rolls and all("t-0" in r.getMessage() for r in rolls)
    retention = [r.getMessage() for r in caplog.records if r.name == "logkit.log"
                 and r.levelno == logging.WARNING and "retention deleted" in r.getMessage()]
    assert retention and "t-0" in retention[-1] and str(start) in retention[-1]


def test_storage_modules_log_under_their_names_without_handlers():
    """Each storage module has `log` named logkit.<module>; none adds a handler."""
    for name in STORAGE_MODULES:
        module = importlib.import_module(f"logkit.{name}")
        assert module.log.name == f"logkit.{name}"
        assert module.log.handlers == []
    assert logging.getLogger("logkit").handlers == []
