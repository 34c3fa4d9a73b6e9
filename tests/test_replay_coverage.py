"""Coverage by default: ``watch`` with no replay flag over a healthy job that writes torch.save
checkpoints notices each (``checkpoint_written``), runs a replay round after it, and the job's last
checkpoint is ``certified`` by ``certify`` with no flag, from the ledger alone."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import REPO, scout
from tests.test_watch import WatchCli

pytestmark = [pytest.mark.slow]


def test_a_job_watched_from_launch_has_its_last_checkpoint_certified(start_job, tmp_path):
    (tmp_path / "checkpoints").mkdir()
    job = start_job(2, args=["--checkpoint-every", "60", "--checkpoint-seconds", "0.1", "--checkpoint-dir",
                             "checkpoints", "--log-every", "10", "--step-time", "0.05"],
                    env={"PYTHONPATH": REPO}, cwd=str(tmp_path))
    w = WatchCli(job.pid, "--state-dir", str(tmp_path / "state"), "--no-ebpf")
    try:
        ledger = tmp_path / "state" / "replay" / "ledger.jsonl"
        end = time.time() + 50
        covering = None
        while time.time() < end and covering is None:  # a clean round after one of its checkpoints
            time.sleep(0.5)
            if ledger.exists():
                rounds = [json.loads(x) for x in ledger.read_text().splitlines()]
                covering = next((e for e in rounds if e["result"] == "clean" and e["checkpoint"]), None)
        assert covering is not None, (w.events, w.stderr())
        written = [e for e in w.events if e["event"] == "checkpoint_written"]
        assert written and written[0]["path"].startswith(str(tmp_path / "checkpoints")), w.events
        after = w.wait_event(lambda e: e["event"] == "checkpoint_written" and e["written"] > covering["time"],
                             timeout=30)
    finally:
        w.proc.terminate()
        w.proc.wait(timeout=30)
    job.stop()
    out = scout("certify", after["path"], "--state-dir", str(tmp_path / "state"), "--json", timeout=120)
    cert = json.loads(out.stdout)
    (c,) = cert["checkpoints"]
    assert (out.returncode, c["status"]) == (0, "certified"), cert
    assert cert["recommended"] == after["path"] and cert["next"] == f"restart from {after['path']}"
    assert c["job"]["cwd"] == str(tmp_path)
