"""watch --cluster's loop on a fake clock: suspicion from heartbeats, confirmation windows, the
incident book and lost agents. The store client is scripted (its real counterpart is exercised end to
end in test_cluster.py)."""

from __future__ import annotations

from scout_sys.cluster.watch import ClusterWatcher
from scout_sys.model import ATTRIBUTED, PROCESS_STALL, Diagnosis, Incident, Job

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
        return {n: ({"host": "ab"[n], "seq": self.seq[n], "time": self.now,
                     "ranks": [{"r": r, "s": self.status[r], "p": 0.1} for r in (2 * n, 2 * n + 1)]}, "")
                for n in (0, 1)}

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
