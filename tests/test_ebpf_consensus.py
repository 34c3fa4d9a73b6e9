"""desync and lifecycle rules on synthetic eBPF records (pure functions, no processes)."""

from __future__ import annotations

from scout_sys.consensus import desync, lifecycle
from scout_sys.model import (
    ATTRIBUTED,
    DESYNC,
    INCONCLUSIVE,
    PROCESS_EXIT,
    CollectiveSample,
    ExitRecord,
    Fingerprint,
    Job,
    Rank,
    SignalRecord,
)


def job(n: int) -> Job:
    return Job(ranks=tuple(Rank(rank=r, pid=1000 + r, host="h") for r in range(n)), world_size=n,
               launcher="torchrun", launcher_pid=999, host="h")


def sample(rank: int, fps: list[Fingerprint], *, inside: bool = False, t: float = 100.0,
           enter: float | None = None, group: str = "gloo:0") -> CollectiveSample:
    last = fps[-1] if fps else None
    return CollectiveSample(time=t, rank=rank, pid=1000 + rank, backend="gloo", group=group,
                            seq=last.seq if last else 0, completed=None, inside=inside,
                            last_enter=enter if enter is not None else (last.time if last else None),
                            last_exit=None, last=last, recent=tuple(fps))


def ar(seq: int, count: int = 4160, op: str = "allreduce", t: float = 10.0) -> Fingerprint:
    return Fingerprint(seq=seq, op=op, time=t + seq, count=count, dtype="float32", redop="sum")


def test_healthy_sequence_is_quiet() -> None:
    obs = [sample(r, [ar(s) for s in range(5, 9)]) for r in range(4)]
    assert desync.analyze(job(4), obs) == []


def test_minority_with_other_collective_is_named() -> None:
    obs = [sample(r, [ar(s) for s in range(5, 9)]) for r in (0, 1, 3)]
    obs.append(sample(2, [ar(5), ar(6), ar(7, op="broadcast"), ar(8)]))
    (inc,) = desync.analyze(job(4), obs)
    assert (inc.kind, inc.status, inc.ranks) == (DESYNC, ATTRIBUTED, (2,))
    assert "#7" in inc.summary and "broadcast" in inc.summary
    assert inc.evidence[0].data["fingerprint"]["op"] == "broadcast"


def test_other_size_is_named() -> None:
    obs = [sample(r, [ar(s) for s in range(1, 4)]) for r in (0, 1, 2)]
    obs.append(sample(3, [ar(1), ar(2), ar(3, count=4153)]))
    (inc,) = desync.analyze(job(4), obs)
    assert inc.ranks == (3,) and "4153" in inc.summary


def test_a_tensor_the_probe_could_not_read_is_unknown_not_different() -> None:
    # rank 1's tensor was not readable when it entered #7 (count, dtype, redop None: seen on a healthy
    # job while rank 0 wrote a checkpoint): its call is compared by what was read, the op
    unread = Fingerprint(seq=7, op="allreduce", time=17.0)
    obs = [sample(r, [ar(s) for s in range(5, 9)]) for r in (0, 2, 3)]
    obs.append(sample(1, [ar(5), ar(6), unread, ar(8)]))
    assert desync.analyze(job(4), obs) == []
    # a different op on the unread rank is still named
    obs[-1] = sample(1, [ar(5), ar(6), Fingerprint(seq=7, op="broadcast", time=17.0), ar(8)])
    (inc,) = desync.analyze(job(4), obs)
    assert inc.ranks == (1,) and "#7 broadcast" in inc.summary


def test_no_majority_is_inconclusive() -> None:
    obs = [sample(0, [ar(1)]), sample(1, [ar(1, count=2)]), sample(2, [ar(1, count=3)]), sample(3, [ar(1, count=4)])]
    (inc,) = desync.analyze(job(4), obs)
    assert inc.status == INCONCLUSIVE and inc.ranks == ()


def test_no_majority_among_the_ranks_seen_so_far_waits_for_the_others() -> None:
    """Two of four ranks sampled yet (the probe's first read, a loaded machine): one against one is no
    verdict, since the two not seen could make the majority; with them seen, the odd one is named."""
    first = [sample(0, [ar(7), ar(8)]), sample(2, [ar(7), ar(8, op="broadcast")])]
    assert desync.analyze(job(4), first) == []
    (inc,) = desync.analyze(job(4), first + [sample(r, [ar(7), ar(8)]) for r in (1, 3)])
    assert (inc.status, inc.ranks) == (ATTRIBUTED, (2,))


