"""Quickstart: produce to and read from a real logkit directory, then reopen it.

Run: .venv/bin/python examples/quickstart.py [directory]
"""

from __future__ import annotations

import shutil
import sys
import tempfile

import logkit


def main(root: str) -> None:
    with logkit.Broker(root) as broker:
        topic = broker.create_topic("orders", partitions=3)
        partition = topic.partition_for(b"customer-42")
        first = topic.partition(partition).append(
            [(b"customer-42", b'{"order": %d}' % n, [("source", b"quickstart")], None)
             for n in range(5)])
        print(f"appended 5 records to orders-{partition} from offset {first}")
    with logkit.Broker(root) as broker:                 # reopen: everything is on disk
        p = broker.topic("orders").partition(partition)
        for record in p.read(p.log_start_offset):
            print(f"  offset {record.offset}: key={record.key!r} value={record.value!r}")
        print(f"orders-{partition}: log end offset {p.log_end_offset}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        root = tempfile.mkdtemp(prefix="logkit-quickstart-")
        try:
            main(root)
        finally:
            shutil.rmtree(root)
