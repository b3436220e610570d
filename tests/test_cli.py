"""The `logkit` command: every command documented with an example, each a thin layer
that prints library results and turns library errors into a message and exit code 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import logkit
from logkit import cli


@pytest.fixture
def root(tmp_path):
    """A broker directory with one topic of two partitions, one holding two records."""
    path = tmp_path / "data"
    with logkit.Broker(path) as broker:
        topic = broker.create_topic("orders", partitions=2)
        topic.partition(0).append([(b"k1", b"v1", [("h", b"x")], None),
                                   (None, b"v2", None, None)])
    return str(path)


def test_every_command_has_help_with_an_example():
    """sqlite-utils' rule: each command's help shows an example of its use."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert set(sub.choices) >= {"topics", "describe", "dump", "bench"}
    for name, command in sub.choices.items():
        assert "example: logkit " + name in command.format_help(), name


def test_topics_lists_topics(root, capsys):
    assert cli.main(["topics", root]) == 0
    assert capsys.readouterr().out.split() == ["orders", "2"]
    assert cli.main(["topics", root, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"topic": "orders", "partitions": 2}]


def test_describe_shows_offsets(root, capsys):
    assert cli.main(["describe", "--json", root, "orders"]) == 0
    parts = json.loads(capsys.readouterr().out)["partitions"]
    assert [(p["partition"], p["log_end_offset"]) for p in parts] == [(0, 2), (1, 0)]
    assert cli.main(["describe", root, "orders"]) == 0
    assert "2 partition(s)" in capsys.readouterr().out


def test_dump_prints_batches_and_records(root, capsys):
    segment = os.path.join(root, "orders-0", "00000000000000000000.log")
    assert cli.main(["dump", "--records", segment]) == 0
    out = capsys.readouterr().out
    assert "baseOffset: 0 lastOffset: 1 count: 2" in out
    assert "key: b'k1' value: b'v1' headers: [('h', b'x')]" in out
    assert "key: null value: b'v2'" in out
    assert "all CRCs valid" in out


def test_dump_of_a_corrupt_segment_fails_cleanly(root, capsys):
    """A flipped byte is reported as a CRC mismatch with the path, exit code 1."""
    segment = os.path.join(root, "orders-0", "00000000000000000000.log")
    with open(segment, "r+b") as f:
        f.seek(70)
        byte = f.read(1)
        f.seek(70)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert cli.main(["dump", segment]) == 1
    err = capsys.readouterr().err
    assert "CRC mismatch" in err and segment in err


def test_errors_become_messages(root, tmp_path, capsys):
    """Unknown topics and non-logkit directories: a message and exit code 1, and the
    directory is not turned into a broker root."""
    assert cli.main(["describe", root, "nope"]) == 1
    assert "nope" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["topics", str(empty)]) == 1
    assert "not a logkit directory" in capsys.readouterr().err
    assert os.listdir(empty) == []


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "usage: logkit" in capsys.readouterr().out


def test_console_entry_point_runs_bench(tmp_path):
    """`python -m logkit.cli bench open` runs a benchmark from a real process."""
    proc = subprocess.run([sys.executable, "-m", "logkit.cli", "bench", "open",
                           "--open-partitions", "2", "--quiet", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "logkit Broker()" in proc.stdout
