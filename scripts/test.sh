#!/usr/bin/env bash
# `make test`: the suite in two parts, on a 2-core machine in about 20 minutes.
#
#   1. everything not marked `serial`, two tests at a time (pytest-xdist): most real-job tests wait
#      on their jobs' clocks, so two of them share the machine as two jobs share a node;
#   2. the `serial` tests alone: cgroup quotas, timing thresholds, healthy jobs that must stay quiet
#      for a minute, whose verdicts depend on the machine's load.
#
# Skips of eBPF / real-job tests fail (SCOUT_SYS_STRICT_SKIPS=1; tests/README.md). Extra arguments go
# to both parts (a file, -k EXPR); a part that selects nothing is not a failure unless both do.
# The slowest tests are listed at the end of each part (--durations).
set -uo pipefail
PY="${PY:-.venv/bin/python}"
export SCOUT_SYS_STRICT_SKIPS=1
JOBS="${SCOUT_SYS_TEST_JOBS:-2}"

"$PY" -m pytest -n "$JOBS" --dist loadgroup -m "not serial" --durations=60 "$@"
parallel=$?
"$PY" -m pytest -p no:xdist -m serial --durations=10 "$@"
serial=$?

ok() { [ "$1" = 0 ] || [ "$1" = 5 ]; }  # 5: this part selected no test
if ok "$parallel" && ok "$serial" && ! { [ "$parallel" = 5 ] && [ "$serial" = 5 ]; }; then
  echo "make test: both parts passed (parallel: exit $parallel, serial: exit $serial)"
  exit 0
fi
echo "make test: FAILED (parallel part: exit $parallel, serial part: exit $serial)" >&2
[ "$parallel" = 5 ] && [ "$serial" = 5 ] && exit 5
exit 1
