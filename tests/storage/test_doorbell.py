"""The doorbell's two paths — the C extension (logkit._doorbell) and the ctypes
fallback — ring and wait alike, interoperate on one page, and bound their spin; the
consumer's poll_spin_us is checked and used. No timed assertions: each wait either
returns because the word moved or is bounded by its own timeout."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import threading

import pytest

import logkit
from logkit import ConfigError, notify
from logkit.notify import Doorbell
from tests.helpers.procs import ROOT_DIR

try:
    from logkit import _doorbell
except ImportError:                     # not built: the ctypes path is all there is
    _doorbell = None

PATHS = ["ctypes", pytest.param("c", marks=pytest.mark.skipif(
    _doorbell is None, reason="logkit._doorbell is not built"))]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    """Run the test on one path: 'c' (the extension) or 'ctypes' (the fallback)."""
    monkeypatch.setattr(notify, "_cdoorbell", _doorbell if request.param == "c" else None)
    return request.param


def test_ring_adds_one_and_wraps(tmp_path, path):
    bell = Doorbell(str(tmp_path))
    start = bell.value()
    bell.ring()
    assert bell.value() == (start + 1) & 0xFFFFFFFF
    bell._word.value = 0xFFFFFFFF
    bell.ring()
    assert bell.value() == 0
    bell.close()


def test_wait_returns_once_the_word_moved_also_while_spinning(tmp_path, path):
    bell = Doorbell(str(tmp_path))
    seen = bell.value()
    bell.ring()
    bell.wait(seen, 60, spin_s=0.001)           # moved already: returns, no sleep
    done = threading.Event()

    def waiter() -> None:
        seen_now = bell.value()
        while bell.value() == seen_now:
            bell.wait(seen_now, 60, spin_s=0.0005)
        done.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    bell.ring()
    thread.join(30)
    assert done.is_set()
    bell.close()
    bell.wait(seen, 60, spin_s=0.01)            # closed: returns at once
    bell.ring()                                 # closed: nothing


def test_the_two_paths_share_one_page(tmp_path, monkeypatch):
    """One process ringing through C wakes one waiting through ctypes, and back."""
    if _doorbell is None:
        pytest.skip("logkit._doorbell is not built")
    bell = Doorbell(str(tmp_path))
    monkeypatch.setattr(notify, "_cdoorbell", _doorbell)
    before = bell.value()
    bell.ring()
    monkeypatch.setattr(notify, "_cdoorbell", None)
    assert bell.value() == before + 1
    bell.ring()
    monkeypatch.setattr(notify, "_cdoorbell", _doorbell)
    assert bell.value() == before + 2
    bell.close()


def test_another_process_wakes_a_waiter(tmp_path, path):
    """A child blocked in wait() (its own path: the one this test selects) ends once
    this process rings; every wait is bounded, so a missed wake-up ends as a timeout
    in the join, not a hang."""
    env = {**os.environ, "PYTHONPATH": ROOT_DIR}
    if path == "ctypes":
        env["LOGKIT_PURE_PYTHON"] = "1"
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\nfrom logkit import notify\n"
         "assert (notify._cdoorbell is None) == (sys.argv[2] == 'ctypes')\n"
         "bell = notify.Doorbell(sys.argv[1])\nseen = bell.value()\n"
         "print('ready', flush=True)\n"
         "while bell.value() == seen:\n    bell.wait(seen, 60, spin_s=0.0002)\n"
         "print('woken', flush=True)", str(tmp_path), path],
        env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    bell = Doorbell(str(tmp_path))
    bell.ring()
    assert child.stdout.readline().strip() == "woken"
    assert child.wait(timeout=30) == 0
    bell.close()


@pytest.mark.skipif(_doorbell is None, reason="logkit._doorbell is not built")
def test_the_extension_refuses_a_word_outside_its_buffer():
    page = mmap.mmap(-1, mmap.PAGESIZE)
    for offset in (-4, 2, mmap.PAGESIZE - 2, mmap.PAGESIZE):
        with pytest.raises(ValueError, match="offset"):
            _doorbell.ring(page, offset)
        with pytest.raises(ValueError, match="offset"):
            _doorbell.wait(page, offset, 0, 0.001, 0.0)
    with pytest.raises(TypeError):
        _doorbell.ring(b"\0" * 8, 0)            # read-only: no word to bump
    assert _doorbell.wait(page, 0, 7, 0.001, 0.001) == 0     # returns the word


def test_poll_spin_us_is_bounded_and_a_spinning_poll_returns_records(broker, path):
    broker.create_topic("t", 1)
    for bad in (-1, 10_001):
        with pytest.raises(ConfigError, match="poll_spin_us"):
            broker.consumer("t", poll_spin_us=bad)
    consumer = broker.consumer("t", auto_offset_reset="earliest", poll_spin_us=2000)
    assert consumer.poll(timeout_ms=1) == []                  # spun, slept, nothing
    appender = threading.Thread(
        target=lambda: broker.topic("t").partition(0).append([(None, b"x", None, None)]))
    appender.start()
    got = []
    while not got:
        got = consumer.poll(timeout_ms=100)
    appender.join(30)
    assert [r.value for r in got] == [b"x"]
    consumer.close()


def test_pure_python_forces_the_ctypes_path():
    out = subprocess.run(
        [sys.executable, "-c", "from logkit import notify; print(notify._cdoorbell)"],
        env={**os.environ, "PYTHONPATH": ROOT_DIR, "LOGKIT_PURE_PYTHON": "1"},
        capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "None", out.stderr


def test_a_read_only_broker_has_no_doorbell_to_spin_on(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 1)
    with logkit.Broker(tmp_path, read_only=True) as reader:
        assert reader.doorbell is None
        consumer = reader.consumer(auto_offset_reset="earliest", poll_spin_us=500)
        consumer.assign([logkit.TopicPartition("t", 0)])
        assert consumer.poll(timeout_ms=1) == []
