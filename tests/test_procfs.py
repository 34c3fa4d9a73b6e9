"""The procfs probe on real processes: a rank held in tracing-stop by py-spy (a native dump's
momentary pause) is told apart from one held by any other tracer (a debugger); when a sleeping main
thread last ran is right whichever CPU it ran on (each CPU's scheduler clock drifts apart on a VM)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from scout_sys.model import Job, Rank
from scout_sys.probes.procfs import ProcfsProbe

TRACER = """
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(15, sys.argv[2].encode(), 0, 0, 0)  # PR_SET_NAME: what /proc/PID/comm shows
target = int(sys.argv[1])
for request in (0x4206, 0x4207):  # PTRACE_SEIZE, then PTRACE_INTERRUPT: the target stops, traced
    assert libc.ptrace(ctypes.c_long(request), ctypes.c_long(target), None, None) == 0, ctypes.get_errno()
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="tracing another process needs root (or ptrace_scope 0)")
@pytest.mark.parametrize("tracer,by_pyspy", [("py-spy", True), ("gdb", False)])
def test_tracing_stop_names_whether_py_spy_holds_it(tracer: str, by_pyspy: bool) -> None:
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    holder = subprocess.Popen([sys.executable, "-c", TRACER, str(target.pid), tracer], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        probe = ProcfsProbe()
        probe.start(Job(ranks=(Rank(rank=0, pid=target.pid, host=socket.gethostname()),), world_size=1,
                        launcher="explicit", launcher_pid=None, host=socket.gethostname()))
        end = time.time() + 30
        while (s := probe.sample(time.time())[0]).status != "tracing-stop" and time.time() < end:
            time.sleep(0.05)
        assert (s.status, s.paused_by_pyspy, s.stopped) == ("tracing-stop", by_pyspy, not by_pyspy)
    finally:
        for p in (holder, target):
            p.send_signal(signal.SIGKILL)
            p.wait(10)


SLEEPER = """
import sys, time
print(time.time(), flush=True)
sys.stdout.close()
time.sleep(60)
"""


@pytest.mark.parametrize("cpu", sorted(os.sched_getaffinity(0)))
def test_main_thread_last_ran_is_read_in_the_clock_of_its_cpu(cpu: int) -> None:
    # On this VM the CPUs' task clocks are seconds apart (steal time): read in the clock of the CPU we
    # happen to run on, a thread asleep for 1 s looked asleep for 10 s, or running.
    sleeper = subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert sleeper.stdout is not None
        went_to_sleep = float(sleeper.stdout.readline())
        time.sleep(1.0)
        probe = ProcfsProbe()
        probe.start(Job(ranks=(Rank(rank=0, pid=sleeper.pid, host=socket.gethostname()),), world_size=1,
                        launcher="explicit", launcher_pid=None, host=socket.gethostname()))
        mask = os.sched_getaffinity(0)
        for reader_cpu in sorted(mask):  # whichever CPU the watch runs on: move there, free to move on
            os.sched_setaffinity(0, {reader_cpu})
            os.sched_setaffinity(0, mask)
            s = probe.sample(time.time())[0]
            assert s.status == "sleeping" and s.main_last_ran is not None
            # the skew this guards against is seconds (8.7 s on a VM up for hours); 1.5 s of slack is load
            assert abs(s.main_last_ran - went_to_sleep) < 1.5, (cpu, reader_cpu, s.main_last_ran - went_to_sleep)
    finally:
        sleeper.kill()
        sleeper.wait(10)


def test_cgroup_throttling_counters_v1_and_v2(tmp_path):
    from scout_sys.probes.procfs import cgroup_throttling

    proc, root = tmp_path / "proc", tmp_path / "cg"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text("3:cpuset:/\n2:cpu,cpuacct:/slow\n0::/\n")
    v1 = root / "cpu,cpuacct" / "slow"
    v1.mkdir(parents=True)
    (v1 / "cpu.stat").write_text("nr_periods 30\nnr_throttled 25\nthrottled_time 2400000000\n")
    (v1 / "cpu.cfs_quota_us").write_text("12000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_throttling(7, str(proc), str(root)) == (30, 25, 2_400_000_000, 0.12)
    # v2 (pure, at the root): throttled_usec, cpu.max; "max" is no quota
    (proc / "7" / "cgroup").write_text("0::/job/rank3\n")
    v2 = root / "job" / "rank3"
    v2.mkdir(parents=True)
    (v2 / "cpu.stat").write_text("usage_usec 9\nnr_periods 10\nnr_throttled 4\nthrottled_usec 300000\n")
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_throttling(7, str(proc), str(root)) == (10, 4, 300_000_000, None)
    (v2 / "cpu.max").write_text("5000 100000\n")
    assert cgroup_throttling(7, str(proc), str(root))[3] == 0.05
    # no CPU controller files: Nones
    (proc / "7" / "cgroup").write_text("0::/elsewhere\n")
    assert cgroup_throttling(7, str(proc), str(root)) == (None, None, None, None)
