"""The straggler across process sub-groups (dp x tp): the rank late in every group it is in."""

from __future__ import annotations

from scout_sys.consensus import straggler, straggler_groups, straggler_window
from scout_sys.model import STRAGGLER, CollectiveSample, Fingerprint, Job, Rank
from tests.test_straggler_rules import _busy

T0 = 5_000.0
# dp=2 x tp=2: tp groups {0,1} {2,3}, dp groups {0,2} {1,3}; no collective spans all four ranks
GROUPS = {"gloo:1": (0, 1), "gloo:2": (2, 3), "gloo:3": (0, 2), "gloo:4": (1, 3)}


def _job(n=4):
    return Job(ranks=tuple(Rank(rank=r, pid=100 + r, host="h") for r in range(n)), world_size=n,
               launcher="torchrun", launcher_pid=1, host="h")


def _subgroups(late: dict[tuple[int, str], float], period=0.05, steps=20):
    """Each member enters its group's collective k at T0 + k*period + its lateness in that group
    (plus a ms of jitter by rank, so that nobody is exactly on time)."""
    obs = []
    for g, members in GROUPS.items():
        for r in members:
            fps = tuple(Fingerprint(seq=k + 1, op="allreduce",
                                    time=T0 + k * period + 0.001 * r + late.get((r, g), 0.0)) for k in range(steps))
            obs.append(CollectiveSample(time=T0 + steps * period, rank=r, pid=100 + r, backend="gloo", group=g,
                                        seq=steps, completed=steps, inside=False, last_enter=fps[-1].time,
                                        last_exit=None, last=fps[-1], recent=fps))
    return obs


def _verdict(obs):
    return straggler.window_verdict(_job(), obs, T0 - 0.1, T0 + 1.1)


def test_a_rank_late_in_both_its_groups_is_named():
    obs = _subgroups({(3, "gloo:2"): 0.04, (3, "gloo:4"): 0.04})
    assert straggler._lags(obs, [0, 1, 2, 3], T0 - 0.1, T0 + 1.1) == ({}, None)  # the whole-job lag sees nothing
    w = _verdict(obs)
    assert w.metric == "lag" and w.suspects == (3,) and w.groups == ("gloo:2", "gloo:4")
    assert abs(w.values[3] - 0.04) < 0.005 and w.period and abs(w.period - 0.05) < 1e-9
    inc = straggler.confirm(_job(), [w, w, w])
    assert inc is not None and inc.kind == STRAGGLER and inc.ranks == (3,)
    # the slow groups named by their members (the probe's names only say the order of first use)
    ev = next(e for e in inc.evidence if "groups" in e.data)
    assert "belongs to, ranks 2-3 (gloo:2) and ranks 1, 3 (gloo:4):" in ev.text, ev.text
    assert ev.data["groups"] == ["gloo:2", "gloo:4"] and ev.data["members"] == {"gloo:2": [2, 3], "gloo:4": [1, 3]}


def test_a_rank_late_in_both_its_groups_with_idle_peers_is_named_when_it_is_the_busy_one():
    # Every rank also sleeps part of its step (tests/jobs/layouts.py's --step-sleep): the peers idle
    # beyond their wait for rank 3 (slack). Rank 3 busy while they idle: a straggler, its lag on top
    # of the step. Equally busy: a rank late by phase, into time its peers would sleep anyway.
    late = {(3, "gloo:2"): 0.02, (3, "gloo:4"): 0.02}
    w = _verdict(_subgroups(late) + _busy(4, {3: 0.7}, default=0.05))
    assert w.slack is not None and w.slack > straggler.SLACK_MAX
    assert (w.metric, w.suspects) == ("lag", (3,))
    w = _verdict(_subgroups(late) + _busy(4, {}, default=0.05))
    assert w.suspects == ()


def test_nobody_late_names_nobody():
    w = _verdict(_subgroups({}))
    assert w.suspects == ()
    assert straggler.confirm(_job(), [w, w, w]) is None


def test_late_in_one_group_only_names_nobody():
    assert _verdict(_subgroups({(3, "gloo:2"): 0.04})).suspects == ()  # its dp group is on time


def test_different_ranks_late_in_different_groups_name_nobody():
    assert _verdict(_subgroups({(3, "gloo:2"): 0.04, (0, "gloo:3"): 0.04})).suspects == ()


def test_a_peer_held_up_by_the_straggler_is_not_the_origin():
    # rank 2 waits for rank 3 in tp, then arrives late at its dp all-reduce with rank 0: three slow
    # groups, but rank 2 is on time in its tp group; rank 3 is late in both of its own
    x = straggler_groups.intersect(
        {"tp1": {2: 0.0, 3: 0.04}, "dp1": {1: 0.0, 3: 0.04}, "dp0": {0: 0.0, 2: 0.04}, "tp0": {0: 0.0, 1: 0.001}},
        dict.fromkeys(("tp0", "tp1", "dp0", "dp1"), 0.01))
    assert x.origin == 3 and x.slow == ("dp0", "dp1", "tp1")


def test_diagnose_counts_the_sub_group_lag_as_a_measure():
    obs = _subgroups({(3, "gloo:2"): 0.04, (3, "gloo:4"): 0.04})
    named, _causes = straggler_window.measures(_job(), obs, T0 - 0.1, T0 + 1.1)
    assert [w.metric for w in named[3]] == ["lag"] and set(named) == {3}
    incs, _notes = straggler_window.in_window(_job(), obs, {}, (T0 - 0.1, T0 + 1.1))
    assert len(incs) == 1 and "rank 3" in incs[0].summary  # one measure alone: inconclusive
    assert any(e.data.get("groups") == ["gloo:2", "gloo:4"] for e in incs[0].evidence)


