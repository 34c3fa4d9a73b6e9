#!/bin/bash
# scout-sys-node-watch: follow every job that runs on this node, each apart (the command of
# the Kubernetes DaemonSet and of a node-level container; docs/deploy.md).
#
# It runs `scout-sys watch --job $SCOUT_SYS_SELECTOR --every-job`: one monitor for the node that follows
# every job whose ranks carry the variable, each apart (its own incidents, bundles and probes; its job
# label on every event and metrics series; one metrics port for the node), new jobs as they start.
# Default selector: env:TORCHELASTIC_RUN_ID, which torchrun sets in every rank, so any torchrun job is
# found, in its container or not. Extra arguments go to the watch, e.g.
#   scout-sys-node-watch --prometheus 9464 --events /var/log/scout-sys/events.jsonl
# A watch that could not start (exit 2: a bad option, a port in use) is retried every 30 s.
# SIGTERM / SIGINT stop the watch cleanly (every job's probes detached) and end the loop with status 0.
set -u
selector="${SCOUT_SYS_SELECTOR:-env:TORCHELASTIC_RUN_ID}"
child=""

stop() {
  if [ -n "$child" ]; then
    kill -TERM "$child" 2>/dev/null
    wait "$child" 2>/dev/null
  fi
  exit 0
}
trap stop TERM INT

while :; do
  scout-sys watch --job "$selector" --every-job "$@" &
  child=$!
  wait "$child"
  rc=$?
  child=""
  if [ "$rc" -eq 2 ]; then
    # could not watch (a bad option, the metrics port in use): say so and retry, slowly
    echo "scout-sys-node-watch: the watch could not start (exit 2, see above); retrying in 30 s" >&2
    sleep 30 &
  else
    sleep 1 &
  fi
  child=$!
  wait "$child"
  child=""
done
