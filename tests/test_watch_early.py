"""The watch's early probes (scout_sys/watch/early.py): prepared from the selected processes before the
ranks exist, retried while no NCCL library is there yet, leased to each Monitor without detaching."""

from __future__ import annotations

import os

from scout_sys.errors import ProbeUnavailable
from scout_sys.watch.early import EarlyProbes


class Recorder:
    """Stands in for CommProbe's contract (its real behaviour: tests/test_ebpf_comms.py)."""

    name = "ebpf-comms"

    def __init__(self, found_after: int = 0, reason: str | None = None) -> None:
        self.calls: list[list[int]] = []
        self.found_after, self.reason = found_after, reason
        self.bound, self.closed, self.handed_off, self._bpf = None, 0, 0, None

    def check(self):
        return self.reason

    def prepare(self, pids):
        self.calls.append(list(pids))
        if len(self.calls) <= self.found_after:
            raise ProbeUnavailable("no NCCL library (libnccl.so*) mapped by or installed beside the job's Python")
        self._bpf = object()

    def start(self, job):
        self.bound = job

    def unbind(self):
        self.bound = None

    def sample(self, now):
        return []

    def health(self):
        return None

    def close(self):
        self.closed += 1
        self._bpf = None

    def handoff(self):
        self.handed_off += 1


def test_retries_until_the_library_appears_then_leases_without_detaching():
    p = Recorder(found_after=2)
    e = EarlyProbes([p], lambda: [os.getpid()])
    e.start()
    assert e.wait(10) and e.reason is None
    assert len(p.calls) == 3 and all(os.getpid() in c for c in p.calls)
    [lease] = e.leases()
    lease.start("job")
    assert p.bound == "job"
    lease.close()  # a Monitor closing (a restart): the probe stays attached
    assert p.bound is None and p.closed == 0
    e.close()  # this process goes on (one job of watch --every-job ended): detached here, now
    assert (p.handed_off, p.closed) == (0, 1)


def test_a_watch_that_exits_next_hands_its_probes_to_a_child():
    p = Recorder()
    e = EarlyProbes([p], lambda: [os.getpid()])
    e.start()
    assert e.wait(10) and e.reason is None
    e.close(exiting=True)  # detached by a child once this process exits (a uprobe costs ~0.1 s to unregister)
    assert (p.handed_off, p.closed) == (1, 0)


def test_a_probe_that_cannot_run_says_why_to_every_monitor():
    p = Recorder(reason="needs root")
    e = EarlyProbes([p], lambda: [])
    e.start()
    assert e.wait(10) and e.reason == "needs root" and p.calls == []
    [lease] = e.leases()
    assert lease.check() == "needs root"
    e.close()
    assert (p.handed_off, p.closed) == (0, 0)  # never attached: nothing to detach



def test_the_give_up_time_counts_from_the_jobs_first_process():
    # an env: watch started by a prolog or a node agent may wait hours for its job: no process yet is
    # not "this job never loads NCCL"; once the job's processes exist, GIVE_UP applies
    import threading

    from scout_sys.watch.early import GIVE_UP

    class NoSleep(threading.Event):
        def wait(self, timeout=None):
            return self.is_set()

    now, looks = [0.0], [0]

    def pids() -> list[int]:
        looks[0] += 1
        now[0] += 72.0  # each look, the clock moves 72 s: 50 looks are an hour
        return [os.getpid()] if looks[0] > 50 else []

    p = Recorder(found_after=10**9)  # the library never appears
    e = EarlyProbes([p], pids, clock=lambda: now[0])
    e._stop = NoSleep()
    e.start()
    try:
        assert e.wait(10) and e.reason and e.reason.startswith("no NCCL library"), e.reason
        with_job = [c for c in p.calls if c]
        assert looks[0] > 50 and len(with_job) >= GIVE_UP // 72, (looks, len(with_job))
    finally:
        e.close()
