#!/usr/bin/env bash
# Tools the documentation tests (tests/test_docs_*.py) check the documented examples with: jq for the
# runbook's jq lines, visudo (Debian's sudo) for the sudoers rule of docs/metrics.md, logrotate for its
# rotation stanza, promtool for examples/prometheus-alerts.yml. promtool is taken out of Debian's
# prometheus package into VENV/bin (no Prometheus server is installed or started). Idempotent.
set -euo pipefail
venv="${1:-.venv}"
need=()
command -v visudo >/dev/null || need+=(sudo)
command -v jq >/dev/null || need+=(jq)
command -v logrotate >/dev/null || [ -x /usr/sbin/logrotate ] || need+=(logrotate)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then echo "scout-sys setup: need Debian packages ${need[*]}; run make as root" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null; }
fi
if [ ! -x "$venv/bin/promtool" ] && ! command -v promtool >/dev/null; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && { apt-get download -qq prometheus 2>/dev/null || { apt-get update -qq && apt-get download -qq prometheus; }; })
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
  install -m 0755 "$tmp/x/usr/bin/promtool" "$venv/bin/promtool"
fi
