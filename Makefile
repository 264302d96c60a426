# Everything a fresh machine needs: `make demo` (convert + verify the bundled
# example on XLA's CPU backend) and `make test` (the test suite). Both create
# the virtual environment on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
export PJRT_DEVICE ?= CPU

.PHONY: setup demo test bench clean browser

WHEEL_042 := .cache/wheels/diffusers-0.42.1-py3-none-any.whl

# torch (a CUDA build on PyPI) and torch_xla fill about 8 GB. Where the disk has less room, the
# venv is set up without them (the `verify` extra): convert, lint and every test that needs no
# torch still run, the tests that run programs on XLA are skipped saying why, and `make demo`
# says what it needs. `make clean setup` with the room installs them.
NEED_GB := 8.5

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@free=$$($(PY) -c 'import os, shutil; print(round(shutil.disk_usage(os.curdir).free / 2**30, 1))'); \
	if $(PY) -c "import sys; sys.exit($$free < $(NEED_GB))"; then \
	  extras=verify,test,diffusers; \
	else \
	  extras=test,diffusers; \
	  echo "make setup: torch and torch_xla need about $(NEED_GB) GB; $$free GB is free here. Setting up without them: the tests that run torch or XLA are skipped, and make demo cannot run." >&2; \
	fi; \
	$(PY) -m pip install --quiet --no-cache-dir -e ".[$$extras]" && echo $$extras > $@

# diffusers 0.42.1 (already ported by hand) is read from its wheel, not installed
$(WHEEL_042): | $(VENV)/.installed
	$(PY) -m pip download --quiet --no-deps --dest .cache/wheels diffusers==0.42.1

setup: $(VENV)/.installed $(WHEEL_042)

demo: setup
	@$(PY) -c 'import importlib.util, sys; sys.exit(None if importlib.util.find_spec("torch_xla") else "make demo: torch_xla is not installed in $(VENV) (make setup found less than $(NEED_GB) GB free); make clean setup, with the room, installs it")'
	rm -rf build/demo
	$(VENV)/bin/xlaport convert fixtures/train_mlp -o build/demo
	$(VENV)/bin/xlaport verify fixtures/train_mlp/input.py --root fixtures/train_mlp --converted build/demo -- --epochs 2

# verify's HTML report is tested in a real headless browser: Debian's chromium,
# installed here where the machine lets us (the test is skipped, saying why, where not)
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 || \
	    echo "make: could not install chromium; the browser test will be skipped"; }

# on every core, up to 4 (the XLA tests are mostly child processes: 2 cores run the suite in about
# half the time one does); `TESTFLAGS=-n0` runs it in one process
TESTFLAGS ?= -n auto --maxprocesses 4

test: setup browser
	$(PY) -m pytest -q $(TESTFLAGS)

bench: setup
	$(PY) benchmarks/bench_speed.py
	$(PY) benchmarks/bench_fixtures.py
	$(PY) benchmarks/bench_diffusers.py

clean:
	rm -rf $(VENV) build .pytest_cache
