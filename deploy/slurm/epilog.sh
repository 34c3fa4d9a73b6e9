#!/bin/bash
# Slurm Epilog (slurm.conf: Epilog=/etc/scout-sys/slurm/epilog.sh): stop the watch prolog.sh started
# for this job (SIGTERM: the probes are detached and the log says "watch stopped"; SIGKILL after 15 s).
# Only a process that is still that watch is signalled (a pid file may outlive its process).
# Then the job's log and events file go to the job's user (SLURM_JOB_UID: they read their own verdict,
# and no one else's), and logs older than SCOUT_SYS_LOG_DAYS days (default 14) are removed.
# Never fails the job: the exit status is always 0.
run() {
  [ -r /etc/default/scout-sys ] && . /etc/default/scout-sys
  local run_dir="${SCOUT_SYS_RUN_DIR:-/run/scout-sys}" job="${SLURM_JOB_ID:-}"
  [[ "$job" =~ ^[0-9A-Za-z_.-]+$ ]] || return 0
  stop_watch "$run_dir" "$job"
  local log_dir="${SCOUT_SYS_LOG_DIR:-/var/log/scout-sys}" uid="${SLURM_JOB_UID:-}" days="${SCOUT_SYS_LOG_DAYS:-14}"
  if [[ "$uid" =~ ^[0-9]+$ ]]; then
    chown -- "$uid" "$log_dir/job-$job.log" "$log_dir/job-$job.events.jsonl" 2>/dev/null
  fi
  [[ "$days" =~ ^[0-9]+$ ]] && find "$log_dir" -maxdepth 1 -type f -name 'job-*' -mtime "+$days" -delete
  return 0
}
stop_watch() {
  local run_dir="$1" job="$2"
  local pidfile="$run_dir/watch-$job.pid" pid
  [ -f "$pidfile" ] || return 0
  pid="$(cat "$pidfile")"
  rm -f "$pidfile"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- " watch --job env:SLURM_JOB_ID=$job " || return 0
  kill -TERM "$pid" || return 0
  for _ in $(seq 30); do
    [ -e "/proc/$pid" ] || return 0
    sleep 0.5
  done
  kill -KILL "$pid"
}
run 2>/dev/null
exit 0
