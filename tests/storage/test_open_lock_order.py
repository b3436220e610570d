"""Opening a partition that waits for its lock blocks no other topic (issue 36).

A partition that needs recovery at open waits for its append lock; a process that
holds that lock and stalls (SIGSTOP mid-append) makes the open wait up to the lock
timeout. The broker must not hold its own lock meanwhile: another thread's
`broker.topic("other")` and `broker.topics()` answer at once. Real processes, a real
flock; the waiting thread is seen inside the flock wait (its Python stack) before the
other calls are made.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import logkit

HOLDER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "helpers", "stalled_lock_holder.py")
PROMPT_S = 5.0            # far below the 30 s lock timeout the opener waits


def waiting_for_flock(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == "_flock" and \
                frame.f_code.co_filename.endswith(os.path.join("logkit", "partition_lock.py")):
            return True
        frame = frame.f_back
    return False


def test_a_partition_open_waiting_for_a_stalled_lock_blocks_no_other_topic(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        for name in ("slow", "other"):
            broker.create_topic(name, 1).partition(0).append([(None, b"v", None, None)])
    slow_dir = os.path.join(tmp_path, "slow-0")
    os.unlink(os.path.join(slow_dir, "00000000000000000000.timeindex"))  # needs recovery
    holder = subprocess.Popen([sys.executable, HOLDER, slow_dir], stdout=subprocess.PIPE,
                              text=True)
    opened: list = []
    try:
        assert holder.stdout.readline().strip() == "locked"      # and it stops itself
        broker = logkit.Broker(tmp_path, background=False)
        opener = threading.Thread(target=lambda: opened.append(broker.topic("slow")),
                                  daemon=True)
        opener.start()
        deadline = time.monotonic() + 30
        while not waiting_for_flock(opener):
            assert opener.is_alive() and time.monotonic() < deadline, \
                f"the open did not wait for the lock: {opened}"
            time.sleep(0.01)
        answers: list = []
        other = threading.Thread(target=lambda: answers.append(
            (broker.topics(), [r.value for r in broker.topic("other").partition(0)
                               .read(0)])), daemon=True)
        started = time.monotonic()
        other.start()
        other.join(PROMPT_S)
        assert not other.is_alive(), \
            f"topic('other') and topics() still waiting after {PROMPT_S} s"
        assert answers == [(["other", "slow"], [b"v"])]
        assert time.monotonic() - started < PROMPT_S
        assert opener.is_alive() and waiting_for_flock(opener)   # still waiting, alone
    finally:
        holder.send_signal(signal.SIGCONT)              # it lets go of the lock and exits
        holder.wait(timeout=30)
    opener.join(30)
    assert not opener.is_alive()
    assert [r.value for r in opened[0].partition(0).read(0)] == [b"v"]
    broker.close()
