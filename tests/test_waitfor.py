"""The wait-for graph (consensus/waitfor.py) on synthetic ranks: chains to their origin, desync in a
group, chains that run elsewhere, pauses, and the strict-majority confirmation."""

from __future__ import annotations

from scout_sys.consensus.waitfor import ATTRIBUTED, INCONCLUSIVE, NONE, Wait, analyze, chain_text

# dp=2 x tp=2, Megatron order (tp fastest): tp {0,1} {2,3}; dp {0,2} {1,3}; world
GROUPS = [(0, 1, 2, 3), (0, 1), (2, 3), (0, 2), (1, 3)]
TP01, TP23, DP02, DP13 = 1, 2, 3, 4


def w(rank, state="waiting", group=None, coll="all_reduce at x.py:1"):
    return Wait(rank, state, group, coll if state == "waiting" else "")


def test_megatron_lock_chain_names_the_stuck_rank():
    waits = {0: w(0, group=DP02), 1: w(1, group=DP13), 3: w(3, group=TP23, coll="all_reduce at mappings.py:9"),
             2: w(2, "idle")}
    g = analyze(waits, GROUPS)
    assert (g.status, g.origins, g.kinds) == (ATTRIBUTED, (2,), {2: "idle"})
    edges = {(e.waiters, e.awaited) for e in g.edges}
    assert edges == {((0,), (2,)), ((1,), (3,)), ((3,), (2,))}
    assert (1, 3, 2) in g.chains
    text = chain_text(g, (1, 3, 2), waits)
    assert text.startswith("rank 1 waits in all_reduce at x.py:1 of group {1, 3} for rank 3, which waits in")
    assert text.endswith("rank 2, which is idle")


def test_stopped_and_exited_are_origins_of_their_kind():
    for state in ("stopped", "exited", "busy", "disk-sleep"):
        waits = {0: w(0, group=DP02), 1: w(1, group=DP13), 3: w(3, group=TP23), 2: w(2, state)}
        g = analyze(waits, GROUPS)
        assert (g.status, g.origins, g.kinds[2]) == (ATTRIBUTED, (2,), state)


def test_chain_through_a_rank_elsewhere_names_nobody():
    # rank 3 runs on another host: 1 waits for it; what 3 waits for is unknown, so 2 (idle, reachable
    # only through 3 for rank 1) is not named while a chain runs elsewhere
    waits = {0: w(0, group=DP02), 1: w(1, group=DP13), 2: w(2, "idle")}
    g = analyze(waits, GROUPS)
    assert g.status == INCONCLUSIVE and "not observed on this host" in g.reason


def test_desync_in_a_group_with_a_majority():
    groups = [(0, 1, 2, 3)]
    waits = {r: w(r, group=0) for r in (0, 1, 3)} | {2: w(2, group=0, coll="broadcast at t.py:5")}
    g = analyze(waits, groups)
    assert (g.status, g.origins, g.kinds) == (ATTRIBUTED, (2,), {2: "desync"})


def test_two_member_group_in_two_collectives_is_a_tie():
    waits = {0: w(0, group=DP02), 1: w(1, group=DP13), 2: w(2, group=TP23, coll="broadcast at t.py:5"),
             3: w(3, group=TP23)}
    g = analyze(waits, GROUPS)
    assert g.status == INCONCLUSIVE and "no strict majority" in g.reason
    assert g.edges  # the graph is the evidence


def test_all_members_in_one_collective_is_common_mode():
    waits = {r: w(r, group=0) for r in range(4)}
    g = analyze(waits, GROUPS)
    assert g.status == INCONCLUSIVE and "origin is outside" in g.reason


def test_pause_names_nobody():
    waits = {0: w(0, group=DP02), 2: w(2, "running"), 1: w(1, "running"), 3: w(3, "running")}
    assert analyze(waits, GROUPS).status == NONE


def test_nothing_waits():
    assert analyze({r: w(r, "running") for r in range(4)}, GROUPS).status == NONE


def test_group_majority_must_confirm():
    # one group of 5: only 2 wait in it, so its strict majority does not confirm rank 4
    groups = [(0, 1, 2, 3, 4)]
    waits = {0: w(0, group=0), 1: w(1, group=0), 2: w(2, "running"), 3: w(3, "running"), 4: w(4, "idle")}
    g = analyze(waits, groups)
    assert g.status == INCONCLUSIVE
    waits |= {2: w(2, group=0), 3: w(3, group=0)}
    assert analyze(waits, groups).status == ATTRIBUTED


