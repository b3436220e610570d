"""The traced workload: `python -m tests.powercut.traced ROOT VARIANT LEDGER`.

Runs the crash-point workload (tests/crashpoints/workload.py) with an observer that
writes what the system-call trace cannot show: the content of logkit's memory-mapped
files. Stores through a map are not system calls, so each is reported as one write(2)
of a snapshot record to `LEDGER.marks`, which strace records in order with the file
operations around it:

  b"PCUT\\0tail-version\\0<path>\\0" + the tail's first TAIL_SNAPSHOT bytes, after every
      store of a tail (the torn half of a publish, then the whole one): any of these
      may reach the disk by write-back before the next msync;
  b"PCUT\\0tail-sync\\0<path>\\0" + bytes, after `TailFile.sync()` (msync returned);
  b"PCUT\\0index-sync\\0<path>\\0" + the index map's bytes, after an index's msync.

The observer wraps those methods and calls the originals unchanged: logkit behaves as it
does untraced (its own system calls are the same; only the marks writes are added).
"""

from __future__ import annotations

import os
import sys

from logkit import index as _index
from logkit import tail as _tail

TAIL_SNAPSHOT = 256            # the header and body end well before this
MARK = b"PCUT\0"


def install(marks_path: str) -> None:
    fd = os.open(marks_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)

    def emit(kind: str, path: str, data: bytes) -> None:
        os.write(fd, MARK + kind.encode() + b"\0" + os.path.abspath(path).encode()
                 + b"\0" + data)

    tail_write_torn = _tail.TailFile._write_torn
    tail_write = _tail.TailFile.write
    tail_sync = _tail.TailFile.sync
    index_flush = _index._Index.flush

    def _write_torn(self, tail):
        seq = tail_write_torn(self, tail)
        emit("tail-version", self.path, bytes(self.mm[:TAIL_SNAPSHOT]))
        return seq

    def write(self, tail):
        tail_write(self, tail)
        emit("tail-version", self.path, bytes(self.mm[:TAIL_SNAPSHOT]))

    def sync(self):
        tail_sync(self)
        emit("tail-sync", self.path, bytes(self.mm[:TAIL_SNAPSHOT]))

    def flush(self):
        index_flush(self)
        if self._map is not None and self._map.buf is not None:
            emit("index-sync", self.path, bytes(self._map.buf))

    _tail.TailFile._write_torn = _write_torn
    _tail.TailFile.write = write
    _tail.TailFile.sync = sync
    _index._Index.flush = flush


def main(argv: list[str]) -> int:
    root, variant, ledger = argv
    os.environ["LOGKIT_POWERCUT_MARKS"] = ledger + ".marks"     # the second writer's too
    from tests.crashpoints import workload
    return workload.main([root, variant, ledger])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
