"""Notification, the first application in Kafka's design notes: service A updates a
record in its own database and emits "record updated"; service B, another process,
consumes the notification and re-reads A's record to sync its copy.

Run: .venv/bin/python examples/notification.py
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sqlite3
import tempfile
from typing import Any

import logkit


def service_a_update(root: str, db_path: str, account: str, balance: int,
                     producer: Any) -> None:
    """A: write the record to A's database, then emit the notification."""
    with sqlite3.connect(db_path) as db:
        db.execute("INSERT INTO accounts(id, balance) VALUES (?, ?) "
                   "ON CONFLICT(id) DO UPDATE SET balance = excluded.balance",
                   (account, balance))
    producer.send("account-updated", json.dumps({"id": account}).encode(),
                  key=account.encode())


def service_b(root: str, a_db: str, b_copy: str, expected_updates: int) -> None:
    """B (a separate process): consume notifications, re-read A, update B's copy."""
    copy: dict[str, int] = {}
    with logkit.Broker(root) as broker, sqlite3.connect(a_db) as a:
        consumer = broker.consumer("account-updated", group_id="service-b",
                                   auto_offset_reset="earliest", enable_auto_commit=False)
        seen = 0
        while seen < expected_updates:
            for record in consumer.poll(timeout_ms=1000):
                account = json.loads(record.value)["id"]
                (balance,) = a.execute("SELECT balance FROM accounts WHERE id = ?",
                                       (account,)).fetchone()
                copy[account] = balance
                seen += 1
            consumer.commit()
    with open(b_copy, "w") as f:
        json.dump(copy, f)


def run(root: str) -> dict[str, Any]:
    a_db = os.path.join(root, "service-a.sqlite")
    b_copy = os.path.join(root, "service-b-copy.json")
    with sqlite3.connect(a_db) as db:
        db.execute("CREATE TABLE accounts(id TEXT PRIMARY KEY, balance INTEGER)")
    updates = [(f"acct-{i % 5}", 100 * i) for i in range(25)]
    log_dir = os.path.join(root, "log")      # the broker's own directory, beside A's files
    with logkit.Broker(log_dir) as broker:
        broker.create_topic("account-updated", partitions=2)
        b = multiprocessing.get_context("spawn").Process(
            target=service_b, args=(log_dir, a_db, b_copy, len(updates)))
        b.start()
        producer = broker.producer()
        for account, balance in updates:
            service_a_update(root, a_db, account, balance, producer)
        producer.flush()
        b.join(timeout=120)
    with sqlite3.connect(a_db) as db:
        a_state = dict(db.execute("SELECT id, balance FROM accounts"))
    with open(b_copy) as f:
        b_state = json.load(f)
    return {"a": a_state, "b": b_state, "exit_code": b.exitcode}


def main() -> None:
    root = tempfile.mkdtemp(prefix="logkit-notify-")
    try:
        result = run(root)
    finally:
        shutil.rmtree(root)
    same = result["a"] == result["b"]
    print(f"A has {len(result['a'])} accounts; B's copy is {'in sync' if same else 'STALE'}: "
          f"{result['b']}")


if __name__ == "__main__":
    main()
