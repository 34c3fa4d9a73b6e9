#!/usr/bin/env bash
# `make test`: the suite in three parts, on a 2-core machine in about 20 minutes.
#
#   1. the real-job tests (`slow` or `ebpf`) not marked `serial`, two at a time (pytest-xdist): most
#      wait on their jobs' clocks, so two of them share the machine as two jobs share a node; the
#      ranks' own CPU keeps both cores busy;
#   2. the `serial` tests alone: cgroup quotas, timing thresholds, healthy jobs that must stay quiet
#      for a while, whose verdicts depend on the machine's load;
#   3. beside part 2, at a low CPU priority (nice 10), the tests that start no real job (about
#      three minutes of one core): they use the CPU the one serial job leaves idle, and where both
#      want a CPU the scheduler favours the serial test's job and monitor about ten to one. Their
#      output is printed after part 2's.
#
# Skips of eBPF / real-job tests fail (SCOUT_SYS_STRICT_SKIPS=1; tests/README.md). Extra arguments go
# to every part (a file, -k EXPR); a part that selects nothing is not a failure unless all do.
# The slowest tests are listed at the end of each part (--durations).
set -uo pipefail
PY="${PY:-.venv/bin/python}"
export SCOUT_SYS_STRICT_SKIPS=1
JOBS="${SCOUT_SYS_TEST_JOBS:-2}"

"$PY" -m pytest -n "$JOBS" --dist loadgroup -m "not serial and (slow or ebpf)" --durations=60 "$@"
parallel=$?

unit_log="$(mktemp /tmp/scout-sys-unit.XXXXXX)"
nice -n 10 "$PY" -m pytest -p no:xdist -p no:cacheprovider -m "not serial and not slow and not ebpf" \
  --durations=10 "$@" >"$unit_log" 2>&1 &
unit_pid=$!
trap 'kill "$unit_pid" 2>/dev/null; rm -f "$unit_log"' EXIT
"$PY" -m pytest -p no:xdist -m serial --durations=10 "$@"
serial=$?
wait "$unit_pid"
unit=$?
echo "---- the tests that start no real job (run beside the serial part, nice 10) ----"
cat "$unit_log"

ok() { [ "$1" = 0 ] || [ "$1" = 5 ]; }  # 5: this part selected no test
if ok "$parallel" && ok "$serial" && ok "$unit" && ! { [ "$parallel" = 5 ] && [ "$serial" = 5 ] && [ "$unit" = 5 ]; }; then
  echo "make test: all three parts passed (real jobs: exit $parallel, serial: exit $serial, no job: exit $unit)"
  exit 0
fi
echo "make test: FAILED (real jobs: exit $parallel, serial: exit $serial, no job: exit $unit)" >&2
[ "$parallel" = 5 ] && [ "$serial" = 5 ] && [ "$unit" = 5 ] && exit 5
exit 1
