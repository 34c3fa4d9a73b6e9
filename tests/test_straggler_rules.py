"""Straggler rules on synthetic records (pure consensus, no processes)."""

from __future__ import annotations

from scout_sys.consensus import cpushare, straggler, straggler_window
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


def test_a_late_rank_busier_than_its_idle_peers_is_a_straggler_whatever_their_slack():
    # The same peers' slack (they sleep a fixed 50 ms each step), but rank 0 is late because it computes
    # while they wait: its lag is added to every step. Without the busy share's word it stays a phase.
    obs = _collectives(4, {0: 0.027}) + _busy(4, {0: 0.6}, default=0.04)
    w = straggler.window_verdict(_job(), obs, T0 - 0.1, T0 + 1.1)
    assert w.slack is not None and w.slack > straggler.SLACK_MAX
    assert (w.metric, w.suspects) == ("lag", (0,))


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


# ---- diagnose: one window of stacks

def _window(rank_stacks, states, wrote=None):
    """rank -> list of per-sample stacks (frames); Activities with ``states``."""
    from scout_sys.model import Activity, StackSample, ThreadStack

    obs = []
    for r, frames_list in rank_stacks.items():
        for i, frames in enumerate(frames_list):
            obs.append(StackSample(time=100.0 + i, rank=r, pid=10 + r,
                                   threads=(ThreadStack(tid=10 + r, name="MainThread", active=True, frames=frames),)))
    acts = {r: Activity(rank=r, pid=10 + r, state=states[r], wrote=(wrote or {}).get(r, 0)) for r in rank_stacks}
    return obs, acts


def _fr(*names):
    from scout_sys.model import Frame

    return tuple(Frame(function=n, file="/j/train.py", line=i) for i, n in enumerate(names))


WAIT = _fr("wait_for_buckets", "main")
COMPUTE = [_fr("forward", "main"), _fr("extra_compute", "main"), _fr("backward", "main"), _fr("extra_compute", "main"),
           _fr("extra_compute", "main")]


def test_diagnose_names_the_rank_the_others_keep_waiting_for():
    peers = [WAIT, WAIT, _fr("forward", "main"), WAIT, WAIT]
    obs, acts = _window({0: peers, 1: peers[1:] + peers[:1], 2: COMPUTE, 3: peers},
                        {0: "running", 1: "running", 2: "running", 3: "running"})
    assert set(straggler_window.never_waiting(_job(4), obs, acts)) == {2}
    # with the stacks alone (no busy share in the window): a note, not an incident
    incidents, notes = straggler_window.in_window(_job(4), obs, acts, (100.0, 104.0))
    assert incidents == [] and any("rank 2 was never found waiting" in n for n in notes)
    # the busy share alone: an inconclusive straggler, naming no origin
    busy = [ProcSample(time=100.0 + t, rank=r, pid=10 + r, status="running", main_cpu_ns=int(t * 1e9 * (0.95 if r == 2 else 0.3)),
                       main_delay_ns=0) for r in range(4) for t in (0, 4)]
    incidents, _ = straggler_window.in_window(_job(4), busy, acts, (100.0, 104.0))
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("straggler", "inconclusive", ())]
    assert "rank 2 may be a straggler" in incidents[0].summary and "one measure only" in incidents[0].summary
    # the busy share alone, of a rank that was busier only because it waited for a CPU (run queue): the
    # host's load when its peers' stacks, read, show them no more waiting than it (a note) ...
    contended = [ProcSample(time=100.0 + t, rank=r, pid=10 + r, status="running", main_cpu_ns=int(t * 1e9 * 0.07),
                            main_delay_ns=int(t * 1e9 * (0.25 if r == 1 else 0.0))) for r in range(4) for t in (0, 4)]
    alike, _ = _window({0: peers, 1: peers, 2: peers[1:] + peers[:1], 3: peers},
                       {0: "running", 1: "running", 2: "running", 3: "running"})
    incidents, notes = straggler_window.in_window(_job(4), alike + contended, acts, (100.0, 104.0))
    assert incidents == [] and any("rank 1 waited for a CPU" in n and "contended" in n for n in notes), notes
    # ... with no stacks to ask, an inconclusive straggler still
    incidents, _ = straggler_window.in_window(_job(4), contended, acts, (100.0, 104.0))
    assert [(i.kind, i.status) for i in incidents] == [("straggler", "inconclusive")], incidents
    # ... while with the stack samples too (its peers were found waiting for it), the same share names it
    rank2 = [ProcSample(time=100.0 + t, rank=r, pid=10 + r, status="running", main_cpu_ns=int(t * 1e9 * 0.07),
                        main_delay_ns=int(t * 1e9 * (0.25 if r == 2 else 0.0))) for r in range(4) for t in (0, 4)]
    incidents, _ = straggler_window.in_window(_job(4), obs + rank2, acts, (100.0, 104.0))
    assert [(i.kind, i.ranks) for i in incidents] == [("straggler", (2,))], incidents
    assert "contended" in incidents[0].summary
    # both measures agree: attributed
    busy = [ProcSample(time=100.0 + t, rank=r, pid=10 + r, status="running", main_cpu_ns=int(t * 1e9 * (0.95 if r == 2 else 0.3)),
                       main_delay_ns=0) for r in range(4) for t in (0, 4)]
    incidents, _ = straggler_window.in_window(_job(4), obs + busy, acts, (100.0, 104.0))
    assert [(i.kind, i.ranks) for i in incidents] == [("straggler", (2,))]
    assert "never waits" in incidents[0].summary and {e.source for e in incidents[0].evidence} == {"stack", "procfs"}


