"""The `logkit` command: a thin layer over the library.

Owns: argument parsing and turning library errors into a message and an exit code. Each
command opens one library object and makes one or two calls on it; it uses only the
public names of `logkit` (tests/test_seams.py holds it to that), so it knows nothing of
the file formats beyond what they expose. Every command's help carries an
example (tests/test_cli.py checks that).

    logkit topics DIR                    list topics and their partition counts
    logkit describe DIR TOPIC            offsets and sizes of each partition
    logkit dump SEGMENT.log              the batches (and records) of one segment file
    logkit bench [BENCHMARK ...]         the benchmark suite (benchmarks/ of a checkout)

Exit codes: 0 success, 1 a logkit or OS error (message on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any, Callable, Sequence

from . import Broker, LogkitError, iter_segment_batches

__all__ = ["main", "build_parser"]

log = logging.getLogger(__name__)


def _broker(directory: str) -> Broker:
    if not os.path.isfile(os.path.join(directory, "logkit.json")):
        # inspection must never turn an arbitrary directory into a broker root
        raise LogkitError(f"{directory} is not a logkit directory (no logkit.json)")
    # Inspection writes nothing: no recovery, no format file, no clean marks.
    return Broker(directory, background=False, read_only=True)


def cmd_topics(args: argparse.Namespace) -> int:
    with _broker(args.directory) as broker:
        rows = [{"topic": name, "partitions": broker.topic(name).num_partitions}
                for name in broker.topics()]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['topic']}\t{row['partitions']}")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    with _broker(args.directory) as broker:
        topic = broker.topic(args.topic)
        rows = [{"partition": p.topic_partition.partition,
                 "log_start_offset": p.log_start_offset,
                 "log_end_offset": p.log_end_offset,
                 "high_watermark": p.high_watermark,
                 "size_bytes": p.size_bytes()}
                for p in topic.partitions]
    if args.json:
        print(json.dumps({"topic": args.topic, "partitions": rows}, indent=2))
        return 0
    print(f"topic {args.topic}: {len(rows)} partition(s)")
    print(f"{'partition':>9}  {'start':>12}  {'end':>12}  {'hw':>12}  {'bytes':>14}")
    for row in rows:
        print(f"{row['partition']:>9}  {row['log_start_offset']:>12}  "
              f"{row['log_end_offset']:>12}  {row['high_watermark']:>12}  "
              f"{row['size_bytes']:>14}")
    return 0


def cmd_dump(args: argparse.Namespace) -> int:
    path = args.segment
    size = os.stat(path).st_size
    if size == 0:
        print(f"{path}: empty")
        return 0
    batches = records = 0
    for batch in iter_segment_batches(path, decode=args.records):
        header = batch.header
        print(f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} "
              f"count: {header.records_count} position: {batch.position} "
              f"size: {header.size} codec: {header.codec} "
              f"maxTimestamp: {header.max_timestamp} crc: {header.crc} "
              f"isControl: {header.is_control}")
        for r in batch.records or ():
            print(f"| offset: {r.offset} timestamp: {r.timestamp} "
                  f"key: {_show(r.key)} value: {_show(r.value)}"
                  + (f" headers: {list(r.headers)}" if r.headers else ""))
        batches += 1
        records += header.records_count
    print(f"{batches} batch(es), {records} record(s), {size} bytes: all CRCs valid")
    return 0


def _show(data: bytes | None, limit: int = 60) -> str:
    if data is None:
        return "null"
    text = repr(data)
    return text if len(text) <= limit else text[:limit] + "..."


def _benchmarks() -> Any:
    """The `benchmarks` package, or None. It is not part of the installed library: it is
    the benchmarks/ folder of the source checkout, found on sys.path (`python -m`
    from the checkout's root) or beside the `logkit/` this module was loaded from (an
    editable install)."""
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isfile(os.path.join(checkout, "benchmarks", "__init__.py")) \
            and checkout not in sys.path:
        sys.path.append(checkout)
    try:
        import benchmarks
    except ImportError:
        return None
    return benchmarks if hasattr(benchmarks, "run_from_args") else None


BENCH_MISSING = ("the benchmark suite is not installed with logkit: it is the benchmarks/ "
                 "folder of a source checkout (git clone, then `make bench` or "
                 "`python -m benchmarks --help` from its root)")


def cmd_bench(args: argparse.Namespace) -> int:
    suite = _benchmarks()
    if suite is None:
        print(f"logkit bench: {BENCH_MISSING}", file=sys.stderr)
        return 1
    return suite.run_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="logkit", description="Inspect logkit data directories and benchmark logkit.",
        epilog="example: logkit describe data/ orders",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands: list[tuple[str, str, str, Callable[[argparse.Namespace], int]]] = [
        ("topics", "list the topics of a broker directory", "logkit topics data/",
         cmd_topics),
        ("describe", "offsets and sizes of each partition of a topic",
         "logkit describe data/ orders", cmd_describe),
        ("dump", "print the batches (and with --records the records) of a .log file, "
         "checking every CRC", "logkit dump --records data/orders-0/00000000000000000000.log",
         cmd_dump),
        ("bench", "run the benchmark suite beside its peers",
         "logkit bench produce consume --records 1000000 --json results.json", cmd_bench),
    ]
    for name, help_text, example, fn in commands:
        cmd = sub.add_parser(name, help=help_text, description=help_text,
                             epilog=f"example: {example}",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        cmd.set_defaults(func=fn)
        if name == "bench":
            suite = _benchmarks()
            if suite is None:
                cmd.description = f"{help_text}. Not available here: {BENCH_MISSING}."
                cmd.add_argument("benchmarks", nargs="*")
            else:
                suite.build_parser(cmd)
            continue
        if name == "dump":
            cmd.add_argument("segment", help="path of a NNNNNNNNNNNNNNNNNNNN.log file")
            cmd.add_argument("--records", action="store_true", help="print every record")
            continue
        cmd.add_argument("directory", help="the broker's root directory")
        if name == "describe":
            cmd.add_argument("topic")
        cmd.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:          # `logkit dump ... | head`
        return 0
    except (LogkitError, OSError) as exc:
        log.debug("logkit %s failed", args.command, exc_info=exc)   # the traceback, if wanted
        print(f"logkit {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
