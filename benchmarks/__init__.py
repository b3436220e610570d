"""logkit's benchmarks: the suite that measures logkit beside its peers in one run.

Owns: `python -m benchmarks` (and `logkit bench`, which hands over to it). Not part of
the installed library: it lives in the source checkout beside `logkit/`.
"""

from .suite import (BENCHMARKS, BenchConfig, Result, build_parser, format_table, main,
                    run, run_from_args)

__all__ = ["BENCHMARKS", "BenchConfig", "Result", "build_parser", "format_table", "main",
           "run", "run_from_args"]
