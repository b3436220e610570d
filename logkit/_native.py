"""The one choice between logkit's compiled twins and its pure-Python code.

Owns: importing the optional C extensions once, MarkupSafe's way (`try: from . import
_speedups ... except ImportError`): `speedups` is `logkit._speedups` (record codec,
column decoder, murmur2), `sendpath` is `logkit._sendpath` (Producer.send's common
case), `appendpath` is `logkit._appendpath` (the append path's flock and pwrite with the GIL
kept, its common case under the lock in one call, and the whole uncontended append) and
`doorbell` is `logkit._doorbell` (the doorbell's futex calls; logkit/notify.py also
checks the futex is there), each None when it was not built or when the environment
variable `LOGKIT_PURE_PYTHON` is set to a non-empty value (tests and benchmarks use it
to run the pure-Python code). Every module that has a compiled twin takes it from here.

`MISSING` names the extensions that were looked for and not found (empty when
LOGKIT_PURE_PYTHON is set: none was looked for). An install that could not compile
them (no C compiler or Python headers: setup.py builds them `optional=True`) gets one
WARNING at import naming them and what it costs; one that asked for the Python code
with LOGKIT_PURE_PYTHON gets none. `make test` fails on a non-empty MISSING.

Invariant: the pure-Python code is complete and always correct on its own; a compiled
twin only makes it faster, and tests/storage/test_speedups.py holds the two to the same bytes.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

__all__ = ["PURE_PYTHON_ENV", "FORCED_PURE_PYTHON", "EXTENSIONS", "MISSING", "speedups",
           "sendpath", "appendpath", "doorbell"]

log = logging.getLogger(__name__)

PURE_PYTHON_ENV = "LOGKIT_PURE_PYTHON"
FORCED_PURE_PYTHON = bool(os.environ.get(PURE_PYTHON_ENV))

# Every extension setup.py builds, and what runs in pure Python without it
# (tests/tools/test_build.py checks this table against setup.py's list).
EXTENSIONS = {
    "_speedups": "record encoding and decoding",
    "_sendpath": "Producer.send",
    "_appendpath": "each append's locking and write",
    "_doorbell": "waking waiting consumers",
}


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f".{name}", __package__)
    except ImportError:
        return None


_loaded = {} if FORCED_PURE_PYTHON else {name: _load(name) for name in EXTENSIONS}
MISSING: tuple[str, ...] = tuple(f"logkit.{name}" for name, module in _loaded.items()
                                 if module is None)

speedups: ModuleType | None = _loaded.get("_speedups")
sendpath: ModuleType | None = _loaded.get("_sendpath")
appendpath: ModuleType | None = _loaded.get("_appendpath")
doorbell: ModuleType | None = _loaded.get("_doorbell")

if FORCED_PURE_PYTHON:
    log.debug("%s is set: pure-Python code only", PURE_PYTHON_ENV)
elif MISSING:
    log.warning(
        "logkit: compiled extensions not built: %s. logkit runs that code in pure "
        "Python: correct, but producing and consuming are several times slower. "
        "Reinstall logkit where a C compiler and the Python headers are present, or set "
        "%s=1 to choose the pure-Python code and silence this warning.",
        ", ".join(f"logkit.{name} ({what})" for name, what in EXTENSIONS.items()
                  if f"logkit.{name}" in MISSING), PURE_PYTHON_ENV)
