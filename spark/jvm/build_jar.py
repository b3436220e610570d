"""Build the logkit JVM reader (spark/jvm/src) into pyspark_logkit/jars/logkit-spark.jar.

Owns: finding javac and the Spark jars to compile against (the ones PySpark ships, or
SPARK_HOME's), compiling, and writing the jar. Invariant: it never fails a build: with
no javac or no Spark jars it says why and returns False, and logkit's Python source is
used instead. Run by `make jar` (and `make install`) and by setup.py's build_py.

    python spark/jvm/build_jar.py [output.jar]
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
JAR = os.path.join(os.path.dirname(HERE), "pyspark_logkit", "jars", "logkit-spark.jar")


def spark_jars() -> str | None:
    """The directory of Spark's jars: $LOGKIT_SPARK_JARS, $SPARK_HOME/jars, the
    installed pyspark's jars, or the checkout's .venv's pyspark."""
    candidates = [os.environ.get("LOGKIT_SPARK_JARS", "")]
    if os.environ.get("SPARK_HOME"):
        candidates.append(os.path.join(os.environ["SPARK_HOME"], "jars"))
    spec = importlib.util.find_spec("pyspark")
    if spec and spec.submodule_search_locations:
        candidates += [os.path.join(p, "jars") for p in spec.submodule_search_locations]
    root = os.path.dirname(os.path.dirname(HERE))
    candidates += glob.glob(os.path.join(root, ".venv", "lib", "python*", "site-packages",
                                         "pyspark", "jars"))
    for path in candidates:
        if path and glob.glob(os.path.join(path, "spark-sql_*.jar")):
            return path
    return None


def build(out: str = JAR) -> bool:
    javac = shutil.which("javac")
    jars = spark_jars()
    if javac is None or jars is None:
        print(f"logkit: not building the JVM reader ({'no javac' if javac is None else ''}"
              f"{'' if jars else ' no Spark jars (set LOGKIT_SPARK_JARS)'}); the Python "
              "data source is used", file=sys.stderr)
        return False
    sources = sorted(glob.glob(os.path.join(HERE, "src", "**", "*.java"), recursive=True))
    with tempfile.TemporaryDirectory() as classes:
        result = subprocess.run([javac, "--release", "17", "-nowarn", "-cp",
                                 os.path.join(jars, "*"), "-d", classes, *sources],
                                capture_output=True, text=True)
        if result.returncode != 0:
            print(f"logkit: the JVM reader did not compile; the Python data source is "
                  f"used:\n{result.stderr}", file=sys.stderr)
            return False
        os.makedirs(os.path.dirname(out), exist_ok=True)
        tmp = out + ".tmp"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n"
                         "Created-By: logkit spark/jvm/build_jar.py\r\n\r\n")
            for base in (classes, os.path.join(HERE, "resources")):
                for path in sorted(glob.glob(os.path.join(base, "**", "*"), recursive=True)):
                    if os.path.isfile(path):
                        jar.write(path, os.path.relpath(path, base))
        os.replace(tmp, out)
    return True


if __name__ == "__main__":
    sys.exit(0 if build(*sys.argv[1:]) else 1)
