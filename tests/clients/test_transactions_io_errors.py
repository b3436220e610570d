"""A transaction whose send failed on a storage error cannot commit (Kafka's rule: a
failed send makes the transaction abortable; DESIGN §15, "read_committed never returns
a record of an open or aborted transaction" and the producer's "a failed send of the
transaction raises here").

Found by the crash-point enumeration of transactions (tests/crashpoints/transactions.py,
EIO or ENOSPC on the coordinator's LMDB write inside a send): the first send of a
transaction raised MetadataStoreError when registering its partitions, the next send
registered them, and commit_transaction() committed the other five records — a
transaction the application saw fail, made visible in part.

The error is injected with strace into each fdatasync of the broker's LMDB file in
turn (`-P` names the file), in a child that opens a broker, begins a transaction,
sends three records and commits; the one whose send raised must not commit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import logkit
from tests.crashpoints import driver

_REASON = driver.strace_usable()

CHILD = """
import json, sys, logkit
out = {"send_errors": [], "commit": None}
with logkit.Broker(sys.argv[1], background=False) as broker:
    producer = broker.producer(transactional_id="t", linger_ms=0)
    try:
        producer.init_transactions()
        producer.begin_transaction()
    except logkit.LogkitError as exc:
        out["commit"] = "not begun: " + type(exc).__name__
    else:
        for n in range(3):
            try:
                producer.send("x", b"v%d" % n, key=b"k", partition=n).result(10)
            except logkit.LogkitError as exc:
                out["send_errors"].append(type(exc).__name__)
        try:
            producer.commit_transaction()
            out["commit"] = "committed"
        except logkit.LogkitError as exc:
            out["commit"] = type(exc).__name__
    print(json.dumps(out), flush=True)
    try:
        producer.close()
    except logkit.LogkitError:
        pass
"""


@pytest.mark.skipif(_REASON is not None, reason=f"needs strace: {_REASON}")
def test_a_transaction_whose_send_raised_on_a_storage_error_does_not_commit(tmp_path):
    seen = []
    for n in range(1, 13):
        root = tmp_path / f"r{n}"
        with logkit.Broker(root, background=False) as broker:
            broker.create_topic("x", 3)
        mdb = str(root / "meta" / "data.mdb")
        proc = subprocess.run(
            [driver.STRACE, "-f", "-qq", "-o", "/dev/null", "-P", mdb,
             "-e", "trace=fdatasync", "-e", f"inject=fdatasync:error=EIO:when={n}",
             sys.executable, "-c", CHILD, str(root)],
            cwd=driver.ROOT_DIR, env=driver.child_env(), capture_output=True, text=True,
            timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outcome = json.loads(proc.stdout.strip().splitlines()[-1])
        seen.append(outcome)
        if outcome["send_errors"]:
            with logkit.Broker(root, background=False) as broker:
                visible = [r.value for p in broker.topic("x").partitions
                           for r in p.read(0, isolation_level="read_committed")]
            assert outcome["commit"] != "committed" and visible == [], (n, outcome, visible)
    assert any(o["send_errors"] for o in seen), f"no fdatasync hit a send: {seen}"
