"""A time index whose entries are ordered but wrong cannot steer offset_for_timestamp.

The time index is derived data: every entry a lookup uses, and the last entry that
lets a search skip a sealed segment, is checked against the log (the batch holding its
offset ends there and its max timestamp is the entry's); a false one costs a scan from
the segment's start, never a wrong answer (issue 36). The tests write records over
several segments, overwrite every `.timeindex` entry with ordered but false values,
reopen after a clean shutdown and after a SIGKILL, and compare every answer with
Kafka's: the first offset whose timestamp is >= the one asked for.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest

import logkit

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENTRY = struct.Struct(">qi")
CONFIG = {"segment.bytes": 4096, "index.interval.bytes": 64}
BATCHES, PER_BATCH = 120, 3
T0, STEP = 1_000_000, 10
WRITE = f"""
import sys, logkit
broker = logkit.Broker(sys.argv[1], background=False)
p = broker.create_topic("t", 1, config={CONFIG!r}).partition(0)
for b in range({BATCHES}):
    p.append([(None, b"v%d" % (b * {PER_BATCH} + i), None,
               {T0} + (b * {PER_BATCH} + i) * {STEP}) for i in range({PER_BATCH})])
if sys.argv[2] == "clean":
    broker.close()
else:
    import os, signal
    os.kill(os.getpid(), signal.SIGKILL)
"""


def write(root: str, how: str) -> None:
    proc = subprocess.run([sys.executable, "-c", WRITE, root, how], cwd=ROOT_DIR,
                          env={**os.environ, "PYTHONPATH": ROOT_DIR},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == (0 if how == "clean" else -9), proc.stderr


def kafkas_answer(timestamps: list[int], target: int) -> int | None:
    return next((o for o, ts in enumerate(timestamps) if ts >= target), None)


def forge(directory: str, how: str) -> int:
    """Overwrite every entry of every .timeindex file (the active one's written part
    too) with ordered but false values; returns the entries changed."""
    changed = 0
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".timeindex"):
            continue
        path = os.path.join(directory, name)
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            n = 0
            while (n + 1) * ENTRY.size <= len(data):
                ts, rel = ENTRY.unpack_from(data, n * ENTRY.size)
                if (ts, rel) == (0, 0) and n:
                    break                             # the active file's unused room
                if how == "beyond":                   # offsets past the segment's end
                    ENTRY.pack_into(data, n * ENTRY.size, ts, rel + 100_000 + n)
                else:                                 # timestamps below every batch's
                    ENTRY.pack_into(data, n * ENTRY.size, T0 - 1000 + n, rel)
                n += 1
            f.seek(0)
            f.write(data)
            changed += n
    return changed


@pytest.mark.parametrize("shutdown", ["clean", "unclean"])
@pytest.mark.parametrize("how", ["beyond", "early"])
def test_offset_for_timestamp_gives_kafkas_answer_over_a_forged_time_index(
        tmp_path, shutdown, how):
    root = str(tmp_path / "root")
    write(root, shutdown)
    directory = os.path.join(root, "t-0")
    assert len([n for n in os.listdir(directory) if n.endswith(".log")]) >= 3
    assert forge(directory, how) >= 10
    timestamps = [T0 + o * STEP for o in range(BATCHES * PER_BATCH)]
    targets = sorted({T0 - 5, T0, timestamps[-1], timestamps[-1] + 1,
                      *range(T0 - 3, timestamps[-1] + 20, 37)})
    with logkit.Broker(root, background=False) as broker:
        p = broker.topic("t").partition(0)
        assert p.log_end_offset == len(timestamps)
        wrong = {t: (p.offset_for_timestamp(t), kafkas_answer(timestamps, t))
                 for t in targets}
        wrong = {t: pair for t, pair in wrong.items() if pair[0] != pair[1]}
        assert wrong == {}, f"{len(wrong)} of {len(targets)} answers differ: " \
                            f"{sorted(wrong.items())[:5]}"
