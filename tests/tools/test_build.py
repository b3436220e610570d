"""What the build produced is what the tests test: every C extension built (a failed
compile must not turn into skipped tests), one WARNING for an install that could not
compile them, C that compiles on any POSIX system, and a wheel that carries the Spark
JVM reader's jar."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

from logkit import _native

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
    assert None not in (_native.speedups, _native.sendpath, _native.appendpath,
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
    missing, lines = _import_with_blocked("_speedups", "_appendpath")
    assert missing == "('logkit._speedups', 'logkit._appendpath')"
    warnings = [line for line in lines if line[0] == "WARNING"]
    assert len(warnings) == 1, lines
    level, name, message = warnings[0]
    assert name == "logkit._native"
    assert "logkit._speedups" in message and "logkit._appendpath" in message
    assert "logkit._sendpath" not in message and "slower" in message
    assert _native.PURE_PYTHON_ENV in message


def test_asking_for_pure_python_gives_no_warning():
    """LOGKIT_PURE_PYTHON=1 chooses the Python code on purpose: nothing to warn about."""
    missing, lines = _import_with_blocked("_speedups", pure=True)
    assert missing == "()"
    assert [line for line in lines if line[0] == "WARNING"] == []


@pytest.mark.parametrize("source", ["_speedups", "_sendpath", "_appendpath", "_doorbell"])
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


# ---- the wheel: what `pip install logkit` gives, tested installed -----------------------

@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The checkout's files (not its ignored ones: no .venv, no build output) built into a
    wheel the way pip builds one for a user (an isolated build: no PySpark, no .venv to
    borrow Spark's jars from) and installed into a directory of its own; returns that
    directory."""
    for tool in ("git", "javac", "mvn"):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool}: the wheel is built without the JVM reader")
    base = tmp_path_factory.mktemp("wheel")
    source, wheels, target = base / "source", base / "wheels", base / "target"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")   # the work tree
    for name in filter(None, files):
        if os.path.isfile(os.path.join(ROOT, name)):
            os.makedirs(source / os.path.dirname(name), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), source / name)
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOGKIT_SPARK_JARS", "SPARK_HOME", "PYTHONPATH")}
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w",
                            str(wheels), str(source)], capture_output=True, text=True,
                           env=env, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert "against Spark's jars from Maven" in build.stdout + build.stderr
    [wheel] = wheels.glob("logkit-*.whl")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps",
                              "--target", str(target), str(wheel)],
                             capture_output=True, text=True, env=env, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    return target


READ_FROM_THE_INSTALL = """
import json, logging, sys
logging.basicConfig(format="%(levelname)s|%(name)s|%(message)s")
import logkit, pyspark_logkit
from pyspark_logkit import jar_path, local_session, register
root = sys.argv[1]
with logkit.Broker(root) as broker:
    broker.create_topic("events", 2)
    with broker.producer() as producer:
        for i in range(50):
            producer.send("events", b"v%d" % i, key=b"k%d" % i)
spark = local_session("logkit-wheel-test", **{"spark.driver.memory": "512m"})
register(spark)
df = spark.read.format("logkit").option("path", root).option("subscribe", "events").load()
plan = df._jdf.queryExecution().executedPlan().toString()
print(json.dumps({"logkit": logkit.__file__, "source": pyspark_logkit.__file__,
                  "jar": jar_path(), "jars": spark.conf.get("spark.jars", ""),
                  "jvm": "JVM reader" in plan, "values": sorted(r.value.decode()
                  for r in df.collect())}))
spark.stop()
"""


def _read_from(target, tmp_path):
    """A Spark read of a topic through the package installed in `target` (never the
    checkout's); returns what the child saw and its log lines."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_HOME"}
    env.update(PYTHONPATH=str(target), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, "-c", READ_FROM_THE_INSTALL,
                           str(tmp_path / "data")], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["logkit"].startswith(str(target)), seen
    assert seen["source"].startswith(str(target)), seen
    assert seen["values"] == sorted(f"v{i}" for i in range(50))
    return seen, [line.split("|", 2) for line in proc.stderr.splitlines()
                  if line.count("|") >= 2 and line.startswith(("WARNING", "ERROR"))]


def test_the_wheel_carries_the_jvm_reader_and_spark_reads_through_it(installed, tmp_path):
    """A wheel pip builds without PySpark still compiles the JVM reader (Spark's jars
    from Maven), ships it, and a Spark read from the installed package goes through it,
    with no fallback WARNING."""
    pytest.importorskip("pyspark")
    jar = installed / "pyspark_logkit" / "jars" / "logkit-spark.jar"
    assert jar.is_file()
    seen, warnings = _read_from(installed, tmp_path)
    assert seen["jar"] == str(jar) and str(jar) in seen["jars"]
    assert seen["jvm"] is True
    assert [w for w in warnings if w[1].startswith("pyspark_logkit")] == []


def test_a_session_without_the_jar_says_once_that_python_reads(spark, tmp_path,
                                                              monkeypatch, caplog):
    """An install whose build had no JDK (no jar in pyspark_logkit/jars): the session
    set-up says once that the Python source reads, and why."""
    import pyspark_logkit
    monkeypatch.setattr(pyspark_logkit, "JAR", str(tmp_path / "logkit-spark.jar"))
    monkeypatch.setattr(pyspark_logkit, "_warned_no_jar", False)
    with caplog.at_level(logging.WARNING, logger="pyspark_logkit"):
        for _ in range(2):
            assert pyspark_logkit.local_session("logkit-tests") is not None
    [record] = [r for r in caplog.records if r.name == "pyspark_logkit"]
    assert record.levelno == logging.WARNING and "no JVM reader jar" in record.getMessage()


def test_make_prints_no_recipe_comments_and_no_licence_banner():
    """`make demo` and `make test` echo every recipe line they run: a comment in a recipe
    must start with `@#` to stay quiet, and the licence is an SPDX string (a TOML table
    makes setuptools print a deprecation banner at every build)."""
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    echoed = [line for line in makefile.splitlines() if line.startswith("\t#")]
    assert echoed == []
    assert "\nlicense = \"Apache-2.0\"\n" in open(os.path.join(ROOT, "pyproject.toml")).read()