def test_rank_behind_while_majority_waits() -> None:
    obs = [sample(r, [ar(s) for s in range(1, 9)], inside=True, enter=50.0) for r in (0, 1, 3)]
    obs.append(sample(2, [ar(s) for s in range(1, 8)], inside=False))
    (inc,) = desync.analyze(job(4), obs)
    assert (inc.kind, inc.ranks) == (DESYNC, (2,)) and "behind" in inc.summary and inc.since == 50.0


def test_a_split_majority_at_n_waits_for_the_late_rank_instead_of_calling_it_behind() -> None:
    """Seen on a loaded machine: rank 2 called #8 with another size, rank 1 reached #8 a second after
    the others. The ranks at #8 disagree on it (two against one, of four): rank 1 is not behind, and
    once its #8 is seen the differing size is named (rule 1)."""
    inside = [sample(r, [ar(s) for s in range(1, 9)], inside=True, enter=50.0) for r in (0, 3)]
    odd = sample(2, [*(ar(s) for s in range(1, 8)), ar(8, count=4153)], inside=True, enter=50.0)
    late = sample(1, [ar(s) for s in range(1, 8)])
    assert desync.analyze(job(4), [*inside, odd, late]) == []
    arrived = sample(1, [ar(s) for s in range(1, 9)], inside=True, t=101.0)
    (inc,) = desync.analyze(job(4), [*inside, odd, late, arrived])
    assert (inc.status, inc.ranks) == (ATTRIBUTED, (2,)) and "4153 x float32" in inc.summary, inc.summary
    assert "behind" not in inc.summary


def test_a_differing_call_at_n_that_a_late_rank_cannot_outvote_is_named_at_once() -> None:
    """Five ranks: three agree on #8, rank 2 differs, rank 4 is not there yet. Three of five agree
    whatever rank 4 calls, so rank 2's call is named, not rank 4 as behind."""
    obs = [sample(r, [ar(s) for s in range(1, 9)], inside=True, enter=50.0) for r in (0, 1, 3)]
    obs.append(sample(2, [*(ar(s) for s in range(1, 8)), ar(8, op="broadcast")], inside=True, enter=50.0))
    obs.append(sample(4, [ar(s) for s in range(1, 8)]))
    (inc,) = desync.analyze(job(5), obs)
    assert (inc.status, inc.ranks) == (ATTRIBUTED, (2,)) and "#8 broadcast" in inc.summary, inc.summary


def _two_groups(swapped: tuple[int, ...], odd: int | None = None) -> list[CollectiveSample]:
    """Each rank calls a tp group (64 elements) and a dp group (4160); a probe attached mid-step saw
    the ranks in ``swapped`` first in their dp group, so they number it gloo:0. ``odd`` broadcast
    instead of its 7th tp all-reduce."""
    obs = []
    for r in range(4):
        tp = [ar(s, count=64, op="broadcast" if (r == odd and s == 7) else "allreduce") for s in range(5, 9)]
        dp = [ar(s) for s in range(5, 9)]
        first, second = (dp, tp) if r in swapped else (tp, dp)
        obs += [sample(r, first, group="gloo:0"), sample(r, second, group="gloo:1")]
    return obs


def test_groups_numbered_in_another_order_are_aligned_by_their_calls() -> None:
    aligned = desync.align(desync.latest(_two_groups(swapped=(1, 3))))
    for r in range(4):
        assert aligned[("gloo:0", r)].last.count == 64 and aligned[("gloo:1", r)].last.count == 4160
        assert aligned[("gloo:0", r)].group == "gloo:0"
    assert desync.analyze(job(4), _two_groups(swapped=(1, 3))) == []


def test_desync_named_when_a_late_probe_numbered_the_groups_differently() -> None:
    # without the alignment gloo:0 holds two tp and two dp sequences: a 2-2 tie, nobody named
    (inc,) = desync.analyze(job(4), _two_groups(swapped=(1, 2), odd=2))
    assert (inc.kind, inc.status, inc.ranks) == (DESYNC, ATTRIBUTED, (2,)) and "broadcast" in inc.summary


