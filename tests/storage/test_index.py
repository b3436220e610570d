"""Index files opened while another process changes them."""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
import os, sys
from logkit import index as index_module
path = sys.argv[1]
index = index_module.OffsetIndex(path, 0, writable=True, entries=0, create_bytes=1 << 20)
for n in range(3):
    index.append(10 * n + 9, 100 * (n + 1))
index.close()                       # preallocated: 3 entries, then zeros
real_fstat, calls = os.fstat, []

def fstat_then_trim(fd):
    got = real_fstat(fd)
    calls.append(1)
    if len(calls) == 2:             # the map is made and checked: the roller trims now
        os.truncate(path, 3 * 8)
    return got

index_module.os.fstat = fstat_then_trim
sealed = index_module.OffsetIndex(path, 0, writable=False)
index_module.os.fstat = real_fstat
print(sealed.entries, sealed.lookup_entry(25))
"""


def test_a_sealed_index_trimmed_while_it_is_opened_is_read_without_sigbus(tmp_path):
    """A roll publishes the new segment before it trims the old one's preallocated
    index; a reader that mapped the untrimmed file and then looks for the padding
    while the trim happens must not read the map past the new end: that was a SIGBUS,
    which killed a reader process of the compaction tests. Here the trim lands right
    after the reader's map was made and checked, in a child process."""
    path = str(tmp_path / "00000000000000000000.index")
    proc = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.split("\n")[0] == "3 (19, 200)"
