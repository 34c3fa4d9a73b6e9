# scout-sys: everything a fresh Debian/Ubuntu machine needs, as root, idempotently.
#   make        set up .venv and the eBPF prerequisites
#   make demo   run a 4-rank demo job with one faulty rank and diagnose it
#   make test   run the test suite (real torchrun jobs, real py-spy, real eBPF as root), two tests at
#               a time, then the load-sensitive ones alone (scripts/test.sh); an eBPF or real-job test
#               that skips fails it (SCOUT_SYS_ALLOW_SKIPS=1 allows skips on purpose)
#   make bench  run the benchmarks

PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: all setup system ebpf doctools test demo bench lint clean

all: setup

setup: $(STAMP) ebpf doctools

# Debian packages the venv itself needs (python3-venv is not there on a bare Debian 12).
system:
	@bash scripts/setup-system.sh

$(STAMP): requirements.txt requirements-frameworks.txt constraints.txt pyproject.toml | system
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.txt
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -r requirements-frameworks.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

# bcc from Debian, kernel headers (linked when the running kernel has none), debugfs;
# exposes only the distro `bcc` module to the venv. See docs/ebpf.md and `scout-sys doctor`.
ebpf: $(STAMP)
	@bash scripts/setup-ebpf.sh $(VENV)

# visudo and promtool: tests/test_docs_examples.py checks the sudoers line and the alert rules the docs show.
doctools: $(STAMP)
	@bash scripts/setup-doc-tools.sh $(VENV)

test: setup
	PY=$(BIN)/python bash scripts/test.sh $(PYTEST_ARGS)

demo: setup
	$(BIN)/scout-sys demo

bench: setup
	$(BIN)/python benchmarks/run.py

lint: $(STAMP)
	$(BIN)/ruff check scout_sys tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache
