#!/usr/bin/env bash
# Tools tests/test_docs_examples.py checks the documented examples with: visudo (Debian's sudo) for the
# sudoers line of docs/metrics.md, promtool for examples/prometheus-alerts.yml. promtool is taken out of
# Debian's prometheus package into VENV/bin (no Prometheus server is installed or started). Idempotent.
set -euo pipefail
venv="${1:-.venv}"
if ! command -v visudo >/dev/null; then
  if [ "$(id -u)" != 0 ]; then echo "scout-sys setup: need Debian package sudo (visudo); run make as root" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq sudo >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq sudo >/dev/null; }
fi
if [ ! -x "$venv/bin/promtool" ] && ! command -v promtool >/dev/null; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && { apt-get download -qq prometheus 2>/dev/null || { apt-get update -qq && apt-get download -qq prometheus; }; })
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
  install -m 0755 "$tmp/x/usr/bin/promtool" "$venv/bin/promtool"
fi
