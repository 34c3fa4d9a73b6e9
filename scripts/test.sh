#!/usr/bin/env bash
# `make test`: the suite in four parts, on a 2-core machine in about 20 minutes.
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
#   4. after part 3, the same way, those tests again on Python 3.9, the oldest the monitor supports
#      (.venv-oldest: scripts/setup-oldest.sh; about a minute), less what needs torch (marker `torch`,
#      and the modules that import it) or the dev venv's tools (the docs and deploy tests). No
#      .venv-oldest: a failure, unless SCOUT_SYS_ALLOW_SKIPS=1.
#
# Skips of eBPF / real-job tests fail (SCOUT_SYS_STRICT_SKIPS=1; tests/README.md). Extra arguments go
# to every part (a file, -k EXPR); a part that selects nothing is not a failure unless all do.
# The slowest tests are listed at the end of each part (--durations).
set -uo pipefail
PY="${PY:-.venv/bin/python}"
OLDEST_PY="${OLDEST_PY:-.venv-oldest/bin/python}"
export SCOUT_SYS_STRICT_SKIPS=1
JOBS="${SCOUT_SYS_TEST_JOBS:-2}"

"$PY" -m pytest -n "$JOBS" --dist loadgroup -m "not serial and (slow or ebpf)" --durations=60 "$@"
parallel=$?

unit_log="$(mktemp /tmp/scout-sys-unit.XXXXXX)"
oldest_log="$(mktemp /tmp/scout-sys-oldest.XXXXXX)"
oldest() {  # part 4 (in its own subshell: exec)
  if [ ! -x "$OLDEST_PY" ]; then
    echo "no $OLDEST_PY (make oldest: scripts/setup-oldest.sh)"
    [ "${SCOUT_SYS_ALLOW_SKIPS:-}" = 1 ] && exit 5
    exit 1
  fi
  exec nice -n 10 "$OLDEST_PY" -m pytest -p no:cacheprovider -m "not serial and not slow and not ebpf and not torch" \
    --ignore=tests/test_deploy.py --ignore-glob='tests/test_docs_*.py' --durations=5 "$@"
}
# parts 3 then 4, beside part 2; the exit status is part 3's, part 4's is written to its log's .rc
(
  trap 'kill "$child" 2>/dev/null; exit 143' TERM
  nice -n 10 "$PY" -m pytest -p no:xdist -p no:cacheprovider -m "not serial and not slow and not ebpf" \
    --durations=10 "$@" >"$unit_log" 2>&1 &
  child=$!
  wait "$child"
  rc=$?
  oldest "$@" >"$oldest_log" 2>&1 &
  child=$!
  wait "$child"
  echo $? >"$oldest_log.rc"
  exit "$rc"
) &
unit_pid=$!
trap 'kill "$unit_pid" 2>/dev/null; rm -f "$unit_log" "$oldest_log" "$oldest_log.rc"' EXIT
"$PY" -m pytest -p no:xdist -m serial --durations=10 "$@"
serial=$?
wait "$unit_pid"
unit=$?
oldest=$(cat "$oldest_log.rc" 2>/dev/null || echo 1)
echo "---- the tests that start no real job (run beside the serial part, nice 10) ----"
cat "$unit_log"
echo "---- those tests on Python 3.9, the oldest the monitor supports (.venv-oldest, nice 10) ----"
cat "$oldest_log"

ok() { [ "$1" = 0 ] || [ "$1" = 5 ]; }  # 5: this part selected no test
codes="real jobs: exit $parallel, serial: exit $serial, no job: exit $unit, no job on 3.9: exit $oldest"
none() { [ "$parallel" = 5 ] && [ "$serial" = 5 ] && [ "$unit" = 5 ] && [ "$oldest" = 5 ]; }
if ok "$parallel" && ok "$serial" && ok "$unit" && ok "$oldest" && ! none; then
  echo "make test: all four parts passed ($codes)"
  exit 0
fi
echo "make test: FAILED ($codes)" >&2
none && exit 5
exit 1
