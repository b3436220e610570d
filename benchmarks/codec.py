"""The codec benchmark: the same records encoded and decoded by logkit's record codec as
the library chose it (compiled when `_speedups` is built), by logkit's pure-Python codec,
and by kafka-python's DefaultRecordBatchBuilder / DefaultRecordBatch.

Owns: the `codec-encode` and `codec-decode` rows. The pure-Python rows are measured in a
child process started with LOGKIT_PURE_PYTHON=1, the variable `logkit._native` reads once
at import to choose C or Python: the library has no switch to flip at run time, and this
benchmark swaps nothing inside it. The child stays up for the whole benchmark and measures each
operation right after this process measured it (compiled encode, pure encode, compiled
decode, pure decode), so the two figures of a ratio come from the same moment of a noisy
machine. Invariant: a child that finds the compiled codec loaded anyway fails the run
rather than report compiled figures as pure Python; every wait on the child is bounded.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any

from logkit._native import PURE_PYTHON_ENV   # the switch logkit reads once, at import

from ._common import (NOT_INSTALLED, TOPIC, BenchConfig, Result, chunks, make_records,
                      measure, records_per_batch)
from ._peers import kafka_python

MAX_CODEC_RECORDS = 1_000_000
OPERATIONS = ("encode", "decode")
CHILD_TIMEOUT_S = 600                     # bound on the child's set-up and on each answer
READY = "ready"


def run(config: BenchConfig) -> list[Result]:
    from logkit import _native
    label = "compiled" if _native.speedups is not None else "pure Python (no _speedups)"
    work = _Workload(config)
    out: list[Result] = []
    with _PurePythonChild(config) as child:
        for operation in OPERATIONS:
            out.append(_measure(work, operation, label, headline=True))
            out.append(child.measure(operation))
    return out + _kafka_python_rows(work)


class _Workload:
    """The records of one codec run: input tuples per batch, and the same batches encoded.
    The same config builds the same workload in every process."""

    def __init__(self, config: BenchConfig) -> None:
        from logkit.compression import codec_id
        from logkit.records import encode_batch, read_header
        self.count = min(config.records, MAX_CODEC_RECORDS)
        self.payload_bytes = self.count * (config.key_bytes + config.value_bytes)
        self.codec = codec_id(config.codec_name())
        self.now_ms = int(time.time() * 1000)
        pairs = make_records(config, self.count)
        self.inputs = [[(k, v, None, self.now_ms) for k, v in chunk]
                       for chunk in chunks(pairs, records_per_batch(config))]
        self.batches = [encode_batch(rows, codec=self.codec, now_ms=self.now_ms)
                        for rows in self.inputs]
        self.headers = [read_header(b, 0, len(b)) for b in self.batches]


def _measure(work: _Workload, operation: str, label: str, *, headline: bool) -> Result:
    """One row: `operation` (encode or decode) of the whole workload with logkit's codec
    as this process loaded it."""
    from logkit.records import decode_batch, encode_batch

    def encode() -> None:
        for rows in work.inputs:
            encode_batch(rows, codec=work.codec, now_ms=work.now_ms)

    def decode() -> None:
        for batch, header in zip(work.batches, work.headers):
            for r in decode_batch(batch, 0, header, TOPIC, 0):
                r.value

    fn = {"encode": encode, "decode": decode}[operation]
    return measure(f"codec-{operation}", f"logkit {operation}_batch ({label})", work.count,
                   work.payload_bytes, fn, headline=headline)


class _PurePythonChild:
    """`python -m benchmarks.codec CONFIG_JSON` with LOGKIT_PURE_PYTHON=1, answering one
    JSON row per operation name written to its stdin."""

    def __init__(self, config: BenchConfig) -> None:
        env = dict(os.environ)
        env[PURE_PYTHON_ENV] = "1"
        checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (checkout, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.codec", json.dumps(asdict(config))],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        if self._answer() != READY:
            raise self._failed("did not start")

    def measure(self, operation: str) -> Result:
        assert self.proc.stdin is not None
        self.proc.stdin.write(operation + "\n")
        self.proc.stdin.flush()
        line = self._answer()
        if not line:
            raise self._failed(f"gave no {operation} row")
        return Result(**json.loads(line))

    def _answer(self) -> str:
        """The child's next line ('' if it ended), waiting at most CHILD_TIMEOUT_S."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], CHILD_TIMEOUT_S)
        if not ready:
            raise self._failed(f"did not answer within {CHILD_TIMEOUT_S} s")
        return self.proc.stdout.readline().strip()

    def _failed(self, what: str) -> RuntimeError:
        self.proc.kill()
        _, stderr = self.proc.communicate(timeout=CHILD_TIMEOUT_S)
        return RuntimeError(f"the pure-Python codec child {what} (exit "
                            f"{self.proc.returncode}): {stderr.strip()[-2000:]}")

    def __enter__(self) -> _PurePythonChild:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc.poll() is None:
            self.proc.communicate(input="", timeout=CHILD_TIMEOUT_S)   # EOF: it exits


def _kafka_python_rows(work: _Workload) -> list[Result]:
    kp = kafka_python()
    if kp is None:
        return [Result("codec", "kafka-python", note=NOT_INSTALLED)]
    kp_codec = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4}[work.codec]

    def kp_encode() -> None:
        for rows in work.inputs:
            builder = kp.DefaultRecordBatchBuilder(2, kp_codec, False, -1, -1, -1, 1 << 30)
            for i, (k, v, _h, ts) in enumerate(rows):
                builder.append(i, ts, k, v, [])
            builder.build()

    def kp_decode() -> None:
        for batch in work.batches:
            for r in kp.DefaultRecordBatch(bytes(batch)):
                r.value

    return [measure("codec-encode", "kafka-python DefaultRecordBatchBuilder", work.count,
                    work.payload_bytes, kp_encode),
            measure("codec-decode", "kafka-python DefaultRecordBatch", work.count,
                    work.payload_bytes, kp_decode)]


def _child(argv: list[str]) -> int:
    """The child's side: build the workload, say READY, then answer each operation name
    read from stdin with its row as one JSON line, until EOF."""
    config = BenchConfig(**json.loads(argv[0]))
    from logkit import _native
    if not _native.FORCED_PURE_PYTHON or _native.speedups is not None:
        sys.stderr.write(f"the compiled codec is loaded: run with {PURE_PYTHON_ENV}=1\n")
        return 2
    work = _Workload(config)
    print(READY, flush=True)
    label = f"pure Python, {PURE_PYTHON_ENV}=1"
    for line in sys.stdin:
        operation = line.strip()
        if operation not in OPERATIONS:
            sys.stderr.write(f"unknown operation {operation!r}\n")
            return 2
        print(json.dumps(asdict(_measure(work, operation, label, headline=False))),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
