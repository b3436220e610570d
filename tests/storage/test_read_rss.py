"""A reader does not keep what it has read in its memory: the pages of a segment's map
that a reader has gone past are dropped from the process (the page cache keeps them),
so reading a big segment to its end grows the reader's file-backed RSS by a few MiB,
not by the segment's size. Measured in a fresh child process from /proc/self/status."""

from __future__ import annotations

import subprocess
import sys

import pytest

import logkit
from tests.helpers.procs import ROOT_DIR

READER = r"""
import sys, logkit
def rss_file_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1])
with logkit.Broker(sys.argv[1]) as broker:
    p = broker.topic("t").partition(0)
    before = rss_file_kib()
    offset, count, first, last = 0, 0, None, None
    while True:
        records = p.read(offset, max_records=500)
        if not records:
            break
        first = records[0].value if first is None else first
        count += len(records)
        offset = records[-1].offset + 1
        last = records[-1].value
    print(count, rss_file_kib() - before, first[:8].decode(), last[:8].decode())
"""

MIB = 1 << 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_reading_a_48_mib_segment_to_its_end_keeps_a_few_mib_resident(tmp_path):
    value = b"x" * 1000
    records = 48 * MIB // 1070
    with logkit.Broker(tmp_path) as broker:
        p = broker.create_topic("t", 1, config={"segment.bytes": 256 * MIB}).partition(0)
        for start in range(0, records, 500):
            p.append([(None, b"%08d" % n + value, None, None)
                      for n in range(start, min(start + 500, records))])
        assert p.segment_base_offsets() == [0]         # one segment, read through its map
    out = subprocess.run([sys.executable, "-c", READER, str(tmp_path)], check=True,
                         capture_output=True, text=True, env={"PYTHONPATH": ROOT_DIR},
                         timeout=120).stdout.split()
    count, grown_kib = int(out[0]), int(out[1])
    assert count == records and out[2:] == ["00000000", "%08d" % (records - 1)]
    assert grown_kib < 16 * 1024, f"file-backed RSS grew {grown_kib} KiB reading 48 MiB"