# As the collective probe saw a real dp=2 x tp=2 DTensor job (tests/jobs/layouts.py --layout tp --slow-rank 3
# --slow-work 6000, a 150 ms step): each rank's tensor-parallel group is its ``gloo:0`` and its data-parallel
# one its ``gloo:1``, so the two tp groups {0,1} and {2,3} share a name, and so do the two dp groups. Rank 3
# computes ~100 ms more before its forward: ranks 0, 1 and 2 enter their tp all-reduce (#43, #44, ...) within
# a few ms, rank 3 ~100 ms later; ranks 0 and 1 enter their dp all-reduce (#39, ...) ~10 ms after their tp
# one, ranks 2 and 3 ~105 ms after (rank 2 waited for rank 3 in tp).
STEP = 0.15
OBSERVED = {  # rank -> (tp entry, dp entry), seconds into the step
    0: (0.000, 0.012), 1: (0.005, 0.010), 2: (0.003, 0.108), 3: (0.102, 0.106)}
TP, DP = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}, {0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (1, 3)}


def _observed(members: bool, steps: int = 8):
    obs = []
    for r, (tp, dp) in OBSERVED.items():
        for name, at, first_seq, group in (("gloo:0", tp, 43, TP[r]), ("gloo:1", dp, 39, DP[r])):
            fps = tuple(Fingerprint(seq=first_seq + k, op="allreduce", time=T0 + k * STEP + at, count=512,
                                    dtype="float32", redop="sum") for k in range(steps))
            obs.append(CollectiveSample(time=T0 + steps * STEP, rank=r, pid=100 + r, backend="gloo", group=name,
                                        seq=fps[-1].seq, completed=None, inside=False, last_enter=fps[-1].time,
                                        last_exit=None, last=fps[-1], recent=fps,
                                        members=group if members else ()))
    return obs


def test_a_real_dp_tp_jobs_groups_are_told_apart_by_their_members():
    """Issue 22: compared by the probe's names, the tp all-reduce #43 of ranks 0-1 was paired with that of
    ranks 2-3, and the whole-job lag mixed two groups' collectives ("920% of a 10 ms step"). Told apart by
    their members, each group is compared within itself: rank 3 is late in both of its groups, its lag is
    ~100 ms of a 150 ms step."""
    obs = _observed(members=True)
    assert straggler._lags(obs, [0, 1, 2, 3], T0 - 0.1, T0 + 2) == ({}, None)  # no collective spans the job
    w = straggler.window_verdict(_job(), obs, T0 - 0.1, T0 + 2)
    assert (w.metric, w.suspects, w.groups) == ("lag", (3,), ("gloo[1,3]", "gloo[2,3]")), w
    assert w.members == {"gloo[1,3]": (1, 3), "gloo[2,3]": (2, 3)}
    assert w.period is not None and abs(w.period - STEP) < 1e-6
    assert 0.09 < w.values[3] - w.median < w.period
    inc = straggler.confirm(_job(), [w, w, w])
    assert inc is not None and inc.ranks == (3,)
    pct = int(inc.summary.split("about ")[1].split("%")[0])
    assert 50 < pct < 100 and "of a 150 ms step" in inc.summary, inc.summary
    ev = next(e for e in inc.evidence if "groups" in e.data)
    assert "belongs to, ranks 1, 3 and ranks 2-3:" in ev.text, ev.text


def test_a_lag_longer_than_the_interval_between_collectives_of_an_unread_group_is_dropped():
    """Members not read (the probe's names alone): over the whole job the collectives of the two tp groups
    are paired under one name, a collective every ~75 ms, rank 3 ~100 ms behind: no rank arrives a whole
    interval late in one group, so that is not a lag."""
    obs = _observed(members=False)
    assert straggler._lags(obs, [0, 1, 2, 3], T0 - 0.1, T0 + 2) == ({}, None)
    w = straggler.window_verdict(_job(), obs, T0 - 0.1, T0 + 2)
    # no lag within one interval, and no other measure of this window (no busy share, no step times)
    assert (w.metric, w.values, w.suspects, w.groups) == ("", {}, (), ()), w


def test_nccl_groups_are_told_apart_by_the_communicators_the_comms_probe_matched():
    """NCCL: the collective probe reads no members, but each call's communicator (``group_ptr``) was
    matched to its group at creation (ProcessGroupSample.handles): the same intersection."""
    from dataclasses import replace

    from scout_sys.model import ProcessGroupSample

    groups = ((0, 1), (2, 3), (0, 2), (1, 3))
    handles = tuple((r, 0x100 * (g + 1) + r, g) for g, ms in enumerate(groups) for r in ms)
    comm = {(r, g): h for r, h, g in handles}
    obs = [replace(s, backend="nccl", group=s.group.replace("gloo", "nccl"),
                   group_ptr=comm[(s.rank, groups.index(s.members))], members=())
           for s in _observed(members=True)]
    w = straggler.window_verdict(_job(), obs, T0 - 0.1, T0 + 2)
    # without the communicators' groups the calls are paired by name over the whole job, as above: no lag
    assert (w.metric, w.values, w.suspects, w.groups) == ("", {}, (), ()), w
    pgs = ProcessGroupSample(time=T0, groups=groups, source="ebpf-comms", handles=handles)
    w = straggler.window_verdict(_job(), [*obs, pgs], T0 - 0.1, T0 + 2)
    assert (w.metric, w.suspects, w.groups) == ("lag", (3,), ("nccl[1,3]", "nccl[2,3]")), w
