"""The `logkit` command: Kafka's tools in shape (topics, produce, consume, groups), every
command documented with an example, each a thin layer that prints library results and
turns library errors into one line on stderr and exit code 1 (2 for bad usage).

Most checks call `cli.main` in this process (fast); the end-to-end ones run the
installed `logkit` console script in real processes, several commands per process."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import logkit
from logkit import cli

LOGKIT = os.path.join(os.path.dirname(sys.executable), "logkit")
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def root(tmp_path):
    """A broker directory with one topic of two partitions, one holding two records."""
    path = tmp_path / "data"
    with logkit.Broker(path) as broker:
        topic = broker.create_topic("orders", partitions=2)
        topic.partition(0).append([(b"k1", b"v1", [("h", b"x")], None),
                                   (None, b"v2", None, None)])
    return str(path)


def run(capsys, *argv, stdin=None, monkeypatch=None):
    """cli.main(argv) -> (exit code, stdout, stderr)."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def table(out):
    """Plain-text table rows (stdout is not a terminal here) as lists of cells."""
    return [line.split() for line in out.splitlines()]


def test_every_command_has_help_with_an_example():
    """sqlite-utils' rule: each command's and subcommand's help shows an example."""
    parsers = {}
    cli.build_parser(parsers)
    assert {"/topics/list", "/topics/create", "/topics/delete", "/topics/describe",
            "/topics/alter-config", "/produce", "/consume", "/groups/list",
            "/groups/describe", "/groups/reset-offsets", "/groups/delete", "/describe",
            "/dump", "/bench", "/completion"} <= set(parsers)
    for path, parser in parsers.items():
        words = path.strip("/").replace("/", " ")
        assert f"logkit {words}".strip() in parser.format_help().split("example:")[1], path


def test_topics_create_list_describe_alter_delete(root, capsys):
    """kafka-topics in shape: create with configs, list, describe (partitions and
    configs), alter-config, delete; --json for scripts."""
    assert run(capsys, "topics", "create", root, "clicks", "--partitions", "3",
               "--config", "retention.ms=60000")[:2] == (0, "Created topic clicks "
                                                            "(3 partition(s)).\n")
    assert run(capsys, "topics", "list", root)[1].split() == ["clicks", "orders"]
    code, out, _ = run(capsys, "topics", "list", root, "--json")
    assert json.loads(out) == [{"topic": "clicks", "partitions": 3},
                               {"topic": "orders", "partitions": 2}]
    code, out, _ = run(capsys, "topics", "describe", root, "orders")
    assert table(out) == [["TOPIC", "PARTITION", "LOG-START-OFFSET", "LOG-END-OFFSET",
                           "HIGH-WATERMARK", "SIZE-BYTES", "CLEANUP-POLICY"],
                          ["orders", "0", "0", "2", "2", table(out)[1][5], "delete"],
                          ["orders", "1", "0", "0", "0", "0", "delete"]]
    assert int(table(out)[1][5]) > 0
    code, out, _ = run(capsys, "topics", "describe", root, "clicks", "--configs")
    assert ["clicks", "retention.ms", "60000"] in table(out)
    assert run(capsys, "topics", "alter-config", root, "clicks", "--add-config",
               "segment.bytes=4096", "--delete-config", "retention.ms")[0] == 0
    code, out, _ = run(capsys, "topics", "describe", root, "clicks", "--json")
    config = json.loads(out)["config"]
    assert config["segment.bytes"] == 4096 and config["retention.ms"] == 604800000
    code, _, err = run(capsys, "topics", "create", root, "clicks")
    assert code == 1 and "already exists" in err and len(err.splitlines()) == 1
    assert run(capsys, "topics", "create", root, "clicks", "--if-not-exists")[0] == 0
    assert run(capsys, "topics", "delete", root, "clicks")[0] == 0
    assert run(capsys, "topics", "delete", root, "clicks", "--if-exists")[0] == 0
    code, _, err = run(capsys, "topics", "delete", root, "clicks")
    assert code == 1 and "'clicks' does not exist" in err
    code, _, err = run(capsys, "topics", "alter-config", root, "orders", "--add-config",
                       "retention.mss=5")
    assert code == 1 and "did you mean 'retention.ms'" in err


