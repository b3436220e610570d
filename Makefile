# Both entry points do all set-up on a fresh machine: a .venv with the project and
# every extra installed, then the job itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench install clean

$(STAMP): pyproject.toml setup.cfg
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[all]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) examples/demo.py

test: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) -m logkit.bench all

clean:
	rm -rf $(VENV) build *.egg-info
