"""Build the logkit JVM reader (spark/jvm/src) into pyspark_logkit/jars/logkit-spark.jar.

Owns: finding javac and the Spark jars to compile against, compiling, and writing the
jar. Spark's jars come from the Spark here (PySpark's, SPARK_HOME's, $LOGKIT_SPARK_JARS)
or, where there is none (pip's isolated build of a wheel has no PySpark), from Maven
Central: spark/jvm/pom.xml's build-classpath goal resolves them into ~/.m2 (offline
first, so a filled ~/.m2 needs no network). Invariant: it never fails a build: with no
javac, or no Spark jars from either place, it says why and returns False, and logkit's
Python source is used instead. Run by `make jar` (and `make install`) and by setup.py's
build_py, so every wheel built where a JDK and Maven (or a Spark) are carries the jar.

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


def maven_classpath() -> str | None:
    """Spark's jars resolved by Maven from spark/jvm/pom.xml (at its spark.version, or
    $LOGKIT_SPARK_VERSION), as a classpath; None without mvn or when they cannot be
    resolved (the reason goes to stderr)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        return None
    version = os.environ.get("LOGKIT_SPARK_VERSION")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "classpath.txt")
        command = [mvn, "-q", "-B", "-f", os.path.join(HERE, "pom.xml"),
                   "dependency:build-classpath", f"-Dmdep.outputFile={out}",
                   *([f"-Dspark.version={version}"] if version else [])]
        for offline in (["-o"], []):
            result = subprocess.run(command + offline, capture_output=True, text=True)
            if result.returncode == 0 and os.path.isfile(out):
                with open(out) as f:
                    return f.read().strip() or None
        print(f"logkit: Maven could not resolve Spark's jars:\n{result.stdout[-2000:]}",
              file=sys.stderr)
    return None


def build(out: str = JAR) -> bool:
    javac = shutil.which("javac")
    if javac is None:
        return _not_built("no javac")
    jars = spark_jars()
    classpath = os.path.join(jars, "*") if jars else maven_classpath()
    if classpath is None:
        return _not_built("no Spark jars here (set LOGKIT_SPARK_JARS) and none from Maven")
    print(f"logkit: compiling the JVM reader against Spark's jars "
          f"{'in ' + jars if jars else 'from Maven (spark/jvm/pom.xml)'}", file=sys.stderr)
    sources = sorted(glob.glob(os.path.join(HERE, "src", "**", "*.java"), recursive=True))
    with tempfile.TemporaryDirectory() as classes:
        result = subprocess.run([javac, "--release", "17", "-nowarn", "-cp", classpath,
                                 "-d", classes, *sources],
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


def _not_built(why: str) -> bool:
    print(f"logkit: not building the JVM reader ({why}); the Python data source is used",
          file=sys.stderr)
    return False


if __name__ == "__main__":
    sys.exit(0 if build(*sys.argv[1:]) else 1)