def test_describe_keeps_its_top_level_form(root, capsys):
    """`logkit describe DIR TOPIC` is `topics describe` for one topic."""
    code, out, _ = run(capsys, "describe", "--json", root, "orders")
    parts = json.loads(out)["partitions"]
    assert [(p["partition"], p["log_end_offset"]) for p in parts] == [(0, 2), (1, 0)]


def test_produce_and_consume_round_trip(root, capsys, monkeypatch):
    """Lines from stdin become records (keys after --key-separator, headers after
    --headers, JSON lines); consume prints them back in each format."""
    lines = "a:1\nb:2\nc:3\n"
    code, out, err = run(capsys, "produce", root, "orders", "--key-separator", ":",
                         stdin=lines, monkeypatch=monkeypatch)
    assert (code, out) == (0, "") and "3 record(s) to orders" in err
    code, out, _ = run(capsys, "consume", root, "orders", "--from-beginning", "--format",
                       "kv", "--key-separator", "=")
    assert sorted(out.splitlines()) == ["a=1", "b=2", "c=3", "k1=v1", "null=v2"]
    run(capsys, "produce", root, "orders", "--headers", "--key-separator", ":",
        stdin="trace:7,user:x\tkey:value\n", monkeypatch=monkeypatch)
    run(capsys, "produce", root, "orders", "--json", monkeypatch=monkeypatch,
        stdin='{"key": "j", "value": {"n": 1}, "partition": 1, "headers": {"h": "v"}}\n'
              '\n{"value": {"base64": "AP8="}, "partition": 1, "timestamp": 1700000000000}\n')
    code, out, _ = run(capsys, "consume", root, "orders", "--partition", "1", "--offset",
                       "0", "--format", "json")
    records = [json.loads(line) for line in out.splitlines()]
    assert [(r["key"], r["value"], r["headers"]) for r in records[-2:]] == [
        ("j", '{"n":1}', [["h", "v"]]), (None, {"base64": "AP8="}, [])]
    assert records[-1]["timestamp"] == 1700000000000
    code, out, _ = run(capsys, "consume", root, "orders", "--from-beginning", "--format",
                       "json")
    headed = [json.loads(line) for line in out.splitlines() if "trace" in line]
    assert headed[0]["headers"] == [["trace", "7"], ["user", "x"]]
    assert (headed[0]["key"], headed[0]["value"]) == ("key", "value")
    code, out, _ = run(capsys, "consume", root, "orders", "--partition", "0", "--offset",
                       "1", "--max-messages", "1")
    assert out == "v2\n"
    code, out, _ = run(capsys, "consume", root, "orders")       # Kafka's default: new only
    assert (code, out) == (0, "")


def test_produce_errors_name_the_line(root, capsys, monkeypatch):
    """A line without the key separator, or bad JSON, stops with its line number
    (exit 1, one line); records before it were produced."""
    code, _, err = run(capsys, "produce", root, "fresh", "--key-separator", ":",
                       stdin="a:1\nno separator\n", monkeypatch=monkeypatch)
    assert code == 1 and "line 2 has no key separator ':'" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "produce", root, "fresh", "--json", stdin="[1]\n",
                       monkeypatch=monkeypatch)
    assert code == 1 and "line 1" in err and "object" in err
    code, _, err = run(capsys, "produce", root, "fresh", "--json", "--headers", stdin="",
                       monkeypatch=monkeypatch)
    assert code == 2 and "usage error" in err


def test_consume_with_a_group_commits_what_it_printed(root, capsys):
    """--group consumes as a member and commits exactly the records printed; a second
    run continues after them; groups describe shows the kafka-consumer-groups table."""
    code, out, _ = run(capsys, "consume", root, "orders", "--group", "billing",
                       "--from-beginning", "--max-messages", "1")
    assert out == "v1\n"
    code, out, _ = run(capsys, "groups", "describe", root, "billing")
    assert table(out) == [
        ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
         "CONSUMER-ID", "HOST", "CLIENT-ID"],
        ["billing", "orders", "0", "1", "2", "1", "-", "-", "-"],
        ["billing", "orders", "1", "-", "0", "0", "-", "-", "-"]]
    code, out, _ = run(capsys, "consume", root, "orders", "--group", "billing",
                       "--from-beginning")
    assert out == "v2\n"
    code, out, _ = run(capsys, "groups", "list", root, "--state")
    assert table(out) == [["GROUP", "STATE", "MEMBERS"], ["billing", "Empty", "0"]]


