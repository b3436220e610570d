"""Test helper: a process that takes a partition's append lock (the flock on its
`logkit.tail`, as an appender does) and then stops itself with SIGSTOP — an appender
stalled mid-append. Prints "locked" before stopping; after SIGCONT it releases the lock
and exits.

usage: stalled_lock_holder.py <partition directory>
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys


def main() -> None:
    with open(os.path.join(sys.argv[1], "logkit.tail"), "rb+") as tail:
        fcntl.flock(tail, fcntl.LOCK_EX)
        print("locked", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        fcntl.flock(tail, fcntl.LOCK_UN)


if __name__ == "__main__":
    main()
