"""procfs probe: process state, CPU, context switches, wchan, I/O and exit status, via psutil and /proc.

Cheap (a few file reads per rank) and never touches the job. Besides psutil it reads three raw files:

- ``/proc/PID/task/PID/schedstat``: on-CPU and run-queue nanoseconds of the *main thread* (a rank
  blocked in a collective has a main thread that does not run at all, whatever its helper threads
  do; a straggler's main thread is busy or waiting for a CPU while its peers sleep);
- ``/proc/PID/task/PID/sched``: ``se.exec_start``, when the main thread last ran (hang onset), in
  the task clock of the CPU it ran on (``/proc/PID/task/PID/stat`` field 39): see :class:`SchedClocks`;
- ``/proc/PID/stat`` field 52: the exit status of a zombie;
- the CPU cgroup's ``cpu.stat`` (``/proc/PID/cgroup`` gives its path): how often and how long a
  CPU quota throttled it (:func:`cgroup_throttling`; a rank starved by its container's limit).
"""

from __future__ import annotations

import os
import re
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


CGROUP_ROOT = "/sys/fs/cgroup"


def _cpu_stat(raw: str | None) -> dict[str, int]:
    out = {}
    for line in (raw or "").splitlines():
        k, _, v = line.partition(" ")
        try:
            out[k] = int(v)
        except ValueError:
            continue
    return out


def cgroup_throttling(pid: int, proc: str = PROC, root: str = CGROUP_ROOT
                      ) -> tuple[int | None, int | None, int | None, float | None]:
    """(nr_periods, nr_throttled, throttled ns, quota in CPUs) of the CPU cgroup ``pid`` is in.

    Cgroup v1: the hierarchy with the ``cpu`` controller (``/sys/fs/cgroup/cpu/<path>/cpu.stat``:
    ``throttled_time`` in ns; quota ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``). Cgroup v2: the
    ``0::<path>`` line, under the root (pure v2) or ``unified/`` (hybrid) (``throttled_usec``; quota
    ``cpu.max``). Nones when the files are not there (no CPU controller, no quota ever set)."""
    lines = [ln.split(":", 2) for ln in (_read(f"{proc}/{pid}/cgroup") or "").splitlines()]
    v1 = next((p for p in lines if len(p) == 3 and "cpu" in p[1].split(",")), None)
    if v1 is not None:
        for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            d = f"{root}/{mount}{v1[2].rstrip('/')}"
            st = _cpu_stat(_read(f"{d}/cpu.stat"))
            if "nr_periods" in st:
                quota, period = _int(_read(f"{d}/cpu.cfs_quota_us")), _int(_read(f"{d}/cpu.cfs_period_us"))
                q = quota / period if quota is not None and quota > 0 and period else None
                return st.get("nr_periods"), st.get("nr_throttled"), st.get("throttled_time"), q
    v2 = next((p for p in lines if len(p) == 3 and p[0] == "0" and p[1] == ""), None)
    if v2 is not None:
        for base in (root, f"{root}/unified"):
            d = f"{base}{v2[2].rstrip('/')}"
            st = _cpu_stat(_read(f"{d}/cpu.stat"))
            if "nr_periods" in st:
                us = st.get("throttled_usec")
                mx = (_read(f"{d}/cpu.max") or "").split()
                q = int(mx[0]) / int(mx[1]) if len(mx) == 2 and mx[0].isdigit() and mx[1].isdigit() else None
                return st.get("nr_periods"), st.get("nr_throttled"), None if us is None else us * 1000, q
    return None, None, None, None


def _int(raw: str | None) -> int | None:
    try:
        return int((raw or "").strip())
    except ValueError:
        return None


def _exec_start_ms(raw: str | None) -> float | None:
    for line in (raw or "").splitlines():
        if line.startswith("se.exec_start"):
            try:
                return float(line.split(":", 1)[1])
            except ValueError:
                return None
    return None


def _stat_field(raw: str | None, n: int) -> int | None:
    """Field ``n`` (1-based, as proc(5) numbers them) of a /proc stat line."""
    if not raw:
        return None
    try:
        return int(raw[raw.rindex(")") + 2:].split()[n - 3])
    except (ValueError, IndexError):
        return None