def test_unknown_group_is_inconclusive():
    waits = {0: w(0, group=None), 1: w(1, group=DP13), 3: w(3, group=TP23), 2: w(2, "idle")}
    assert analyze(waits, GROUPS).status == INCONCLUSIVE


def test_cycle_without_an_origin_is_inconclusive():
    groups = [(0, 1), (1, 2), (2, 0)]
    waits = {0: w(0, group=0), 1: w(1, group=1), 2: w(2, group=2)}
    g = analyze(waits, groups)
    assert g.status == INCONCLUSIVE and "cycle" in g.reason


def test_65536_ranks_dp_tp_pp():
    import time

    from benchmarks.waitfor_graph import synthetic

    waits, groups, stuck = synthetic(65536)
    t0 = time.perf_counter()
    g = analyze(waits, groups)
    assert (g.status, g.origins) == (ATTRIBUTED, (stuck,)), g.reason
    assert time.perf_counter() - t0 < 10  # the 1 s target is checked by benchmarks/waitfor_graph.py


def test_one_waiting_rank_of_two_is_no_majority():
    g = analyze({0: w(0, group=0), 1: w(1, "idle")}, [(0, 1)])
    assert g.status == INCONCLUSIVE and "1 of 2 ranks wait" in g.reason and g.origins == (1,)


# --------------------------------------------------------------------------- the seam: hang.analyze


def _job(n: int):
    from scout_sys.model import Job, Rank

    return Job(ranks=tuple(Rank(rank=r, pid=100 + r, host="h0") for r in range(n)), world_size=n,
               launcher="torchrun", launcher_pid=99, host="h0")


def _acts(states: dict[int, str], labels: dict[int, str]):
    from scout_sys.model import Activity, CollectiveWait

    return {r: Activity(rank=r, pid=100 + r, state=s,
                        wait=CollectiveWait(op="all_reduce", site=labels[r], depth=0) if s == "waiting" else None)
            for r, s in states.items()}


def _resolve(sample, acts):
    from scout_sys.consensus.hang import _attribute
    from scout_sys.consensus.waitresolve import resolve
    from scout_sys.model import HANG, INCONCLUSIVE, Incident

    before = [Incident(HANG, INCONCLUSIVE, (), ("h0",), 0.0, "no strict majority")]
    return resolve(_job(4), [sample], acts, before, _attribute, (0.0, 1.0))


def test_resolve_names_the_origin_with_chains_and_edges():
    from scout_sys.model import ProcessGroupSample

    groups = ((0, 1, 2, 3), (0, 2), (1, 3), (2, 3))
    sample = ProcessGroupSample(time=1.0, groups=groups, waits_in=((0, 1), (1, 2), (3, 3)))
    acts = _acts({0: "waiting", 1: "waiting", 2: "idle", 3: "waiting"},
                 {0: "t.py:67", 1: "t.py:67", 3: "mappings.py:9"})
    incidents, notes = _resolve(sample, acts)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("hang", "attributed", (2,))]
    ev = incidents[0].evidence
    assert [e.data["chain"] for e in ev if "chain" in e.data] == [[0, 2], [1, 3, 2]]
    edges = next(e.data["wait_for"] for e in ev if "wait_for" in e.data)
    assert {"group": [1, 3], "collective": "all_reduce at t.py:67", "waiters": [1], "awaited": [3]} in edges
    assert notes and "wait-for graph" in notes[0]


