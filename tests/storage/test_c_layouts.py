"""The C extensions restate layouts and one rule that Python owns (docs/design.md §2):
the batch header (`records.py` → `_batch.h`), the tail file (`tail.py` → `_appendpath.c`),
the index entry sizes (`index.py` → `_appendpath.c`) and the segment-roll rule
(`PartitionLog._must_roll` → `_appendpath.c`'s `append_locked`). These tests read the C
sources and compare every shared constant with the Python definition, and run the roll
rule through both paths, so a change made on one side only fails here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from logkit import index, records, tail

LOGKIT = Path(records.__file__).parent


def c_defines(name: str) -> dict[str, int]:
    """The integer `#define NAME value` lines of one C file (hex or decimal)."""
    found = {}
    for match in re.finditer(r"^#define\s+(\w+)\s+(0x[0-9a-fA-F]+|\d+)\b",
                             (LOGKIT / name).read_text(), re.M):
        found[match.group(1)] = int(match.group(2), 0)
    return found


def test_the_batch_header_in_c_is_records_py_s_table():
    c = c_defines("_batch.h")
    python = {
        "B_BASE_OFFSET": records.BASE_OFFSET_OFFSET,
        "B_LENGTH": records.LENGTH_OFFSET,
        "B_LEADER_EPOCH": records.PARTITION_LEADER_EPOCH_OFFSET,
        "B_MAGIC": records.MAGIC_OFFSET,
        "B_CRC": records.CRC_OFFSET,
        "B_ATTRIBUTES": records.ATTRIBUTES_OFFSET,
        "B_LAST_OFFSET_DELTA": records.LAST_OFFSET_DELTA_OFFSET,
        "B_BASE_TIMESTAMP": records.BASE_TIMESTAMP_OFFSET,
        "B_MAX_TIMESTAMP": records.MAX_TIMESTAMP_OFFSET,
        "B_PRODUCER_ID": records.PRODUCER_ID_OFFSET,
        "B_RECORDS_COUNT": records.RECORDS_COUNT_OFFSET,
        "B_HEADER": records.RECORDS_OFFSET,
        "LOG_OVERHEAD": records.LOG_OVERHEAD,
        "B_MAGIC_V2": records.MAGIC,
        "ATTR_CODEC_MASK": records.ATTR_CODEC_MASK,
        "ATTR_APPEND_TIME": records.ATTR_TIMESTAMP_TYPE,
        "ATTR_CONTROL": records.ATTR_CONTROL,
    }
    assert {k: c.get(k) for k in python} == python


def test_the_tail_file_in_c_is_tail_py_s_layout():
    source = (LOGKIT / "_appendpath.c").read_text()
    c = c_defines("_appendpath.c")
    # The enum of 64-bit fields, in order, must name Tail's fields after the boot id.
    enum = re.search(r"enum\s*\{([^}]*)\}", source[source.index("#define TAIL_FIELD"):])
    names = [n.strip() for n in enum.group(1).split(",") if n.strip()]
    assert names[-1] == "T_FIELDS"
    python_fields = [f for f in tail.Tail._fields if f != "boot_id"]
    short = {"log_start_offset": "LOG_START", "log_end_offset": "LOG_END",
             "active_base_offset": "ACTIVE_BASE", "max_timestamp": "MAX_TS",
             "max_timestamp_offset": "MAX_TS_OFFSET", "unflushed_messages": "UNFLUSHED",
             "first_unflushed_ms": "FIRST_UNFLUSHED", "roll_time_ms": "ROLL_TIME"}
    expected = ["T_" + short.get(f, f.upper()) for f in python_fields]
    assert names[:-1] == expected
    assert c["TAIL_SEQ"] == tail._SEQ_OFFSET
    assert c["TAIL_BOOT"] == tail._BODY_OFFSET
    # TAIL_FIELD(n) = 32 + 8n: the first 64-bit field follows the 16-byte boot id.
    first = int(re.search(r"#define TAIL_FIELD\(n\) \((\d+) \+ 8 \* \(n\)\)", source).group(1))
    assert first == tail._BODY_OFFSET + 16
    assert tail._BODY.size == 16 + 8 * len(python_fields)
    assert tail._BODY.format.lstrip("<").startswith("16s")


def test_index_entry_sizes_in_c_are_index_py_s():
    c = c_defines("_appendpath.c")
    assert c["OFFSET_ENTRY"] == index.OffsetIndex.ENTRY.size
    assert c["TIME_ENTRY"] == index.TimeIndex.ENTRY.size


_ROLLS = r"""
import json, sys
import logkit
import logkit._native
with logkit.Broker(sys.argv[1]) as broker:
    topic = broker.create_topic("t", partitions=1, config={
        "segment.bytes": 4096, "segment.index.bytes": 64, "index.interval.bytes": 1})
    producer = broker.producer(linger_ms=0)
    for i in range(120):
        producer.send("t", b"v" * (i % 97 + 1), key=b"k%d" % i, partition=0).result()
    producer.flush()
    p = topic.partition(0)
    bases = sorted(int(n[:20]) for n in __import__("os").listdir(sys.argv[1] + "/t-0")
                   if n.endswith(".log"))
    print(json.dumps({"bases": bases, "end": p.log_end_offset,
                      "native": logkit._native.appendpath is not None}))
"""


def _rolls(tmp_path, pure):
    env = dict(os.environ)
    env.pop("LOGKIT_PURE_PYTHON", None)
    if pure:
        env["LOGKIT_PURE_PYTHON"] = "1"
    out = subprocess.run([sys.executable, "-c", _ROLLS, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_both_append_paths_roll_at_the_same_offsets(tmp_path):
    """Size rolls and full-index rolls: the C path and the Python path cut segments at
    the same offsets for the same appends."""
    import logkit._native as native
    if native.appendpath is None:
        pytest.skip("logkit._appendpath is not built (LOGKIT_PURE_PYTHON=1 or no compiler): "
                    "there is no C roll rule to compare")
    compiled = _rolls(tmp_path / "c", pure=False)
    python = _rolls(tmp_path / "py", pure=True)
    assert compiled["native"] and not python["native"]
    assert compiled["end"] == python["end"] == 120
    assert len(compiled["bases"]) > 3          # the workload did roll, by size and by index
    assert compiled["bases"] == python["bases"]
