"""logkit's benchmarks: logkit beside its peers, measured in the same run.

Owns: `python -m benchmarks` (and `logkit bench`, which hands its arguments here), the
list of benchmarks and the driver that runs them. Not part of the installed library: the
package lives in the source checkout beside `logkit/`, and `logkit/` never imports it.

One module per benchmark, each measuring logkit and its peers on the same records in
the same process run, because only same-run ratios are comparable on a noisy machine
(the spirit of Kafka's `kafka-producer-perf-test` / `kafka-consumer-perf-test`):

    codec          logkit's codec compiled and pure Python; kafka-python's batch classes
    produce        producer.send, log-level appends; SQLite WAL, persist-queue, os.write
    consume        consumer.poll, Partition.read; SQLite, persist-queue, os.read, kafka-python
    e2e            send -> poll across processes; an OS pipe, SQLite polling
    durable        produce with an fsync per batch; SQLite synchronous=FULL, write + fsync
    broker_open    `open`: a 30-partition broker; SQLite connect, os.open of the same files
    recover        a forced full recovery scan; bare CRC-32C, kafka-python, quick_check

Kafka's published 2014 single-node figures are printed as a labelled historical anchor,
never as a same-run peer. Results are rows (`Result`); `ratio` is how many times better
logkit's headline row is than the peer (>1: logkit faster, or lower latency). Shared
pieces: `_common` (config, rows, timing, workload), `_peers` (SQLite, persist-queue,
kafka-python), `_report` (ratios, tables, JSON).

Other benchmarks have their own command line and output, and are not part of `all`:
`python -m benchmarks.wakeup_latency` (blocking-poll wake-up latency, writes
benchmarks/wakeup_latency.json), `python -m benchmarks.spark_read` and
`python -m benchmarks.spark_write` (the Spark data source beside Parquet; need Java),
`python -m benchmarks.schemas` (serdes beside confluent-kafka's, docs/schemas.md),
`python -m benchmarks.listener` (the Kafka protocol listener beside librdkafka's mock
cluster and Tansu); `standalone()` finds them all.

Speed is never asserted anywhere: tests run each benchmark small and check only that
the figures are sane.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from typing import Sequence

from ._common import MAX_RECORDS, BenchConfig, Result
from ._report import add_ratios, document, format_table

__all__ = ["BENCHMARKS", "MODULES", "standalone", "BenchConfig", "Result", "run", "format_table",
           "build_parser", "run_from_args", "main"]

# name -> what it measures; each is the module benchmarks.<name> (MODULES says where
# not), whose run(config) returns its rows. Imported only when run, so `logkit --help`
# stays quick.
BENCHMARKS: dict[str, str] = {
    "codec": "encode and decode: compiled, pure Python, kafka-python",
    "produce": "keyed records into 3 partitions, beside SQLite, persist-queue, os.write",
    "consume": "read every record back, beside SQLite, persist-queue, os.read",
    "e2e": "send -> poll latency across processes, beside a pipe and SQLite",
    "durable": "produce with an fsync per batch, beside SQLite FULL and write+fsync",
    "open": "open a broker of open_partitions partitions, beside SQLite and os.open",
    "recover": "a full recovery scan, beside CRC-32C alone, kafka-python, SQLite",
}

# `open` is not a module name here: an attribute `open` on this package would hide the
# builtin from the code below.
MODULES = {name: name for name in BENCHMARKS} | {"open": "broker_open"}



def standalone() -> list[str]:
    """The benchmarks with their own command line (`python -m benchmarks.<name> --help`):
    every public module of this package that `all` does not run."""
    suite = set(MODULES.values())
    return sorted(m.name for m in pkgutil.iter_modules(__path__)
                  if not m.name.startswith("_") and m.name not in suite)


def run(names: Sequence[str], config: BenchConfig) -> list[Result]:
    """Run the named benchmarks in order; returns every row with ratios filled in."""
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    if not 0 < config.records <= MAX_RECORDS:
        raise ValueError(f"records must be in 1..{MAX_RECORDS:,}, not {config.records}")
    results: list[Result] = []
    for name in names:
        if config.progress:
            sys.stderr.write(f"running {name} ...\n")
            sys.stderr.flush()
        results.extend(importlib.import_module(f"{__name__}.{MODULES[name]}").run(config))
    add_ratios(results)
    return results


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The argument parser (`logkit bench` passes its subcommand's parser to fill)."""
    if parser is None:
        parser = argparse.ArgumentParser(
            prog="python -m benchmarks",
            description="Benchmark logkit beside its peers in one run.",
            epilog="example: python -m benchmarks all --records 1000000 --json out.json",
            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.epilog = (parser.epilog or "") + "\n\nbenchmarks:\n" + "".join(
        f"  {name:<9} {what}\n" for name, what in BENCHMARKS.items()) + (
        "with their own command line (not in all):\n" +
        "".join(f"  python -m benchmarks.{n} --help\n" for n in standalone()))
    defaults = BenchConfig()
    parser.add_argument("benchmarks", nargs="*", default=["all"],
                        help=f"which to run: all, {', '.join(BENCHMARKS)}")
    parser.add_argument("--records", type=int, default=defaults.records,
                        help="records for codec, produce and consume (default %(default)s)")
    parser.add_argument("--value-size", type=int, default=defaults.value_bytes,
                        help="value bytes (default %(default)s)")
    parser.add_argument("--key-size", type=int, default=defaults.key_bytes,
                        help="key bytes (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=defaults.partitions,
                        help="partitions of the produce/consume topic (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_bytes,
                        help="batch bytes, the producer's batch_size (default %(default)s)")
    parser.add_argument("--compression", default=defaults.compression,
                        choices=["none", "gzip", "snappy", "lz4", "zstd"])
    parser.add_argument("--e2e-records", type=int, default=defaults.e2e_records)
    parser.add_argument("--e2e-interval-us", type=int, default=defaults.e2e_interval_us)
    parser.add_argument("--durable-records", type=int, default=defaults.durable_records)
    parser.add_argument("--open-partitions", type=int, default=defaults.open_partitions)
    parser.add_argument("--recover-mb", type=int, default=defaults.recover_mb)
    parser.add_argument("--peer-records", type=int, default=defaults.peer_records_cap,
                        help="cap on records for the slow peers (default %(default)s)")
    parser.add_argument("--dir", default=None, help="where temporary data goes")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="also write the results as JSON ('-' for stdout only)")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser


