#!/usr/bin/env python
"""The exactly-once kill loop, long form (issue 33; docs/testing.md has the last result).

    python tools/eos_kill_loop.py --kills 500                     # embedded copier
    python tools/eos_kill_loop.py --kills 500 --client confluent  # over the listener

A consume-transform-produce copier (tests/helpers/eos_copier.py) in a child process,
SIGKILLed at a random moment of each life and restarted with the same transactional id
until --kills kills landed; the input is fed in chunks as the copier catches up, one
last life copies the rest. After every --check-every kills, and at the end, the output
read with read_committed must be the transformed input below the group's committed
offsets, none twice. Prints one JSON line (kills, records, transactions, runtime,
outcome); exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import logkit  # noqa: E402
from tests.helpers.eos_copier import KillLoop  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=500)
    ap.add_argument("--client", choices=("embedded", "confluent"), default="embedded")
    ap.add_argument("--seed", type=int, default=33)
    ap.add_argument("--chunk-records", type=int, default=400,
                    help="input fed each time the copier is within half of this")
    ap.add_argument("--max-delay-s", type=float, default=0.3,
                    help="a life is killed this long (at most) after it is ready")
    ap.add_argument("--check-every", type=int, default=1)
    ap.add_argument("--directory", default=None, help="where the broker root goes")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="eos-kill-loop-", dir=args.directory)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    with logkit.Broker(root) as broker:
        server = broker.serve() if args.client == "confluent" else None
        target = server.bootstrap_servers if server is not None else root
        loop = KillLoop(broker, args.client, target, seed=args.seed,
                        chunk_records=args.chunk_records, max_delay_s=args.max_delay_s,
                        check_every=args.check_every, log=log)
        outcome = loop.run(args.kills)
        if server is not None:
            server.close()
    result = outcome.as_dict()
    result.update(outcome="exactly once" if not outcome.failures else "FAILED",
                  seed=args.seed, date=datetime.date.today().isoformat())
    if outcome.failures:
        result["root"] = root                       # kept for a look
    else:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))
    return 1 if outcome.failures else 0


if __name__ == "__main__":
    sys.exit(main())