def test_diagnose_straggler_not_for_a_checkpoint_pause_or_a_hang():
    waiting = [WAIT] * 5
    # rank 0 writes a checkpoint while the others wait the whole window: a pause
    obs, acts = _window({0: COMPUTE, 1: waiting, 2: waiting, 3: waiting},
                        {0: "running", 1: "idle", 2: "idle", 3: "idle"}, wrote={0: 10 << 20})
    assert straggler_window.never_waiting(_job(4), obs, acts) == {}
    # a rank stuck elsewhere is a hang, never a straggler
    obs, acts = _window({0: [_fr("load", "main")] * 5, 1: COMPUTE, 2: COMPUTE, 3: COMPUTE},
                        {0: "idle", 1: "running", 2: "running", 3: "running"})
    assert straggler_window.never_waiting(_job(4), obs, acts) == {}


def test_diagnose_straggler_healthy_job_names_nobody():
    mixed = [[WAIT, _fr("forward", "main"), WAIT, _fr("backward", "main"), WAIT][(i + r) % 5:] +
             [WAIT, _fr("forward", "main"), WAIT, _fr("backward", "main"), WAIT][:(i + r) % 5] for r, i in
             zip(range(4), (0, 1, 2, 3))]
    obs, acts = _window(dict(enumerate(mixed)), dict.fromkeys(range(4), "running"))
    assert straggler_window.never_waiting(_job(4), obs, acts) == {}


def test_socket_writes_shared_by_every_rank_are_no_checkpoint():
    # write counts include the sockets: every rank sends its share of the collectives' data (a real
    # Megatron dp=2 x tp=2 job: ~86 KB each in 3 s); only a rank that writes far more than its peers pauses
    peers = [WAIT, WAIT, _fr("forward", "main"), WAIT, WAIT]
    ranks = {0: peers, 1: peers[1:] + peers[:1], 2: COMPUTE, 3: peers}
    states = dict.fromkeys(range(4), "running")
    obs, acts = _window(ranks, states, wrote=dict.fromkeys(range(4), 86 << 10))
    assert set(straggler_window.never_waiting(_job(4), obs, acts)) == {2}
    obs, acts = _window(ranks, states, wrote={0: 86 << 10, 1: 86 << 10, 2: 10 << 20, 3: 86 << 10})
    assert straggler_window.never_waiting(_job(4), obs, acts) == {}


def test_peers_found_in_collectives_each_time_progress_when_they_exchange_data():
    # peers sampled inside their collectives every time look 'waiting'; their socket writes say they move
    waiting = [WAIT] * 5
    ranks = {0: waiting, 1: waiting, 2: COMPUTE, 3: waiting}
    states = {0: "waiting", 1: "waiting", 2: "running", 3: "waiting"}
    obs, acts = _window(ranks, states, wrote=dict.fromkeys(range(4), 90 << 10))
    assert set(straggler_window.never_waiting(_job(4), obs, acts)) == {2}
    obs, acts = _window(ranks, states, wrote={2: 90 << 10})  # peers silent: not a straggler's peers
    assert straggler_window.never_waiting(_job(4), obs, acts) == {}


# ---- causes and the cgroup throttling measure