def run_from_args(args: argparse.Namespace) -> int:
    """Run what the parsed arguments ask for; prints the table (and writes the JSON)."""
    names = list(BENCHMARKS) if "all" in args.benchmarks else args.benchmarks
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        hint = [n for n in unknown if n.replace("-", "_") in standalone()]
        sys.stderr.write(f"unknown benchmark(s) {unknown}; choose from all, "
                         f"{', '.join(BENCHMARKS)}"
                         + (f" (run python -m benchmarks.{hint[0].replace('-', '_')})"
                            if hint else "") + "\n")
        return 2
    if not 0 < args.records <= MAX_RECORDS:
        sys.stderr.write(f"--records must be in 1..{MAX_RECORDS:,}\n")
        return 2
    config = BenchConfig(records=args.records, value_bytes=args.value_size,
                         key_bytes=args.key_size, partitions=args.partitions,
                         batch_bytes=args.batch_size, compression=args.compression,
                         e2e_records=args.e2e_records, e2e_interval_us=args.e2e_interval_us,
                         durable_records=args.durable_records,
                         open_partitions=args.open_partitions, recover_mb=args.recover_mb,
                         peer_records_cap=args.peer_records, directory=args.dir,
                         progress=not args.quiet)
    results = run(names, config)
    doc = document(config, results)
    if args.json == "-":
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(format_table(results, markdown=args.markdown))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_from_args(build_parser().parse_args(argv))
