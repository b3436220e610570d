"""What the build produced is what the tests test: every C extension built (a failed
compile must not turn into skipped tests), one WARNING for an install that could not
compile them, C that compiles on any POSIX system, and a wheel that carries the Spark
JVM reader's jar."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

from logkit import _native

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_extension_setup_py_builds_is_one_native_chooses():
    """setup.py's extensions and _native's table are the same four, so the check below
    and the import WARNING cover every one."""
    with open(os.path.join(ROOT, "setup.py")) as f:
        built = set(re.findall(r'Extension\("logkit\.(\w+)"', f.read()))
    assert built == set(_native.EXTENSIONS) and len(built) == 4


@pytest.mark.skipif(_native.FORCED_PURE_PYTHON,
                    reason=f"{_native.PURE_PYTHON_ENV} is set: the pure-Python path is tested")
def test_every_c_extension_is_built():
    """A compile that failed (setup.py builds them optional=True) fails here instead of
    skipping the compiled-path tests; `make test` names the compiler's error."""
    assert _native.MISSING == ()
    assert None not in (_native.speedups, _native.sendpath, _native.shortio,
                        _native.doorbell)


def _import_with_blocked(*names, pure=False):
    """Import logkit in a child where `names` cannot be imported, as on an install whose
    compiler failed; returns the child's log lines (level, logger, message)."""
    code = ("import logging, sys\n"
            "logging.basicConfig(format='%(levelname)s|%(name)s|%(message)s')\n"
            f"for name in {names!r}:\n"
            "    sys.modules['logkit.' + name] = None\n"
            "import logkit, logkit.producer, logkit.consumer, logkit.notify\n"
            "from logkit import _native\n"
            "print(_native.MISSING)\n")
    env = {k: v for k, v in os.environ.items() if k != _native.PURE_PYTHON_ENV}
    if pure:
        env[_native.PURE_PYTHON_ENV] = "1"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip(), [line.split("|", 2) for line in proc.stderr.splitlines()
                                 if line.count("|") >= 2]


def test_an_install_without_an_extension_says_so_once_at_import():
    """The pure-Python path is several times slower: a user who got it because the
    compile failed is told once, with the missing extensions and what runs in Python."""
    missing, lines = _import_with_blocked("_speedups", "_shortio")
    assert missing == "('logkit._speedups', 'logkit._shortio')"
    warnings = [line for line in lines if line[0] == "WARNING"]
    assert len(warnings) == 1, lines
    level, name, message = warnings[0]
    assert name == "logkit._native"
    assert "logkit._speedups" in message and "logkit._shortio" in message
    assert "logkit._sendpath" not in message and "slower" in message
    assert _native.PURE_PYTHON_ENV in message


def test_asking_for_pure_python_gives_no_warning():
    """LOGKIT_PURE_PYTHON=1 chooses the Python code on purpose: nothing to warn about."""
    missing, lines = _import_with_blocked("_speedups", pure=True)
    assert missing == "()"
    assert [line for line in lines if line[0] == "WARNING"] == []


@pytest.mark.parametrize("source", ["_speedups", "_sendpath", "_shortio", "_doorbell"])
def test_each_c_extension_compiles_on_a_posix_system_other_than_linux(source):
    """Linux-only calls (the futex) sit behind `#if defined(__linux__)`, and nothing
    else does: each file compiles with __linux__ undefined, as on macOS or a BSD."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc})")
    proc = subprocess.run([cc, "-fsyntax-only", "-std=gnu99", "-U__linux__",
                           "-I", sysconfig.get_paths()["include"],
                           os.path.join(ROOT, "logkit", source + ".c")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