def test_a_group_whose_number_another_took_is_never_compared() -> None:
    # ranks 0, 2, 3: tp, dp, and a third group (1-element all-reduces); rank 1 saw a group of its own
    # first (an all-gather nobody else called), then tp and dp
    obs = []
    for r in (0, 2, 3):
        obs += [sample(r, [ar(s, count=64) for s in range(5, 9)], group="gloo:0"),
                sample(r, [ar(s) for s in range(5, 9)], group="gloo:1"),
                sample(r, [ar(s, count=1) for s in range(1, 3)], group="gloo:2")]
    obs += [sample(1, [ar(1, count=7, op="allgather")], group="gloo:0"),
            sample(1, [ar(s, count=64) for s in range(5, 9)], group="gloo:1"),
            sample(1, [ar(s) for s in range(5, 9)], group="gloo:2")]
    aligned = desync.align(desync.latest(obs))
    assert aligned[("gloo:0", 1)].last.count == 64 and aligned[("gloo:1", 1)].last.count == 4160
    assert aligned[("gloo:0@1", 1)].last.op == "allgather" and ("gloo:2", 1) not in aligned
    assert desync.analyze(job(4), obs) == []


def test_skew_without_waiting_majority_is_not_desync() -> None:
    # the majority entered #8 half a second ago and is not inside it: ordinary skew between ranks
    obs = [sample(r, [ar(s) for s in range(1, 9)], inside=False, t=18.5) for r in (0, 1, 3)]
    obs.append(sample(2, [ar(s) for s in range(1, 8)], t=18.5))
    assert desync.analyze(job(4), obs) == []


def test_async_majority_quiet_for_long_names_the_rank_behind() -> None:
    # the GPU shape: #8 was only enqueued (never "inside"); nobody issued anything for QUIET_ASYNC s
    t = 18.0 + desync.QUIET_ASYNC + 0.5
    obs = [sample(r, [ar(s) for s in range(1, 9)], inside=False, t=t) for r in (0, 1, 3)]
    obs.append(sample(2, [ar(s) for s in range(1, 8)], t=t))
    (inc,) = desync.analyze(job(4), obs)
    assert (inc.kind, inc.status, inc.ranks) == (DESYNC, ATTRIBUTED, (2,)) and "behind" in inc.summary


def test_scales_to_10k_ranks() -> None:
    n = 10_000
    obs = [sample(r, [ar(s) for s in range(1, 4)]) for r in range(n - 1)]
    obs.append(sample(n - 1, [ar(1), ar(2), ar(3, op="barrier")]))
    (inc,) = desync.analyze(job(n), obs)
    assert inc.ranks == (n - 1,)


def _exit(rank: int, t: float, sig: int | None = None, code: int | None = None) -> ExitRecord:
    return ExitRecord(time=t, rank=rank, pid=1000 + rank, exit_code=code, signal=sig)


def _sig(rank: int, sig: int, sender: int, comm: str, t: float) -> SignalRecord:
    return SignalRecord(time=t, rank=rank, pid=1000 + rank, signal=sig, signal_name="", sender_pid=sender,
                        sender_comm=comm, code=0, result=0, first_time=t)


def test_first_death_named_with_signal_and_sender() -> None:
    obs = [_sig(1, 9, 4242, "kill", 10.0), _exit(1, 10.001, sig=9)]
    for r in (0, 2, 3):
        obs += [_sig(r, 15, 999, "torchrun", 10.2), _exit(r, 10.3 + r / 100, sig=15)]
    (inc,) = lifecycle.analyze(job(4), obs)
    assert (inc.kind, inc.ranks) == (PROCESS_EXIT, (1,))
    assert "SIGKILL" in inc.summary and "4242" in inc.summary
    assert inc.evidence[0].data["sender_pid"] == 4242
    assert [e.data["sender_comm"] for e in inc.evidence[1:]] == ["torchrun"] * 3


def test_exit_code_and_clean_finish() -> None:
    (inc,) = lifecycle.analyze(job(2), [_exit(0, 5.0, code=3), _exit(1, 6.0, sig=15)])
    assert inc.ranks == (0,) and "code 3" in inc.summary
    assert lifecycle.analyze(job(2), [_exit(0, 5.0, code=0), _exit(1, 5.1, code=0)]) == []
    # a job finishing: rank 3 is out with 0 before the others; nobody died
    assert lifecycle.analyze(job(4), [_exit(3, 5.0, code=0)]) == []
    # once a rank died, the order counts again: the clean exit came first (the death may follow from it)
    (inc,) = lifecycle.analyze(job(4), [_exit(3, 5.0, code=0), _exit(1, 6.0, code=2)])
    assert inc.ranks == (3,) and "1 more rank ended after it" in inc.summary


