#!/bin/bash
# Run one job step with this node's watch beside it, from a batch script:
#   srun --ntasks-per-node=1 /etc/scout-sys/slurm/watch-step.sh torchrun --nnodes "$SLURM_NNODES" ... train.py
# The watch starts first (it waits for the step's ranks: env:SLURM_JOB_ID=$SLURM_JOB_ID) and is stopped
# when the command ends. The monitor never fails the step: a missing or failing scout-sys is ignored,
# and the exit status is the command's. Its lines go to $SCOUT_SYS_LOG_DIR/job-ID.node.log.
# SIGTERM / SIGINT (scancel) go to the command.
[ "$#" -gt 0 ] || { echo "usage: watch-step.sh COMMAND [ARG...]" >&2; exit 2; }
bin="${SCOUT_SYS:-/usr/local/bin/scout-sys}"
log_dir="${SCOUT_SYS_LOG_DIR:-/var/log/scout-sys}"
job="${SLURM_JOB_ID:-}"
watch=""
if [[ "$job" =~ ^[0-9A-Za-z_.-]+$ ]] && [ -x "$bin" ] && mkdir -p -m 0700 "$log_dir" 2>/dev/null; then
  # shellcheck disable=SC2086  # SCOUT_SYS_ARGS is a list of options
  "$bin" watch --job "env:SLURM_JOB_ID=$job" --headless ${SCOUT_SYS_ARGS:-} \
    </dev/null >>"$log_dir/job-$job.$(hostname -s).log" 2>&1 &
  watch=$!
fi

"$@" &
cmd=$!
trap 'kill -TERM "$cmd" 2>/dev/null' TERM
trap 'kill -INT "$cmd" 2>/dev/null' INT
while :; do
  wait "$cmd"
  rc=$?
  kill -0 "$cmd" 2>/dev/null || break  # ended (else: a trap interrupted the wait)
done

if [ -n "$watch" ] && kill -TERM "$watch" 2>/dev/null; then
  for _ in $(seq 30); do
    kill -0 "$watch" 2>/dev/null || break
    sleep 0.5
  done
  kill -KILL "$watch" 2>/dev/null
  wait "$watch" 2>/dev/null
fi
exit "$rc"
