"""watch --cluster as a dashboard Source on a fake clock: the snapshot groups ranks by the host their
agent reports, a new hang gets an evidence bundle (private) named in its incident, the sinks see every
event and snapshot, and a lost agent's ranks are shown as not observed. The store client is the scripted
one of test_cluster_watch.py (the real one runs end to end in test_cluster_dashboard.py)."""

from __future__ import annotations

import json
import os
import stat

from test_cluster_watch import STALL, Script

from scout_sys.cluster.source import ClusterSource
from scout_sys.tui.source import Source
from scout_sys.watch.config import WatchConfig


class Recorder:
    def __init__(self) -> None:
        self.events: list = []
        self.snapshots: list = []

    def on_event(self, e) -> None:
        self.events.append(e)

    def on_snapshot(self, s, took: float) -> None:
        self.snapshots.append(s)

    def close(self) -> None:
        pass


def _poll(src: ClusterSource, s: Script, seconds: int, nodes=(0, 1)) -> list:
    out = []
    for _ in range(seconds):
        s.now += 1.0
        for n in nodes:
            s.seq[n] += 1
        out += src.poll()
    return out


def test_snapshot_by_host_bundle_sinks_and_a_lost_agent(tmp_path):
    s = Script()
    src = ClusterSource(lambda: s, WatchConfig(interval=1.0, state_dir=str(tmp_path / "state")), store="node0:29450",
                        clock=lambda: s.now)
    assert isinstance(src, Source) and src.snapshot is None and src.waiting
    rec = Recorder()
    src.sinks.append(rec)
    assert _poll(src, s, 3) == []
    snap = src.snapshot
    assert snap is not None and src.waiting is None
    assert {r.rank: r.host for r in snap.job.ranks} == {0: "a", 1: "a", 2: "b", 3: "b"}
    assert snap.job.launcher == "2 agents via node0:29450" and snap.job.world_size == 4
    assert {r: v.state for r, v in snap.views.items()} == dict.fromkeys(range(4), "running")  # paused 0.1 s
    assert [a["state"] for a in snap.agents] == ["up", "up"] and snap.pauses[3] == 0.1
    assert src.diagnose_now().healthy and s.windows == 1  # the dashboard's d: one whole-job window

    s.status[2], s.verdict = "stopped", (STALL,)
    ev = _poll(src, s, 2)
    opened = [e for e in ev if e.event == "incident_opened"]
    assert len(opened) == 1 and opened[0].bundle
    path = opened[0].bundle
    assert path.startswith(str(tmp_path / "state" / "bundles")) and any(
        e.data.get("bundle") == path for e in opened[0].incident.evidence)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert sorted(os.listdir(path)) == ["diagnosis.json", "heartbeats.json"]  # the script has no agents' windows
    doc = json.load(open(os.path.join(path, "diagnosis.json")))
    assert doc["incident"]["ranks"] == [2] and "cluster" in doc
    beats = json.load(open(os.path.join(path, "heartbeats.json")))
    assert beats["1"]["heartbeat"]["host"] == "b" and "nonce" not in beats["1"]["heartbeat"]
    assert stat.S_IMODE(os.stat(os.path.join(path, "heartbeats.json")).st_mode) == 0o600
    # the book keeps the bundle's evidence; the snapshot shows it; the sinks saw the same event
    assert src.snapshot.bundle == path and src.snapshot.incidents[0].evidence == opened[0].incident.evidence
    assert opened[0] in rec.events and rec.snapshots[-1] is src.snapshot
    assert src.snapshot.views[2].state == "stopped"

    # node 1's agent stops reporting: the next window says its ranks are not observed: at once unknown
    s.unobserved = [{"rank": 2, "host": "b", "node": 1}, {"rank": 3, "host": "b", "node": 1}]
    s.now += 3.0  # the next confirmation is due (every 5 s while the stall stays); the agent is not lost yet
    ev = _poll(src, s, 1, nodes=(0,))
    assert not any(e.event.startswith("agent") for e in ev) and s.windows == 3
    assert {r: v.state for r, v in src.snapshot.views.items() if r >= 2} == {2: "unknown", 3: "unknown"}
    # then the agent is lost: the agent entry says so
    ev = _poll(src, s, 8, nodes=(0,))
    assert [(e.event, e.node) for e in ev if e.event.startswith("agent")] == [("agent_lost", 1)]
    snap = src.snapshot
    assert [a["state"] for a in snap.agents] == ["up", "lost"] and snap.job.remote == (2, 3)
    assert {r: v.state for r, v in snap.views.items() if r >= 2} == {2: "unknown", 3: "unknown"}
    assert snap.job.launcher.endswith(", 1 lost")
    assert [e.event for e in rec.events if e.event.startswith("agent")] == ["agent_lost"]
    ev = _poll(src, s, 1)
    assert [(e.event, e.node) for e in ev] == [("agent_back", 1)]
    assert [a["state"] for a in src.snapshot.agents] == ["up", "up"] and src.snapshot.job.remote == ()
    # a saved report of the whole job reopens with its agents
    from scout_sys.model import Snapshot

    back = Snapshot.from_report(json.loads(json.dumps(src.snapshot.to_report())))
    assert [a["host"] for a in back.agents] == ["a", "b"]
    assert {r.rank: r.host for r in back.job.ranks} == {0: "a", 1: "a", 2: "b", 3: "b"}


def test_human_lines_name_the_host_and_the_agents(capsys):
    import argparse

    from scout_sys.cli.watch import _emitter
    from scout_sys.cluster.watch import AgentEvent
    from scout_sys.model import Event

    emit = _emitter(argparse.Namespace(json=False), hosts=True)
    emit(Event("incident_opened", 1000.0, STALL, bundle="/state/bundles/x"))
    emit(AgentEvent("agent_lost", 1001.0, 1, "b", (2, 3), "no heartbeat for 5 s: its ranks are not observed"))
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("OPENED  process_stall (attributed) rank 2 on b: rank 2 stopped"), out
    assert out[1] == "  evidence saved to /state/bundles/x"
    assert out[2].endswith("AGENT_LOST agent node 1 (b) lost, ranks 2-3: no heartbeat for 5 s: its ranks are "
                           "not observed"), out
