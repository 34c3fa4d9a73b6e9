"""The frameworks users run unmodified, each as a real job under torchrun on CPU / Gloo: DeepSpeed
(ZeRO-2 with its own engine; tests/jobs/deepspeed_job.py). Megatron-Core has its own files
(test_peers_e2e.py, test_waitfor_e2e.py). One job per framework serves the healthy check and then the
fault (a go-file), so each costs one start-up.

The witnesses' stacks go through the framework's own collective frames: what consensus/patterns.py
has rows for is what the real job shows."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import JOBS, origins, scout, settle

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deepspeed")]
DEEPSPEED = os.path.join(JOBS, "deepspeed_job.py")


def _diagnose(pid: int) -> tuple[int, dict]:
    out = scout("diagnose", "--job", str(pid), "--json", timeout=90)
    assert out.stdout.strip(), out.stderr
    return out.returncode, json.loads(out.stdout)


@pytest.fixture(scope="module")
def deepspeed_job(tmp_path_factory):
    from scout_sys.demo.launch import DemoJob

    go = tmp_path_factory.mktemp("ds") / "go"
    job = DemoJob(4, script=DEEPSPEED, args=["--zero", "2", "--fault", "hang", "--fault-rank", "1",
                                            "--fault-when", str(go)])
    job.start()
    try:
        job.wait_for(r"DSJOB step 10", timeout=240)
        yield job, go
    finally:
        job.stop()
        assert job.pids() == [], "processes of the DeepSpeed job left behind"


def test_deepspeed_zero2_healthy(deepspeed_job):
    job, _ = deepspeed_job
    rc, d = _diagnose(job.pid)
    assert (rc, d["status"], d["incidents"]) == (0, "healthy", []), (d["incidents"], d["notes"])
    assert {r["rank"] for r in d["job"]["ranks"]} == {0, 1, 2, 3}


def test_deepspeed_zero2_hang_names_the_rank_and_its_peers_wait_in_deepspeed_comm(deepspeed_job):
    job, go = deepspeed_job
    go.touch()
    m = job.wait_for(r"DSJOB fault hang rank=1 pid=(\d+)", timeout=60)
    settle(job, int(m.group(1)))
    rc, d = _diagnose(job.pid)
    assert rc == 1 and origins(d) == [("hang", "attributed", [1])], (d["incidents"], d["notes"])
    assert "fetch_batch_from_remote_storage" in d["incidents"][0]["summary"]
    states = {r["rank"]: r for r in d["job"]["ranks"]}
    assert all(states[r]["state"] == "waiting" for r in (0, 2, 3)), states
    # the witnesses wait in DeepSpeed's gradient reduction: its comm frames are on their stacks
    stacks = [e["stack"] for e in d["incidents"][0]["evidence"] if e.get("ranks") == [0, 2, 3] and "stack" in e]
    assert stacks and any("deepspeed/" in f for f in stacks[0]), d["incidents"][0]["evidence"]
    assert any("deepspeed/comm/" in f for f in stacks[0]), stacks[0]