def test_resolve_marks_a_stall_whose_waits_all_lead_to_a_progressing_rank_as_a_pause():
    """Waits still spreading out from a fault (or a rank catching up): every chain ends at a rank that
    moved within the window. The stall stays inconclusive, never names the waiters, and carries the
    ``paused_on`` evidence a watch holds back for one window."""
    from scout_sys.consensus.waitresolve import PAUSED_ON
    from scout_sys.model import ProcessGroupSample

    groups = ((0, 1, 2, 3), (0, 2), (1, 3), (2, 3))
    sample = ProcessGroupSample(time=1.0, groups=groups, waits_in=((0, 1), (1, 2), (3, 3)))
    acts = _acts({0: "waiting", 1: "waiting", 2: "running", 3: "waiting"},
                 {0: "t.py:67", 1: "t.py:67", 3: "mappings.py:9"})
    incidents, notes = _resolve(sample, acts)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("hang", "inconclusive", ())]
    [pause] = [e for e in incidents[0].evidence if PAUSED_ON in e.data]
    assert pause.data[PAUSED_ON] == [2] and "still progressing" in pause.text and pause.data["wait_for"]
    assert notes == ["the waiting ranks wait for rank 2, still progressing"]
    # the same waits with rank 2 idle: the origin, no pause
    acts[2] = _acts({2: "idle"}, {})[2]
    incidents, _ = _resolve(sample, acts)
    assert [(i.status, i.ranks) for i in incidents] == [("attributed", (2,))]
    assert not any(PAUSED_ON in e.data for e in incidents[0].evidence)


def test_resolve_never_names_through_a_group_with_members_elsewhere():
    from scout_sys.model import ProcessGroupSample

    # group {1, 3} has a member on another host: rank 1's chain runs elsewhere
    groups = ((0, 1, 2, 3), (0, 2), (1, 3), (2, 3))
    sample = ProcessGroupSample(time=1.0, groups=groups, partial=(2,), waits_in=((0, 1), (1, 2), (3, 3)))
    acts = _acts({0: "waiting", 1: "waiting", 2: "idle", 3: "waiting"},
                 {0: "t.py:67", 1: "t.py:67", 3: "mappings.py:9"})
    incidents, notes = _resolve(sample, acts)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("hang", "inconclusive", ())]
    assert "not observed on this host" in notes[0]
    assert any("wait_for" in e.data for e in incidents[0].evidence)


def test_a_chain_ending_at_a_tie_says_where_both_wait():
    # DTensor dp=2 x tp=2 attached after rank 2 called a broadcast in its tp group: the two members
    # of {2, 3} are mirror images (each awaited by its dp partner, each waiting for the other)
    waits = {0: w(0, group=DP02), 1: w(1, group=DP13), 2: w(2, group=TP23, coll="broadcast at t.py:5"),
             3: w(3, group=TP23, coll="wait_tensor at t.py:6")}
    g = analyze(waits, GROUPS)
    texts = [chain_text(g, c, waits) for c in g.chains]
    assert "rank 0 waits in all_reduce at x.py:1 of group {0, 2} for rank 2, which waits in broadcast at t.py:5, " \
           "where its group's other waiting members are in another collective (no strict majority)" in texts, texts
    assert any("for rank 3, which waits in wait_tensor at t.py:6" in t for t in texts), texts


# --------------------------------------------------------------------------- pipelines (point-to-point)


def test_p2p_waits_at_different_calls_of_one_pipeline_group_are_no_desync():
    # 4 stages in one pipeline group, stage 2 stalled: stage 3 waits in recv, stage 1 in send, stage 0
    # in recv of the backward, each at its own call site; none is a desync origin
    waits = {0: Wait(0, "waiting", 0, "recv at p.py:9", p2p=True), 1: Wait(1, "waiting", 0, "send at p.py:7", p2p=True),
             3: Wait(3, "waiting", 0, "recv at p.py:7", p2p=True), 2: Wait(2, "idle")}
    g = analyze(waits, [(0, 1, 2, 3)])
    assert (g.status, g.origins, g.kinds) == (ATTRIBUTED, (2,), {2: "idle"})
    # the same waits taken for collectives: three calls of one group, no majority: a tie, nobody named
    g = analyze({r: Wait(r, x.state, x.group, x.collective) for r, x in waits.items()}, [(0, 1, 2, 3)])
    assert g.status == INCONCLUSIVE and "no strict majority" in g.reason


def _mix_acts():
    # dp=2 x tp=2 x pp=2 (rank = pp*4 + dp*2 + tp), rank 6 stalled after its step (measured on the job)
    states = {r: "waiting" for r in range(8)} | {6: "idle"}
    sites = {0: "t.py:109", 1: "t.py:109", 2: "t.py:97", 3: "t.py:99", 4: "t.py:109", 5: "t.py:109", 7: "t.py:91"}
    return _acts(states, sites)


