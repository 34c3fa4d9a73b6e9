#!/bin/bash
# Slurm Prolog (slurm.conf: Prolog=/etc/scout-sys/slurm/prolog.sh, on every compute node): start a
# watch of this job on this node, in the background, before any process of the job exists; it waits
# for the job's ranks (env:SLURM_JOB_ID=...) and follows them. epilog.sh stops it.
# Never fails or delays the job: whatever happens here, the exit status is 0.
# Settings (environment, e.g. from /etc/default/scout-sys sourced below):
#   SCOUT_SYS          the binary (default /usr/local/bin/scout-sys, where `make install` links it)
#   SCOUT_SYS_RUN_DIR  pid files (default /run/scout-sys)
#   SCOUT_SYS_LOG_DIR  each job's log and events (default /var/log/scout-sys)
#   SCOUT_SYS_ARGS     more watch options, e.g. "--no-replay". Not --prometheus PORT: two jobs on one
#                      node would ask for the same port (the second watch exits 2); for metrics run one
#                      monitor per node instead (the systemd unit: watch --every-job, docs/deploy.md)
# A missing binary is said once in the system log (logger -t scout-sys), never to the job.
run() {
  [ -r /etc/default/scout-sys ] && . /etc/default/scout-sys
  local bin="${SCOUT_SYS:-/usr/local/bin/scout-sys}"
  local run_dir="${SCOUT_SYS_RUN_DIR:-/run/scout-sys}" log_dir="${SCOUT_SYS_LOG_DIR:-/var/log/scout-sys}"
  local job="${SLURM_JOB_ID:-}"
  [[ "$job" =~ ^[0-9A-Za-z_.-]+$ ]] || return 0
  if [ ! -x "$bin" ]; then
    logger -t scout-sys "prolog: job $job not watched: no $bin (set SCOUT_SYS in /etc/default/scout-sys)"
    return 0
  fi
  # the log folder is 0711: the epilog hands each job's own log to its user, who can read it by name
  mkdir -p -m 0700 "$run_dir" && mkdir -p "$log_dir" && chmod 0711 "$log_dir" || return 0
  # shellcheck disable=SC2086  # SCOUT_SYS_ARGS is a list of options
  setsid "$bin" watch --job "env:SLURM_JOB_ID=$job" --headless \
    --events "$log_dir/job-$job.events.jsonl" ${SCOUT_SYS_ARGS:-} \
    </dev/null >>"$log_dir/job-$job.log" 2>&1 &
  echo "$!" >"$run_dir/watch-$job.pid"
}
run 2>/dev/null
exit 0
