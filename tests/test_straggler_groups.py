"""The straggler across process sub-groups (dp x tp): the rank late in every group it is in."""

from __future__ import annotations

from scout_sys.consensus import straggler, straggler_groups, straggler_window
from scout_sys.model import STRAGGLER, CollectiveSample, Fingerprint, Job, Rank

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
