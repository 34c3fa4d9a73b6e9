"""NCCL process groups learned from communicator creation (probes/ebpf/comms.py), on a real torchrun job.

tests/jobs/nccl_groups.py loads the real libnccl.so.2 of the nvidia-nccl-cu12 wheel and calls
ncclGetUniqueId / ncclCommInitRank{,Config,Scalable} / ncclCommSplit as ProcessGroupNCCL does: the world, two
tensor-parallel pairs made from ids shared through the c10d store, two data-parallel pairs and a trio
split from the world by color. No GPU: the calls fail after the uprobes fired (see the job's
docstring for the handles). One job serves the probe attached before it and one attached late; the
watch test's own watch prepares its probe as a user's does.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from scout_sys.job import find_job
from scout_sys.monitor import Monitor
from scout_sys.probes.pgroups import ProcessGroupProbe
from tests._ebpf_jobs import ebpf_skip_reason
from tests._host import libnccl
from tests.conftest import JOBS, settle
from tests.test_ebpf_detach import perf_event_fds
from tests.test_watch import watch_cli  # noqa: F401 (fixture)

pytestmark = [pytest.mark.ebpf, pytest.mark.slow]
REASON = ebpf_skip_reason()
LIB = libnccl()
SCRIPT = os.path.join(JOBS, "nccl_groups.py")
LAYOUT = {(0, 1, 2, 3), (0, 1), (2, 3), (0, 2), (1, 3), (0, 1, 2)}
needs = [pytest.mark.skipif(REASON is not None, reason=f"eBPF unavailable: {REASON}"),
         pytest.mark.skipif(LIB is None, reason="nvidia-nccl-cu12 wheel not installed (pip install -r requirements-test.txt)")]


@pytest.fixture(scope="module")
def probe():
    from scout_sys.probes.ebpf.comms import CommProbe

    p = CommProbe()
    before = perf_event_fds()
    yield p
    attached = len(p.attached)
    p.close()  # its perf-event fds closed in parallel, then bcc's cleanup: nothing left behind
    assert attached == 0 or perf_event_fds() == before


def _job(start_job, *args: str):
    job = start_job(4, script=SCRIPT, args=["--lib", str(LIB), *args])
    job.wait_for(r"NCCLJOB created", timeout=120, count=4)
    # the ranks share one log: another rank's line may follow this one's text before its newline
    # (print writes the text and the end apart under PYTHONUNBUFFERED), so read exactly its fields
    line = r"NCCLJOB created rank=(\d) world=(\d+) tp=(\d+) dp=(\d+) trio=(\d+)"
    handles = {int(m.group(1)): dict(zip(("world", "tp", "dp", "trio"), map(int, m.groups()[1:])))
               for m in re.finditer(line, job.log())}
    assert sorted(handles) == [0, 1, 2, 3], job.log()
    return job, handles


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs)])
def test_groups_learned_exactly_and_the_wait_for_graph_names_the_origin(start_job, probe, tmp_path, _):
    probe.prepare([os.getpid()])  # before the job: as a watch started with it
    go = tmp_path / "go"
    job, handles = _job(start_job, "--fault", "hang", "--fault-rank", "2", "--fault-when", str(go))
    j = find_job(str(job.pid))
    probe.start(j)
    # healthy: every rank steps; the sequences move; nobody is named
    with Monitor(j, extra_probes=[_Shared(probe), ProcessGroupProbe(every=0.0)]) as mon:
        mon.wait_started(10)
        d = mon.diagnose(2.5)
    assert d.incidents == (), d.incidents
    go.touch()
    m = job.wait_for(r"NCCLJOB fault hang rank=2 step=(\d+)", timeout=120)
    step = int(m.group(1))
    # every other rank spins at its sync point (the store's meet) for a partner that never comes: its
    # collectives entered, the positions below are final
    settle(job, j.by_rank()[2].pid, parked_in="meet")
    probe.start(j)  # the healthy window's Monitor unbound it on close, as a watch's restart does
    comms = probe.learned()
    assert set(comms.groups) == LAYOUT and len(comms.groups) == len(LAYOUT), comms
    assert comms.partial == () and comms.notes == ()
    # each rank's handles (what the collective probe reports as group_ptr) map to their group
    group_of = {(r, h): comms.groups[g] for r, h, g in comms.handles}
    for r, hs in handles.items():
        assert group_of[(r, hs["world"])] == (0, 1, 2, 3)
        assert group_of[(r, hs["tp"])] == ((0, 1) if r < 2 else (2, 3))
        assert group_of[(r, hs["dp"])] == ((0, 2) if r % 2 == 0 else (1, 3))
        assert group_of.get((r, hs["trio"])) == (None if r == 3 else (0, 1, 2))
    [s] = probe.sample(time.time())
    assert not any("attached after" in n for n in probe.health().notes), probe.health()  # there from the start
    seq = {(r, s.groups[g]): n for r, g, n in s.seqs}
    # rank 2 stopped before its tp all-reduce of that step: its partners entered theirs and wait
    assert (seq[(2, (2, 3))], seq[(3, (2, 3))], seq[(0, (0, 2))], seq[(2, (0, 2))]) == (step, step + 1, step + 1, step)
    assert {r: s.groups[g] for r, g, _op, _t in s.latest} == {0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (2, 3)}

    # The Gloo sockets show the world group only (the pairs are NCCL's): the waiting ranks spin at two
    # different sync points, so no strict majority and no graph names anyone.
    with Monitor(j, extra_probes=[ProcessGroupProbe(every=0.0)]) as mon:
        mon.wait_started(10)
        d = mon.diagnose(2.5)
    assert not [i for i in d.incidents if i.status == "attributed"], d.incidents
    # With the NCCL groups: chains 0 -> 2, 3 -> 2, 1 -> 3 -> 2.
    with Monitor(j, extra_probes=[_Shared(probe), ProcessGroupProbe(every=0.0)]) as mon:
        mon.wait_started(10)
        d = mon.diagnose(2.5)
    hangs = [i for i in d.incidents if i.status == "attributed"]
    assert [(i.kind, i.ranks) for i in hangs] == [("hang", (2,))], d.incidents
    ev = hangs[0].evidence
    chains = [e.data["chain"] for e in ev if "chain" in e.data]
    assert [1, 3, 2] in chains, chains
    graph = next(e.data["wait_for"] for e in ev if "wait_for" in e.data)
    edges = {(tuple(e["waiters"]), tuple(e["awaited"]), tuple(e["group"])) for e in graph}
    assert edges == {((0,), (2,), (0, 2)), ((1,), (3,), (1, 3)), ((3,), (2,), (2, 3))}, graph
    assert any("NCCL communicator creation" in e.text for e in ev)

    # Attached late (after the communicators were made): learns nothing and says so.
    from scout_sys.probes.ebpf.comms import CommProbe

    late = CommProbe()
    try:
        t0 = time.monotonic()
        late.prepare([job.pid])  # from the launcher: its torch is in the site-packages holding the wheel
        print(f"comms probe: compile {late.compile_s:.2f} s, prepare {time.monotonic() - t0:.2f} s, "
              f"{len(late.attached)} uprobes")
        late.start(j)
        assert late.sample(time.time()) == [] and late.learned().groups == ()
        notes = " ".join(late.health().notes)
        assert "attached after ranks 0, 1, 2, 3 had started" in notes, notes
        assert late.lost() == 0
    finally:
        late.close()


class _Shared:
    """The module's prepared probe in a Monitor, which must not detach it (the Watcher's Lease does
    the same: scout_sys/watch/early.py)."""

    def __init__(self, p) -> None:
        self.p, self.name = p, p.name

    def check(self):
        return None

    def start(self, job):
        self.p.start(job)

    def sample(self, now):
        return self.p.sample(now)

    def health(self):
        return self.p.health()

    def close(self):
        self.p.unbind()


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs)])
def test_watch_started_with_the_job_names_the_origin_without_topology(start_job, watch_cli, _):  # noqa: F811
    job = start_job(4, script=SCRIPT, args=["--lib", str(LIB), "--fault", "hang", "--fault-rank", "1",
                                            "--fault-step", "40"])
    w = watch_cli(job.pid, "--stall-after", "4", "--no-replay")
    job.wait_for(r"NCCLJOB fault hang rank=1", timeout=120)
    e = w.wait_event(lambda e: e["event"] == "incident_opened" and e["incident"]["kind"] == "hang"
                     and e["incident"]["status"] == "attributed", timeout=90)
    assert e["incident"]["ranks"] == [1], e
    assert w.opened() == [("hang", "attributed", [1])], w.events
    assert any("NCCL communicator creation" in (v.get("text") or "") for v in e["incident"]["evidence"]), e
