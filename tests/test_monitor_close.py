"""Monitor.close() never waits forever for a probe still starting (bcc compiling for seconds): it
returns after its timeout, and the probe, once started, is detached at once.

The probe here is gated by the test (its start blocks until released), the only way to hold a
start for as long as a test needs at any load; everything else is the real Monitor on this process."""

from __future__ import annotations

import os
import socket
import threading

from scout_sys.model import Job, Rank
from scout_sys.monitor import Interrupted, Monitor
from scout_sys.probes import Health


def _returns(call, timeout: float = 30.0) -> bool:
    """``call()`` in a thread returned within ``timeout`` s (it ends at all while the gate holds for 60 s)."""
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(timeout)
    return not t.is_alive()


class GatedProbe:
    name = "gated"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.attached = False
        self.closed = threading.Event()

    def check(self) -> str | None:
        return None

    def start(self, job: Job) -> None:
        self.entered.set()
        self.release.wait(60)
        self.attached = True

    def sample(self, now: float) -> list:
        return []

    def health(self) -> Health:
        return Health()

    def close(self) -> None:
        self.attached = False
        self.closed.set()


def test_close_returns_while_a_probe_still_starts_and_the_probe_detaches_after() -> None:
    me = Job(ranks=(Rank(rank=0, pid=os.getpid(), host=socket.gethostname()),), world_size=1,
             launcher="explicit", launcher_pid=None, host=socket.gethostname())
    probe = GatedProbe()
    mon = Monitor(me, extra_probes=[probe])
    mon.start()
    assert probe.entered.wait(60)
    mon.close(timeout=0.1)  # returns although the probe's start has not: it would block for 60 s
    assert not probe.release.is_set() and not probe.closed.is_set()
    probe.release.set()  # compiling done: the start thread sees the monitor closed and detaches it
    assert probe.closed.wait(60) and not probe.attached


def test_a_probe_detaching_late_never_holds_the_monitor_lock_and_a_person_waits_briefly() -> None:
    # `q` in the dashboard: close(background=True) waits a moment only; the probe that finishes
    # compiling after it detaches (seconds, for uprobes) without holding the lock the monitor needs
    me = Job(ranks=(Rank(rank=0, pid=os.getpid(), host=socket.gethostname()),), world_size=1,
             launcher="explicit", launcher_pid=None, host=socket.gethostname())
    probe = GatedProbe()
    detaching, done = threading.Event(), threading.Event()

    def slow_close() -> None:
        detaching.set()
        done.wait(60)
        GatedProbe.close(probe)

    probe.close = slow_close  # type: ignore[method-assign]
    mon = Monitor(me, extra_probes=[probe])
    mon.start()
    assert probe.entered.wait(60)
    # close(background=True) returns while the probe's start still blocks (it would for 60 s): it ends
    # at all before the test lets the start go
    assert _returns(lambda: mon.close(background=True)), "close(background=True) waited for the probe's start"
    assert not probe.release.is_set()
    probe.release.set()
    assert detaching.wait(60)  # the probe thread detaches it now...
    on: list[bool] = []
    assert _returns(lambda: on.append(mon._on(probe)))  # ...and the lock is free meanwhile
    assert on == [False] and not done.is_set()  # answered while the detach still blocks
    done.set()
    assert probe.closed.wait(60) and not probe.attached


def test_an_interrupted_window_stops_at_its_next_sample_and_judges_nothing() -> None:
    """q while a watch's confirmation window runs: the window raises at its next sample instead of
    running to its end (the prompt waits for the poll in flight)."""
    me = Job(ranks=(Rank(rank=0, pid=os.getpid(), host=socket.gethostname()),), world_size=1,
             launcher="explicit", launcher_pid=None, host=socket.gethostname())
    mon = Monitor(me)
    mon.start()
    raised: list[BaseException] = []

    def window() -> None:
        try:
            mon.collect(3600.0, proc_interval=0.25, stack_interval=3600.0)  # an hour, unless interrupted
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            raised.append(e)

    try:
        t = threading.Thread(target=window, daemon=True)
        t.start()
        threading.Timer(0.3, mon.interrupt).start()  # q, while the window runs
        t.join(60)  # ends at all: it stops at its next sample, not at the hour's end
        assert not t.is_alive(), "the interrupted window ran on"
        assert [type(e) for e in raised] == [Interrupted], raised
    finally:
        mon.close()


_FORK_BESIDE_A_SPAWN = r"""
import os, sys
from scout_sys.monitor import detach_in_child

class Held:  # a probe handed to the child: it holds nothing here
    def handoff(self): pass
    def close(self): pass

r, w = os.pipe()  # what another thread's spawn in flight holds: its child's exec-status pipe, its stdout
assert detach_in_child([Held()])
os.close(w)
os.set_blocking(r, False)
import select
ready, _, _ = select.select([r], [], [], 10)
print("eof" if ready and os.read(r, 1) == b"" else "held open by the detaching child")
"""


def test_the_detaching_child_keeps_no_fd_of_another_threads_work() -> None:
    # the child lives until this process exits: a pipe end it kept would make another thread's
    # subprocess (py-spy, a hook) wait for ever for its EOF (watch --every-job hung at SIGTERM so)
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FORK_BESIDE_A_SPAWN], capture_output=True, text=True, timeout=60,
                         check=False)
    assert (out.returncode, out.stdout.strip()) == (0, "eof"), out.stderr
