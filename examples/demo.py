"""`make demo`: the stream-processing pipeline on an embedded directory (data/demo).

Events are produced into logkit, a Spark Structured Streaming job (the `logkit` data
source) counts them per page and writes the counts back into logkit exactly once, and
a consumer group reads the results.
"""

from __future__ import annotations

import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from stream_processing import report, run  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                    "demo")


def main() -> int:
    shutil.rmtree(ROOT, ignore_errors=True)
    os.makedirs(ROOT)
    print(f"logkit demo: stream processing on {ROOT} (Spark local[2])")
    result = run(ROOT, events=50000)
    report(result)
    return 0 if result["dashboard"] == result["truth"] else 1


if __name__ == "__main__":
    sys.exit(main())