def test_groups_describe_of_an_unknown_group_says_it_is_dead(root, capsys):
    """A misspelt group id is not an empty group: exit 1, state Dead, the close ids."""
    with logkit.Broker(root) as broker:
        broker.group("billing").reset_offsets({logkit.TopicPartition("orders", 0): 1})
    code, out, err = run(capsys, "groups", "describe", root, "biling")
    assert code == 1 and out == ""
    assert "'biling' does not exist (state Dead" in err and "did you mean billing" in err
    code, _, err = run(capsys, "groups", "delete", root, "nope")
    assert code == 1 and "known groups: billing" in err


def test_reset_offsets_is_a_dry_run_unless_execute(root, capsys):
    """--to-earliest/--to-latest/--to-offset with --topic or --all-topics print the
    new offsets; only --execute commits them; --to-offset is kept within the log."""
    with logkit.Broker(root) as broker:
        broker.group("g").reset_offsets({logkit.TopicPartition("orders", 0): 2})
    code, out, err = run(capsys, "groups", "reset-offsets", root, "g", "--to-earliest",
                         "--all-topics")
    assert table(out)[1:] == [["g", "orders", "0", "0"], ["g", "orders", "1", "0"]]
    assert "dry run" in err
    with logkit.Broker(root) as broker:
        assert broker.group("g").committed() == {logkit.TopicPartition("orders", 0): 2}
    code, out, err = run(capsys, "groups", "reset-offsets", root, "g", "--to-offset", "9",
                         "--topic", "orders", "--execute")
    assert code == 0 and table(out)[1:] == [["g", "orders", "0", "2"],
                                           ["g", "orders", "1", "0"]]
    assert "outside [0, 2]" in err and "dry run" not in err
    code, out, _ = run(capsys, "groups", "reset-offsets", root, "g", "--to-earliest",
                       "--topic", "orders", "--execute")
    with logkit.Broker(root) as broker:
        group = broker.group("g")
        assert set(group.committed().values()) == {0}
        member = broker.consumer("orders", group_id="g")
        member.poll(timeout_ms=50)
        code, _, err = run(capsys, "groups", "reset-offsets", root, "g", "--to-latest",
                           "--topic", "orders", "--execute")
        assert code == 1 and "has active members" in err and member.config["client_id"] in err
        code, _, err = run(capsys, "groups", "delete", root, "g")
        assert code == 1 and "live member" in err
        member.close()
    assert run(capsys, "groups", "delete", root, "g")[0] == 0
    assert run(capsys, "groups", "list", root)[1] == ""
    code, _, err = run(capsys, "groups", "reset-offsets", root, "g", "--to-earliest")
    assert code == 2 and "--topic" in err


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
    """Unknown topics and non-logkit directories: one line and exit code 1, and the
    directory is not turned into a broker root; usage errors exit 2."""
    code, _, err = run(capsys, "describe", root, "nope")
    assert code == 1 and "nope" in err and len(err.splitlines()) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv in (["topics", "list", empty], ["consume", empty, "t"],
                 ["groups", "list", empty]):
        code, _, err = run(capsys, *argv)
        assert code == 1 and "not a logkit directory" in err
    assert os.listdir(empty) == []
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("")
    code, _, err = run(capsys, "topics", "create", foreign, "t")
    assert code == 1 and "adopt=True" in err and os.listdir(foreign) == ["notes.txt"]
    assert run(capsys, "consume", root, "orders", "--offset", "3")[0] == 2
    assert run(capsys, "topics", "list")[0] == 2
    assert run(capsys, "topics")[0] == 2


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "usage: logkit" in capsys.readouterr().out


def test_bash_completion_knows_commands_and_options(tmp_path):
    """`logkit completion bash` prints a script bash loads; it completes commands,
    subcommands and options."""
    script = tmp_path / "logkit.bash"
    script.write_text(cli.completion_script())
    probe = f"""
source {script}
complete_words() {{ COMP_WORDS=("$@"); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ));
                    COMPREPLY=(); _logkit_complete; echo "${{COMPREPLY[*]}}"; }}
complete_words logkit to
complete_words logkit groups re
complete_words logkit groups reset-offsets data/ g --to
complete_words logkit consume data/ orders --fo
complete -p logkit
"""
    proc = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "topics", "reset-offsets", "--to-earliest --to-latest --to-offset --topic",
        "--follow --format", "complete -o default -F _logkit_complete logkit"]


