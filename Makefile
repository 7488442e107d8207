# Two commands do everything (README quickstart): `make run` and `make test`.
# Each target is idempotent: stamps under .venv/.stamps skip steps whose inputs did not change.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMPS := $(VENV)/.stamps
PYTEST_ARGS ?=
# Test workers (pytest-xdist): most tests wait on sockets, timers and fsyncs, so on a 2-core
# machine more workers than cores pay (measured 2026-11-28: three 12:49 against two 16:06;
# 2026-11-29, idle machine, back to back: four 12:51 against three 13:35). Spark tests share
# one worker (one JVM).
TEST_WORKERS ?= 4

RUST_SRC   := $(shell find bindings/src bindings/python -type f 2>/dev/null) bindings/Cargo.toml bindings/pyproject.toml
CYTHON_SRC := $(wildcard core_ext/*.pyx core_ext/*.pxd) setup.py pyproject.toml

.PHONY: setup run test bench clean

setup: $(STAMPS)/core_ext

# The main job: a broker on LMDB in ./data (Pulsar protocol on 6650, admin REST and metrics on 8080).
run: setup
	$(VENV)/bin/pyengine serve --data-dir ./data --port 6650 --http-port 8080

# Each worker collects every test, and pytest's assertion rewriting of ~700 test files costs
# ~18 s of CPU per worker unless its bytecode cache is written: it is, for this run, also where
# PYTHONDONTWRITEBYTECODE is set (collection 27.7 -> 9.2 s per worker on the next run).
test: setup
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

bench: setup
	$(PY) -m benchmarks kernels

$(STAMPS)/apt: scripts/apt-packages.txt scripts/apt-install
	scripts/apt-install scripts/apt-packages.txt
	@mkdir -p $(STAMPS) && touch $@

$(STAMPS)/venv: $(STAMPS)/apt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@mkdir -p $(STAMPS) && touch $@

# Third-party Python packages, exact versions from constraints.txt.
$(STAMPS)/deps: $(STAMPS)/venv requirements.txt constraints.txt
	$(PY) -m pip install -q -c constraints.txt -r requirements.txt
	@touch $@

# Rust kernels (bindings/), a release build by maturin installed into the venv.
$(STAMPS)/bindings: $(STAMPS)/deps $(RUST_SRC)
	$(PY) -m pip install -q --no-build-isolation --no-deps --force-reinstall ./bindings
	@touch $@

# Root distribution: Cython extensions built in place (editable install).
$(STAMPS)/core_ext: $(STAMPS)/bindings $(CYTHON_SRC)
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	@touch $@

clean:
	rm -rf build dist *.egg-info core_ext/*.c core_ext/*.so bindings/target