def _cpu(n, on: dict[int, float], run: dict[int, float], thr: dict[int, float], seconds=5.0, quota=None):
    """procfs samples at T0 and T0+seconds: main thread on-CPU / run-queue shares, cgroup throttled share."""
    obs = []
    for r in range(n):
        for i, t in enumerate((T0, T0 + seconds)):
            obs.append(ProcSample(time=t, rank=r, pid=100 + r, status="running",
                                  main_cpu_ns=int(i * on.get(r, 0.1) * seconds * 1e9),
                                  main_delay_ns=int(i * run.get(r, 0.0) * seconds * 1e9),
                                  cg_periods=i * int(seconds * 10), cg_throttled=i * int(thr.get(r, 0.0) * seconds * 10),
                                  cg_throttled_ns=int(i * thr.get(r, 0.0) * seconds * 1e9),
                                  cg_quota=quota if thr.get(r) else None))
    return obs


def test_a_rank_throttled_by_its_quota_gets_the_cause_throttled_with_the_numbers():
    obs = _cpu(4, {3: 0.12}, {3: 0.8}, {3: 0.8}, quota=0.12)
    sh = cpushare.shares(obs, range(4))
    c = cpushare.cause(sh, 3, obs)
    assert c.kind == "throttled" and c.label == "starved of CPU (throttled)"
    assert c.data["nr_throttled"] == 40 and c.data["nr_periods"] == 50 and c.data["throttled_s"] == 4.0
    assert "quota of 0.12 CPU" in c.text and "40 of 50 periods" in c.text
    # the window verdict names it (busy share), with that cause
    w = straggler.window_verdict(_job(), obs, T0, T0 + 5)
    assert w.suspects == (3,) and w.causes[3].kind == "throttled"


def test_contended_compute_input_and_communication_causes():
    obs = _cpu(4, {2: 0.3}, {2: 0.6}, {})
    assert cpushare.cause(cpushare.shares(obs, range(4)), 2, obs).kind == "contended"
    obs = _cpu(4, {2: 0.9}, {}, {})
    c = cpushare.cause(cpushare.shares(obs, range(4)), 2, obs)
    assert c.kind == "compute" and "runs 90%" in c.text
    obs = _cpu(4, {}, {}, {})
    assert cpushare.cause(cpushare.shares(obs, range(4)), 2, obs).kind == "communication"
    from scout_sys.model import StackSample, ThreadStack

    loader = _fr("_next_data", "__next__", "main")
    stacks = [StackSample(time=T0 + i, rank=2, pid=102, threads=(ThreadStack(tid=102, name="MainThread", active=True, frames=loader),)) for i in range(3)]
    assert cpushare.cause(cpushare.shares(obs, range(4)), 2, obs + stacks).kind == "input"


def test_throttling_alone_names_a_rank_only_when_it_is_busier_than_its_peers():
    # lag names nobody (eBPF hid it): the throttle measure names the throttled rank, busier than its peers
    w = straggler.window_verdict(_job(), _cpu(4, {1: 0.1}, {1: 0.5}, {1: 0.5}), T0, T0 + 5)
    assert w.suspects == (1,)
    # throttled but idle like its peers (its quota is not what paces the job): nobody
    w = straggler.window_verdict(_job(), _cpu(4, {1: 0.05}, {1: 0.1}, {1: 0.15}), T0, T0 + 5)
    assert w.suspects == ()
    # every rank in one throttled cgroup: a common limit, nobody stands out
    w = straggler.window_verdict(_job(), _cpu(4, {}, {r: 0.5 for r in range(4)}, {r: 0.5 for r in range(4)}), T0, T0 + 5)
    assert w.suspects == ()


def test_throttle_measure_confirmed_over_windows_is_a_straggler_with_its_cause():
    hist = []
    for k in range(straggler.CONFIRM):
        obs = [o for o in _cpu(4, {1: 0.1}, {1: 0.6}, {1: 0.6}, quota=0.1)]
        obs = [type(o)(**{**o.__dict__, "time": o.time + 5 * k}) for o in obs]
        hist.append(straggler.window_verdict(_job(), obs, T0 + 5 * k, T0 + 5 * (k + 1)))
    inc = straggler.confirm(_job(), hist)
    assert inc is not None and inc.ranks == (1,) and "cause: starved of CPU (throttled)" in inc.summary
    assert any(e.data.get("cause") == "throttled" for e in inc.evidence)


