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

.PHONY: install browser demo test bench clean

DEMO := demo
DEMO_SWEEP := src/batchlab/sweep/examples/demo_mnist_fc64.toml

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt requirements-nodeps.txt
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "batchlab needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[all,test]'
	$(PIP) install -q --no-deps -c constraints.txt -r requirements-nodeps.txt
	touch $(STAMP)

# The browser of tests/report/test_browser.py: Debian's chromium from apt (never one downloaded at run time).
# Where it cannot be installed (not root, no apt) this prints one line and the browser test is skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; \
	  { $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium \
	    || { $$SUDO apt-get update -q && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }; \
	  } >/dev/null 2>&1; \
	  if command -v chromium >/dev/null 2>&1; then echo "browser: installed $$(chromium --version 2>/dev/null)"; \
	  else echo "browser: could not install chromium (apt-get install chromium needs root and apt): tests/report/test_browser.py will be skipped"; fi; }

# The NQM figures, a small real sweep (resumed when re-run), advise's recommendation and the report, all under $(DEMO)/.
demo: install
	mkdir -p $(DEMO)
	$(VENV)/bin/batchlab nqm figures --out $(DEMO)/nqm
	$(VENV)/bin/batchlab sweep --config $(DEMO_SWEEP) --store $(DEMO)/store > $(DEMO)/sweep.txt
	@tail -n 1 $(DEMO)/sweep.txt; echo "sweep table: $(DEMO)/sweep.txt"
	@# the predictors of the critical batch size against the measured sweep (kept once measured)
	test -s $(DEMO)/predictions.jsonl || { for o in sgd momentum; do $(VENV)/bin/batchlab predict mnist/fc_64_64_64 \
	  --optimizer $$o --store $(DEMO)/store --json || exit 1; done > $(DEMO)/predictions.tmp && \
	  mv $(DEMO)/predictions.tmp $(DEMO)/predictions.jsonl; }
	@# advise on the demo's workload: it continues the sweep above (the same settings, so the same unit),
	@# adds the studies that narrow B_crit most within the time budget, and prints its recommendation
	$(VENV)/bin/batchlab advise mnist/fc_64_64_64 --optimizer sgd --config $(DEMO_SWEEP) --store $(DEMO)/store \
	  --budget-hours 0.05 > $(DEMO)/advise.txt
	@cat $(DEMO)/advise.txt
	$(VENV)/bin/batchlab report --store $(DEMO)/store --out $(DEMO)/report.html --nqm --predictions $(DEMO)/predictions.jsonl

test: install browser
	$(PY) -m pytest -q -n 2 tests

bench: install
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) figures $(DEMO)
