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

test: lint
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) -m benchmarks all

clean:
	rm -rf $(VENV) build *.egg-info
