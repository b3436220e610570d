# Both entry points do all set-up on a fresh machine: a .venv with the project and
# every extra installed, then the job itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench install clean jar

$(STAMP): pyproject.toml setup.cfg
	# strace drives the crash-point enumeration (tests/test_crashpoints.py); as root on
	# Debian it is installed when missing, elsewhere those tests say why they skip.
	command -v strace >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && (apt-get update -qq && apt-get install -y -qq strace) >/dev/null 2>&1 || true; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[all]"
	# An editable install hides pyspark_logkit from pkgutil.iter_modules, which is how
	# PySpark discovers data sources: put spark/ itself on the venv's path too.
	$(PY) -c "import site, sys; open(site.getsitepackages()[0] + '/logkit-spark-source.pth', 'w').write(sys.argv[1] + '\n')" "$(abspath spark)"
	# The Spark JVM reader's jar, when javac is here (else the Python source reads).
	$(PY) spark/jvm/build_jar.py || true
	touch $(STAMP)

install: $(STAMP)

jar: $(STAMP)
	$(PY) spark/jvm/build_jar.py

demo: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check logkit spark tests tools benchmarks examples

test: lint kafka
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -rs tests

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