def test_the_console_script_end_to_end(tmp_path):
    """The installed `logkit` script, several commands in one shell: create, produce
    from a pipe, consume into `head` (a closed pipe is not an error), exit codes 0/1/2
    with one line on stderr."""
    script = f"""
set -u
L={LOGKIT}
$L topics create data orders --partitions 1 >/dev/null; echo "create $?"
seq 1 500 | $L produce data orders 2>/dev/null; echo "produce $?"
$L consume data orders --from-beginning | head -n 2; echo "head ${{PIPESTATUS[0]}}"
$L describe data missing 2>err.txt; echo "missing $? $(wc -l < err.txt)"
$L consume data 2>/dev/null; echo "usage $?"
"""
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.splitlines() == ["create 0", "produce 0", "1", "2", "head 0",
                                        "missing 1 1", "usage 2"], proc.stderr
    assert "Traceback" not in proc.stderr


def test_consume_follow_exits_0_on_sigterm_and_sigint(root):
    """--follow waits for new records like tail -f, prints one produced after it
    started, and on SIGTERM (or SIGINT) closes the broker and exits 0."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc = subprocess.Popen([LOGKIT, "consume", root, "orders", "--follow"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            line = ""
            with logkit.Broker(root) as broker:
                producer = broker.producer()
                while not line and time.monotonic() < deadline:
                    # until the consumer has started, each record lands before its start
                    producer.send("orders", b"late", partition=1).result()
                    time.sleep(0.2)
                    line = _readline_nonblocking(proc)
                producer.close()
            assert line == "late\n"
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
            assert "stopped by a signal" in err and "Traceback" not in err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _readline_nonblocking(proc):
    import select
    ready, _, _ = select.select([proc.stdout], [], [], 0.5)
    return proc.stdout.readline() if ready else ""


def test_console_entry_point_runs_bench(tmp_path):
    """`python -m logkit.cli bench open` runs a benchmark from a real process."""
    proc = subprocess.run([sys.executable, "-m", "logkit.cli", "bench", "open",
                           "--open-partitions", "2", "--quiet", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "logkit Broker()" in proc.stdout


def test_docs_cli_md_is_generated_from_the_help():
    """docs/cli.md is the commands' own help (regenerate: tools/cli_docs.py)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "cli_docs", os.path.join(CHECKOUT, "tools", "cli_docs.py"))
    cli_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli_docs)
    with open(os.path.join(CHECKOUT, "docs", "cli.md"), encoding="utf-8") as f:
        assert f.read() == cli_docs.render(), \
            "docs/cli.md is stale: run .venv/bin/python tools/cli_docs.py"


def test_tables_on_a_terminal_are_drawn_with_rich(root):
    """With stdout a terminal (a pty here) the table is rich's, with the same cells;
    the same command into a pipe prints plain columns (the tests above)."""
    pytest.importorskip("rich")
    import pty
    main_fd, child_fd = pty.openpty()
    env = dict(os.environ, COLUMNS="120", TERM="xterm")
    proc = subprocess.Popen([LOGKIT, "topics", "describe", root, "orders"], stdout=child_fd,
                            stderr=subprocess.PIPE, env=env)
    os.close(child_fd)
    chunks = []
    while True:
        try:
            chunk = os.read(main_fd, 4096)
        except OSError:                     # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main_fd)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    screen = b"".join(chunks).decode()
    assert "\x1b[" in screen                             # rich's styling
    plain = re.sub(r"\x1b\[[0-9;]*m", "", screen)
    assert "LOG-END-OFFSET" in plain and "orders" in plain


# ---- schemas (issue 12, deliverable 6) ---------------------------------------------------

ORDER_V1 = json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}]})
ORDER_V2 = json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "currency", "type": "string",
                                     "default": "EUR"}]})
ORDER_BAD = json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "age", "type": "int"}]})


