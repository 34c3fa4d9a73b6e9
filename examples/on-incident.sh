#!/usr/bin/env bash
# An --on-incident hook for scout-sys watch: post the incident to a webhook (Slack-style {"text": ...})
# and, with --drain, drain the Slurm node(s) of an attributed incident whose cause lies in the node:
# `hardware` (its GPU reports ECC errors or slows itself down), `sdc` on a GPU (it computes other bits
# than its peers; on a CPU device the cause is usually the rank's environment — its ATEN_CPU_CAPABILITY
# or thread count, in the evidence's `context` — not the silicon), or a `straggler` that replay confirmed is a slow device (unless it is starved of CPU:
# throttled or contended, which its replay worker shares). Never for `hang`,
# `collective_desync`, `process_stall`, `process_exit` or a straggler replay cleared: those are
# usually the job's code, its input pipeline or the network, and draining a healthy node for them
# only shrinks the cluster (docs/runbook.md says whose each verdict is).
#
#   sudo scout-sys watch --job PID --headless --on-incident-user root --on-incident-all \
#        --on-incident '/usr/local/bin/on-incident.sh --webhook https://hooks.example/T0/B0/x --drain'
#
# (--on-incident-all: a watch's straggler is confirmed by replay in an incident_updated event.)
# Hooks run as nobody unless --on-incident-user says otherwise. To drain without root, run the hook as an
# account of its own (--on-incident-user scout-hook) with --sudo-as slurm: the drain runs as
# `sudo -n -u slurm scontrol update nodename=N state=drain reason=scout-sys/ID/KIND/ranks/R`, exactly what
# the sudoers rule in docs/metrics.md allows that account (never grant it to nobody, which daemons share).
#
# The event JSON (as `watch --headless --json` prints it) is on stdin; SCOUT_SYS_EVENT, _INCIDENT,
# _KIND, _STATUS, _RANKS, _HOSTS and _BUNDLE are in the environment (docs/metrics.md).
# --dry-run prints what it would do instead of doing it:
#
#   scout-sys watch ... --headless --json | head -1 | examples/on-incident.sh --dry-run --webhook URL --drain
set -euo pipefail

usage() { echo "usage: $0 [--webhook URL] [--drain [--sudo-as USER]] [--dry-run]" >&2; exit 2; }
webhook="${SCOUT_SYS_WEBHOOK:-}" drain=0 dry=0 sudo_as=""
while [ $# -gt 0 ]; do
    case "$1" in
        --webhook) [ $# -ge 2 ] || usage; webhook="$2"; shift 2 ;;
        --drain) drain=1; shift ;;
        --sudo-as) [ $# -ge 2 ] || usage; sudo_as="$2"; shift 2 ;;
        --dry-run) dry=1; shift ;;
        *) usage ;;
    esac
done

event_json="$(cat)"
# Fields from the JSON itself (one python3 for all), so that the script also works on a saved event line
# (--dry-run); the SCOUT_SYS_* variables the watch sets win when present.
fields="$(printf '%s' "$event_json" | python3 -c '
import json, shlex, sys
e = json.load(sys.stdin)
i = e.get("incident") or {}
# a slow device, as replay measured it: device_slow on a watch straggler that replay explained (false:
# not the device), peer_median on a straggler replay found itself
slow = any(x.get("source") == "replay" and x.get("device_slow", "peer_median" in x) is True
           for x in i.get("evidence") or [])
# a rank starved of CPU (its cgroup quota, or contention): its replay worker shares that cgroup and those
# cores, so its "slow device" is the same starvation; fix the quota or the neighbour, keep the node
slow = slow and not any(x.get("cause") in ("throttled", "contended") for x in i.get("evidence") or [])
# an sdc named on a GPU (replay evidence per divergent device: "cuda:3"; a CPU worker is "cpu/rank2")
gpu_sdc = any(x.get("source") == "replay" and "kernels" in x and not str(x.get("device", "cpu")).startswith("cpu")
              for x in i.get("evidence") or [])
for k, v in {"j_event": e.get("event", ""), "j_id": i.get("id", ""), "j_kind": i.get("kind", ""),
             "j_status": i.get("status", ""), "j_ranks": ",".join(map(str, i.get("ranks", []))),
             "j_hosts": ",".join(i.get("hosts", [])), "j_bundle": e.get("bundle") or "",
             "summary": i.get("summary", ""), "slow_device": "1" if slow else "", "gpu_sdc": "1" if gpu_sdc else ""}.items():
    print(f"{k}={shlex.quote(str(v))}")
')"  # not JSON: python3 fails, and so does the script (set -e)
eval "$fields"
event="${SCOUT_SYS_EVENT:-$j_event}"
id="${SCOUT_SYS_INCIDENT:-$j_id}"
kind="${SCOUT_SYS_KIND:-$j_kind}"
status="${SCOUT_SYS_STATUS:-$j_status}"
ranks="${SCOUT_SYS_RANKS-$j_ranks}"
hosts="${SCOUT_SYS_HOSTS-$j_hosts}"
bundle="${SCOUT_SYS_BUNDLE-$j_bundle}"

run() {  # run a command, or print it (shell-quoted) with --dry-run
    if [ "$dry" = 1 ]; then printf 'would run:'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

text="scout-sys ${event#incident_} ${id}: ${kind} (${status})${ranks:+ rank(s) ${ranks}}${hosts:+ on ${hosts}}: ${summary}${bundle:+ — evidence: ${bundle}}"
if [ -n "$webhook" ]; then
    payload="$(TEXT="$text" python3 -c 'import json,os; print(json.dumps({"text": os.environ["TEXT"]}))')"
    run curl --silent --show-error --fail --max-time 20 -H 'Content-Type: application/json' \
        --data "$payload" "$webhook"
fi

# Drain only for an attributed incident whose cause lies in the node; an inconclusive verdict names no node.
in_node() {
    case "$kind" in
        hardware) return 0 ;;
        sdc) [ -n "$gpu_sdc" ] ;;  # on a GPU; on a CPU device, compare the evidence's context first
        straggler) [ -n "$slow_device" ] ;;  # a slow device, as replay measured it (not input or network)
        *) return 1 ;;
    esac
}
case "$event" in incident_opened|incident_updated) opened=1 ;; *) opened=0 ;; esac
if [ "$drain" = 1 ] && [ "$opened" = 1 ] && [ "$status" = attributed ] && [ -n "$hosts" ] && in_node; then
    # one word, of the characters the sudoers rule of docs/metrics.md allows (scontrol shows it as is)
    reason="scout-sys/${id}/${kind}/ranks/${ranks//,/+}"
    reason="${reason//[^A-Za-z0-9_.\/+-]/_}"
    for node in ${hosts//,/ }; do
        run ${sudo_as:+sudo -n -u "$sudo_as"} scontrol update "nodename=${node%%.*}" state=drain "reason=$reason"
    done
fi