MIX = ((0, 1, 2, 3, 4, 5, 6, 7), (0, 4), (0, 2), (0, 1), (1, 5), (1, 3), (2, 6), (2, 3), (3, 7), (4, 6), (4, 5),
       (5, 7), (6, 7))


def test_a_tie_between_groups_is_kept_when_every_choice_ends_at_one_origin():
    from scout_sys.consensus.waitresolve import analyze_sample
    from scout_sys.model import ProcessGroupSample

    # rank 3 sent last to {3, 7} and {2, 3} in one tick: either way its chain ends at rank 6
    gi = {m: i for i, m in enumerate(MIX)}
    waits_in = ((0, gi[(0, 2)]), (1, gi[(1, 3)]), (2, gi[(2, 6)]), (4, gi[(4, 6)]), (5, gi[(5, 7)]),
                (7, gi[(6, 7)]))
    sample = ProcessGroupSample(time=1.0, groups=MIX, waits_in=waits_in,
                                waits_in_one_of=((3, (gi[(2, 3)], gi[(3, 7)])),))
    g, _, note = analyze_sample(_mix_acts(), sample)
    assert (g.status, g.origins) == (ATTRIBUTED, (6,)) and "one clock tick" in note
    # a tie whose choices end at different ranks (here: 0 is idle too) stays unknown: inconclusive
    acts = _mix_acts()
    acts[0] = _acts({0: "idle"}, {})[0]
    sample = ProcessGroupSample(time=1.0, groups=MIX, waits_in=waits_in[1:],
                                waits_in_one_of=((3, (gi[(2, 3)], gi[(1, 3)])),))
    g, _, note = analyze_sample(acts, sample)
    assert g.status != ATTRIBUTED and note == ""


def test_resolve_adds_the_graph_to_an_agreeing_verdict_and_replaces_one_that_names_a_waiter():
    from scout_sys.consensus.hang import _attribute
    from scout_sys.consensus.waitresolve import resolve
    from scout_sys.model import DESYNC, HANG, Incident, ProcessGroupSample

    gi = {m: i for i, m in enumerate(MIX)}
    sample = ProcessGroupSample(time=1.0, groups=MIX, waits_in=(
        (0, gi[(0, 2)]), (1, gi[(1, 3)]), (2, gi[(2, 6)]), (3, gi[(3, 7)]), (4, gi[(4, 6)]), (5, gi[(5, 7)]),
        (7, gi[(6, 7)])))
    acts = _mix_acts()
    job = _job(8)
    right = Incident(HANG, "attributed", (6,), ("h0",), 0.0, "rank 6 is stuck")
    out, notes = resolve(job, [sample], acts, [right], _attribute, (0.0, 1.0))
    assert [i.ranks for i in out] == [(6,)] and any("chain" in e.data for e in out[0].evidence), notes
    # the tp partner (7) named as a desync: it waits for 6 in their tp group — replaced by the graph
    wrong = Incident(DESYNC, "attributed", (7,), ("h0",), 0.0, "rank 7 waits elsewhere")
    out, notes = resolve(job, [sample], acts, [right, wrong], _attribute, (0.0, 1.0))
    assert [(i.kind, i.ranks) for i in out] == [(HANG, (6,))], out
    assert any("witnesses, not origins" in n for n in notes), notes


def test_a_pipeline_group_with_stages_elsewhere_names_nobody():
    # stages 0-1 here, stages 2-3 on another host (-1 stands for them): stage 1 waits in recv of the
    # pipeline group; stage 0 is idle here, but what stage 1 waits for may be a stage elsewhere
    waits = {1: Wait(1, "waiting", 0, "recv at p.py:7", p2p=True), 0: Wait(0, "idle")}
    g = analyze(waits, [(0, 1, 2, 3, -1)])
    assert g.status == INCONCLUSIVE and "not observed on this host" in g.reason, g


def test_a_pause_is_a_value_of_the_graph_not_its_sentence():
    from scout_sys.consensus.waitfor import NONE, PROGRESS, Graph

    assert Graph(NONE, ends=frozenset({PROGRESS})).pause
    assert not Graph(NONE, ends=frozenset({PROGRESS, "elsewhere"})).pause
    assert not Graph("inconclusive", ends=frozenset({PROGRESS})).pause
    assert not Graph(NONE, reason="a rank that is still progressing (a pause, not a hang)").pause