def test_the_first_death_replaces_procfs_lumping_its_victims_with_it() -> None:
    """/proc sees ranks 0, 2 and 3 dead; the exit probe saw rank 3 die first and the others after it:
    one incident naming rank 3, with both sources' evidence; ranks 0 and 2 are not blamed."""
    from scout_sys.consensus.merge import merge_findings
    from scout_sys.model import Evidence, Incident

    procfs = Incident(kind=PROCESS_EXIT, status=ATTRIBUTED, ranks=(0, 2, 3), hosts=("h",), since=12.0,
                      summary="rank 0 exited with code 1; rank 2 exited with code 1; rank 3 was killed by SIGKILL",
                      evidence=tuple(Evidence("procfs", f"rank {r} exited", rank=r) for r in (0, 2, 3)))
    obs = [_sig(3, 9, 4242, "kill", 10.0), _exit(3, 10.001, sig=9), _exit(0, 15.0, code=1), _exit(2, 15.1, code=1)]
    first = lifecycle.analyze(job(4), obs)
    assert [i.ranks for i in first] == [(3,)]
    (inc,) = merge_findings([procfs], first)
    assert (inc.kind, inc.ranks, inc.since) == (PROCESS_EXIT, (3,), 10.001)
    assert inc.summary == first[0].summary and {e.source for e in inc.evidence} == {"ebpf", "procfs"}
    (other_way,) = merge_findings(first, [procfs])
    assert other_way.ranks == (3,) and len(other_way.evidence) == len(inc.evidence)


def test_a_dead_rank_behind_in_sequence_is_one_incident_with_its_exit() -> None:
    # every rank has died by now (Gloo peers fail after the first death): the stack rules are silent,
    # the exit probe names rank 3 first, and desync sees rank 3 behind: one incident, not two
    from scout_sys.monitor import Monitor

    obs = [sample(r, [ar(s) for s in range(1, 9)], inside=True, t=100.0, enter=90.0) for r in (0, 1, 2)]
    obs.append(sample(3, [ar(s) for s in range(1, 8)], t=100.0))
    obs += [_exit(3, 95.0, sig=9), _exit(0, 96.0, code=1), _exit(1, 96.1, code=1), _exit(2, 96.2, code=1)]
    found = Monitor(job(4)).decide(obs, (99.0, 100.0)).incidents  # the rules as diagnose and watch merge them
    assert [(i.kind, i.ranks) for i in found] == [(PROCESS_EXIT, (3,))], found
    assert any(e.source == "ebpf" and "behind" in e.text for e in found[0].evidence)


