"""How a run's rows are reported: ratios against logkit's headline row, the table a
person reads (plain or markdown), and the JSON document machines read.

Owns: `add_ratios`, `format_table`, `document`. Invariant: a ratio always reads "how
many times better logkit's headline row is than this row" (> 1: logkit faster, or lower
latency), whatever the benchmark's unit.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict
from typing import Any

from ._common import KAFKA_2014, TARGETS, BenchConfig, Result


def add_ratios(results: list[Result]) -> None:
    """Fill `ratio` on every row that has a headline row in its benchmark."""
    by_bench: dict[str, list[Result]] = {}
    for r in results:
        by_bench.setdefault(r.benchmark, []).append(r)
    for rows in by_bench.values():
        heads = [r for r in rows if r.headline]
        if not heads:
            continue
        head = heads[0]
        for r in rows:
            if r is head:
                continue
            if head.latency_us_p50 and r.latency_us_p50:
                r.ratio = r.latency_us_p50 / head.latency_us_p50
            elif head.benchmark == "open" and r.seconds:
                r.ratio = r.seconds / head.seconds
            elif head.benchmark == "recover" and head.mb_per_s and r.mb_per_s:
                r.ratio = head.mb_per_s / r.mb_per_s
            elif head.records_per_s and r.records_per_s:
                r.ratio = head.records_per_s / r.records_per_s


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return ""
    return f"{value:,.{digits}f}"


def format_table(results: list[Result], *, markdown: bool = False) -> str:
    """The rows as a table a person reads (plain text, or GitHub markdown)."""
    header = ["benchmark", "system", "records/s", "MB/s", "p50 µs", "p99 µs", "p99.9 µs",
              "max µs", "time", "peak RSS MB", "logkit ×"]
    rows = []
    for r in results:
        if r.benchmark == "open" and r.extra:
            time_cell = f"{r.extra['open_ms_median']:.2f} ms"
        elif r.seconds:
            time_cell = f"{r.seconds:.2f} s"
        else:
            time_cell = ""
        ratio = "(headline)" if r.headline else (f"{r.ratio:.2f}×" if r.ratio else "")
        rows.append([r.benchmark, r.system, _fmt(r.records_per_s), _fmt(r.mb_per_s, 1),
                     _fmt(r.latency_us_p50, 1), _fmt(r.latency_us_p99, 1),
                     _fmt(r.latency_us_p999, 1), _fmt(r.latency_us_max, 1), time_cell,
                     _fmt(r.peak_rss_mb, 0), ratio or r.note])
    if markdown:
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    widths[1] = min(widths[1], 72)

    def line(cells: list[str]) -> str:
        return "  ".join(c[:w].ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths])] +
                     [line(row) for row in rows])


def environment() -> dict[str, Any]:
    """What the figures depend on: Python, machine, and which native code logkit loaded."""
    from logkit import _native
    from logkit.crc import IMPLEMENTATION
    return {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "speedups": _native.speedups is not None,
            "sendpath": _native.sendpath is not None, "crc32c": IMPLEMENTATION}


def document(config: BenchConfig, results: list[Result]) -> dict[str, Any]:
    """The run as docs/benchmarks.json holds it."""
    return {"environment": environment(), "config": asdict(config),
            "results": [asdict(r) for r in results], "kafka_2014": KAFKA_2014,
            "targets": TARGETS}
