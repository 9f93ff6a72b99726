# batchlab: `make demo` sets everything up and runs the main job; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# One torch thread per process and passive OpenMP waits: spinning threads run 10-60x slower on few cores.
export OMP_WAIT_POLICY := PASSIVE
export OMP_NUM_THREADS ?= 1
export MPLBACKEND := Agg

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt requirements-nodeps.txt
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "batchlab needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[all,test]'
	$(PIP) install -q --no-deps -c constraints.txt -r requirements-nodeps.txt
	touch $(STAMP)

demo: install
	$(VENV)/bin/batchlab nqm figures

test: install
	$(PY) -m pytest -q -n 2 tests

bench: install
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) figures
