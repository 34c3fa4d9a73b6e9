#!/bin/bash
# scout-sys-node-watch: follow whatever job runs on this node, one job after another (the command of
# the Kubernetes DaemonSet and of a node-level container; docs/deploy.md).
#
# Each round is one `scout-sys watch --job $SCOUT_SYS_SELECTOR --headless`: it waits (one status line
# on stderr) until rank processes carrying the variable appear, follows that job until it ends, and the
# loop starts the next round. Default selector: env:TORCHELASTIC_RUN_ID, which torchrun sets in every
# rank, so any torchrun job is found, in its container or not. Extra arguments go to every watch, e.g.
#   scout-sys-node-watch --prometheus 9464 --events /var/log/scout-sys/events.jsonl
# SIGTERM / SIGINT stop the current watch cleanly (probes detached) and end the loop with status 0.
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
  scout-sys watch --job "$selector" --headless "$@" &
  child=$!
  wait "$child"
  rc=$?
  child=""
  if [ "$rc" -eq 2 ]; then
    # could not watch (two jobs on the node at once, a bad option): say so and retry, slowly
    echo "scout-sys-node-watch: watch could not follow a job (exit 2, see above); retrying in 30 s" >&2
    sleep 30 &
  else
    sleep 1 &
  fi
  child=$!
  wait "$child"
  child=""
done