def test_schemas_register_list_show_and_check(root, tmp_path, capsys, monkeypatch):
    """register prints the id (from a file or stdin); list and show print subjects,
    versions, ids, types and the text; check names the rule broken and exits 1; an
    incompatible register is refused (exit 1) naming the field and the rule."""
    v1, v2, bad = (tmp_path / "v1.avsc", tmp_path / "v2.avsc", tmp_path / "bad.avsc")
    v1.write_text(ORDER_V1)
    v2.write_text(ORDER_V2)
    bad.write_text(ORDER_BAD)
    assert run(capsys, "schemas", "register", root, "orders-value", v1)[:2] == (0, "1\n")
    code, out, err = run(capsys, "schemas", "check", root, "orders-value", bad)
    assert code == 1
    assert "age: READER_FIELD_MISSING_DEFAULT_VALUE" in out and "version 1" in out
    code, out, _ = run(capsys, "schemas", "check", root, "orders-value", v2, "--json")
    assert code == 0 and json.loads(out)["is_compatible"] is True
    code, out, _ = run(capsys, "schemas", "register", root, "orders-value", "--json",
                       stdin=ORDER_V2, monkeypatch=monkeypatch)
    assert code == 0 and json.loads(out) == {"subject": "orders-value", "version": 2,
                                             "id": 2}
    code, out, err = run(capsys, "schemas", "register", root, "orders-value", bad)
    assert code == 1 and out == ""
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in err and "age" in err
    # the same schema under another subject keeps its id
    assert run(capsys, "schemas", "register", root, "copy-value", v1)[:2] == (0, "1\n")
    code, out, _ = run(capsys, "schemas", "list", root)
    assert table(out) == [["SUBJECT", "VERSIONS", "LATEST-ID", "TYPE", "COMPATIBILITY"],
                          ["copy-value", "1", "1", "AVRO", "BACKWARD"],
                          ["orders-value", "2", "2", "AVRO", "BACKWARD"]]
    code, out, _ = run(capsys, "schemas", "show", root, "orders-value")
    assert table(out)[1:] == [["orders-value", "1", "1", "AVRO", "-"],
                              ["orders-value", "2", "2", "AVRO", "-"]]
    code, out, _ = run(capsys, "schemas", "show", root, "orders-value", "--version", "1")
    assert out.splitlines() == ["subject: orders-value  version: 1  id: 1  type: AVRO",
                                ORDER_V1]
    code, out, _ = run(capsys, "schemas", "show", root, "orders-value", "--version",
                       "latest", "--json")
    assert json.loads(out)["id"] == 2 and json.loads(json.loads(out)["schema"]) == \
        json.loads(ORDER_V2)
    # against version 1 only, v2 with a default is fine; bad names version 1
    code, out, _ = run(capsys, "schemas", "check", root, "orders-value", bad,
                       "--version", "1", "--json")
    assert code == 1 and json.loads(out)["is_compatible"] is False
    assert run(capsys, "schemas", "show", root, "nope")[0] == 1
    assert run(capsys, "schemas", "show", root, "orders-value", "--version", "x")[0] == 2
    assert run(capsys, "schemas", "register", root, "s", v1, "--type", "XML")[0] == 2
    code, _, err = run(capsys, "schemas", "register", root, "s", "--type", "json",
                       stdin="{not json", monkeypatch=monkeypatch)
    assert code == 1 and "logkit schemas register:" in err


def test_consume_decodes_avro_and_stops_at_a_record_that_does_not_decode(root, capsys):
    """--format avro prints each value decoded with its writer's schema (v1 and v2
    records in one topic); a record that is not Confluent-framed is an error naming
    topic, partition and offset (exit 1), and nothing is printed for it."""
    from logkit.serde import AvroSerde
    with logkit.Broker(root) as broker:
        broker.create_topic("shop", partitions=1)
        producer = broker.producer(value_serializer=AvroSerde(broker, "shop", ORDER_V1))
        producer.send("shop", {"id": 1}, key=b"k").result()
        producer.close()
        producer = broker.producer(value_serializer=AvroSerde(broker, "shop", ORDER_V2))
        producer.send("shop", {"id": 2, "currency": "NOK"}).result()
        producer.close()
        broker.topic("shop").partition(0).append([(None, b"plain text", None, None)])
    code, out, err = run(capsys, "consume", root, "shop", "--from-beginning", "--format",
                         "avro")
    assert code == 1
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(r["offset"], r["key"], r["value"]) for r in lines] == \
        [(0, "k", {"id": 1}), (1, None, {"id": 2, "currency": "NOK"})]
    assert "topic shop, partition 0, offset 2" in err and "magic byte" in err


