"""Object-store shipping (issue 10): how long a record takes to reach the store, and
what one shipping pass uploads, for `file://` and an S3 API server (moto's server mode
on 127.0.0.1, its own process).

  lag        from an append on the leader to the manifest that names it (what an
             `ObjectStoreSource` follower or `logkit restore` can read from then), at
             the default `ship.interval.ms`, one 100-byte record every 37 ms
  per pass   bytes, objects and seconds one pass uploads for a busy partition whose
             active segment grows by the same bytes before every pass: chunked (the
             shipper as it is: only the batches appended since) beside whole-tail
             (`Shipper.incremental = False`: the active segment uploaded whole each
             pass, as the first layout did), same run, same appends

Run from the checkout's root (its own command line and JSON, not part of `all`):
    .venv/bin/python -m benchmarks.objectstore [--stores file,s3] [--seconds 20]
        [--passes 80] [--records-per-pass 2000] [--json benchmarks/objectstore.json]
`--quick` is the small size the test suite smoke-tests. Speed is never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, Iterator

import logkit
from logkit.replication.objectstore import Shipper

VALUE = b"v" * 100
RECORD_INTERVAL_S = 0.037          # the lag run's spacing of appends
RECORDS_PER_BATCH = 150            # per appended batch in the per-pass run (~16 KiB)
QUICK = {"seconds": 3.0, "passes": 5, "records_per_pass": 300}
SERVER_START_TIMEOUT_S = 30.0
DRAIN_INTERVALS = 3                # after the lag run, wait this many intervals at most


# ---- stores -------------------------------------------------------------------------

class _MotoServer:
    """moto's S3 server on a free 127.0.0.1 port, in its own process."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
               "AWS_DEFAULT_REGION": "us-east-1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                      "-p", str(port)], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.endpoint_url = f"http://127.0.0.1:{port}"
        self.options = {"endpoint_url": self.endpoint_url, "key": "bench",
                        "secret": "bench"}
        self._buckets = 0
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}")
            try:
                urllib.request.urlopen(self.endpoint_url + "/", timeout=1).close()
                return
            except urllib.error.HTTPError:
                return                                  # it answered: up
            except OSError:
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"moto server did not answer on "
                                       f"{self.endpoint_url}") from None
                time.sleep(0.1)

    def url(self) -> str:
        import s3fs
        self._buckets += 1
        name = f"bench-{os.getpid()}-{self._buckets}"
        s3fs.S3FileSystem(skip_instance_cache=True, **self.options).mkdir(name)
        return f"s3://{name}/shipped"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Stores:
    """Fresh store URLs (and their storage options) of each kind."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.server: _MotoServer | None = None
        self._n = 0

    def new(self, kind: str) -> tuple[str, dict[str, Any] | None]:
        self._n += 1
        if kind == "file":
            return f"file://{self.directory}/bucket-{self._n}", None
        if self.server is None:
            self.server = _MotoServer()
        return self.server.url(), self.server.options

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


STORE_NAMES = {"file": "file://", "s3": "S3 API (moto server, 127.0.0.1)"}


# ---- the lag run --------------------------------------------------------------------

class _TimedShipper(Shipper):
    """A Shipper that notes when each manifest was written and the log end it names."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.written: list[tuple[int, int]] = []       # (monotonic ns, log end)
        super().__init__(*args, **kwargs)

    def _write_manifest(self, body: dict[str, Any]) -> None:
        super()._write_manifest(body)
        ends = [e["log_end_offset"] for e in body["partitions"]]
        self.written.append((time.monotonic_ns(), ends[0] if ends else 0))


