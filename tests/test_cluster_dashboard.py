"""watch --cluster with a dashboard, exporters and bundles, on one real 2-node torchrun job (static
rendezvous, 2 ranks per launcher) with a hang on node 1 and two real agents (test_cluster.py's
``Cluster``). At once: the real command line ``watch --cluster --headless --json --events FILE
--prometheus --state-dir`` in a subprocess, and the dashboard over a ClusterSource driven by textual's
Pilot. Every process is stopped by pid at teardown."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_cluster import Cluster, cluster  # noqa: F401 - the fixture: a 2-node job and its agents

from scout_sys.cluster import wire
from scout_sys.cluster.client import ClusterClient
from scout_sys.cluster.source import ClusterSource
from scout_sys.tui.app import make_app
from scout_sys.tui.widgets import HeaderBar, RankGrid
from scout_sys.watch.config import WatchConfig

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="agents read the ranks' stacks (py-spy): run as root")]


class Headless:
    """``watch --cluster --headless --json`` with the exporters: its stdout lines and stderr as they come."""

    def __init__(self, c: Cluster, tmp) -> None:
        self.events_file, self.state = tmp / "events.jsonl", tmp / "state"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "scout_sys", "watch", "--cluster", c.store, "--token-file", str(c.token),
             "--headless", "--json", "--events", str(self.events_file), "--state-dir", str(self.state),
             "--prometheus", "127.0.0.1:0", "--stall-after", "3"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        self.err: list[str] = []
        threading.Thread(target=lambda: [self.lines.put(ln) for ln in self.proc.stdout], daemon=True).start()
        threading.Thread(target=lambda: [self.err.append(ln) for ln in self.proc.stderr], daemon=True).start()

    def wait(self, pred, timeout: float = 60.0) -> dict:
        end = time.time() + timeout
        while time.time() < end:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.proc.poll() is None, "".join(self.err)
                continue
            self.out.append(line)
            if pred(json.loads(line)):
                return json.loads(line)
        raise AssertionError(f"no such event within {timeout} s: {self.out} {self.err}")

    def metrics(self) -> dict:
        url = next(ln.split("metrics at ", 1)[1].strip() for ln in self.err if "metrics at " in ln)
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        return {(s.name, frozenset(s.labels.items())): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(20)
        time.sleep(0.2)  # the reader thread drains the pipe
        while not self.lines.empty():
            self.out.append(self.lines.get())
        return rc


def _cells(grid: RankGrid) -> dict[str, list[tuple[int, str]]]:
    return {h: [(c.rank, c.category) for c in cs] for h, cs in grid._hosts}


def test_dashboard_events_file_bundle_and_metrics_of_a_hang_on_node_1(cluster, tmp_path):  # noqa: F811
    c = cluster(fault="hang", fault_rank=3)
    c.jobs[1].wait_fault(timeout=120)
    c.start()
    w = Headless(c, tmp_path)
    host, port = c.store.split(":")
    src = ClusterSource(lambda: ClusterClient((host, int(port)), wire.read_token(str(c.token))), store=c.store,
                        config=WatchConfig(state_dir=str(tmp_path / "dash"), stall_after=3.0, interval=1.0))
    try:
        rc = asyncio.run(_drive(c, src, w))
    finally:
        src.close()
        code = w.stop()
    assert rc == 1 and code == 1, "".join(w.err)
    # --events FILE holds exactly what the headless stream printed, agent events included
    assert [json.loads(ln) for ln in w.out] == [json.loads(ln) for ln in w.events_file.read_text().splitlines()]
    assert "agent_lost" in [e["event"] for e in map(json.loads, w.out)]


async def _drive(c: Cluster, src: ClusterSource, w: Headless) -> int:
    app = make_app(src)
    async with app.run_test(size=(140, 44)) as pilot:
        grid = app.query_one(RankGrid)
        end = time.time() + 60
        while time.time() < end and ("nodeB", [(2, "waiting"), (3, "suspect")]) not in _cells(grid).items():
            await pilot.pause(0.25)
        # ranks grouped by the host their agent reports (global ranks); the culprit red, its host too
        assert _cells(grid) == {"nodeA": [(0, "waiting"), (1, "waiting")],
                                "nodeB": [(2, "waiting"), (3, "suspect")]}, (_cells(grid), app._error)
        lines = grid._layout(grid.size.width)
        styles = {segs[0][0].strip(): segs[0][1] for segs in lines if segs and segs[0][1].startswith("host")}
        assert styles == {"nodeA": "host", "nodeB": "host-suspect"}, lines
        assert "INCIDENT hang rank 3" in str(app.query_one(HeaderBar).render())
        assert app.selected == 3 and "2 agents via" in str(app.query_one(HeaderBar).render())

        # the headless stream: the same incident, with the bundle of every agent's window
        e = await asyncio.to_thread(w.wait, lambda e: e["event"] == "incident_opened", 30)
        inc = e["incident"]
        assert (inc["kind"], inc["ranks"], inc["hosts"]) == ("hang", [3], ["nodeB"])
        path = e["bundle"]
        assert path.startswith(str(w.state)) and any(x.get("bundle") == path for x in inc["evidence"])
        assert sorted(os.listdir(path)) == ["agent-0.json", "agent-1.json", "diagnosis.json", "heartbeats.json"]
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
        assert all(stat.S_IMODE(os.stat(os.path.join(path, f)).st_mode) == 0o600 for f in os.listdir(path))
        diag = json.load(open(os.path.join(path, "diagnosis.json")))
        assert diag["incident"]["ranks"] == [3] and [a["state"] for a in diag["cluster"]["agents"]] == [
            "answered", "answered"]
        assert {r["rank"]: r["host"] for r in diag["job"]["ranks"]} == {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}
        node1 = json.load(open(os.path.join(path, "agent-1.json")))
        assert node1["host"] == "nodeB" and sorted(node1["ranks"]) == ["2", "3"]
        assert any("load_next_batch_stuck" in f for f in node1["ranks"]["3"]["stack"]), node1["ranks"]["3"]
        assert node1["window"][1] > node1["window"][0]

        # the metrics carry the hosts
        m = w.metrics()
        assert [v for (n, lbl), v in m.items() if n == "scout_sys_culprit"
                and {("rank", "3"), ("host", "nodeB"), ("job", c.store)} <= lbl] == [1.0]
        assert sorted((dict(lbl)["host"], v) for (n, lbl), v in m.items() if n == "scout_sys_agent_up") == [
            ("nodeA", 1.0), ("nodeB", 1.0)]

        # node 1's agent dies: shown on its host, its ranks not observed; the culprit stays named
        c.kill_agent(1)
        end = time.time() + 30
        while time.time() < end and grid._notes != {"nodeB": "agent lost"}:
            await pilot.pause(0.25)
        assert grid._notes == {"nodeB": "agent lost"}
        assert dict(_cells(grid)["nodeB"]) == {2: "unknown", 3: "suspect"}
        assert "1 lost" in str(app.query_one(HeaderBar).render())
        await asyncio.to_thread(w.wait, lambda e: e["event"] == "agent_lost", 30)
        await pilot.press("q")
    return app.return_value
