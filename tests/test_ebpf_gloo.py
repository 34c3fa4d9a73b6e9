"""Real eBPF on a real 4-rank torchrun Gloo job (root, bcc, kernel headers; skipped with the reason
otherwise). Each job is killed by pid / process group at the end, pass or fail."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from scout_sys.consensus import desync, lifecycle
from scout_sys.model import DESYNC, PROCESS_EXIT, CollectiveSample, ExitRecord, SchedSample, SignalRecord
from tests._ebpf_jobs import TorchrunJob, ebpf_skip_reason

REASON = ebpf_skip_reason()
pytestmark = [pytest.mark.ebpf, pytest.mark.slow,
              pytest.mark.skipif(REASON is not None, reason=f"eBPF unavailable: {REASON}")]


def _probes():
    from scout_sys.probes.ebpf.collectives import CollectiveProbe
    from scout_sys.probes.ebpf.sched import SchedProbe

    return CollectiveProbe(), SchedProbe()


def _collect(probes, until: float, cond=None) -> list:
    """Sample every 0.5 s until ``cond(observations)`` or the deadline."""
    obs: list = []
    while True:
        for p in probes:
            obs.extend(p.sample())
        if (cond and cond(obs)) or time.monotonic() > until:
            return obs
        time.sleep(0.5)


def test_healthy_job_has_equal_sequences(tmp_path: Path) -> None:
    coll, sched = _probes()
    with TorchrunJob(tmp_path, "--steps", "15") as job:
        try:
            j = job.wait_ranks()
            coll.start(j)
            sched.start(j)
            job.start_stepping()
            assert job.wait(60) == 0, job.log.read_text()[-2000:]
            obs = _collect([coll, sched], time.monotonic())
        finally:
            coll.close()
            sched.close()
    cs = [o for o in obs if isinstance(o, CollectiveSample)]
    assert sorted(s.rank for s in cs) == [0, 1, 2, 3] and {s.group for s in cs} == {"gloo:0"}
    # barrier + 15 steps x 2 all_reduce; the tag counter numbers them the same on every rank
    assert {s.seq for s in cs} == {31}, [(s.rank, s.seq) for s in cs]
    assert {s.completed for s in cs} == {31} and not any(s.inside for s in cs)
    for s in cs:
        assert [f.describe() for f in s.recent[-2:]] == ["#30 allreduce 4160 x float32 sum",
                                                         "#31 allreduce 65 x float32 max"]
    assert desync.analyze(j, obs) == []
    exits = [o for o in obs if isinstance(o, ExitRecord)]
    assert sorted((e.rank, e.exit_code, e.signal) for e in exits) == [(r, 0, None) for r in range(4)]
    assert lifecycle.analyze(j, obs) == []
    assert coll.lost() == 0 and sched.lost() == 0


@pytest.mark.parametrize("fault,needle", [("other_op", "broadcast"), ("other_size", "4153 x float32")])
def test_different_collective_is_desync(tmp_path: Path, fault: str, needle: str) -> None:
    """Rank 2 calls another collective (or another size) at step 3; then a person kills it."""
    coll, sched = _probes()
    with TorchrunJob(tmp_path, "--steps", "50", "--fault", fault, "--bad-rank", "2", "--bad-step", "3") as job:
        try:
            j = job.wait_ranks()
            coll.start(j)
            sched.start(j)
            job.start_stepping()

            def found(obs: list) -> bool:
                return any(i.kind == DESYNC for i in desync.analyze(j, obs, min_wait=0.5))

            obs = _collect([coll, sched], time.monotonic() + 30, found)
            incs = desync.analyze(j, obs, min_wait=0.5)
            assert [(i.kind, i.status, i.ranks) for i in incs] == [(DESYNC, "attributed", (2,))], incs
            assert needle in incs[0].summary and "#8" in incs[0].summary, incs[0].summary
            if fault == "other_size":
                return
            # The same job, now a person kills rank 2: torchrun then SIGTERMs the others.
            os.kill(j.by_rank()[2].pid, signal.SIGKILL)
            job.wait(30)
            obs += _collect([coll, sched], time.monotonic() + 10,
                            lambda o: sum(isinstance(x, ExitRecord) for x in o) == 4)
        finally:
            coll.close()
            sched.close()
    (inc,) = lifecycle.analyze(j, obs)
    assert (inc.kind, inc.ranks) == (PROCESS_EXIT, (2,)), inc
    first = inc.evidence[0].data
    assert (first["signal"], first["sender_pid"]) == ("SIGKILL", os.getpid()), first
    sigs = [o for o in obs if isinstance(o, SignalRecord) and o.rank != 2 and o.signal == signal.SIGTERM]
    assert {s.sender_pid for s in sigs} == {job.proc.pid}  # the launcher ended the others
    assert any(isinstance(o, SchedSample) and o.main() and o.main().on_cpu_ns > 0 for o in obs)