def _pick(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lag_run(kind: str, stores: _Stores, root: str, seconds: float) -> dict[str, Any]:
    url, options = stores.new(kind)
    with logkit.Broker(os.path.join(root, f"lag-{kind}")) as broker:
        interval_ms = int(broker.config["ship.interval.ms"])       # the default
        broker.create_topic("lag", 1)
        p = broker.topic("lag").partition(0)
        shipper = _TimedShipper(broker, url, storage_options=options)
        try:
            appended: list[int] = []                            # monotonic ns per offset
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                p.append([(None, VALUE, [], None)])
                appended.append(time.monotonic_ns())
                time.sleep(RECORD_INTERVAL_S)
            until = time.monotonic() + DRAIN_INTERVALS * interval_ms / 1000
            while time.monotonic() < until and \
                    not any(end >= len(appended) for _, end in shipper.written):
                time.sleep(0.01)
        finally:
            shipper.close()
    written = list(shipper.written)
    lags_ms, i = [], 0
    for offset, at in enumerate(appended):
        while i < len(written) and written[i][1] <= offset:
            i += 1
        if i < len(written):
            lags_ms.append((written[i][0] - at) / 1e6)
    ordered = sorted(lags_ms)
    return {"store": STORE_NAMES[kind], "interval_ms": interval_ms,
            "records": len(appended), "seen": len(lags_ms),
            "manifests": len(written), "lag_ms_p50": _pick(ordered, 0.50),
            "lag_ms_p99": _pick(ordered, 0.99), "lag_ms_max": ordered[-1]}


# ---- the per-pass run ---------------------------------------------------------------

def pass_run(kind: str, stores: _Stores, root: str, passes: int, records_per_pass: int,
             incremental: bool) -> dict[str, Any]:
    url, options = stores.new(kind)
    mode = "chunks" if incremental else "whole tail"
    path = os.path.join(root, f"pass-{kind}-{'inc' if incremental else 'whole'}")
    per_pass: list[dict[str, float]] = []
    with logkit.Broker(path, config={"ship.interval.ms": 3600000}) as broker:
        broker.create_topic("busy", 1)                     # Kafka's 1 GiB segments
        p = broker.topic("busy").partition(0)
        shipper = Shipper(broker, url, storage_options=options)
        shipper.incremental = incremental
        try:
            for _ in range(passes):
                end, uploaded, objects = p.log_end_offset, shipper.uploaded_bytes, \
                    shipper.uploaded_objects
                for first in range(0, records_per_pass, RECORDS_PER_BATCH):
                    count = min(RECORDS_PER_BATCH, records_per_pass - first)
                    p.append([(None, VALUE, [], None)] * count)
                appended = len(p.batches_since(end, upto=p.log_end_offset,
                                               max_bytes=1 << 40))
                started = time.perf_counter()
                shipper.flush()
                per_pass.append({"appended_bytes": appended,
                                 "uploaded_bytes": shipper.uploaded_bytes - uploaded,
                                 "objects": shipper.uploaded_objects - objects,
                                 "seconds": time.perf_counter() - started})
        finally:
            shipper.close()
        segments = len(p.segment_base_offsets())
    uploaded = [r["uploaded_bytes"] for r in per_pass]
    appended = [r["appended_bytes"] for r in per_pass]
    times = sorted(r["seconds"] for r in per_pass)
    return {"store": STORE_NAMES[kind], "mode": mode, "passes": passes,
            "segments": segments, "appended_bytes_per_pass": sum(appended) / passes,
            "uploaded_bytes_mean": sum(uploaded) / passes,
            "uploaded_bytes_last": uploaded[-1], "uploaded_bytes_max": max(uploaded),
            "uploaded_bytes_total": sum(uploaded),
            "objects_per_pass_max": max(r["objects"] for r in per_pass),
            "pass_ms_p50": _pick(times, 0.5) * 1000, "pass_ms_max": times[-1] * 1000,
            "upload_per_appended": sum(uploaded) / sum(appended)}


# ---- output -------------------------------------------------------------------------

def markdown(lag: list[dict[str, Any]], passes: list[dict[str, Any]]) -> str:
    out = ["| store | interval | records | p50 | p99 | max |", "|---|---:|---:|---:|---:|---:|"]
    for r in lag:
        out.append(f"| {r['store']} | {r['interval_ms']} ms | {r['records']} "
                   f"| {r['lag_ms_p50']:,.0f} ms | {r['lag_ms_p99']:,.0f} ms "
                   f"| {r['lag_ms_max']:,.0f} ms |")
    out += ["", "| store | tail shipped as | appended / pass | uploaded / pass, mean "
            "| last pass | uploaded / appended | pass p50 | pass max |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in passes:
        out.append(f"| {r['store']} | {r['mode']} | {_kib(r['appended_bytes_per_pass'])} "
                   f"| {_kib(r['uploaded_bytes_mean'])} | {_kib(r['uploaded_bytes_last'])} "
                   f"| {r['upload_per_appended']:.2f}x | {r['pass_ms_p50']:,.1f} ms "
                   f"| {r['pass_ms_max']:,.1f} ms |")
    return "\n".join(out)


def _kib(n: float) -> str:
    return f"{n / 1024:,.0f} KiB"


def _runs(stores_wanted: list[str]) -> Iterator[str]:
    for kind in stores_wanted:
        if kind not in STORE_NAMES:
            raise SystemExit(f"unknown store {kind!r}; choose from {sorted(STORE_NAMES)}")
        yield kind


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stores", default="file,s3",
                        help="which stores: file, s3 (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="length of the lag run per store (default %(default)s)")
    parser.add_argument("--passes", type=int, default=80,
                        help="passes of the per-pass run (default %(default)s)")
    parser.add_argument("--records-per-pass", type=int, default=2000,
                        help="100-byte records appended before each pass "
                             "(default %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny: {QUICK['seconds']} s, {QUICK['passes']} passes of "
                             f"{QUICK['records_per_pass']} records")
    parser.add_argument("--dir", default=None, help="where temporary data goes")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    args = parser.parse_args(argv)
    seconds = QUICK["seconds"] if args.quick else args.seconds
    passes = QUICK["passes"] if args.quick else args.passes
    records = QUICK["records_per_pass"] if args.quick else args.records_per_pass
    if seconds <= 0 or passes < 1 or records < 1:
        parser.error("--seconds, --passes and --records-per-pass must be positive")
    kinds = list(_runs(args.stores.split(",")))
    root = tempfile.mkdtemp(prefix="logkit-bench-objectstore-", dir=args.dir)
    stores = _Stores(root)
    lag, per_pass = [], []
    try:
        for kind in kinds:
            sys.stderr.write(f"objectstore: lag, {STORE_NAMES[kind]}, {seconds} s ...\n")
            lag.append(lag_run(kind, stores, root, seconds))
        for kind in kinds:
            for incremental in (True, False):
                sys.stderr.write(f"objectstore: {passes} passes, {STORE_NAMES[kind]}, "
                                 f"{'chunks' if incremental else 'whole tail'} ...\n")
                per_pass.append(pass_run(kind, stores, root, passes, records,
                                         incremental))
    finally:
        stores.close()
        shutil.rmtree(root, ignore_errors=True)
    document = {"seconds": seconds, "passes": passes, "records_per_pass": records,
                "load_average": os.getloadavg(), "lag": lag, "per_pass": per_pass}
    print(markdown(lag, per_pass))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=1)
            f.write("\n")
    return document


if __name__ == "__main__":
    main()
