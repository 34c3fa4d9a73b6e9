"""One monitor for the node (``watch --every-job``): started before two jobs that share the host, it
follows each apart — its own incidents, its ``job`` on every event and metrics series, one metrics
port — as the node-level deployments run it (docs/deploy.md). Both jobs are torchruns with a static
rendezvous (``--master-port``), so both carry TORCHELASTIC_RUN_ID=none: only their masters tell them
apart (before, they were taken for one job with every rank twice)."""

from __future__ import annotations

import uuid

import psutil
import pytest

from scout_sys.demo.launch import free_port
from scout_sys.model import ATTRIBUTED, HANG
from tests.conftest import wait_for
from tests.test_exporters_e2e import _get, _scrape
from tests.test_watch import WatchCli

pytestmark = pytest.mark.slow


def _jobs_in_metrics(port: int) -> set[str]:
    return {dict(lbl)["job"] for (name, lbl) in _scrape(port, starting=True) if name == "scout_sys_rank_state"}


def _forked_children(pid: int) -> list[int]:
    """The children of ``pid`` that run its own command line: forked, not spawned (py-spy's dumps,
    which come and go, are spawned)."""
    me = psutil.Process(pid)
    out = []
    for c in me.children():
        try:
            if c.cmdline() == me.cmdline():
                out.append(c.pid)
        except psutil.Error:
            pass  # a dump that ended meanwhile
    return out


def test_one_node_watch_follows_two_jobs_apart_with_one_metrics_port(start_job, tmp_path):
    tag = uuid.uuid4().hex[:8]  # the variable both jobs' ranks carry, and no other test's
    port = free_port()
    w = WatchCli(f"env:SCOUT_NODE_TEST={tag}", "--every-job", "--prometheus", f"127.0.0.1:{port}",
                 "--state-dir", str(tmp_path / "state"))
    try:
        healthy = start_job(2, env={"SCOUT_NODE_TEST": tag}, args=["--steps", "400"])  # ends by itself, exit 0
        faulty = start_job(4, fault="hang", fault_rank=2, fault_step=40, env={"SCOUT_NODE_TEST": tag})
        names = {f"127.0.0.1:{healthy.port}", f"127.0.0.1:{faulty.port}"}  # each job's master: its label
        wait_for(lambda: _jobs_in_metrics(port) == names, 120, "both jobs' series on the one metrics port")
        faulty.wait_fault(timeout=120)
        e = w.wait_event(lambda e: e["event"] == "incident_opened", timeout=60)
        assert (e["job"], e["incident"]["kind"], e["incident"]["status"], e["incident"]["ranks"]) == \
            (f"127.0.0.1:{faulty.port}", HANG, ATTRIBUTED, [2]), e
        m = _scrape(port)
        assert _get(m, "scout_sys_incidents_open", job=f"127.0.0.1:{faulty.port}", kind=HANG, status=ATTRIBUTED) == [1.0]
        assert _get(m, "scout_sys_incidents_open", job=f"127.0.0.1:{healthy.port}", kind=HANG, status=ATTRIBUTED) == [0.0]
        # one job ends (its series are kept a while: seen above whenever it ended): the watch goes on
        wait_for(lambda: f"job 127.0.0.1:{healthy.port}: ended" in w.stderr(), 180, "the healthy job's watch ended")
        assert w.proc.poll() is None, w.stderr()
        # its probes were detached then, by the watch itself: a child forked to hold them until the
        # node's watch exits (days, for a DaemonSet) would keep every later job's calls trapped in them
        assert _forked_children(w.proc.pid) == []
    finally:
        rc = w.stop()
    assert rc == 1, w.stderr()
    assert w.opened() == [(HANG, ATTRIBUTED, [2])], w.events  # nothing of the healthy job
    assert all(e.get("job") for e in w.events), w.events
    assert "Traceback" not in w.stderr()


def test_every_job_needs_an_env_selector():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "scout_sys", "watch", "--job", "1", "--every-job"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert out.stderr.strip().splitlines()[-1].startswith("scout-sys: error: --every-job needs --job env:NAME"), out.stderr
