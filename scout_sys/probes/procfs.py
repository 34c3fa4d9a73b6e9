"""procfs probe: process state, CPU, context switches, wchan, I/O and exit status, via psutil and /proc.

Cheap (a few file reads per rank) and never touches the job. Besides psutil it reads three raw files:

- ``/proc/PID/task/PID/schedstat``: on-CPU and run-queue nanoseconds of the *main thread* (a rank
  blocked in a collective has a main thread that does not run at all, whatever its helper threads
  do; a straggler's main thread is busy or waiting for a CPU while its peers sleep);
- ``/proc/PID/task/PID/sched``: ``se.exec_start``, when the main thread last ran (hang onset);
- ``/proc/PID/stat`` field 52: the exit status of a zombie.
"""

from __future__ import annotations

import os
import time

import psutil

from scout_sys.model import Job, ProcSample
from scout_sys.probes import Health

PROC = "/proc"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def main_thread_schedstat(pid: int, proc: str = PROC) -> tuple[int | None, int | None]:
    """(on-CPU ns, run-queue wait ns) of the main thread: the first two fields of schedstat."""
    raw = _read(f"{proc}/{pid}/task/{pid}/schedstat")
    try:
        f = raw.split() if raw else []
        return int(f[0]), int(f[1])
    except (ValueError, IndexError):
        return None, None


def _exec_start_ms(raw: str | None) -> float | None:
    for line in (raw or "").splitlines():
        if line.startswith("se.exec_start"):
            try:
                return float(line.split(":", 1)[1])
            except ValueError:
                return None
    return None


def sched_clock_now(proc: str = PROC) -> float | None:
    """The scheduler clock (seconds) now. It is not CLOCK_MONOTONIC (on VMs they drift apart by
    seconds), so we read it off ourselves: the running thread's ``exec_start`` is "just now"."""
    ms = _exec_start_ms(_read(f"{proc}/thread-self/sched"))
    return None if ms is None else ms / 1000.0


def main_thread_last_ran(pid: int, proc: str = PROC, now: float | None = None,
                         sched_now: float | None = None) -> float | None:
    """Unix time at which the main thread was last put on a CPU (from ``se.exec_start``)."""
    ms = _exec_start_ms(_read(f"{proc}/{pid}/task/{pid}/sched"))
    ref = sched_clock_now(proc) if sched_now is None else sched_now
    if ms is None or ref is None:
        return None
    wall = time.time() if now is None else now
    return wall - max(0.0, ref - ms / 1000.0)


def zombie_exit(pid: int, proc: str = PROC) -> tuple[int | None, int | None]:
    """(exit code, killing signal) of a zombie, from /proc/PID/stat field 52 (waitpid status)."""
    raw = _read(f"{proc}/{pid}/stat")
    if not raw:
        return None, None
    try:
        fields = raw[raw.rindex(")") + 2:].split()
        status = int(fields[52 - 3])
    except (ValueError, IndexError):
        return None, None
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


class ProcfsProbe:
    name = "procfs"

    def __init__(self, proc: str = PROC) -> None:
        self.proc = proc
        self._procs: dict[int, tuple[int, psutil.Process | None, float]] = {}  # rank -> (pid, p, ctime)

    def check(self) -> str | None:
        return None if os.path.isdir(f"{self.proc}/self") else f"{self.proc} is not mounted"

    def start(self, job: Job) -> None:
        for r in job.ranks:
            try:
                p = psutil.Process(r.pid)
                self._procs[r.rank] = (r.pid, p, p.create_time())
            except psutil.Error:
                self._procs[r.rank] = (r.pid, None, 0.0)

    def sample(self, now: float | None = None) -> list[ProcSample]:
        return [self._one(rank, pid, p, ctime, now) for rank, (pid, p, ctime) in self._procs.items()]

    def health(self) -> Health:
        return Health()

    def _one(self, rank: int, pid: int, p: psutil.Process | None, ctime: float, now: float | None) -> ProcSample:
        now = time.time() if now is None else now
        if p is None:
            return ProcSample(time=now, rank=rank, pid=pid, status="gone")
        try:
            with p.oneshot():
                if p.create_time() != ctime:  # pid reused: ours is gone
                    return ProcSample(time=now, rank=rank, pid=pid, status="gone")
                status = p.status()
                if status == psutil.STATUS_ZOMBIE:
                    code, sig = zombie_exit(pid, self.proc)
                    return ProcSample(time=now, rank=rank, pid=pid, status="zombie",
                                      exit_code=code, exit_signal=sig)
                cpu = p.cpu_times()
                ctx = p.num_ctx_switches()
                nthreads = p.num_threads()
                try:
                    io = p.io_counters()
                    wchars, rchars = io.write_chars, io.read_chars
                except (psutil.AccessDenied, AttributeError):
                    wchars = rchars = None
        except psutil.ZombieProcess:
            code, sig = zombie_exit(pid, self.proc)
            return ProcSample(time=now, rank=rank, pid=pid, status="zombie", exit_code=code, exit_signal=sig)
        except psutil.NoSuchProcess:
            return ProcSample(time=now, rank=rank, pid=pid, status="gone")
        except psutil.AccessDenied:
            return ProcSample(time=now, rank=rank, pid=pid, status="unknown")
        main_cpu, main_delay = main_thread_schedstat(pid, self.proc)
        wchan = (_read(f"{self.proc}/{pid}/wchan") or "").strip()
        return ProcSample(
            time=now,
            rank=rank,
            pid=pid,
            status=status,
            cpu_time=cpu.user + cpu.system,
            main_cpu_ns=main_cpu,
            main_delay_ns=main_delay,
            main_last_ran=main_thread_last_ran(pid, self.proc, now),
            ctx_switches=ctx.voluntary + ctx.involuntary,
            num_threads=nthreads,
            wchan=None if wchan in ("", "0") else wchan,
            write_chars=wchars,
            read_chars=rchars,
        )

    def close(self) -> None:
        self._procs.clear()
