# One command per job; each target builds the virtualenv first if it is missing or stale.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test check demo fmt bench clean

venv: $(STAMP)

# The stamp is newer than its inputs once the install succeeded, so reruns skip pip. The
# editable install records the packages it found, so a package's __init__.py is an input too.
$(STAMP): pyproject.toml $(wildcard $(addsuffix /__init__.py,ipujax lowering partitioner))
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

test: venv
	bash scripts/ensure_chromium.sh
	$(MAKE) check
	$(PY) -m pytest

check: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

demo: venv
	$(PY) examples/demo.py

fmt: venv
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# ipujax against jax.jit (benchmarks/run.py, about 10 minutes on 2 cores); writes benchmarks/RESULTS.md.
# Arguments go through BENCH_ARGS, e.g. make bench BENCH_ARGS="--only run,compile --no-write".
bench: venv
	JAX_PLATFORMS=cpu $(PY) benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV)
