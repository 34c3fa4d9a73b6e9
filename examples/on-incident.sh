#!/usr/bin/env bash
# An --on-incident hook for scout-sys watch: post the incident to a webhook (Slack-style {"text": ...})
# and, for a hang-type incident attributed to ranks, drain their Slurm node(s) so the scheduler stops
# placing jobs there.
#
#   sudo scout-sys watch --job PID --headless --on-incident-user root \
#        --on-incident '/usr/local/bin/on-incident.sh --webhook https://hooks.example/T0/B0/x --drain'
#
# The event JSON (as `watch --headless --json` prints it) is on stdin; SCOUT_SYS_EVENT, _INCIDENT,
# _KIND, _STATUS, _RANKS, _HOSTS and _BUNDLE are in the environment (docs/metrics.md).
# --dry-run prints what it would do instead of doing it:
#
#   scout-sys watch ... --headless --json | head -1 | examples/on-incident.sh --dry-run --webhook URL --drain
set -euo pipefail

usage() { echo "usage: $0 [--webhook URL] [--drain] [--dry-run]" >&2; exit 2; }
webhook="${SCOUT_SYS_WEBHOOK:-}" drain=0 dry=0
while [ $# -gt 0 ]; do
    case "$1" in
        --webhook) [ $# -ge 2 ] || usage; webhook="$2"; shift 2 ;;
        --drain) drain=1; shift ;;
        --dry-run) dry=1; shift ;;
        *) usage ;;
    esac
done

event_json="$(cat)"
# Fields from the JSON itself, so that the script also works on a saved event line (--dry-run).
field() { printf '%s' "$event_json" | python3 -c "import json,sys; e=json.load(sys.stdin); print($1)"; }
event="${SCOUT_SYS_EVENT:-$(field 'e["event"]')}"
id="${SCOUT_SYS_INCIDENT:-$(field 'e["incident"].get("id","")')}"
kind="${SCOUT_SYS_KIND:-$(field 'e["incident"]["kind"]')}"
status="${SCOUT_SYS_STATUS:-$(field 'e["incident"]["status"]')}"
ranks="${SCOUT_SYS_RANKS-$(field '",".join(map(str, e["incident"]["ranks"]))')}"
hosts="${SCOUT_SYS_HOSTS-$(field '",".join(e["incident"]["hosts"])')}"
bundle="${SCOUT_SYS_BUNDLE-$(field 'e.get("bundle","")')}"
summary="$(field 'e["incident"]["summary"]')"

run() {  # run a command, or print it (shell-quoted) with --dry-run
    if [ "$dry" = 1 ]; then printf 'would run:'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

text="scout-sys ${event#incident_} ${id}: ${kind} (${status})${ranks:+ rank(s) ${ranks}}${hosts:+ on ${hosts}}: ${summary}${bundle:+ — evidence: ${bundle}}"
if [ -n "$webhook" ]; then
    payload="$(TEXT="$text" python3 -c 'import json,os; print(json.dumps({"text": os.environ["TEXT"]}))')"
    run curl --silent --show-error --fail --max-time 20 -H 'Content-Type: application/json' \
        --data "$payload" "$webhook"
fi

# Drain only on a new, attributed hang-type incident: an inconclusive verdict names no node.
if [ "$drain" = 1 ] && [ "$event" = incident_opened ] && [ "$status" = attributed ] && [ -n "$hosts" ]; then
    case "$kind" in
        hang|process_stall|process_exit|collective_desync|hardware)
            for node in ${hosts//,/ }; do
                run scontrol update "nodename=${node%%.*}" state=drain "reason=scout-sys ${id}: ${kind} rank(s) ${ranks}"
            done ;;
    esac
fi
