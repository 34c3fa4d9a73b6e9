"""``watch --every-job`` without a real job: two jobs told apart by their key (job.job_keys, also when
torchrun gave both TORCHELASTIC_RUN_ID=none), NodeWatch's bookkeeping of the jobs it follows (fake
watchers: start, end, a new incarnation), and one metrics endpoint serving several jobs' series.
Real jobs: tests/test_node_watch_e2e.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scout_sys.errors import BadSelector
from scout_sys.job import find_job, job_keys
from scout_sys.rankenv import key_label
from scout_sys.watch.node import NodeWatch
from tests.conftest import wait_for
from tests.test_exporters import OPENED, _snapshot


@pytest.fixture
def two_static_jobs():
    """Two 2-rank "jobs" of sleepers, as two static-rendezvous torchruns start them: the same run id
    (``none``), their own master port; the marker variable is this test's alone."""
    tag = uuid.uuid4().hex[:8]
    procs = []
    for port in (29601, 29602):
        body = (f"export MASTER_ADDR=127.0.0.1 MASTER_PORT={port} WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 "
                f"TORCHELASTIC_RUN_ID=none SCOUT_NODE_UNIT={tag}\n"
                f"for r in 0 1; do RANK=$r LOCAL_RANK=$r {sys.executable} -c 'import time; time.sleep(60)' & done\nwait\n")
        procs.append(subprocess.Popen(["bash", "-c", body], start_new_session=True))
    sel = f"env:SCOUT_NODE_UNIT={tag}"
    try:
        wait_for(lambda: len(_pids(sel)) == 4, 20, "the four sleepers")
        yield sel
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _pids(sel: str) -> set[int]:
    from scout_sys.watch.restart import env_pids

    return {p for p in env_pids(sel) if "python" in open(f"/proc/{p}/comm").read()}


def test_two_jobs_with_torchruns_default_run_id_are_two_jobs(two_static_jobs, monkeypatch):
    monkeypatch.setenv("SCOUT_SYS_HOST", "gpu-node-17")  # the DaemonSet's: the node's name, not the pod's
    keys = job_keys(two_static_jobs)
    assert sorted(keys.values()) == ["127.0.0.1:29601", "127.0.0.1:29602"], keys
    with pytest.raises(BadSelector, match="covers 2 different jobs"):
        find_job(two_static_jobs)
    for key in keys:
        job = find_job(two_static_jobs, key=key)
        assert sorted(r.rank for r in job.ranks) == [0, 1] and job.missing == (), job
        assert job.host == "gpu-node-17" and {r.host for r in job.ranks} == {"gpu-node-17"}
    a, b = (find_job(two_static_jobs, key=k) for k in keys)
    assert not {r.pid for r in a.ranks} & {r.pid for r in b.ranks}


def test_key_labels():
    assert key_label("run:3f2a") == "3f2a"
    assert key_label("master:10.0.0.1:29500") == "10.0.0.1:29500"
    assert key_label("env:1234:16") == "1234/16"
    assert key_label("env::16") == "world 16"


class _FakeWatcher:
    """What NodeWatch asks of a Watcher; ``run`` returns when ``end`` is set (the job ended)."""

    def __init__(self, key: str, opens: bool, pids: set[int]) -> None:
        self.key, self.end, self.opens = key, threading.Event(), opens
        self.job = SimpleNamespace(ranks=[SimpleNamespace(pid=p) for p in sorted(pids)])
        self.ended = self.closed = self.ever_opened = False
        self.sinks: list = []
        self.snapshot = None

    def start(self) -> None:
        pass

    def run(self, on_event, stop, on_job=None) -> int:
        if self.opens:
            on_event(OPENED)
            self.ever_opened = True
        while not (stop.is_set() or self.end.is_set()):
            time.sleep(0.01)
        self.ended = self.end.is_set()
        return 1 if self.ever_opened else 0

    def close(self, *, background: bool = False, exiting: bool = False) -> None:
        self.closed = "exiting" if exiting else "here"  # exiting: probes detach in a child after our exit


class _Sinks:
    closed = 0

    def attach(self, w) -> None:
        pass

    def close(self) -> None:
        _Sinks.closed += 1


def test_node_watch_follows_each_job_once_and_a_new_incarnation_again():
    live = {"run:a": "a", "run:b": "b"}
    pids = {"run:a": {1, 2}, "run:b": {3, 4}}
    made: list[_FakeWatcher] = []
    events, said = [], []

    def watcher(key: str) -> _FakeWatcher:
        made.append(_FakeWatcher(key, opens=key == "run:b", pids=pids[key]))
        return made[-1]

    node = NodeWatch("env:X", watcher=watcher, sinks=lambda label: _Sinks(), emit=events.append, say=said.append,
                     keys=lambda sel: dict(live), pids=lambda sel, key: pids.get(key, set()))
    node.look()
    node.look()  # the same jobs: no second watch
    assert [w.key for w in made] == ["run:a", "run:b"]
    wait_for(lambda: events, 10, "job b's event")
    assert [(e.job, e.incident.id) for e in events] == [("b", OPENED.incident.id)]
    made[0].end.set()  # job a ends; its last ranks still linger (same pids): not watched again
    wait_for(lambda: not node.followed["run:a"].thread.is_alive(), 10, "a's watch ended")
    node.look()
    # the node's watch goes on: a's probes detached now, not handed to a child that waits for our exit
    assert [w.key for w in made] == ["run:a", "run:b"] and made[0].closed == "here"
    assert "job a: ended" in said
    pids["run:a"] = {5, 6}  # a new incarnation of a: new rank pids with its key
    node.look()
    assert [w.key for w in made] == ["run:a", "run:b", "run:a"]
    del live["run:b"]  # b's ranks are gone; its watch ends on its own (here: still running)
    stop = threading.Event()
    stop.set()
    assert node.run(stop) == 1  # b opened an incident
    assert [w.closed for w in made] == ["here", "exiting", "exiting"]  # the rest at the node watch's exit


def test_one_endpoint_serves_several_jobs_series_apart():
    from scout_sys.exporters.prometheus import PrometheusExporter

    ex = PrometheusExporter("127.0.0.1:0")
    try:
        a, b = ex.job("job-a", keep=0.2), ex.job("job-b", keep=0.2)
        a.on_snapshot(_snapshot(), 0.01)
        b.on_snapshot(_snapshot(), 0.01)
        b.on_event(OPENED)

        def scrape() -> list:
            return list(text_string_to_metric_families(urllib.request.urlopen(ex.url, timeout=5).read().decode()))

        fams = scrape()
        names = [f.name for f in fams]
        assert len(names) == len(set(names)), names  # one family per name: the jobs' samples merged in it
        state = next(f for f in fams if f.name == "scout_sys_rank_state")
        assert {s.labels["job"] for s in state.samples} == {"job-a", "job-b"}
        opened = next(f for f in fams if f.name == "scout_sys_incidents_opened")
        assert {(s.labels["job"], s.value) for s in opened.samples if s.labels.get("kind") == "hang"
                and s.name.endswith("_total")} == {("job-a", 0.0), ("job-b", 1.0)}
        a.close()  # its job ended: served a moment more, then gone
        wait_for(lambda: {s.labels["job"] for f in scrape() if f.name == "scout_sys_rank_state" for s in f.samples}
                 == {"job-b"}, 10, "job a's series dropped")
    finally:
        ex.close()
