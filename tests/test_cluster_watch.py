"""watch --cluster's loop on a fake clock: suspicion from heartbeats, confirmation windows, the
incident book and lost agents. The store client is scripted (its real counterpart is exercised end to
end in test_cluster.py)."""

from __future__ import annotations

import pytest

from scout_sys.cluster import heartbeat
from scout_sys.cluster.heartbeat import RankBeat
from scout_sys.cluster.watch import LOST_AFTER, ClusterWatcher
from scout_sys.model import ATTRIBUTED, HANG, PROCESS_STALL, Diagnosis, Incident, Job
from scout_sys.watch.config import WatchConfig
from scout_sys.watch.hang import MIN_GAPS, MIN_STALL_AFTER
from scout_sys.watch.progress import STACK

JOB = Job(ranks=(), world_size=4, launcher="test", launcher_pid=None, host="")
STALL = Incident(kind=PROCESS_STALL, status=ATTRIBUTED, ranks=(2,), hosts=("b",), since=1.0, summary="rank 2 stopped")


class Script:
    """Heartbeats and verdicts as the test sets them; counts confirmation windows."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.status = {r: "sleeping" for r in range(4)}
        self.seq = {0: 1, 1: 1}
        self.verdict: tuple[Incident, ...] = ()
        self.unobserved: list[dict] = []
        self.windows = 0

    def heartbeats(self):
        return {n: (heartbeat.decode({"host": "ab"[n], "seq": self.seq[n], "time": self.now,
                                      "ranks": [{"r": r, "s": self.status[r], "p": 0.1} for r in (2 * n, 2 * n + 1)]}),
                    "") for n in (0, 1)}

    def diagnose(self, window: float):
        self.windows += 1
        return (Diagnosis(time=self.now, job=JOB, views={}, incidents=self.verdict, probes={}),
                {"not_observed": self.unobserved})


def _run(w: ClusterWatcher, s: Script, seconds: int, beat: bool = True) -> list:
    out = []
    for _ in range(seconds):
        s.now += 1.0
        if beat:
            s.seq = {n: q + 1 for n, q in s.seq.items()}
        out += w.poll()
    return out


def test_healthy_heartbeats_take_no_window_and_a_stopped_rank_opens_then_closes():
    s = Script()
    w = ClusterWatcher(lambda: s, clock=lambda: s.now)
    assert _run(w, s, 10) == [] and s.windows == 0
    s.status[2], s.verdict = "stopped", (STALL,)
    ev = _run(w, s, 3)
    assert [(e.event, e.incident.ranks, e.incident.id) for e in ev] == [("incident_opened", (2,), "inc-1")]
    assert s.windows == 1  # confirmed again only every RECONFIRM_EVERY while it stays
    s.status[2], s.verdict = "sleeping", ()
    ev = _run(w, s, 3)
    assert [e.event for e in ev] == ["incident_closed"] and not w.book.open


def test_an_incident_about_unobserved_ranks_stays_open_and_lost_agents_are_events():
    s = Script()
    w = ClusterWatcher(lambda: s, clock=lambda: s.now)
    s.status[2], s.verdict = "stopped", (STALL,)
    _run(w, s, 2)
    # node 1's agent dies: no new heartbeat; its ranks are not observed; the verdict says nothing of them
    s.verdict, s.unobserved = (), [{"rank": 2}, {"rank": 3}]
    ev = []
    for _ in range(12):
        s.now += 1.0
        s.seq[0] += 1
        ev += w.poll()
    assert [(e.event, e.node, e.ranks) for e in ev if e.event.startswith("agent")] == [("agent_lost", 1, (2, 3))]
    assert not any(e.event == "incident_closed" for e in ev) and w.book.open
    ev = _run(w, s, 1)
    assert [(e.event, e.node) for e in ev] == [("agent_back", 1)]


# ---------------------------------------------------------------- heartbeats carry progress (version 2)

HANG_3 = Incident(kind=HANG, status=ATTRIBUTED, ranks=(3,), hosts=("b",), since=1.0, summary="rank 3 is stuck")


class SpinScript(Script):
    """Version-2 heartbeats from agents that run the watch's progress part: every rank ``running``,
    its main thread never paused, no collective frame (the GPU shape); each rank's stall is what its
    agent's Progress says."""

    def __init__(self) -> None:
        super().__init__()
        self.stall = {r: 0.0 for r in range(4)}
        self.signal = STACK

    def heartbeats(self):
        out = {}
        for n in (0, 1):
            beats = [RankBeat(rank=r, pid=100 + r, state="running", pause=0.0, stall=self.stall[r], signal=self.signal,
                              where="train.py:151 wait_for_buckets", stack="0a1b2c3d") for r in (2 * n, 2 * n + 1)]
            out[n] = (heartbeat.decode({"host": "ab"[n], "seq": self.seq[n], "time": self.now,
                                        **heartbeat.encode_ranks(beats)}), "")
        return out


def _spin(w: ClusterWatcher, s: SpinScript, seconds: int, stalled: tuple[int, ...] = (0, 1, 2, 3)) -> list:
    """``seconds`` polls, one a second; the ``stalled`` ranks' stall grows, the others progress."""
    out = []
    for _ in range(seconds):
        s.now += 1.0
        s.seq = {n: q + 1 for n, q in s.seq.items()}
        for r in s.stall:
            s.stall[r] = s.stall[r] + 1.0 if r in stalled else 0.3
        out += w.poll()
    return out