def test_the_straggler_caught_in_its_own_all_reduce_now_and_then_is_still_named():
    # a real 4x compute straggler on a loaded 2-core host: caught in its own all-reduce 3 times in 13,
    # its peers 8 to 10 times, and in its compute (the same place the peers compute at) the rest: the
    # wait is the collective even though the compute holds more samples than any one collective site
    coll = _fr("wait_for_buckets", "main")
    fwd = _fr("forward", "main")
    peers = {0: [coll] * 9 + [fwd] * 4, 1: [coll] * 8 + [fwd] * 5, 2: [coll] * 10 + [fwd] * 3}
    slow = [fwd] * 10 + [coll] * 3
    obs, acts = _window({**peers, 3: slow}, dict.fromkeys(range(4), "running"))
    got = straggler_window.never_waiting(_job(4), obs, acts)
    assert set(got) == {3} and got[3][0] == 9 and got[3][3] == 3  # peers' median, its own


def test_the_wait_place_ties_go_to_the_collectives():
    c, f = ("coll", "allreduce", "train.py:5"), ("place", "forward")
    assert straggler_window._wait_place([[c, c, f], [c, f, f], [f, f, c], [c, c, f]]) == c
    # 3 of 4 mostly compute, the typical rank inside a collective in 1 of 5 samples: under COLL_USUAL
    assert straggler_window._wait_place([[c, f, f, f, f], [c, c, f, f, f], [f, f, f, f, c], [c, f, f, f, f]]) == f
    # the GPU shape: no collective frames, the peers' common polling place
    p, g = ("place", "poll"), ("place", "gemm")
    assert straggler_window._wait_place([[p, p, g], [p, g, p], [g, g, g], [p, p, p]]) == p


def test_peers_mostly_in_the_compute_their_straggler_never_leaves_still_wait_in_the_collective():
    # CI's miss (1 window in ~30 on a loaded 2-core host): a 4x compute straggler in forward all 13 samples,
    # its peers in forward 7, 5 and 8 times and in the all-reduce 6, 8 and 4 times. Two peers' commonest
    # place was forward, so forward became "the common sync point", every rank waited there 13 of 13 and
    # the stack samples no longer backed the busy share: an inconclusive straggler
    from scout_sys.model import Frame

    coll = (Frame(function="all_reduce", file="/v/torch/distributed/distributed_c10d.py", line=1),
            Frame(function="main", file="/j/train.py", line=51))
    fwd = _fr("forward", "main")
    peers = {0: [coll] * 6 + [fwd] * 7, 1: [coll] * 8 + [fwd] * 5, 2: [coll] * 4 + [fwd] * 9}
    obs, acts = _window({**peers, 3: [fwd] * 13}, dict.fromkeys(range(4), "running"))
    got = straggler_window.never_waiting(_job(4), obs, acts)  # even the strict ratio and bar
    assert set(got) == {3} and got[3][0] == 6 and got[3][3] == 0, got  # peers' median, its own
    assert got[3][2] == "in all_reduce at /j/train.py:51", got[3][2]


def test_a_rank_waiting_half_as_often_as_its_peers_is_named_and_one_waiting_like_them_is_not():
    w, f = WAIT, _fr("forward", "main")
    base = {0: [w] * 8 + [f] * 4, 1: [w] * 8 + [f] * 4, 2: [w] * 8 + [f] * 4}
    states = dict.fromkeys(range(4), "running")
    obs, acts = _window({**base, 3: [w] * 4 + [f] * 8}, states)
    assert set(straggler_window.never_waiting(_job(4), obs, acts)) == {3}
    obs, acts = _window({**base, 3: [w] * 5 + [f] * 7}, states)
    assert straggler_window.never_waiting(_job(4), obs, acts) == {}