def test_consume_decodes_json_schema_and_protobuf(root, tmp_path, capsys, monkeypatch):
    """--format json-schema and --format protobuf decode through the registry; the
    Protobuf schema registered by the CLI, the record framed by hand (id, index [0])."""
    from logkit.serde import JsonSchemaSerde, wire
    pytest.importorskip("google.protobuf")
    proto = 'syntax = "proto3";\npackage shop;\nmessage Item { int64 id = 1; string name = 2; }\n'
    code, out, _ = run(capsys, "schemas", "register", root, "items-value", "--type",
                       "PROTOBUF", stdin=proto, monkeypatch=monkeypatch)
    assert code == 0
    schema_id = int(out)
    with logkit.Broker(root) as broker:
        broker.create_topic("items", partitions=1)
        broker.create_topic("docs", partitions=1)
        items = broker.topic("items").partition(0)
        items.append([(None, wire.frame(schema_id, b"\x08\x05\x12\x03pen", [0]), None,
                       None)])
        serde = JsonSchemaSerde(broker, "docs", {"type": "object", "properties": {
            "n": {"type": "integer"}}})
        producer = broker.producer(value_serializer=serde)
        producer.send("docs", {"n": 7}).result()
        producer.close()
    code, out, _ = run(capsys, "consume", root, "items", "--from-beginning", "--format",
                       "protobuf")
    assert code == 0 and json.loads(out)["value"] == {"id": "5", "name": "pen"}
    code, out, _ = run(capsys, "consume", root, "docs", "--from-beginning", "--format",
                       "json-schema")
    assert code == 0 and json.loads(out)["value"] == {"n": 7}


def test_consume_decodes_framed_keys_and_prints_plain_keys_as_text(root, capsys):
    """With a schema'd --format, a key in Confluent's wire format is decoded through
    the registry like the value; a key that is not framed prints as text; a framed key
    whose schema id is unknown is an error naming the record (exit 1)."""
    from logkit.serde import AvroSerde, wire
    with logkit.Broker(root) as broker:
        broker.create_topic("keyed", partitions=1)
        producer = broker.producer(
            key_serializer=AvroSerde(broker, "keyed", "string", is_key=True),
            value_serializer=AvroSerde(broker, "keyed", ORDER_V1))
        producer.send("keyed", {"id": 1}, key="order-1").result()
        producer.close()
        value = AvroSerde(broker, "keyed", ORDER_V1).serialize({"id": 2})
        broker.topic("keyed").partition(0).append([
            (b"plain", value, None, None),
            (wire.frame(999, b"\x02x"), value, None, None)])
        assert broker.schema_registry().subjects() == ["keyed-key", "keyed-value"]
    code, out, err = run(capsys, "consume", root, "keyed", "--from-beginning", "--format",
                         "avro")
    assert code == 1
    assert [(r["key"], r["value"]) for r in map(json.loads, out.splitlines())] == \
        [("order-1", {"id": 1}), ("plain", {"id": 2})]
    assert "offset 2" in err and "999" in err


