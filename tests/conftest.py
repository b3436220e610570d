"""Shared fixtures: real directories, real brokers."""

from __future__ import annotations

import os
import sys

import pytest

import logkit

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


@pytest.fixture
def broker(tmp_path):
    """A broker on a fresh directory, closed after the test."""
    with logkit.Broker(tmp_path / "data") as b:
        yield b
