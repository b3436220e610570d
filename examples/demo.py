"""`make demo`: the stream-processing pipeline on an embedded directory (data/demo).

Events are produced into logkit, a Spark Structured Streaming job (the `logkit` data
source) counts them per page and writes the counts back into logkit exactly once, and
a consumer group reads the results. `demo.py [DIR] [EVENTS]` runs it on another
directory or with fewer events (tests/kit/test_demo.py runs a small one).
"""

from __future__ import annotations

import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from stream_processing import report, run  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                    "demo")


def main(argv: list[str]) -> int:
    root = argv[0] if argv else ROOT
    events = int(argv[1]) if len(argv) > 1 else 50000
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    print(f"logkit demo: stream processing on {root} (Spark local[2])")
    result = run(root, events=events)
    report(result)
    return 0 if result["dashboard"] == result["truth"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
