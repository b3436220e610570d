"""Build hook for the optional C extensions and the Spark jar; all metadata lives in
pyproject.toml.

The four extensions below are built when a C compiler and the Python headers are
present. `optional=True` means a failed build is a warning, not an error: logkit then
runs on its pure-Python code, which is always kept correct, and logkit/_native.py says
so in a WARNING at import. `make test` fails instead (its `extensions` step), showing
the compiler's error. logkit/_native.py's EXTENSIONS names the same four.
"""

import runpy

from setuptools import Extension, setup
from setuptools.command.build_py import build_py


class BuildPyWithJar(build_py):
    """Also builds the Spark JVM reader's jar (spark/jvm/build_jar.py) into
    pyspark_logkit/jars/ when javac and Spark's jars (a Spark here, or Maven's from
    spark/jvm/pom.xml) are found; without them it says why and the wheel ships the
    Python data source alone."""

    def run(self):
        runpy.run_path("spark/jvm/build_jar.py")["build"]()
        super().run()


setup(cmdclass={"build_py": BuildPyWithJar}, ext_modules=[
    Extension("logkit._speedups", sources=["logkit/_speedups.c"],
              depends=["logkit/_murmur2.h", "logkit/_batch.h"], optional=True,
              extra_compile_args=["-O3", "-std=c99"]),
    # Producer.send()'s common case (logkit/producer.py falls back to Python without it).
    Extension("logkit._sendpath", sources=["logkit/_sendpath.c"],
              depends=["logkit/_murmur2.h"], optional=True,
              extra_compile_args=["-O3", "-std=c99"]),
    # The append path's short system calls with the GIL kept, and its common case in
    # one call (logkit/log.py and logkit/segment.py fall back to fcntl.flock, os.pwrite
    # and the Python append without it).
    Extension("logkit._appendpath", sources=["logkit/_appendpath.c"],
              depends=["logkit/_batch.h"], optional=True,
              extra_compile_args=["-O2", "-std=gnu99"]),
    # The doorbell's futex wait/wake (logkit/notify.py falls back to ctypes without it).
    Extension("logkit._doorbell", sources=["logkit/_doorbell.c"], optional=True,
              extra_compile_args=["-O2", "-std=gnu99"]),
])
