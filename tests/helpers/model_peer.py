"""Test helper: a second process on the same broker directory, for tests/storage/test_model.py.

Run as a script (`python model_peer.py ROOT`), it opens `logkit.Broker(ROOT)` and obeys
one JSON command per stdin line, answering one JSON line per command (`spam` answers
one line per batch, then a final line). Imported, `Peer` starts and drives it from the
test with bounded waits, and kills it (SIGKILL) for crash steps.

Commands: append (rows as one batch, returns its base offset), spam (many batches in a
row, one ack each: the crash step kills the peer in the middle), read, state, roll,
commit (a group offset, by a consumer with manual assignment), group (committed
offsets), reopen (close and open the broker), quit. Bytes travel as hex; a row is
[key, value, headers, timestamp_ms] with None where the record has none.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from typing import Any

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPLY_TIMEOUT_S = 60


# ---- wire encoding (shared by both sides) ----------------------------------------------

def _hex(data: bytes | None) -> str | None:
    return None if data is None else data.hex()


def _unhex(text: str | None) -> bytes | None:
    return None if text is None else bytes.fromhex(text)


def encode_row(row: tuple) -> list:
    key, value, headers, timestamp = row
    return [_hex(key), _hex(value), [[k, _hex(v)] for k, v in headers], timestamp]


def decode_row(row: list) -> tuple:
    key, value, headers, timestamp = row
    return (_unhex(key), _unhex(value), [(k, _unhex(v)) for k, v in headers], timestamp)


def encode_record(record: Any) -> list:
    return [record.offset, _hex(record.key), _hex(record.value),
            [[k, _hex(v)] for k, v in record.headers], record.timestamp]


def decode_record(item: list) -> tuple:
    """(offset, key, value, headers, timestamp) as the test compares them."""
    offset, key, value, headers, timestamp = item
    return (offset, _unhex(key), _unhex(value), [(k, _unhex(v)) for k, v in headers],
            timestamp)


# ---- the peer process ------------------------------------------------------------------

def _serve(root: str) -> None:
    import logkit

    broker = logkit.Broker(root, background=False)

    def reply(message: dict) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    def partition(command: dict) -> Any:
        # broker.topic() re-reads the topic record, so a topic deleted and re-created by
        # the test process is noticed here.
        return broker.topic(command["topic"]).partition(command["p"])

    reply({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        try:
            if op == "append":
                rows = [decode_row(r) for r in command["rows"]]
                base = partition(command).append(rows,
                                                 compression_type=command.get("compression"))
                reply({"base": base})
            elif op == "spam":
                p = partition(command)
                for i, rows in enumerate(command["batches"]):
                    base = p.append([decode_row(r) for r in rows],
                                    compression_type=command.get("compression"))
                    reply({"ack": i, "base": base})
                reply({"done": True})
            elif op == "read":
                records = partition(command).read(command["offset"],
                                                  max_records=command["max"])
                reply({"records": [encode_record(r) for r in records]})
            elif op == "state":
                p = partition(command)
                reply({"lso": p.log_start_offset, "leo": p.log_end_offset,
                       "hw": p.high_watermark})
            elif op == "roll":
                partition(command)._log.roll()
                reply({"ok": True})
            elif op == "commit":            # manual assignment, so the group stays empty
                tp = logkit.TopicPartition(command["topic"], command["p"])
                consumer = broker.consumer(group_id=command["group"],
                                           enable_auto_commit=False)
                try:
                    consumer.assign([tp])
                    consumer.commit({tp: command["offset"]})
                    reply({"committed": consumer.committed(tp)})
                finally:
                    consumer.close()
            elif op == "group":
                committed = broker.group(command["group"]).committed()
                reply({"committed": sorted([tp.topic, tp.partition, offset]
                                           for tp, offset in committed.items())})
            elif op == "reopen":
                broker.close()
                broker = logkit.Broker(root, background=False)
                reply({"ok": True})
            elif op == "quit":
                broker.close()
                reply({"ok": True})
                return
            else:
                reply({"error": "ValueError", "message": f"unknown op {op!r}"})
        except Exception as exc:   # the test decides whether this error was expected
            reply({"error": type(exc).__name__, "message": str(exc)})


# ---- the test side ---------------------------------------------------------------------

class PeerError(Exception):
    """The peer answered with an exception; `.name` is its class name."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


class Peer:
    """A running peer process; every wait is bounded by REPLY_TIMEOUT_S."""

    def __init__(self, root: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(root)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": ROOT_DIR})
        self._lines: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        ready = self._next()
        assert ready.get("ready"), ready

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self._lines.put(json.loads(line))
            except ValueError:                # a line cut short by SIGKILL
                pass
        self._lines.put(None)                 # end of output: the process is gone

    def _next(self, timeout_s: float = REPLY_TIMEOUT_S) -> dict:
        try:
            message = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"peer gave no answer within {timeout_s} s") from None
        if message is None:
            raise AssertionError(f"peer exited (code {self.proc.poll()})")
        return message

    def send(self, command: dict) -> None:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def call(self, command: dict) -> dict:
        self.send(command)
        answer = self._next()
        if "error" in answer:
            raise PeerError(answer["error"], answer["message"])
        return answer

    def append(self, topic: str, p: int, rows: list[tuple],
               compression: str | None = None) -> int:
        return self.call({"op": "append", "topic": topic, "p": p,
                          "rows": [encode_row(r) for r in rows],
                          "compression": compression})["base"]

    def read(self, topic: str, p: int, offset: int, max_records: int) -> list[tuple]:
        answer = self.call({"op": "read", "topic": topic, "p": p, "offset": offset,
                            "max": max_records})
        return [decode_record(r) for r in answer["records"]]

    def state(self, topic: str, p: int) -> dict:
        return self.call({"op": "state", "topic": topic, "p": p})

    def spam_and_kill(self, topic: str, p: int, batches: list[list[tuple]],
                      kill_after: int, compression: str | None = None) -> list[int]:
        """Start appending `batches`; SIGKILL the peer once `kill_after` acks arrived
        (or when it finishes). Returns the base offsets of every acknowledged batch,
        including acks that were already in the pipe when the kill landed."""
        self.send({"op": "spam", "topic": topic, "p": p, "compression": compression,
                   "batches": [[encode_row(r) for r in rows] for rows in batches]})
        acked: list[int] = []
        while len(acked) < kill_after:
            message = self._next()
            if "error" in message:
                raise PeerError(message["error"], message["message"])
            if message.get("done"):
                break
            acked.append(message["base"])
        self.kill()
        while True:                             # acks written before the kill still count
            message = self._lines.get(timeout=REPLY_TIMEOUT_S)
            if message is None:
                return acked
            if "ack" in message:
                acked.append(message["base"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=REPLY_TIMEOUT_S)
        self._reader.join(timeout=REPLY_TIMEOUT_S)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def close(self) -> None:
        """Quit politely (bounded), else kill; safe to call twice."""
        if self.proc.poll() is None:
            try:
                self.call({"op": "quit"})
                self.proc.wait(timeout=REPLY_TIMEOUT_S)
            except (AssertionError, PeerError, OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


if __name__ == "__main__":
    _serve(sys.argv[1])
