# Both entry points do all set-up on a fresh machine: a .venv with the project and
# every extra installed, then the job itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP_STAMP := $(VENV)/.pip-installed

.PHONY: demo test lint bench install clean jar extensions test-pure

# What the build is made of. $(STAMP) is newer than all of it, so a local `make test`
# never tests a stale build: a changed setup file reinstalls, a changed C file rebuilds
# the extensions in place (an editable install does not), a changed Java file the jar.
SETUP_FILES := pyproject.toml setup.cfg setup.py
C_FILES := $(wildcard logkit/*.c logkit/*.h)
JAVA_FILES := $(shell find spark/jvm/src spark/jvm/resources -type f) \
	$(wildcard spark/jvm/pom.xml) spark/jvm/build_jar.py

$(STAMP): $(PIP_STAMP) $(C_FILES) $(JAVA_FILES)
	@# A compile that fails leaves no extension behind (not the last one that built,
	@# here or in build/), so the `extensions` check below sees it.
	rm -rf logkit/_*.so build/lib.*
	$(PY) setup.py build_ext --inplace --force
	@# The Spark JVM reader's jar, when javac is here (else the Python source reads).
	$(if $(filter-out $(C_FILES),$?),$(PY) spark/jvm/build_jar.py || true)
	touch $(STAMP)

$(PIP_STAMP): $(SETUP_FILES)
	@# strace drives the crash-point enumeration (tests/tools/test_crashpoints.py); as root on
	@# Debian it is installed when missing, elsewhere those tests say why they skip.
	command -v strace >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && (apt-get update -qq && apt-get install -y -qq strace) >/dev/null 2>&1 || true; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=77" wheel
	$(PY) -m pip install --quiet -e ".[all]"
	@# An editable install hides pyspark_logkit from pkgutil.iter_modules, which is how
	@# PySpark discovers data sources: put spark/ itself on the venv's path too.
	$(PY) -c "import site, sys; open(site.getsitepackages()[0] + '/logkit-spark-source.pth', 'w').write(sys.argv[1] + '\n')" "$(abspath spark)"
	touch $(PIP_STAMP)

# setup.py builds every C extension optional=True (an install without a compiler still
# works, in pure Python), so a failed compile would only skip the compiled-path tests.
# Here it fails the run: the import error, then the compiler's own error from a verbose
# rebuild. Skipped when LOGKIT_PURE_PYTHON=1 asks for the Python path.
extensions: $(STAMP)
	@[ -n "$$LOGKIT_PURE_PYTHON" ] || $(PY) -c "import importlib; from logkit import _native; \
	  [importlib.import_module(name) for name in _native.MISSING]" || { \
	  echo "make: a C extension did not build; rebuilding it to show the compiler's error:"; \
	  $(PY) setup.py -v build_ext --inplace --force; exit 1; }

install: $(STAMP)

jar: $(STAMP)
	$(PY) spark/jvm/build_jar.py

demo: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check logkit spark tests tools benchmarks examples

test: lint kafka extensions test-pure
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -rs tests

# The path users get where the extensions cannot be compiled: the storage, client and
# protocol tests once more with LOGKIT_PURE_PYTHON=1 (logkit/_native.py then loads no
# extension). A bounded subset: about two minutes on this 2-core machine. Not
# tests/storage/test_doorbell.py: it runs the C and the ctypes doorbell side by side itself.
PURE_PYTHON_TESTS := \
	tests/storage/test_log.py tests/storage/test_index_segment.py tests/storage/test_recovery.py \
	tests/storage/test_records.py tests/storage/test_records_walker.py tests/storage/test_storage_safety.py \
	tests/storage/test_group_commit.py tests/storage/test_sealed_index.py tests/storage/test_parked_segments.py \
	tests/storage/test_append_common.py tests/storage/test_speedups.py tests/storage/test_murmur2.py \
	tests/storage/test_columns.py tests/storage/test_compaction.py tests/storage/test_cleaner_speed.py \
	tests/clients/test_producer.py tests/clients/test_accumulator.py tests/clients/test_consumer.py \
	tests/clients/test_consumer_fetch.py tests/clients/test_consumer_handles.py tests/clients/test_delivery.py \
	tests/groups/test_group.py \
	tests/protocol/test_protocol_codec.py tests/protocol/test_protocol_listener.py \
	tests/protocol/test_protocol_clients.py
test-pure: $(STAMP)
	LOGKIT_PURE_PYTHON=1 $(PY) -m pytest -q -rs $(PURE_PYTHON_TESTS)

# Apache Kafka for the tests that take it as the oracle (tests/helpers/kafka.py):
# tools/kafka/pom.xml resolved into flat classpath directories. The stamp makes a second
# run instant; a resolved ~/.m2 lets it rerun offline. Without java or mvn it says so and
# those tests skip with that reason.
.PHONY: kafka
KAFKA_STAMP := tools/kafka/lib/.resolved
kafka: $(KAFKA_STAMP)
$(KAFKA_STAMP): tools/kafka/pom.xml
	@if ! command -v mvn >/dev/null || ! command -v java >/dev/null; then \
	  echo "kafka: java or mvn is not installed: the Kafka tests will skip"; exit 0; fi; \
	set -e; cd tools/kafka; rm -rf lib spark-lib; \
	for p in "broker lib" "spark spark-lib"; do set -- $$p; \
	  mvn -q -B -o -P$$1 dependency:copy-dependencies -DoutputDirectory=$$2 -DincludeScope=runtime \
	    >/dev/null 2>&1 || mvn -q -B -P$$1 dependency:copy-dependencies -DoutputDirectory=$$2 \
	    -DincludeScope=runtime; done; \
	touch lib/.resolved

bench: $(STAMP)
	$(PY) -m benchmarks all

clean:
	rm -rf $(VENV) build *.egg-info
