"""Real eBPF on a real 4-rank torchrun Gloo job, with the probe set and thresholds `watch` and
`diagnose --ebpf` use (root, bcc, kernel headers; skipped with the reason otherwise). Each job is
killed by pid / process group at the end, pass or fail."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from scout_sys.consensus import desync, lifecycle
from scout_sys.model import (
    DESYNC,
    PROCESS_EXIT,
    CollectiveSample,
    ExitRecord,
    OomRecord,
    SchedSample,
    SignalRecord,
)
from scout_sys.monitor import default_extra_probes
from scout_sys.probes.ebpf.collectives import CollectiveProbe
from scout_sys.probes.ebpf.sched import SchedProbe
from tests._ebpf_jobs import TorchrunJob, ebpf_skip_reason
from tests._host import HOST_PREFIX, cgroup_memory

REASON = ebpf_skip_reason()
pytestmark = [pytest.mark.ebpf, pytest.mark.slow,
              pytest.mark.skipif(REASON is not None, reason=f"eBPF unavailable: {REASON}")]


def _product_probes() -> tuple[CollectiveProbe, SchedProbe]:
    """The kernel probes `watch` and `diagnose --ebpf` attach, as the product configures them."""
    by_name = {p.name: p for p in default_extra_probes()}
    assert set(by_name) == {"ebpf-collectives", "ebpf-sched"}, by_name
    coll, sched = by_name["ebpf-collectives"], by_name["ebpf-sched"]
    assert isinstance(coll, CollectiveProbe) and isinstance(sched, SchedProbe)
    return coll, sched


def _collect(probes, until: float, cond=None) -> list:
    """Sample every 0.5 s until ``cond(observations)`` or the deadline."""
    obs: list = []
    while True:
        for p in probes:
            obs.extend(p.sample(time.time()))
        if (cond and cond(obs)) or time.monotonic() > until:
            return obs
        time.sleep(0.5)


def test_healthy_job_has_equal_sequences(tmp_path: Path) -> None:
    """The product's probe set on a healthy job; beside it, the costly programs the product leaves
    out (Gloo's per-message transport, every context switch), attached separately to the same job."""
    coll, sched = _product_probes()
    costly = [CollectiveProbe(transport=True), SchedProbe(switches=True)]
    with TorchrunJob(tmp_path, "--steps", "15", "--hold", "2") as job:
        try:
            j = job.wait_ranks()
            for p in (coll, sched, *costly):
                p.start(j)
            job.start_stepping()

            def all_done(obs: list) -> bool:  # the ranks hold 2 s after the last step: sample them alive
                return {s.rank for s in obs if isinstance(s, CollectiveSample) and s.completed == 31} == {0, 1, 2, 3}

            costly_obs = _collect(costly, time.monotonic() + 60, all_done)
            assert job.wait(60) == 0, job.log.read_text()[-2000:]
            obs = _collect([coll, sched], time.monotonic())
        finally:
            for p in (coll, sched, *costly):
                p.close()
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
    # the costly programs: bytes each rank's Gloo transport sent, and its main thread's CPU time
    sent = {s.rank: s.bytes_sent for s in costly_obs if isinstance(s, CollectiveSample)}
    assert sorted(sent) == [0, 1, 2, 3] and all(b and b > 0 for b in sent.values()), sent
    on_cpu = {s.rank: s.main().on_cpu_ns for s in costly_obs if isinstance(s, SchedSample) and s.main()}
    assert sorted(on_cpu) == [0, 1, 2, 3] and min(on_cpu.values()) > 0, on_cpu
    assert costly[0].lost() == 0 and costly[1].lost() == 0


@pytest.mark.parametrize("fault,needle", [("other_op", "broadcast"), ("other_size", "4153 x float32")])
def test_different_collective_is_desync(tmp_path: Path, fault: str, needle: str) -> None:
    """Rank 2 calls another collective (or another size) at step 3; then a person kills it."""
    coll, sched = _product_probes()
    with TorchrunJob(tmp_path, "--steps", "50", "--fault", fault, "--bad-rank", "2", "--bad-step", "3") as job:
        try:
            j = job.wait_ranks()
            coll.start(j)
            sched.start(j)
            job.start_stepping()

            def found(obs: list) -> bool:  # the verdict checked: rank 2's call, not a first desync of
                # any kind (under load one poll can see a rank that is only late at #8)
                return any(desync.fingerprint_differs(i) for i in desync.analyze(j, obs))

            obs = _collect([coll, sched], time.monotonic() + 30, found)
            incs = desync.analyze(j, obs)
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


@pytest.mark.serial  # load-sensitive: run alone (see tests/README.md)
def test_rank_behind_while_the_others_wait_at_the_product_threshold(tmp_path: Path) -> None:
    """Rank 2 sleeps before step 5's collective: the others wait inside #12 and, once they waited
    ``desync.MIN_WAIT`` (what the Monitor judges with), rank 2 is named behind at #11."""
    coll, sched = _product_probes()
    with TorchrunJob(tmp_path, "--steps", "50", "--fault", "hang", "--bad-rank", "2", "--bad-step", "5") as job:
        try:
            j = job.wait_ranks()
            coll.start(j)
            sched.start(j)
            job.start_stepping()
            seen: list = []

            def settled(o: list) -> bool:  # the same finding in two consecutive polls: under load the
                # first poll can catch a rank between #11 and #12 (not yet waiting, or not yet behind)
                found = [(i.kind, i.status, i.ranks, i.summary) for i in desync.analyze(j, o)]
                seen.append(found)
                return bool(found) and len(seen) >= 2 and seen[-2] == found

            obs = _collect([coll, sched], time.monotonic() + 30, settled)
        finally:
            coll.close()
            sched.close()
    (inc,) = desync.analyze(j, obs)
    assert (inc.kind, inc.status, inc.ranks) == (DESYNC, "attributed", (2,)), inc
    assert "behind (at #11)" in inc.summary and "wait in #12" in inc.summary, inc.summary
    latest = desync.latest(obs)
    waited = min(latest[("gloo:0", r)].time - latest[("gloo:0", r)].last_enter for r in (0, 1, 3))
    assert waited >= desync.MIN_WAIT


@contextlib.contextmanager
def memory_cgroup(limit: int):
    """A fresh memory cgroup (v2 memory.max, or v1 memory.limit_in_bytes) limited to ``limit`` bytes,
    without swap; yields its cgroup.procs path and removes it at the end (its processes are dead)."""
    found = cgroup_memory()
    if found is None:
        pytest.skip(f"{HOST_PREFIX}a writable cgroup memory controller")
    version, root = found
    d = Path(root) / f"scout-test-oom-{os.getpid()}-{time.monotonic_ns()}"
    if version == "2" and "memory" not in (Path(root) / "cgroup.subtree_control").read_text().split():
        (Path(root) / "cgroup.subtree_control").write_text("+memory")
    d.mkdir()
    try:
        if version == "2":
            (d / "memory.max").write_text(str(limit))
            if (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")
        else:
            (d / "memory.limit_in_bytes").write_text(str(limit))
        yield d / "cgroup.procs"
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                d.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


@pytest.mark.serial  # load-sensitive: run alone (see tests/README.md)
def test_rank_killed_by_the_oom_killer_in_its_memory_cgroup(tmp_path: Path) -> None:
    """Rank 1 runs in a 64 MiB memory cgroup and allocates at step 3: the kernel's OOM killer ends
    it, torchrun then ends the others; the exit probe names rank 1 and says the OOM killer chose it."""
    coll, sched = _product_probes()
    with memory_cgroup(64 << 20) as procs, \
            TorchrunJob(tmp_path, "--steps", "50", "--fault", "alloc", "--bad-rank", "1", "--bad-step", "3") as job:
        try:
            j = job.wait_ranks()
            coll.start(j)
            sched.start(j)
            procs.write_text(str(j.by_rank()[1].pid))
            job.start_stepping()
            job.wait(60)
            obs = _collect([coll, sched], time.monotonic() + 15,
                           lambda o: sum(isinstance(x, ExitRecord) for x in o) == 4)
        finally:
            coll.close()
            sched.close()
    assert [o.rank for o in obs if isinstance(o, OomRecord)] == [1], job.log.read_text()[-2000:]
    (inc,) = lifecycle.analyze(j, obs)
    assert (inc.kind, inc.ranks) == (PROCESS_EXIT, (1,)), inc
    assert "OOM killer" in inc.summary, inc.summary
    assert inc.evidence[0].data["oom"] is True and inc.evidence[0].data["signal"] == "SIGKILL"
