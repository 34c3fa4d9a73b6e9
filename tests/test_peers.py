"""consensus/peers.py: peer groups read from learned process groups, on the groups real jobs showed
(pure, no processes), and who stragglers are compared with."""

from __future__ import annotations

from scout_sys.consensus import peers, straggler
from scout_sys.job import with_layout
from scout_sys.model import Job, ProcessGroupSample, ProcSample, Rank
from scout_sys.tui.state import peer_blocks, peers_title

# as probes/pgroups.py learned them from a real Megatron-Core dp=2 x tp=2 job (tests/jobs/megatron_job.py):
# world-sized groups, dp {0,2} {1,3} and tp {0,1} {2,3}, each several times (Megatron creates many)
MEGATRON_4 = [[0, 1, 2, 3], [0, 2], [0, 2], [0, 2], [0, 2], [0, 1], [0, 1], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1],
              [0, 1], [0, 1], [0, 1], [0, 2], [0, 2], [0, 1, 2, 3], [1, 3], [1, 3], [1, 3], [1, 3], [1, 3], [1, 3],
              [2, 3], [2, 3], [2, 3], [2, 3], [2, 3], [2, 3]]
# a real DTensor job, DeviceMesh (dp=2, tp=2) (tests/jobs/layouts.py --layout tp)
DTENSOR_4 = [[0, 1, 2, 3], [0, 2], [0, 1], [1, 3], [2, 3]]
# Megatron dp=2 x tp=2 x pp=2: tp, dp, pp, embedding ({first, last stage}) and model-parallel (tp x pp) groups
MEGATRON_8 = [list(range(8)), [0, 1], [2, 3], [4, 5], [6, 7], [0, 2], [1, 3], [4, 6], [5, 7], [0, 4], [1, 5],
              [2, 6], [3, 7], [0, 1, 4, 5], [2, 3, 6, 7], [0, 4], [2, 6]]


def _job(n: int = 4, **kw) -> Job:
    return Job(ranks=tuple(Rank(rank=r, pid=100 + r, host="h") for r in range(n)), world_size=n,
               launcher="torchrun", launcher_pid=1, host="h", **kw)


def _sample(groups, partial=(), t=1.0) -> ProcessGroupSample:
    return ProcessGroupSample(time=t, groups=tuple(tuple(g) for g in groups), partial=tuple(partial))


def test_megatron_and_dtensor_groups_read_as_tp_dp():
    for groups in (MEGATRON_4, DTENSOR_4):
        lay = peers.layout_of(groups, 4)
        assert lay is not None and lay.groups() == ((0, 2), (1, 3))
        assert [lay.coords(r) for r in range(4)] == [{"dp": 0, "tp": 0}, {"dp": 0, "tp": 1},
                                                      {"dp": 1, "tp": 0}, {"dp": 1, "tp": 1}]


def test_three_axes_read_as_tp_dp_pp():
    lay = peers.layout_of(MEGATRON_8, 8)
    assert lay is not None and lay.groups() == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert lay.coords(5) == {"pp": 1, "dp": 0, "tp": 1}


def test_nothing_readable_stays_unknown():
    assert peers.layout_of([[0, 1, 2, 3]], 4) is None  # plain data parallel: the world group only
    assert peers.layout_of([[0, 1], [2, 3]], 4) is None  # one axis: what the other is, nothing says
    assert peers.layout_of([[0, 1], [2, 3], [0, 3], [1, 2]], 4) is None  # not progressions
    assert peers.layout_of([[0, 1], [0, 2], [1, 3]], 4) is None  # {2,3} missing: no axis covers the job