class SchedClocks:
    """Each CPU's scheduler task clock (what ``se.exec_start`` counts in) tied to wall time.

    The task clock leaves out, per CPU, the time the hypervisor stole and the time spent in interrupts:
    on a VM the CPUs' clocks drift apart (seconds after hours of uptime; it is not CLOCK_MONOTONIC
    either). A thread's ``exec_start`` is therefore compared with the clock of the CPU it last ran on:
    we run on that CPU for a moment (``sched_setaffinity`` of our own thread, under a millisecond)
    and read our own ``exec_start``, which is "just now" there; again after ``ttl`` seconds. Where we
    may not run on that CPU (our cpuset excludes it) the CPU we are on stands in for it."""

    def __init__(self, proc: str = PROC, ttl: float = 10.0) -> None:
        self.proc = proc
        self.ttl = ttl
        self._offset: dict[int | None, tuple[float, float]] = {}  # cpu -> (wall - task clock, when read)

    def to_wall(self, exec_start: float, cpu: int | None) -> float | None:
        """Unix time of ``exec_start`` (seconds of ``cpu``'s task clock)."""
        wall = time.time()
        hit = self._offset.get(cpu)
        if hit is None or wall - hit[1] > self.ttl:
            hit = self._calibrate(cpu)
            if hit is None:
                return None
        return min(wall, exec_start + hit[0])

    def _calibrate(self, cpu: int | None) -> tuple[float, float] | None:
        try:
            mask: set[int] | None = os.sched_getaffinity(0)
        except OSError:
            mask = None
        pinned = False
        if cpu is not None and mask is not None and cpu in mask and mask != {cpu}:
            try:
                os.sched_setaffinity(0, {cpu})  # this thread only
                pinned = True
            except OSError:
                pass
        try:
            ms = _exec_start_ms(_read(f"{self.proc}/thread-self/sched"))
            wall = time.time()
            here = _stat_field(_read(f"{self.proc}/thread-self/stat"), 39)
        finally:
            if pinned:
                try:
                    os.sched_setaffinity(0, mask)  # type: ignore[arg-type]
                except OSError:
                    pass
        if ms is None:
            return None
        hit = (wall - ms / 1000.0, wall)
        self._offset[here] = self._offset[cpu] = hit  # where we could not run on ``cpu``, ours stands in
        return hit


def main_thread_last_ran(pid: int, clocks: SchedClocks, proc: str = PROC) -> float | None:
    """Unix time at which the main thread was last put on, or taken off, a CPU (``se.exec_start``)."""
    ms = _exec_start_ms(_read(f"{proc}/{pid}/task/{pid}/sched"))
    if ms is None:
        return None
    return clocks.to_wall(ms / 1000.0, _stat_field(_read(f"{proc}/{pid}/task/{pid}/stat"), 39))


def traced_by_pyspy(pid: int, proc: str = "/proc") -> bool:
    """Whether the process's tracer (/proc/PID/status TracerPid) is a py-spy reading its stack."""
    status = _read(f"{proc}/{pid}/status") or ""
    m = re.search(r"^TracerPid:\s*(\d+)", status, re.M)
    if not m or m.group(1) == "0":
        return False
    return (_read(f"{proc}/{m.group(1)}/comm") or "").strip() == "py-spy"


def zombie_exit(pid: int, proc: str = PROC) -> tuple[int | None, int | None]:
    """(exit code, killing signal) of a zombie, from /proc/PID/stat field 52 (waitpid status)."""
    status = _stat_field(_read(f"{proc}/{pid}/stat"), 52)
    if status is None:
        return None, None
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


class ProcfsProbe:
    name = "procfs"

    def __init__(self, proc: str = PROC, cgroup_root: str = CGROUP_ROOT) -> None:
        self.proc = proc
        self.cgroup_root = cgroup_root
        self.clocks = SchedClocks(proc)
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
        periods, throttled, throttled_ns, quota = cgroup_throttling(pid, self.proc, self.cgroup_root)
        return ProcSample(
            time=now,
            rank=rank,
            pid=pid,
            status=status,
            paused_by_pyspy=status == "tracing-stop" and traced_by_pyspy(pid, self.proc),
            cpu_time=cpu.user + cpu.system,
            main_cpu_ns=main_cpu,
            main_delay_ns=main_delay,
            main_last_ran=main_thread_last_ran(pid, self.clocks, self.proc),
            cg_periods=periods,
            cg_throttled=throttled,
            cg_throttled_ns=throttled_ns,
            cg_quota=quota,
            ctx_switches=ctx.voluntary + ctx.involuntary,
            main_voluntary=ctx.voluntary,  # /proc/PID/status: the main thread's own counts
            num_threads=nthreads,
            wchan=None if wchan in ("", "0") else wchan,
            write_chars=wchars,
            read_chars=rchars,
        )

    def close(self) -> None:
        self._procs.clear()
