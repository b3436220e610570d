"""I/O errors on the broker's own files reach the caller as named errors.

Regression tests for what the full crash-point enumeration (docs/crashpoints.md) found
after the bounded slice passed: an error opening the root to list its tombstones at
`Broker()` and an error opening a partition's `partition.metadata` escaped as raw
`OSError`s. Each test runs a fresh process under strace with an error injected into every
call on one exact path (`-P`), so nothing else in the process is disturbed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import logkit
from tests.crashpoints import driver

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_REASON = driver.strace_usable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


def run_failing(path: str, syscall: str, error: str, code: str, *args: str
                ) -> subprocess.CompletedProcess:
    """Run `code` with every `syscall` on exactly `path` failing with `error`."""
    argv = [driver.STRACE, "-f", "-qq", "-o", "/dev/null", "-P", path, "-e",
            f"trace={syscall}", "-e", f"inject={syscall}:error={error}",
            sys.executable, "-c", textwrap.dedent(REPORT) + textwrap.dedent(code), *args]
    env = dict(os.environ, PYTHONPATH=ROOT_DIR)
    return subprocess.run(argv, cwd=ROOT_DIR, env=env, capture_output=True, text=True,
                          timeout=120)


REPORT = """
    import sys, logkit
    def attempt(what, fn):
        try:
            fn()
            print(what, "ok")
        except logkit.LogkitError as exc:
            print(what, "named", type(exc).__name__, exc.operation, exc.path == sys.argv[2])
        except BaseException as exc:
            print(what, "raw", type(exc).__name__, exc)
"""


@pytest.mark.parametrize("error", ["EIO", "ENOSPC", "EMFILE"])
def test_an_error_reading_partition_metadata_is_a_named_storage_error(tmp_path, error):
    root = str(tmp_path / "data")
    with logkit.Broker(root, background=False) as broker:
        broker.create_topic("t", 1).partition(0).append([(None, b"v", [], None)])
    target = os.path.join(root, "t-0", "partition.metadata")
    result = run_failing(target, "openat", error, """
        broker = logkit.Broker(sys.argv[1], background=False)
        attempt("read", lambda: broker.topic("t").partition(0).read(0))
        broker.close()
    """, root, target)
    assert result.returncode == 0, result.stderr
    assert "read named StorageError" in result.stdout or \
        "read named DiskFullError" in result.stdout, result.stdout + result.stderr
    assert "True" in result.stdout, result.stdout       # the error names the file


def count_calls(path: str, syscall: str, code: str, *args: str) -> int:
    """How many `syscall` calls on exactly `path` running `code` makes."""
    trace = path + ".trace" if not os.path.isdir(path) else os.path.join(
        os.path.dirname(path), "calls.trace")
    argv = [driver.STRACE, "-f", "-qq", "-o", trace, "-P", path, "-e", f"trace={syscall}",
            sys.executable, "-c", textwrap.dedent(REPORT) + textwrap.dedent(code), *args]
    subprocess.run(argv, cwd=ROOT_DIR, env=dict(os.environ, PYTHONPATH=ROOT_DIR),
                   check=True, capture_output=True, timeout=120)
    with open(trace) as f:
        count = sum(1 for line in f if f"{syscall}(" in line)
    os.unlink(trace)
    return count


OPEN_ROOT = """
    attempt("open", lambda: logkit.Broker(sys.argv[1], background=False).close())
"""


def test_an_error_on_any_open_of_the_root_at_broker_open_is_a_named_storage_error(
        tmp_path):
    """Every open of the root directory while a Broker opens — the format check, the
    directory handle, the listing of interrupted deletions — fails in turn."""
    root = str(tmp_path / "data")
    with logkit.Broker(root, background=False) as broker:
        broker.create_topic("t", 1)
    calls = count_calls(root, "openat", OPEN_ROOT, root, root)
    assert calls >= 2, calls
    for n in range(1, calls + 1):
        argv = [driver.STRACE, "-f", "-qq", "-o", "/dev/null", "-P", root, "-e",
                "trace=openat", "-e", f"inject=openat:error=EIO:when={n}",
                sys.executable, "-c", textwrap.dedent(REPORT) + textwrap.dedent(OPEN_ROOT),
                root, root]
        result = subprocess.run(argv, cwd=ROOT_DIR, env=dict(os.environ, PYTHONPATH=ROOT_DIR),
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (n, result.stderr)
        assert "open named StorageError" in result.stdout, (n, result.stdout, result.stderr)
    # and nothing was lost: the next open, without the fault, sees the topic
    with logkit.Broker(root, background=False) as broker:
        assert broker.topics() == ["t"]
