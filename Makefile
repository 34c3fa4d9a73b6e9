# scout-sys: everything a fresh Debian/Ubuntu machine needs, as root, idempotently.
#   make        set up .venv (the product's dependencies only) and the eBPF prerequisites
#   make demo   run a 4-rank demo job with one faulty rank and diagnose it
#   make test   add what only the tests need to .venv (requirements-test.txt, requirements-frameworks.txt,
#               the doc tools), then run the test suite (real torchrun jobs, real py-spy, real eBPF as
#               root): real-job tests two at a time, then the load-sensitive ones alone with the job-less
#               ones beside them at nice 10 (scripts/test.sh); an eBPF or real-job test that skips fails
#               it (SCOUT_SYS_ALLOW_SKIPS=1 allows skips on purpose)
#   make bench  run the benchmarks
#   make soak TEST=tests/test_x.py::test_y N=5   one test N times under a CPU hog, its pass rate
#               (scripts/soak.sh; takes the real-job lock itself)
#   make wheel  build dist/scout_sys-VERSION-py3-none-any.whl (pip/pipx install it anywhere)
#   make install  as root: the wheel into its own venv $(PREFIX) with the product's dependencies only
#               (extras $(EXTRAS); EXTRAS= for the monitor alone, no torch), linked as $(BINDIR)/scout-sys,
#               where sudo's secure_path finds it on Debian/Ubuntu (RHEL: BINDIR=/usr/bin). README "Install".

# The interpreter of .venv and of install's venv: the newest Python 3.9 or newer on PATH (RHEL 8's python3
# is 3.6: scripts/find-python.sh names what to install); PY=/path/to/python3.X picks one.
PY      ?= $(shell bash scripts/find-python.sh 2>/dev/null)
NEED_PY  = @[ -n "$(PY)" ] || bash scripts/find-python.sh >/dev/null
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TSTAMP  := $(VENV)/.installed-test
PYTEST_ARGS ?=
PREFIX  ?= /opt/scout-sys
BINDIR  ?= /usr/local/bin
# all, where torch 2.13 has wheels (Python 3.10 or newer); on 3.9 the monitor alone
EXTRAS  ?= $(shell $(PY) -c 'import sys; print("all" if sys.version_info >= (3, 10) else "")' 2>/dev/null)
OLDEST  := .venv-oldest
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
WHEEL   := dist/scout_sys-$(VERSION)-py3-none-any.whl

.PHONY: all setup test-setup system ebpf doctools oldest test demo bench soak lint clean wheel install

all: setup

setup: $(STAMP) ebpf

# what only `make test` (and lint, bench) need: the test runner, the linter, the frameworks the tests
# run real jobs of, and the tools the documentation tests check examples with
test-setup: setup $(TSTAMP) doctools oldest

# Debian packages the venv itself needs (python3-venv is not there on a bare Debian 12).
system:
	@bash scripts/setup-system.sh

# The dev venv: the product's dependencies (requirements.txt: the monitor and its extras, for demo).
$(STAMP): requirements.txt constraints.txt pyproject.toml | system
	$(NEED_PY)
	[ -x $(BIN)/python ] || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -r requirements.txt "setuptools>=64"
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

# Then, for make test only, what only the tests need (one pip run: one start-up and one resolve of both lists).
$(TSTAMP): $(STAMP) requirements-test.txt requirements-frameworks.txt
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -r requirements-test.txt -r requirements-frameworks.txt
	touch $@

# bcc from the distro, kernel headers (linked when the running kernel has none), debugfs;
# exposes only the distro `bcc` module to the venv. See docs/ebpf.md and `scout-sys doctor`.
# A failure is reported and skipped: everything else works without eBPF (doctor says what is missing).
ebpf: $(STAMP)
	@bash scripts/setup-ebpf.sh $(VENV) || echo "scout-sys: eBPF set-up failed (above); the rest is set up, eBPF probes stay off until it is fixed: see \`$(BIN)/scout-sys doctor\` and docs/ebpf.md" >&2

# build/ is removed first: setuptools would put the files of an older build/lib in the wheel.
wheel: $(STAMP)
	rm -rf build $(WHEEL)
	$(BIN)/pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w dist .
	rm -rf build

install: wheel
	@[ "$$(id -u)" = 0 ] || { echo "scout-sys install: run as root (sudo make install)" >&2; exit 1; }
	$(NEED_PY)
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || echo "scout-sys install: $(PY) is Python 3.9: the monitor, without torch's extras (certify, agent, --cluster, demo need Python 3.10 or newer: README \"Install\")"
	[ -x $(PREFIX)/bin/python ] || $(PY) -m venv $(PREFIX)
	$(PREFIX)/bin/pip install -q --disable-pip-version-check -c constraints.txt -c requirements.txt "$(WHEEL)$(if $(EXTRAS),[$(EXTRAS)])"
	$(PREFIX)/bin/pip install -q --disable-pip-version-check --no-deps --force-reinstall "$(WHEEL)"
	mkdir -p $(BINDIR)
	ln -sfn $(PREFIX)/bin/scout-sys $(BINDIR)/scout-sys
	@echo "scout-sys: installed in $(PREFIX), linked as $(BINDIR)/scout-sys; check it with: sudo scout-sys doctor"

# visudo and promtool: tests/test_docs_examples.py checks the sudoers line and the alert rules the docs show.
doctools: $(TSTAMP)
	@bash scripts/setup-doc-tools.sh $(VENV)

# make test's oldest-Python part: the job-less tests on Python 3.9 too (scripts/setup-oldest.sh, from
# pyenv's 3.9.x or python3.9; none: fails unless SCOUT_SYS_ALLOW_SKIPS=1)
oldest:
	@bash scripts/setup-oldest.sh $(OLDEST)

test: test-setup
	PY=$(BIN)/python bash scripts/test.sh $(PYTEST_ARGS)

demo: setup
	$(BIN)/scout-sys demo

bench: test-setup
	$(BIN)/python benchmarks/run.py

N ?= 5
soak: test-setup
	@test -n "$(TEST)" || { echo "usage: make soak TEST=tests/test_x.py::test_y [N=5]" >&2; exit 2; }
	PY=$(BIN)/python bash scripts/soak.sh "$(TEST)" $(N)

lint: $(TSTAMP)
	$(BIN)/ruff check scout_sys tests benchmarks

clean:
	rm -rf $(VENV) $(OLDEST) .pytest_cache build dist
