"""A PyTorch Lightning job started as its users start it, ``python train.py`` (Trainer(strategy="ddp",
devices=3), no torchrun): the script is local rank 0 and the parent of the two others, which carry no
RANK. Watched from the same second by the pid of the script the user started, a hang of rank 0 itself
is named; diagnose by a child's pid finds the same job. The multi-node shapes (a hang on the other
node is never blamed here) are in test_launchers_e2e.py."""

from __future__ import annotations

import os
import sys

import psutil
import pytest

from scout_sys.demo.launch import DemoJob
from scout_sys.model import ATTRIBUTED, HANG
from tests.conftest import JOBS, diagnose_json, settle
from tests.test_watch import WatchCli

pytestmark = pytest.mark.slow

LIGHTNING = os.path.join(JOBS, "lightning_job.py")


def test_a_hang_of_the_script_itself_is_named_and_any_rank_selects_the_job(tmp_path):
    job = DemoJob(3, launcher="shell")  # the marker and the log; its command is the user's own
    job.cmd = [sys.executable, LIGHTNING, "--devices", "3", "--fault", "hang", "--fault-rank", "0",
               "--fault-step", "60"]
    job.start()
    w = WatchCli(job.pid, "--state-dir", str(tmp_path / "state"), human=True)
    try:
        line = w.wait_event(lambda x: x.startswith("watching "), timeout=180)
        assert line.startswith("watching 3 ranks") and f"launcher lightning pid {job.pid}" in line, line
        assert job.wait_fault(timeout=180) == job.pid  # rank 0 is the script the user started
        opened = w.wait_event(lambda x: " OPENED " in x, timeout=60)
        assert f"{HANG} ({ATTRIBUTED}) rank 0:" in opened, opened
        settle(job, job.pid)
        child = psutil.Process(job.pid).children()[0].pid
        rc, d = diagnose_json(child)
    finally:
        w.stop()
        job.stop()
    assert job.pids() == [], "processes of the Lightning job left behind"
    assert rc == 1, d
    assert d["job"]["launcher"] == "lightning", d["job"]
    assert sorted((r["rank"], r["pid"] == job.pid) for r in d["job"]["ranks"]) == [(0, True), (1, False), (2, False)]
    assert [(i["kind"], i["status"], i["ranks"]) for i in d["incidents"]] == [(HANG, ATTRIBUTED, [0])], d["incidents"]
    assert any("3 ranks expected on this host" in n for n in d["notes"]), d["notes"]
