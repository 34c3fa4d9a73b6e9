"""scout_sys/watch/sample.py on its own: which rank counts as dead (stopped or gone; a py-spy dump's
pause is neither), and one poll's cheap sample of real processes: /proc for every rank, stacks only of
live ones, in turn, five times less often once eBPF sees every live rank's collectives."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from scout_sys.model import CollectiveSample, ProcSample
from scout_sys.model_job import Job, Rank
from scout_sys.monitor import Monitor
from scout_sys.watch.progress import Progress, Rotation
from scout_sys.watch.sample import cheap_sample, dead


@pytest.mark.parametrize(("status", "paused_by_pyspy", "expected"), [
    ("running", False, False),
    ("sleeping", False, False),
    ("disk-sleep", False, False),
    ("stopped", False, True),  # SIGSTOP
    ("tracing-stop", False, True),  # a debugger holds it
    ("tracing-stop", True, False),  # our own native dump's moment: not a stop
    ("stopped", True, False),
    ("zombie", False, True),
    ("gone", False, True),
])
def test_dead_is_stopped_or_gone_never_a_py_spy_pause(status, paused_by_pyspy, expected):
    p = ProcSample(time=1.0, rank=0, pid=1, status=status, paused_by_pyspy=paused_by_pyspy)
    assert dead(p) is expected


def _job(pids: list[int]) -> Job:
    host = socket.gethostname()
    return Job(ranks=tuple(Rank(rank=i, pid=p, host=host) for i, p in enumerate(pids)), world_size=len(pids),
               launcher="explicit", launcher_pid=None, host=host)


def _processes():
    """A live Python rank, a stopped one, a zombie (exited, not reaped) and a gone one (reaped)."""
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    stopped = subprocess.Popen(["sleep", "600"])
    os.kill(stopped.pid, signal.SIGSTOP)
    os.waitid(os.P_PID, stopped.pid, os.WSTOPPED | os.WNOWAIT)  # stopped now, not in a moment
    zombie = subprocess.Popen(["true"])
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # exited, left unreaped
    gone = subprocess.Popen(["true"])
    gone.wait()
    return live, stopped, zombie, gone


def _end(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_one_poll_reads_proc_for_every_rank_and_stacks_of_live_ones_only():
    procs = _processes()
    live, stopped, zombie, gone = procs
    mon = Monitor(_job([p.pid for p in procs]))
    try:
        mon.start()
        progress, rotation = Progress(), Rotation(period=4.0, interval=0.5, max_per_poll=4)
        now = 1000.0
        samples, batch, stacks = cheap_sample(mon, progress, rotation, now)
        assert [(s.rank, s.pid, s.time) for s in samples] == [(i, p.pid, now) for i, p in enumerate(procs)]
        assert [s.status for s in samples[1:]] == ["stopped", "zombie", "gone"]
        assert [dead(s) for s in samples] == [False, True, True, True]
        assert [(s.rank, s.pid) for s in stacks] == [(0, live.pid)]  # never a stopped or gone rank's
        assert batch == [*samples, *stacks]  # no other probe here: /proc, then the stacks
        assert sorted(progress.pauses()) == [0, 1]  # progress saw the /proc samples (gone ones are forgotten)
    finally:
        mon.close()
        _end(*procs)


def test_rotation_takes_the_live_ranks_in_turn():
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(3)]
    mon = Monitor(_job([p.pid for p in procs]))
    try:
        mon.start()
        progress = Progress()
        rotation = Rotation(period=1.0, interval=0.5, max_per_poll=4)  # 2 of 3 ranks a poll
        taken = [[s.rank for s in cheap_sample(mon, progress, rotation, 1000.0 + k)[2]] for k in range(3)]
        assert taken == [[0, 1], [0, 2], [1, 2]]  # 0,1 then 2,0 then 1,2; each poll's read in rank order
    finally:
        mon.close()
        _end(*procs)


def _seen_by_ebpf(rank: int, pid: int, t: float) -> CollectiveSample:
    return CollectiveSample(time=t, rank=rank, pid=pid, backend="gloo", group="gloo:0", seq=7, completed=7,
                            inside=False, last_enter=t, last_exit=t, last=None)


def test_stacks_are_read_five_times_less_often_once_ebpf_sees_every_live_rank():
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    mon = Monitor(_job([p.pid for p in procs]))
    try:
        mon.start()
        progress, rotation = Progress(), Rotation(period=1.0, interval=1.0, max_per_poll=4)  # every rank a poll
        assert [s.rank for s in cheap_sample(mon, progress, rotation, 1000.0)[2]] == [0, 1]
        progress.observe([_seen_by_ebpf(0, procs[0].pid, 1000.0)], 1000.0)  # one rank is not enough
        assert [s.rank for s in cheap_sample(mon, progress, rotation, 1001.0)[2]] == [0, 1]
        progress.observe([_seen_by_ebpf(1, procs[1].pid, 1001.0)], 1001.0)
        taken = [[s.rank for s in cheap_sample(mon, progress, rotation, 1002.0 + k)[2]] for k in range(5)]
        assert taken == [[], [], [0, 1], [], []]  # the rotation's 5th poll, then 4 without a stack
    finally:
        mon.close()
        _end(*procs)