def test_stack_samples_that_back_a_busy_share_may_be_less_lopsided_than_alone():
    # CI's miss: a 4x compute straggler on a loaded host caught waiting 5 times in 13 while its peers' median
    # was 9: too many for the stacks alone (5 * 2 > 9), enough to back its busy share (5 * 1.5 <= 9, and fewer
    # than any peer), so the two agree and name it
    w, f = WAIT, _fr("forward", "main")
    peers = {0: [w] * 9 + [f] * 4, 1: [w] * 9 + [f] * 4, 2: [w] * 10 + [f] * 3}
    states = dict.fromkeys(range(4), "running")
    busy = [ProcSample(time=100.0 + t, rank=r, pid=10 + r, status="running",
                       main_cpu_ns=int(t * 1e9 * (0.85 if r == 3 else 0.35)), main_delay_ns=0)
            for r in range(4) for t in (0, 4)]
    obs, acts = _window({**peers, 3: [w] * 5 + [f] * 8}, states)
    assert straggler_window.never_waiting(_job(4), obs, acts) == {}
    incidents, notes = straggler_window.in_window(_job(4), obs + busy, acts, (100.0, 104.0))
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("straggler", "attributed", (3,))], (incidents, notes)
    assert "found waiting in only 5 of 13 samples" in incidents[0].evidence[0].text
    # the same busy share with stacks nearer its peers' (7 of 13: 7 * 1.5 > 9) stays one measure: inconclusive
    obs, acts = _window({**peers, 3: [w] * 7 + [f] * 6}, states)
    incidents, _ = straggler_window.in_window(_job(4), obs + busy, acts, (100.0, 104.0))
    assert [(i.status, i.ranks) for i in incidents] == [("inconclusive", ())], incidents
    # seldom enough by the ratio but not the least waiting of its group (a peer waited less): no backing
    low = {**peers, 0: [w] * 4 + [f] * 9}
    obs, acts = _window({**low, 3: [w] * 6 + [f] * 7}, states)
    incidents, _ = straggler_window.in_window(_job(4), obs + busy, acts, (100.0, 104.0))
    assert [(i.status, i.ranks) for i in incidents] == [("inconclusive", ())], incidents


def test_a_busy_share_is_backed_by_peers_that_wait_for_it_part_of_each_step_only():
    # CI's dp=2 x tp=2 miss: rank 3 62% busy (peers 5%) while its peers, which also sleep 50 ms of each step,
    # were found waiting in 5 of 13 samples: under the stacks' own bar (40%), over the backing bar (30%)
    w, f, s = WAIT, _fr("forward", "main"), _fr("sleep", "main")
    peers = {0: [w] * 5 + [s] * 6 + [f] * 2, 1: [w] * 5 + [s] * 5 + [f] * 3, 2: [w] * 6 + [s] * 6 + [f]}
    slow = [_fr("extra_compute", "main")] * 8 + [s] * 4 + [w]
    states = dict.fromkeys(range(4), "running")
    busy = [ProcSample(time=100.0 + t, rank=r, pid=10 + r, status="running",
                       main_cpu_ns=int(t * 1e9 * (0.62 if r == 3 else 0.05)), main_delay_ns=0)
            for r in range(4) for t in (0, 4)]
    obs, acts = _window({**peers, 3: slow}, states)
    assert straggler_window.never_waiting(_job(4), obs, acts) == {}  # the stacks alone: not even a note
    incidents, notes = straggler_window.in_window(_job(4), obs + busy, acts, (100.0, 104.0))
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("straggler", "attributed", (3,))], (incidents, notes)
    # peers found waiting in only 3 of 13 samples back nothing: the busy share stays alone
    rest = [s, s, f, f, _fr("backward", "main"), _fr("backward", "main"), _fr("step", "main"), _fr("step", "main"),
            _fr("log", "main"), _fr("log", "main")]
    thin = {0: [w] * 3 + rest, 1: rest[:5] + [w] * 3 + rest[5:], 2: rest + [w] * 3}
    obs, acts = _window({**thin, 3: [_fr("extra_compute", "main")] * 8 + [s, s, w, f, _fr("backward", "main")]}, states)
    incidents, _ = straggler_window.in_window(_job(4), obs + busy, acts, (100.0, 104.0))
    assert [(i.status, i.ranks) for i in incidents] == [("inconclusive", ())], incidents


def test_a_straggler_caught_in_its_compute_at_every_sample_is_still_one_while_its_peers_progress():
    # a heavy straggler's samples all land in its compute now and then (its activity: 'busy' at one place,
    # as a rank spinning outside any collective); its peers move, so it is no hang: still the straggler
    peers = [WAIT, WAIT, _fr("forward", "main"), WAIT, WAIT]
    ranks = {0: peers, 1: peers[1:] + peers[:1], 2: [_fr("extra_compute", "main")] * 5, 3: peers}
    obs, acts = _window(ranks, {0: "running", 1: "running", 2: "busy", 3: "running"})
    assert set(straggler_window.never_waiting(_job(4), obs, acts)) == {2}
    # the same rank while its peers are stuck (no rank moves): a hang's shape, never a straggler
    obs, acts = _window(ranks, {0: "idle", 1: "idle", 2: "busy", 3: "idle"})
    assert straggler_window.never_waiting(_job(4), obs, acts) == {}
