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
    from scout_sys.model import Evidence, Incident
    from scout_sys.monitor import merge_findings

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