def test_schemas_delete_and_config(root, tmp_path, capsys):
    """schemas config shows and sets the global and a subject's level (--reset drops
    the subject's own); schemas delete soft deletes a version or the subject, and
    --permanent removes only what was soft deleted, as the REST API does."""
    v1, v2 = tmp_path / "v1.avsc", tmp_path / "v2.avsc"
    v1.write_text(ORDER_V1)
    v2.write_text(ORDER_V2)
    assert run(capsys, "schemas", "register", root, "orders-value", v1)[0] == 0
    assert run(capsys, "schemas", "register", root, "orders-value", v2)[0] == 0
    assert run(capsys, "schemas", "config", root)[1] == "global compatibility: BACKWARD\n"
    code, out, _ = run(capsys, "schemas", "config", root, "orders-value", "--level",
                       "full_transitive", "--json")
    assert code == 0 and json.loads(out) == {"subject": "orders-value", "own": True,
                                             "compatibility": "FULL_TRANSITIVE"}
    code, out, _ = run(capsys, "schemas", "config", root, "--level", "NONE")
    assert out == "global compatibility: NONE\n"
    code, out, _ = run(capsys, "schemas", "config", root, "orders-value", "--reset")
    assert out == "subject 'orders-value' compatibility: NONE (the global level)\n"
    code, _, err = run(capsys, "schemas", "config", root, "--level", "SIDEWAYS")
    assert code == 1 and "SIDEWAYS" in err
    assert run(capsys, "schemas", "config", root, "--level", "FULL", "--reset")[0] == 2
    code, _, err = run(capsys, "schemas", "delete", root, "orders-value", "--version", "2",
                       "--permanent")
    assert code == 1 and "soft deleted" in err
    code, out, _ = run(capsys, "schemas", "delete", root, "orders-value", "--version", "2")
    assert code == 0 and out == "soft deleted: subject 'orders-value' version(s) 2\n"
    with logkit.Broker(root) as broker:
        registry = broker.schema_registry()
        assert registry.versions("orders-value") == [1]
        assert registry.versions("orders-value", deleted=True) == [1, 2]
    code, out, _ = run(capsys, "schemas", "delete", root, "orders-value", "--version", "2",
                       "--permanent", "--json")
    assert json.loads(out) == {"subject": "orders-value", "versions": [2],
                               "permanent": True}
    assert run(capsys, "schemas", "delete", root, "orders-value")[1] == \
        "soft deleted: subject 'orders-value' version(s) 1\n"
    assert run(capsys, "schemas", "list", root)[1].splitlines()[1:] == []
    assert run(capsys, "schemas", "delete", root, "orders-value", "--permanent")[0] == 0
    with logkit.Broker(root) as broker:
        assert broker.schema_registry().subjects(deleted=True) == []


def test_serve_with_a_schema_registry_port_serves_the_rest_api(tmp_path):
    """`logkit serve --schema-registry-port 0` prints the registry's URL next to the
    listener's address; a REST registration there lands in the directory; SIGTERM
    closes both and exits 0."""
    import urllib.request
    directory = tmp_path / "data"
    process = subprocess.Popen([sys.executable, "-m", "logkit.cli", "serve", str(directory),
                                "--port", "0", "--schema-registry-port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "to Kafka clients at 127.0.0.1:" in process.stdout.readline()
        line = process.stdout.readline()
        url = line.strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:"), line
        request = urllib.request.Request(
            url + "/subjects/orders-value/versions", method="POST",
            data=json.dumps({"schema": ORDER_V1}).encode(),
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        with urllib.request.urlopen(request, timeout=20) as answer:
            assert json.load(answer) == {"id": 1}
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
    with logkit.Broker(directory) as broker:
        assert broker.schema_registry().latest("orders-value").schema_id == 1


def test_a_file_given_as_the_directory_is_called_a_file(tmp_path, capsys):
    """`logkit topics list FILE` says it is a file, not that it does not exist."""
    path = tmp_path / "notes.txt"
    path.write_text("x")
    code, out, err = run(capsys, "topics", "list", path)
    assert code == 1 and out == ""
    assert "is a file, not a logkit directory" in err and "does not exist" not in err


@pytest.mark.parametrize("existing", [False, True], ids=["missing", "empty"])
def test_a_refused_create_leaves_no_logkit_directory_behind(tmp_path, capsys, existing):
    """A refused `topics create` in a directory it would have started takes back what
    it made: a missing directory stays missing, an empty one stays empty."""
    path = tmp_path / "new"
    if existing:
        path.mkdir()
    code, _, err = run(capsys, "topics", "create", path, "a/b")
    assert code == 1 and "invalid topic name" in err
    if existing:
        assert os.listdir(path) == []
    else:
        assert not path.exists()
    # A command that succeeds keeps its new root, and a failure in a root holding topics
    # removes nothing.
    assert run(capsys, "topics", "create", path, "ok")[0] == 0
    assert run(capsys, "topics", "create", path, "a/b")[0] == 1
    with logkit.Broker(path, read_only=True) as broker:
        assert broker.topics() == ["ok"]
