"""One open `logkit.Broker` per directory per Python process (driver or Spark worker).

Owns: the process-wide cache of brokers the data source uses. Spark reuses its Python
workers, so a worker opens a directory once, not once per task. Invariant: a cached
broker is only used in the process that opened it (the cache is keyed by pid, since
Spark forks workers from a daemon).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading

import logkit

log = logging.getLogger(__name__)

_lock = threading.Lock()
_brokers: dict[tuple[int, str], logkit.Broker] = {}


def broker_for(path: str) -> logkit.Broker:
    key = (os.getpid(), os.path.abspath(path))
    with _lock:
        broker = _brokers.get(key)
        if broker is None or broker.closed:
            log.debug("opening the broker at %s in process %d", key[1], key[0])
            broker = _brokers[key] = logkit.Broker(key[1], background=False)
        return broker


def close_all() -> None:
    with _lock:
        for (pid, _), broker in list(_brokers.items()):
            if pid == os.getpid():
                broker.close()
        _brokers.clear()


atexit.register(close_all)