def test_with_learned_gives_the_job_its_peers_and_coordinates():
    job = peers.with_learned(_job(), [_sample(MEGATRON_4)])
    assert job.peer_groups == ((0, 2), (1, 3)) and peers.is_learned(job)
    assert dict(job.by_rank()[3].coords) == {"dp": 1, "tp": 1}
    assert sum(n.startswith("peer groups from " + peers.LEARNED) for n in job.notes) == 1
    again = peers.with_learned(job, [_sample(MEGATRON_4, t=2.0)])
    assert again is job  # unchanged: the same object, no second note
    assert peers.with_learned(job, []) is job  # a learned layout is kept between two samples


def test_given_layout_wins_and_partial_groups_are_not_read():
    given = with_layout(_job(), "dp=4")
    assert peers.with_learned(given, [_sample(MEGATRON_4)]) is given
    job = _job()
    assert peers.with_learned(job, [_sample(MEGATRON_4, partial=[1])]) is job


def test_stragglers_compare_ranks_of_equal_work():
    assert peers.work_groups(peers.with_learned(_job(), [_sample(MEGATRON_4)])) == ((0, 1, 2, 3),)
    eight = peers.with_learned(_job(8), [_sample(MEGATRON_8)])
    assert peers.work_groups(eight) == ((0, 1, 2, 3), (4, 5, 6, 7))  # pipeline stages apart
    assert peers.work_groups(_job()) == ((0, 1, 2, 3),)  # nothing known: the whole job


def _busy(busy: dict[int, float], n: int, t0: float = 10.0) -> list[ProcSample]:
    return [ProcSample(time=t, rank=r, pid=100 + r, status="sleeping",
                       main_cpu_ns=int(i * busy[r] * 1e9), main_delay_ns=0)
            for r in range(n) for i, t in enumerate((t0, t0 + 1.0))]


def test_a_heavier_pipeline_stage_is_no_straggler_but_a_slow_rank_in_it_is():
    eight = peers.with_learned(_job(8), [_sample(MEGATRON_8)])
    even = {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.1, 4: 0.6, 5: 0.6, 6: 0.6, 7: 0.6}  # the last stage computes the loss
    assert straggler.window_verdict(eight, _busy(even, 8), 10.0, 11.0).suspects == ()
    assert straggler.window_verdict(_job(8), _busy(even, 8), 10.0, 11.0).suspects == ()  # (tie: 4 of 8)
    slow = {**even, 1: 0.5}  # busy 0.5 is slow in stage 0, ordinary next to stage 1
    w = straggler.window_verdict(eight, _busy(slow, 8), 10.0, 11.0)
    assert w.metric == "busy" and w.suspects == (1,) and set(w.values) == set(range(8))
    assert straggler.window_verdict(_job(8), _busy(slow, 8), 10.0, 11.0).suspects == ()


def test_dashboard_blocks_say_the_shared_coordinates():
    job = peers.with_learned(_job(), [_sample(MEGATRON_4)])
    assert peer_blocks(job) == [("peers 0 (tp=0)", (0, 2)), ("peers 1 (tp=1)", (1, 3))]
    assert peers_title(job) == "ranks by peer group (process groups learned from the ranks' TCP connections)"
    assert peer_blocks(_job()) == [("peers 0", (0, 1, 2, 3))]
    assert peers_title(_job()) == "ranks by peer group (layout unknown: the whole job)"


def test_dp_pp_without_tp_reads_as_tp_dp():
    # documented limit (docs/layouts.md): a DeviceMesh ("dp", "pp") (pp fastest) reads as tp x dp with
    # the right replicas; DeepSpeed's pipeline engine (dp fastest) with the wrong ones
    mesh = [[0, 1], [2, 3], [4, 5], [6, 7], [0, 2, 4, 6], [1, 3, 5, 7]]
    assert peers.layout_of(mesh, 8).groups() == ((0, 2, 4, 6), (1, 3, 5, 7))
    deepspeed = [[0, 1], [2, 3], [0, 2], [1, 3]]
    assert peers.layout_of(deepspeed, 4).groups() == ((0, 2), (1, 3))  # truly (0, 1), (2, 3)
