"""The codec benchmark: the same records encoded and decoded by logkit's record codec as
the library chose it (compiled when `_speedups` is built), by logkit's pure-Python codec,
and by kafka-python's DefaultRecordBatchBuilder / DefaultRecordBatch.

Owns: the `codec-encode` and `codec-decode` rows. The pure-Python rows are measured in a
child process started with LOGKIT_PURE_PYTHON=1, the variable logkit reads once at import
to choose its codec: the library has no switch to flip at run time, and this benchmark
swaps nothing inside it. Invariant: a child that finds the compiled codec loaded anyway
fails the run rather than report compiled figures as pure Python.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict

from ._common import (NOT_INSTALLED, TOPIC, BenchConfig, Result, chunks, make_records,
                      measure, records_per_batch)
from ._peers import kafka_python

PURE_PYTHON_ENV = "LOGKIT_PURE_PYTHON"    # logkit's own switch, read when it is imported
MAX_CODEC_RECORDS = 1_000_000
CHILD_TIMEOUT_S = 600


def run(config: BenchConfig) -> list[Result]:
    from logkit import records
    native = _logkit_rows(config, "compiled" if records.SPEEDUPS
                          else "pure Python (no _speedups)", headline=True)
    pure = _pure_python_rows(config)
    out = [native[0], pure[0], native[1], pure[1]]
    out += _kafka_python_rows(config)
    return out


class _Workload:
    """The records of one codec run: input tuples per batch, and the same batches encoded."""

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


def _logkit_rows(config: BenchConfig, label: str, *, headline: bool) -> list[Result]:
    """[encode row, decode row] for logkit's codec as this process loaded it."""
    from logkit.records import decode_batch, encode_batch
    work = _Workload(config)

    def encode() -> None:
        for rows in work.inputs:
            encode_batch(rows, codec=work.codec, now_ms=work.now_ms)

    def decode() -> None:
        for batch, header in zip(work.batches, work.headers):
            for r in decode_batch(batch, 0, header, TOPIC, 0):
                r.value

    return [measure("codec-encode", f"logkit encode_batch ({label})", work.count,
                    work.payload_bytes, encode, headline=headline),
            measure("codec-decode", f"logkit decode_batch ({label})", work.count,
                    work.payload_bytes, decode, headline=headline)]


def _pure_python_rows(config: BenchConfig) -> list[Result]:
    """The same two rows from a child process that loaded logkit with the pure-Python codec."""
    env = dict(os.environ)
    env[PURE_PYTHON_ENV] = "1"
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (checkout, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.codec",
                           json.dumps(asdict(config))],
                          env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"the pure-Python codec child failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-2000:]}")
    return [Result(**row) for row in json.loads(proc.stdout)]


def _kafka_python_rows(config: BenchConfig) -> list[Result]:
    kp = kafka_python()
    if kp is None:
        return [Result("codec", "kafka-python", note=NOT_INSTALLED)]
    work = _Workload(config)
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
    """`python -m benchmarks.codec CONFIG_JSON` with LOGKIT_PURE_PYTHON=1: prints the two
    pure-Python rows as JSON."""
    config = BenchConfig(**json.loads(argv[0]))
    from logkit import records
    if not os.environ.get(PURE_PYTHON_ENV) or records.SPEEDUPS:
        sys.stderr.write(f"the compiled codec is loaded: run with {PURE_PYTHON_ENV}=1\n")
        return 2
    rows = _logkit_rows(config, f"pure Python, {PURE_PYTHON_ENV}=1", headline=False)
    json.dump([asdict(r) for r in rows], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
