#!/usr/bin/env bash
# scripts/soak.sh TEST_ID [N] (`make soak TEST=... N=...`): one test N times (default 5) under a CPU
# hog, then its pass rate: "soak: 9/10 passed under a 2-core hog". A flake is a bug with a root cause;
# this is how a fix for one is shown (tests/README.md "Flakes").
#
# The hog: one busy loop per core (SOAK_HOG=K for K), at the test's own priority (nice 0), started
# and killed by pid by this script. The whole soak holds the real-job lock (/tmp/scout-realjob.lock),
# so it never runs beside another real-job test on this machine. Skips fail (SCOUT_SYS_STRICT_SKIPS=1).
# Each run's output is kept in a temporary folder, named at the end; a failed run's tail is printed.
set -uo pipefail
usage="usage: scripts/soak.sh TEST_ID [N]   (e.g. tests/test_x.py::test_y 5)"
test_id="${1:-}"
n="${2:-5}"
hog="${SOAK_HOG:-$(nproc)}"
[ -n "$test_id" ] && [ "$#" -le 2 ] || { echo "$usage" >&2; exit 2; }
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "soak: N must be a positive whole number, not '$n'" >&2; exit 2; }
[[ "$hog" =~ ^[0-9]+$ ]] || { echo "soak: SOAK_HOG must be a whole number, not '$hog'" >&2; exit 2; }
[ -e "${test_id%%::*}" ] || { echo "soak: no such test file: ${test_id%%::*}" >&2; exit 2; }
PY="${PY:-.venv/bin/python}"
export SCOUT_SYS_STRICT_SKIPS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this tree's code, in the test and its jobs

logs="$(mktemp -d /tmp/scout-soak.XXXXXX)"
hogs=()
stop_hogs() {
  for p in "${hogs[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${hogs[@]}"; do wait "$p" 2>/dev/null; done
  hogs=()
}
trap stop_hogs EXIT
trap 'stop_hogs; exit 130' INT TERM

exec 9>>/tmp/scout-realjob.lock
echo "soak: waiting for the real-job lock (/tmp/scout-realjob.lock)"
flock 9
for _ in $(seq "$hog"); do
  nice -n 0 bash -c 'while :; do :; done' 9>&- &  # the lock stays with this script alone
  hogs+=("$!")
done
passed=0
for i in $(seq "$n"); do
  log="$logs/run-$i.log"
  "$PY" -m pytest -q -p no:xdist -p no:cacheprovider "$test_id" >"$log" 2>&1 9>&-
  rc=$?
  # one test selected and passed (a pattern that selects nothing, or a skip, is no pass)
  if [ "$rc" = 0 ] && grep -qE '^[0-9]+ passed' <(tail -n 1 "$log") && ! tail -n 1 "$log" | grep -q skipped; then
    passed=$((passed + 1))
    echo "soak: run $i/$n passed ($(tail -n 1 "$log"))"
  else
    echo "soak: run $i/$n FAILED (exit $rc); the end of its output:"
    tail -n 15 "$log" | sed 's/^/    /'
  fi
done
stop_hogs
echo "soak: $passed/$n passed under a $hog-core hog ($test_id; logs: $logs)"
[ "$passed" = "$n" ]