def _grid(dims: tuple[str, str], peer_groups: tuple[tuple[int, ...], ...]) -> Job:
    """Four ranks, tp fastest: rank r at (dims[0]=r // 2, dims[1]=r % 2), with the given peer groups."""
    ranks = tuple(Rank(rank=r, pid=1000 + r, host="h", coords=((dims[0], r // 2), (dims[1], r % 2)))
                  for r in range(4))
    return Job(ranks=ranks, world_size=4, launcher="torchrun", launcher_pid=999, host="h",
               peer_groups=peer_groups, layout="--topology")


DP2_TP2 = _grid(("dp", "tp"), ((0, 2), (1, 3)))  # peers: the dp replicas of each tp rank


def _tp_gather(odd_op: str = "allgather", odd_rank: int = 2, partner_op: str = "allreduce") -> list[CollectiveSample]:
    """dp=2 x tp=2: every rank's tp group (gloo:0, 128-element all-reduces) up to #7; at #8 ranks 0, 1
    (the other tp group) and the odd rank's partner all-reduce, the odd rank calls ``odd_op``."""
    obs = []
    for r in range(4):
        op = odd_op if r == odd_rank else (partner_op if r == odd_rank ^ 1 else "allreduce")
        fps = [ar(s, count=128) for s in range(5, 8)] + [ar(8, count=4 if op == "allgather" else 128, op=op)]
        obs.append(sample(r, fps, group="gloo:0"))
    return obs


def test_a_tie_in_one_tp_group_is_decided_by_the_equivalent_tp_group() -> None:
    """Rank 2 all-gathers where its tp partner 3 all-reduces: within the peer group (0, 2) it is one
    against one; over both tp groups three of four ranks all-reduced at #8."""
    (inc,) = desync.analyze(DP2_TP2, _tp_gather())
    assert (inc.kind, inc.status, inc.ranks) == (DESYNC, ATTRIBUTED, (2,)), inc.summary
    assert "#8" in inc.summary and "allgather" in inc.summary and "equivalent" in inc.summary
    across = next(e for e in inc.evidence if "equivalent_groups" in e.data)
    assert across.data["position"] == 8 and across.data["equivalent_groups"] == [[0, 2], [1, 3]]
    assert {r: f["op"] for r, f in across.data["fingerprints"].items()} == {
        "0": "allreduce", "1": "allreduce", "2": "allgather", "3": "allreduce"}
    assert inc.evidence[0].rank == 2 and inc.evidence[0].data["fingerprint"]["op"] == "allgather"


def test_a_desync_names_the_group_by_its_members_where_the_probe_read_them() -> None:
    """The probe's name says only the order of first use (both tp groups are gloo:0): the summary and the
    evidence say which ranks the group is (issue 22), the name beside them."""
    from dataclasses import replace

    tp = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}
    (inc,) = desync.analyze(DP2_TP2, [replace(s, members=tp[s.rank]) for s in _tp_gather()])
    assert inc.ranks == (2,) and "called a different collective at #8 of ranks 2-3 (gloo:0)" in inc.summary, \
        inc.summary
    assert inc.evidence[0].text.startswith("rank 2 in ranks 2-3 (gloo:0): #8 allgather"), inc.evidence[0].text
    assert inc.evidence[0].data["members"] == [2, 3]
    across = next(e for e in inc.evidence if "equivalent_groups" in e.data)
    assert "at #8 of ranks 0-1 and ranks 2-3 (gloo:0)" in across.text, across.text
    # without members, the probe's name as before
    (plain,) = desync.analyze(DP2_TP2, _tp_gather())
    assert "at gloo:0 #8" in plain.summary, plain.summary


def test_equivalent_groups_healthy_and_two_against_two_name_nobody() -> None:
    assert desync.analyze(DP2_TP2, _tp_gather(odd_op="allreduce")) == []
    # ranks 2 and 3 call two other collectives than ranks 0, 1 (two against two): no strict majority
    two = _tp_gather(partner_op="broadcast")
    found = desync.analyze(DP2_TP2, two)
    assert found and all((i.status, i.ranks) == (INCONCLUSIVE, ()) for i in found), [i.summary for i in found]


def test_pipeline_stages_are_not_equivalent_groups() -> None:
    """pp=2 x dp=2: the stages' groups hold other shards (other sizes); a tie in one stage stays one."""
    pp2_dp2 = _grid(("pp", "dp"), ((0, 1), (2, 3)))
    obs = []
    for r in range(4):
        op = "allgather" if r == 2 else "allreduce"
        obs.append(sample(r, [ar(s, count=128) for s in range(5, 8)] + [ar(8, count=128, op=op)], group="gloo:0"))
    found = desync.analyze(pp2_dp2, obs)
    assert [(i.status, i.ranks) for i in found] == [(INCONCLUSIVE, ())], [i.summary for i in found]


def test_an_attributed_desync_explains_the_stack_rules_tie() -> None:
    """Every rank waits, the stacks alone see no strict majority (an inconclusive hang): the desync
    the fingerprints name is the one incident, the tie its evidence."""
    from scout_sys.consensus.merge import merge_findings
    from scout_sys.model import HANG, Evidence, Incident

    tie = Incident(kind=HANG, status=INCONCLUSIVE, ranks=(), hosts=("h",), since=1.0,
                   summary="no progress on any of 4 ranks, but no strict majority waits at one place",
                   evidence=(Evidence("stack", "rank 2 waits in all_gather"),))
    named = desync.analyze(DP2_TP2, _tp_gather())
    (inc,) = merge_findings([tie], named)
    assert (inc.kind, inc.status, inc.ranks) == (DESYNC, ATTRIBUTED, (2,))
    folded = inc.evidence[-1]
    assert folded.data["was"] == HANG and folded.data["explained_by"] == [2], folded
    assert folded.data["evidence"] == ["rank 2 waits in all_gather"]
    # without a named desync the tie stays
    assert merge_findings([tie], []) == [tie]


def test_a_differing_fingerprint_is_a_value_of_its_evidence_not_its_text():
    from scout_sys.consensus.desync import fingerprint_differs
    from scout_sys.model import DESYNC, Evidence, Incident

    def inc(*ev: Evidence) -> Incident:
        return Incident(kind=DESYNC, status="attributed", ranks=(2,), hosts=("h",), since=0.0, summary="s",
                        evidence=ev)

    assert fingerprint_differs(inc(Evidence("ebpf", "rank 2 gloo:0: #8 broadcast", rank=2, data={"differs": True})))
    assert not fingerprint_differs(inc(Evidence("ebpf", "rank 2 gloo:0: #8 broadcast (differs)", rank=2)))
    assert not fingerprint_differs(inc(Evidence("ebpf", "rank 2 behind", rank=2)))
