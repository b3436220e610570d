"""The REST proxy's costs (issue 34): streamed produce records per second, one record's
round trip, and v2 consume beside the Kafka listener's, in one run.

Cases (the server, `broker.serve_rest()`, in this process; every client in a child
process of its own, so the server's event loop and its thread pool are the only Python
of the server side; 100 B values as BINARY (base64), one partition):

  stream     one chunked POST /v3/.../records of --records records (64 KiB chunks from
             a raw socket, a reader thread counting the reports), records per second
             from the first byte sent to the last report read; every report checked
  single     --single sequential POSTs of one record each over one keep-alive
             connection (http.client): p50 and p99 round trip in ms
  consume    --records records read from the start through a v2 binary consumer
             instance (GET .../records until all arrived) and through the Kafka
             listener (kafka-python, no group), records per second each

Run from the checkout's root (its own command line and JSON):
    .venv/bin/python -m benchmarks.rest [--json benchmarks/rest.json]
    .venv/bin/python -m benchmarks.rest --profile     # cProfile of the stream case
`--quick` is a smoke size. Goals (issue 34): stream >= 100k records/s; single p50 <=
1 ms. Speed is never asserted.
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import datetime
import json
import os
import pstats
import subprocess
import sys
import tempfile
import textwrap

import logkit

GOALS = {"stream_records_per_s": 100_000, "single_p50_ms": 1.0}
VALUE = base64.b64encode(b"v" * 100).decode()

STREAM_CLIENT = textwrap.dedent('''
    import json, socket, sys, threading, time
    port, path, n, value = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    record = json.dumps({"value": {"type": "BINARY", "data": value}}).encode()
    per_chunk = max(1, 65536 // len(record))
    sock = socket.create_connection(("127.0.0.1", port))
    got = {"reports": 0, "bad": 0, "bytes": b""}
    def read():
        tail = b""
        while got["reports"] < n:
            data = sock.recv(1 << 20)
            if not data:
                break
            joined = tail + data               # a marker may straddle two reads
            for marker, key in ((b'"error_code":', "reports"), (b'"error_code":4', "bad"),
                                (b'"error_code":5', "bad")):
                got[key] += joined.count(marker) - tail.count(marker)
            tail = joined[-16:]
    reader = threading.Thread(target=read)
    start = time.perf_counter()
    sock.sendall((f"POST {path} HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json"
                  "\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n").encode())
    reader.start()
    sent = 0
    while sent < n:
        count = min(per_chunk, n - sent)
        chunk = record * count
        sock.sendall(b"%x\\r\\n" % len(chunk) + chunk + b"\\r\\n")
        sent += count
    sock.sendall(b"0\\r\\n\\r\\n")
    reader.join()
    seconds = time.perf_counter() - start
    print(json.dumps({"records": n, "reports": got["reports"], "errors": got["bad"],
                      "seconds": seconds, "records_per_s": n / seconds}))
''')

SINGLE_CLIENT = textwrap.dedent('''
    import http.client, json, sys, time
    port, path, n, value = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    body = json.dumps({"value": {"type": "BINARY", "data": value}})
    conn = http.client.HTTPConnection("127.0.0.1", port)
    times = []
    for i in range(n + 100):
        start = time.perf_counter()
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = response.read()
        if i >= 100:                                   # the first 100 warm up
            times.append(time.perf_counter() - start)
        assert response.status == 200, answer
    times.sort()
    print(json.dumps({"requests": n, "p50_ms": times[n // 2] * 1000,
                      "p99_ms": times[int(n * 0.99)] * 1000}))
''')

V2_CLIENT = textwrap.dedent('''
    import http.client, json, sys, time
    port, topic, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    conn = http.client.HTTPConnection("127.0.0.1", port)
    def call(method, path, body=None, accept=None):
        headers = {"Content-Type": "application/vnd.kafka.v2+json"}
        if accept:
            headers["Accept"] = accept
        conn.request(method, path, body and json.dumps(body), headers)
        response = conn.getresponse()
        return response.status, response.read()
    call("POST", "/consumers/bench", {"name": "b", "format": "binary",
                                      "auto.offset.reset": "earliest"})
    base = "/consumers/bench/instances/b"
    call("POST", base + "/subscription", {"topics": [topic]})
    start = time.perf_counter()
    got = 0
    while got < n:
        status, raw = call("GET", base + "/records?timeout=1000",
                           accept="application/vnd.kafka.binary.v2+json")
        got += len(json.loads(raw))
    seconds = time.perf_counter() - start
    call("DELETE", base)
    print(json.dumps({"records": got, "seconds": seconds, "records_per_s": got / seconds}))
''')

KAFKA_CLIENT = textwrap.dedent('''
    import json, sys, time
    from kafka import KafkaConsumer, TopicPartition
    bootstrap, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic, 0)])
    start = time.perf_counter()
    got = 0
    while got < n:
        for records in consumer.poll(timeout_ms=1000).values():
            got += len(records)
    seconds = time.perf_counter() - start
    consumer.close()
    print(json.dumps({"records": got, "seconds": seconds, "records_per_s": got / seconds}))
''')


def _child(script: str, *args: object) -> dict:
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"client failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _on_every_thread(server, fn) -> None:
    """Run fn() on the server's event loop thread and on each of its pool threads (a
    barrier keeps each pool task on a thread of its own)."""
    import asyncio
    import threading
    from logkit.rest import WORKER_THREADS
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), server._loop).result()
    server._loop.call_soon_threadsafe(fn)
    barrier = threading.Barrier(WORKER_THREADS)

    def each() -> None:
        fn()
        barrier.wait(timeout=30)
    for future in [server._pool.submit(each) for _ in range(WORKER_THREADS)]:
        future.result(timeout=60)


def _profile_server(server) -> list:
    """cProfile in every server thread (cProfile sees one thread each)."""
    import threading
    profilers: list = []
    lock = threading.Lock()

    def start() -> None:
        profiler = cProfile.Profile()
        with lock:
            profilers.append(profiler)
        profiler.enable()
    _on_every_thread(server, start)
    return profilers


def _report_profile(server, profilers: list) -> None:
    """Stop every thread's profiler (cProfile hooks sys.setprofile), print them merged."""
    _on_every_thread(server, lambda: sys.setprofile(None))
    stats = pstats.Stats(profilers[0])
    for profiler in profilers[1:]:
        stats.add(profiler)
    stats.sort_stats("tottime").print_stats(25)


