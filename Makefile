# Everything a fresh machine needs: `make demo` (convert + verify the bundled
# example on XLA's CPU backend) and `make test` (the test suite). Both create
# the virtual environment on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
export PJRT_DEVICE ?= CPU

.PHONY: setup demo test bench clean browser

WHEEL_042 := .cache/wheels/diffusers-0.42.1-py3-none-any.whl

# torch (a CUDA build on PyPI) and torch_xla fill about 8 GB: say so before pip runs out of room
$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import shutil, sys; free = shutil.disk_usage(".").free / 2**30; \
	  sys.exit(0 if free >= 8.5 else f"make setup: $(VENV) needs about 8.5 GB free (torch and torch_xla); {free:.1f} GB is free here")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[verify,test,diffusers]'
	touch $@

# diffusers 0.42.1 (already ported by hand) is read from its wheel, not installed
$(WHEEL_042): | $(VENV)/.installed
	$(PY) -m pip download --quiet --no-deps --dest .cache/wheels diffusers==0.42.1

setup: $(VENV)/.installed $(WHEEL_042)

demo: setup
	rm -rf build/demo
	$(VENV)/bin/xlaport convert fixtures/train_mlp -o build/demo
	$(VENV)/bin/xlaport verify fixtures/train_mlp/input.py --root fixtures/train_mlp --converted build/demo -- --epochs 2

# verify's HTML report is tested in a real headless browser: Debian's chromium,
# installed here where the machine lets us (the test is skipped, saying why, where not)
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 || \
	    echo "make: could not install chromium; the browser test will be skipped"; }

test: setup browser
	$(PY) -m pytest -q

bench: setup
	$(PY) benchmarks/bench_speed.py
	$(PY) benchmarks/bench_fixtures.py
	$(PY) benchmarks/bench_diffusers.py

clean:
	rm -rf $(VENV) build .pytest_cache
