"""Matching NCCL communicator creations into process groups (probes/ebpf/comms.py ``learn``) and the
GPU-shaped waits they give the wait-for graph (consensus/waitfor.py), on synthetic records: pure."""

from __future__ import annotations

from scout_sys.consensus import learned, waitfor, waitresolve
from scout_sys.model import Activity, ProcessGroupSample
from scout_sys.probes.ebpf.commgroups import (
    K_INIT,
    K_INIT_CONFIG,
    K_SPLIT,
    CommCalls,
    Creation,
    learn,
    progress,
)

WORLD, TP0, TP1 = b"w" * 128, b"a" * 128, b"b" * 128


def layout(ranks=(0, 1, 2, 3)) -> dict[int, list[Creation]]:
    """world (4) from an id; tp pairs {0,1} {2,3} from ids; dp pairs {0,2} {1,3} split from the world;
    a trio {0,1,2} split from the world with rank 3 passing NCCL_SPLIT_NOCOLOR. Handle: 100*rank + n."""
    out = {}
    for r in ranks:
        h = 100 * r
        out[r] = [
            Creation(0, K_INIT, nranks=4, comm_rank=r, id=WORLD, comm=h + 1, ns=10 + r),
            Creation(1, K_INIT_CONFIG, nranks=2, comm_rank=r % 2, id=TP0 if r < 2 else TP1, comm=h + 2, ns=20 + r),
            Creation(2, K_SPLIT, parent=h + 1, color=r % 2, comm_rank=r, comm=h + 3, ns=30 + r),
            Creation(3, K_SPLIT, parent=h + 1, color=-1 if r == 3 else 5, comm_rank=-r, comm=h + 4, ns=40 + r),
        ]
    return out


def test_layout_learned_exactly_with_each_handle_in_its_group():
    c = learn(layout())
    assert c.groups == ((0, 1, 2, 3), (0, 1), (2, 3), (0, 2), (1, 3), (0, 1, 2))
    assert c.partial == () and c.notes == ()
    g = {(r, h): c.groups[i] for r, h, i in c.handles}
    assert g[(1, 101)] == (0, 1, 2, 3) and g[(3, 302)] == (2, 3) and g[(3, 303)] == (1, 3)
    assert g[(2, 204)] == (0, 1, 2) and (3, 304) not in g  # NOCOLOR: no communicator


def test_a_member_not_seen_leaves_its_groups_out_on_one_host_and_partial_across_hosts():
    recs = layout((0, 1, 2))  # rank 3's creations came before the probe attached
    c = learn(recs)
    assert set(c.groups) == {(0, 1)}  # only the pair whose members were all seen
    assert "left out" in c.notes[0]
    c = learn(recs, others_elsewhere=True)  # rank 3 runs on another host
    assert {c.groups[i] for i in c.partial} == {(0, 1, 2), (2,), (0, 2), (1,)}  # world and trio: one set
    assert (0, 1) in c.groups and (0, 1, 2) in c.groups


def test_split_of_an_unseen_parent_and_disagreeing_sizes_are_said():
    recs = layout()
    recs[0] = [r for r in recs[0] if r.seq != 0]  # rank 0's world creation not seen
    c = learn(recs)
    assert (0, 2) not in c.groups and any("parent communicator" in n for n in c.notes)
    bad = {r: [Creation(0, K_INIT, nranks=2 if r else 3, comm_rank=r, id=WORLD, ns=1)] for r in (0, 1)}
    c = learn(bad)
    assert c.groups == () and "disagree" in c.notes[0]


def test_a_destroyed_handle_reused_maps_to_the_newer_communicator():
    recs = {r: [Creation(0, K_INIT, nranks=2, comm_rank=r, id=TP0, comm=7, ns=10),
                Creation(1, K_INIT, nranks=2, comm_rank=r, id=TP1, comm=7, ns=30)] for r in (0, 1)}
    c = learn(recs, {(0, 7): 20, (1, 7): 20})
    assert [c.groups[i] for r, h, i in c.handles] == [(0, 1), (0, 1)]
    assert c.communicators == 2


def _acts(states):
    return {r: Activity(rank=r, pid=1000 + r, state=s, where=f"train.py:{r} sync") for r, s in states.items()}


def _sample(c, calls, t=5.0):
    seqs, latest = progress(c, calls)
    latest = tuple((r, g, op, t) for r, g, op, _ in latest)
    return ProcessGroupSample(time=10.0, groups=c.groups, seqs=seqs, latest=latest, handles=c.handles,
                              source="ebpf-comms")


def _hung_rank_2(c):
    # rank 2 stopped before its 9th tp all-reduce; 3 waits in tp, 0 in dp for 2, 1 in dp for 3
    calls = []
    for r in range(4):
        tp, dp = (9, 9) if r in (0, 1) else (9, 8) if r == 3 else (8, 8)
        calls += [CommCalls(r, 100 * r + 2, tp, last_ns=tp * 10 + 1 + (r == 3) * 20, last_op="allreduce"),
                  CommCalls(r, 100 * r + 3, dp, last_ns=dp * 10 + 2, last_op="allreduce")]
    return calls


def test_gpu_shaped_waits_follow_the_sequence_to_the_origin():
    c = learn(layout())
    s = _sample(c, _hung_rank_2(c))
    acts = _acts({0: "busy", 1: "idle", 2: "idle", 3: "busy"})
    waits, groups = waitresolve.from_activities(acts, s)
    g = waitfor.analyze(waits, groups)
    assert (g.status, g.origins) == (waitfor.ATTRIBUTED, (2,))
    assert {(e.waiters, e.awaited, e.members) for e in g.edges} == {
        ((0,), (2,), (0, 2)), ((1,), (3,), (1, 3)), ((3,), (2,), (2, 3))}
    assert (1, 3, 2) in g.chains
    assert learned.gpu_stall(s, acts, (6.0, 8.0))
    assert not learned.gpu_stall(s, acts, (4.0, 8.0))  # a collective entered within the window: progress
    moving = {**acts, **_acts({1: "running"})}
    assert not learned.gpu_stall(s, moving, (6.0, 8.0))


def test_level_sequences_wait_for_nobody():
    c = learn(layout())
    calls = [CommCalls(r, 100 * r + 2, 9, last_ns=1, last_op="allreduce") for r in range(4)]
    s = _sample(c, calls)
    assert learned.gpu_waits(s, _acts(dict.fromkeys(range(4), "idle"))) == {}


def test_both_sources_merge_into_one_model():
    c = learn(layout())
    nccl = _sample(c, _hung_rank_2(c))
    gloo = ProcessGroupSample(time=9.0, groups=((0, 1, 2, 3),), waits_in=((1, 0),))
    m = waitresolve.latest_groups([gloo, nccl])
    assert m.groups == c.groups and m.source == "ebpf-comms+procfs"
    assert dict(m.waits_in) == {1: 0}
    assert {m.groups[g] for _r, g, _n in m.seqs} == {(0, 1), (2, 3), (0, 2), (1, 3)}