def run(records: int, single: int, profile: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as root, logkit.Broker(root) as broker:
        server = broker.serve_rest()
        path = f"/v3/clusters/{server.cluster_id}/topics/%s/records"
        out: dict = {}
        broker.create_topic("stream", 1)
        profilers = _profile_server(server) if profile else None
        out["stream"] = _child(STREAM_CLIENT, server.port, path % "stream", records, VALUE)
        if profilers:
            _report_profile(server, profilers)
        broker.create_topic("single", 1)
        out["single"] = _child(SINGLE_CLIENT, server.port, path % "single", single, VALUE)
        listener = broker.serve()
        out["consume"] = {
            "v2 binary consumer": _child(V2_CLIENT, server.port, "stream", records),
            "Kafka listener (kafka-python)": _child(KAFKA_CLIENT,
                                                    listener.bootstrap_servers,
                                                    "stream", records)}
        listener.close()
        server.close()
    stream, single_run = out["stream"], out["single"]
    out["goals"] = {
        "stream_records_per_s": {"goal": GOALS["stream_records_per_s"],
                                 "value": stream["records_per_s"],
                                 "met": stream["records_per_s"]
                                 >= GOALS["stream_records_per_s"]},
        "single_p50_ms": {"goal": GOALS["single_p50_ms"], "value": single_run["p50_ms"],
                          "met": single_run["p50_ms"] <= GOALS["single_p50_ms"]}}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--single", type=int, default=2_000)
    ap.add_argument("--quick", action="store_true", help="a smoke size")
    ap.add_argument("--profile", action="store_true", help="cProfile the stream case")
    ap.add_argument("--json", metavar="FILE", help="write the results here")
    args = ap.parse_args(argv)
    records, single = (5_000, 200) if args.quick else (args.records, args.single)
    result = run(records, single, args.profile)
    doc = {"date": datetime.date.today().isoformat(), "quick": args.quick,
           "machine": {"cpus": os.cpu_count(), "load_1m": list(os.getloadavg()[:1])},
           **result}
    text = json.dumps(doc, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
