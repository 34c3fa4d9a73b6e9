#!/usr/bin/env bash
# The interpreter `make` builds .venv and `make install`'s venv with (the Makefile's PY default): the
# newest Python 3.9 or newer on PATH (python3.14 ... python3.9, then python3), one with its venv module
# first (Debian's python3 lacks it until python3-venv is installed: `make`'s system step does that).
# Printed as a path; none: one line saying what to install, exit 1. README "Install".
set -uo pipefail
cands=(python3.14 python3.13 python3.12 python3.11 python3.10 python3.9 python3)
for check in 'import venv, ensurepip' 'pass'; do
  for c in "${cands[@]}"; do
    p="$(command -v "$c" 2>/dev/null)" || continue
    # runs it: a pyenv shim of a version that is not selected is on PATH but fails here
    "$p" -c "import sys; $check; sys.exit(sys.version_info < (3, 9))" 2>/dev/null && { echo "$p"; exit 0; }
  done
done
have="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo none)"
echo "scout-sys setup: no Python 3.9 or newer on PATH (python3: $have); install one first (RHEL/Rocky/Alma 8: dnf install python3.11; Debian/Ubuntu: apt-get install python3 python3-venv) or name it: make PY=/path/to/python3.X" >&2
exit 1
