#!/usr/bin/env bash
# Debian packages needed before the venv can be built. Idempotent; quiet when all is there.
set -euo pipefail
need=()
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
command -v tmux >/dev/null || need+=(tmux)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "scout-sys setup: need Debian packages ${need[*]}; run make as root" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
