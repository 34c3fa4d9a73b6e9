#!/usr/bin/env bash
# make test's oldest-Python part: VENV (default .venv-oldest) on Python 3.9, the oldest the monitor
# supports (RHEL/Rocky/Alma 9's python3), with the product's runtime dependencies (requirements.txt:
# its markers leave out torch, which has no 3.9 wheel), the test runner (requirements-test-oldest.txt)
# and this tree, editable (pip checks the package's Requires-Python). The interpreter: pyenv's newest
# 3.9.x ($PYENV_ROOT/versions/3.9.*), else python3.9 on PATH. Idempotent: VENV/.installed, newer
# than the files it was built from. No Python 3.9: fails, unless SCOUT_SYS_ALLOW_SKIPS=1 (then it says
# so and scripts/test.sh leaves the part out).
set -euo pipefail
venv="${1:-.venv-oldest}"
stamp="$venv/.installed"
inputs=(requirements.txt requirements-test-oldest.txt constraints.txt pyproject.toml)
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ -z "$(find "${inputs[@]}" -newer "$stamp")" ]; then
  exit 0
fi
root="${PYENV_ROOT:-$HOME/.pyenv}"
py=""
for p in $(ls -d "$root"/versions/3.9.*/bin/python3.9 2>/dev/null | sort -V -r) "$(command -v python3.9 || true)"; do
  if [ -n "$p" ] && "$p" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info[:2] != (3, 9))' 2>/dev/null; then
    py="$p"
    break
  fi
done
if [ -z "$py" ]; then
  msg="scout-sys setup: no Python 3.9 (pyenv's $root/versions/3.9.*, or python3.9 on PATH) for make test's oldest-Python part: pyenv install 3.9"
  if [ "${SCOUT_SYS_ALLOW_SKIPS:-}" = 1 ]; then
    echo "$msg (SCOUT_SYS_ALLOW_SKIPS=1: the part is left out)" >&2
    exit 0
  fi
  echo "$msg; SCOUT_SYS_ALLOW_SKIPS=1 leaves the part out" >&2
  exit 1
fi
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
# Python 3.9's own pip (23.0) backtracks for many minutes over textual's and pytest's dependencies
"${pip[@]}" pip==25.2
"${pip[@]}" -c constraints.txt -r requirements.txt -r requirements-test-oldest.txt
"${pip[@]}" --no-deps -e .
touch "$stamp"
