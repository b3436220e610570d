"""The one choice between logkit's compiled twins and its pure-Python code.

Owns: importing the optional C extensions once, MarkupSafe's way (`try: from . import
_speedups ... except ImportError`): `speedups` is `logkit._speedups` (record codec,
column decoder, murmur2), `sendpath` is `logkit._sendpath` (Producer.send's common
case) and `shortio` is `logkit._shortio` (the append path's flock and pwrite with the GIL
kept, its common case under the lock in one call, and the whole uncontended append),
each None when it was not built or when the environment variable `LOGKIT_PURE_PYTHON` is
set to a non-empty value (tests and benchmarks use it to run the pure-Python code).
Every module that has a compiled twin takes it from here.

Invariant: the pure-Python code is complete and always correct on its own; a compiled
twin only makes it faster, and tests/test_speedups.py holds the two to the same bytes.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

__all__ = ["PURE_PYTHON_ENV", "FORCED_PURE_PYTHON", "speedups", "sendpath", "shortio"]

log = logging.getLogger(__name__)

PURE_PYTHON_ENV = "LOGKIT_PURE_PYTHON"
FORCED_PURE_PYTHON = bool(os.environ.get(PURE_PYTHON_ENV))

speedups: ModuleType | None = None
sendpath: ModuleType | None = None
shortio: ModuleType | None = None

if not FORCED_PURE_PYTHON:
    try:
        from . import _speedups as speedups  # type: ignore[no-redef]
    except ImportError:
        log.debug("logkit._speedups is not built: the record codec runs in pure Python")
    try:
        from . import _sendpath as sendpath  # type: ignore[no-redef]
    except ImportError:
        log.debug("logkit._sendpath is not built: Producer.send runs in pure Python")
    try:
        from . import _shortio as shortio  # type: ignore[no-redef]
    except ImportError:
        log.debug("logkit._shortio is not built: appends lock and write through "
                  "fcntl.flock and os.pwrite")
else:
    log.debug("%s is set: pure-Python code only", PURE_PYTHON_ENV)
