"""Straggler rules on synthetic records (pure consensus, no processes)."""

from __future__ import annotations

from scout_sys.consensus import straggler
from scout_sys.model import STRAGGLER, CollectiveSample, Fingerprint, Job, ProcSample, Rank

T0 = 5_000.0


def _job(n=4):
    return Job(ranks=tuple(Rank(rank=r, pid=100 + r, host="h") for r in range(n)), world_size=n,
               launcher="torchrun", launcher_pid=1, host="h")


def _collectives(n, late: dict[int, float], period=0.05, steps=20):
    """Each rank enters collective k at T0 + k*period + its lateness."""
    obs = []
    for r in range(n):
        fps = tuple(Fingerprint(seq=k + 1, op="allreduce", time=T0 + k * period + late.get(r, 0.0))
                    for k in range(steps))
        obs.append(CollectiveSample(time=T0 + steps * period, rank=r, pid=100 + r, backend="gloo", group="gloo:0",
                                    seq=steps, completed=steps, inside=False, last_enter=fps[-1].time,
                                    last_exit=None, last=fps[-1], recent=fps))
    return obs


def _busy(n, busy: dict[int, float], default: float, seconds=1.0):
    obs = []
    for r in range(n):
        b = busy.get(r, default)
        for i, t in enumerate((T0, T0 + seconds)):
            obs.append(ProcSample(time=t, rank=r, pid=100 + r, status="sleeping",
                                  main_cpu_ns=int(i * b * seconds * 1e9), main_delay_ns=0))
    return obs


def test_the_rank_every_collective_waits_for_is_an_outlier():
    obs = _collectives(4, {1: 0.04}) + _busy(4, {1: 0.9}, default=0.05)
    w = straggler.window_verdict(_job(), obs, T0 - 0.1, T0 + 1.1)
    assert w.metric == "lag" and w.suspects == (1,)
    assert abs(w.values[1] - 0.04) < 1e-9 and w.period and abs(w.period - 0.05) < 1e-9


def test_a_late_rank_whose_peers_would_sleep_anyway_is_not_a_straggler():
    # Ranks paced by their input: rank 0 is out of phase by 27 ms of a 50 ms step, but its peers
    # are idle outside collectives for the rest of their step: nothing is slowed.
    obs = _collectives(4, {0: 0.027}) + _busy(4, {}, default=0.04)
    w = straggler.window_verdict(_job(), obs, T0 - 0.1, T0 + 1.1)
    assert w.suspects == () and w.slack is not None and w.slack > straggler.SLACK_MAX


def test_busy_share_without_ebpf():
    obs = _busy(4, {3: 0.6}, default=0.05)
    w = straggler.window_verdict(_job(), obs, T0, T0 + 1.0)
    assert w.metric == "busy" and w.suspects == (3,)


def test_noise_is_not_an_outlier():
    obs = _busy(4, {0: 0.07, 1: 0.05, 2: 0.09, 3: 0.06}, default=0.05)
    assert straggler.window_verdict(_job(), obs, T0, T0 + 1.0).suspects == ()


def test_two_ranks_cannot_outvote_each_other():
    obs = _busy(2, {1: 0.9}, default=0.05)
    assert straggler.window_verdict(_job(2), obs, T0, T0 + 1.0).metric == ""


def test_an_incident_needs_the_same_rank_in_three_windows():
    job = _job()
    slow = straggler.window_verdict(job, _busy(4, {2: 0.8}, default=0.05), T0, T0 + 1)
    calm = straggler.window_verdict(job, _busy(4, {}, default=0.05), T0, T0 + 1)
    assert straggler.confirm(job, [calm, slow, slow]) is None  # one slow step, then two: not yet
    inc = straggler.confirm(job, [slow, slow, slow])
    assert inc is not None and inc.kind == STRAGGLER and inc.ranks == (2,)
    assert "straggler" in inc.summary and inc.evidence