def test_the_gpu_shape_is_suspected_from_the_agents_progress_ages_at_stall_after():
    s = SpinScript()
    w = ClusterWatcher(lambda: s, clock=lambda: s.now)
    assert w.stall_after == MIN_STALL_AFTER
    _spin(w, s, int(MIN_STALL_AFTER))
    assert s.windows == 0  # every rank running, never paused: only the progress ages can tell
    s.verdict = (HANG_3,)
    ev = _spin(w, s, 1)
    assert s.windows == 1 and [(e.event, e.incident.ranks) for e in ev] == [("incident_opened", (3,))]
    trigger = [x for x in ev[0].incident.evidence if "trigger" in x.data]
    assert trigger and trigger[0].data["trigger"] == STACK and trigger[0].data["stall"] >= MIN_STALL_AFTER
    assert w.ranks[3].host == "b" and w.ranks[3].beat.where.startswith("train.py:151")


def test_a_minority_stalled_is_not_suspected_and_a_window_that_finds_nothing_backs_off():
    s = SpinScript()
    w = ClusterWatcher(lambda: s, clock=lambda: s.now)
    _spin(w, s, 20, stalled=(2, 3))  # half the job is not a strict majority
    assert s.windows == 0
    _spin(w, s, 2)  # now a majority (2 s > stall-after): suspected, the window finds nothing
    assert s.windows == 1 and not w.book.open
    _spin(w, s, 1)  # backed off for stall-after, as on one host
    assert s.windows == 1
    _spin(w, s, 2)  # the majority's stall has doubled: looked at again
    assert s.windows >= 2


def test_a_beats_age_counts_as_stall_and_a_lost_agents_ranks_leave_the_majority():
    s = SpinScript()
    w = ClusterWatcher(lambda: s, clock=lambda: s.now)
    _spin(w, s, 3, stalled=())
    # node 1's beat stops changing (its agent is busy or wedged): its ranks' ages grow from our clock
    for _ in range(3):
        s.now += 1.0
        s.seq[0] += 1
        w.poll()
    assert w.ranks[2].age == 3.0 and w.ranks[0].age == 0.0
    for _ in range(int(LOST_AFTER)):
        s.now += 1.0
        s.seq[0] += 1
        w.poll()
    assert 2 not in w.ranks and s.windows == 0  # lost: not observed, never a reason to suspect


def test_stall_after_adapts_to_healthy_stretches_like_the_single_host_watch():
    s = SpinScript()
    w = ClusterWatcher(lambda: s, clock=lambda: s.now)
    for _ in range(MIN_GAPS + 2):  # a healthy job whose majority goes 3 s without progress, then progresses
        _spin(w, s, 3)
        _spin(w, s, 1, stalled=())
    # 2.5 times the recent steady gap (0.3 + 3 s); until it was known, each stretch cost a window
    assert w.stall_after == pytest.approx(2.5 * 3.3)
    assert s.windows > 0 and not w.book.ever_opened
    fixed = ClusterWatcher(lambda: s, WatchConfig(interval=1.0, stall_after=2.0), clock=lambda: s.now)
    assert fixed.stall_after == 2.0


# ---------------------------------------------------------------- what an agent puts in a beat

def test_an_agents_beats_are_the_watch_progress_part_place_hash_seqs_and_step_time():
    from scout_sys.cluster.beat import LocalWatch
    from scout_sys.model import CollectiveSample, ExitRecord, Fingerprint, ProcSample
    from tests.test_watch_parts import T0, _proc, _stack

    def coll(rank, t, seq):
        fps = tuple(Fingerprint(seq=s, op="allreduce", time=t - 0.25 * (seq - s)) for s in range(max(1, seq - 3), seq + 1))
        return CollectiveSample(time=t, rank=rank, pid=100 + rank, backend="nccl", group="nccl:0", seq=seq,
                                completed=None, inside=False, last_enter=None, last_exit=None, last=fps[-1], recent=fps)

    lw = LocalWatch(1.0)
    procs: list[ProcSample] = []
    for i in range(8):  # ranks 0-2 spin at one place (GPU shape, no eBPF); rank 3's collectives go on
        t = T0 + i
        procs = [_proc(r, t, status="running") for r in range(4)]
        lw.window([*procs, *[_stack(r, t, line=1 + i % 2) for r in range(3)], _stack(3, t, fn=f"step{i}"),
                   coll(3, t, seq=10 + 4 * i)], t)
    lw.window([ExitRecord(time=T0 + 7, rank=9, pid=109, exit_code=1, signal=None)], T0 + 7)
    beats = {b.rank: b for b in lw.beats(procs, T0 + 7)}
    assert (beats[0].stall, beats[0].signal) == (7.0, STACK)  # what watch's Progress says, not a second tracker
    assert (beats[3].stall, beats[3].signal) == (0.0, "collectives")
    assert beats[0].where.startswith("/j/train.py:") and "wait" in beats[0].where
    assert beats[0].stack == beats[1].stack != beats[3].stack and len(beats[0].stack) == 8
    assert beats[3].seqs == (("nccl:0", 38),) and beats[3].step == 0.25 and beats[0].step is None
    assert not any(b.dead for b in beats.values()) and beats[0].pause == 0.0
    # the probes' records stay for the next window's answer (an exit is reported once, to whoever reads first)
    assert any(isinstance(o, ExitRecord) for o in lw.records())
    lw.forget()
    assert lw.records() == [] and lw.beats(procs, T0 + 8)[0].stall == 0.0


def test_an_agent_busy_with_a_window_it_announced_does_not_age_its_ranks():
    s = SpinScript()
    w = ClusterWatcher(lambda: s, clock=lambda: s.now)
    _spin(w, s, 2, stalled=())
    real = s.heartbeats

    def busy():  # both agents announced a 10 s window and have not beaten since
        return {n: (heartbeat.decode({**hb.body, "busy_for": 10.0}), p) for n, (hb, p) in real().items()}

    s.heartbeats = busy
    for _ in range(8):
        s.now += 1.0
        w.poll()
    assert s.windows == 0 and w.ranks[0].age == 8.0
