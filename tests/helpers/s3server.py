"""Test helper: a real S3 API server (moto's server mode) on 127.0.0.1 in its own
process, for the object-store replication tests.

`s3_server` is a session fixture: it starts `python -m moto.server` on a free port,
waits until it answers HTTP, yields an `S3Server` (endpoint URL, credentials, a fresh
bucket per call of `bucket()`), and stops the process after the session. When moto
is not installed or the server does not come up, the tests that use it skip, saying
why. Nothing here mocks logkit: the server speaks S3 over a real socket, and s3fs
talks to it as it would to any S3.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

START_TIMEOUT_S = 30.0
_bucket_numbers = itertools.count()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """A running moto server: `endpoint_url`, `storage_options` for fsspec/s3fs, and
    `bucket()`, which creates an empty bucket and returns its `s3://` URL."""

    def __init__(self, proc: subprocess.Popen, endpoint_url: str, log_file) -> None:
        self.proc = proc
        self.log_file = log_file
        self.endpoint_url = endpoint_url
        self.storage_options = {"endpoint_url": endpoint_url, "key": "testing",
                                "secret": "testing"}

    def filesystem(self):
        import s3fs
        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options)

    def bucket(self) -> str:
        name = f"logkit-{os.getpid()}-{next(_bucket_numbers)}"
        self.filesystem().mkdir(name)
        return f"s3://{name}"


def start() -> S3Server:
    """Start moto's server on 127.0.0.1; raises RuntimeError saying why it did not."""
    port = _free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    # Its request log goes to a file: a pipe nobody reads would fill and stall it.
    log_file = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                             "-p", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=log_file)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log_file.seek(0)
            raise RuntimeError(f"moto server exited with {proc.returncode}: "
                               f"{log_file.read().decode(errors='replace')[-2000:]}")
        try:
            urllib.request.urlopen(url + "/", timeout=1).close()
            return S3Server(proc, url, log_file)
        except urllib.error.HTTPError:
            return S3Server(proc, url, log_file)  # it answered: up
        except OSError:
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    log_file.close()
    raise RuntimeError(f"moto server did not answer on {url} within {START_TIMEOUT_S} s")


def stop(server: S3Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
    server.log_file.close()


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server for the session (skips, saying why, if it cannot start)."""
    try:
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"moto[server] and s3fs are needed for the S3 tests: {exc}")
    try:
        server = start()
    except RuntimeError as exc:
        pytest.skip(f"moto's S3 server could not start: {exc}")
    try:
        yield server
    finally:
        stop(server)
