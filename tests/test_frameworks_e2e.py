"""The frameworks users run unmodified, each as a real job under torchrun on CPU / Gloo: DeepSpeed
(ZeRO-2 with its own engine; tests/jobs/deepspeed_job.py) and TorchTitan (its own trainer, llama3
debugmodel with FSDP2, through the thin CPU launcher tests/jobs/titan_job.py). Megatron-Core has its
own files (test_peers_e2e.py, test_waitfor_e2e.py). One job per framework serves the healthy check
and then the fault (a go-file), so each costs one start-up; the two jobs run on separate xdist
workers.

The witnesses' stacks go through the framework's own collective frames: what consensus/patterns.py
has rows for is what the real job shows."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import JOBS, origins, scout, settle

pytestmark = [pytest.mark.slow]
DEEPSPEED = os.path.join(JOBS, "deepspeed_job.py")
TITAN = os.path.join(JOBS, "titan_job.py")


def _diagnose(pid: int) -> tuple[int, dict]:
    out = scout("diagnose", "--job", str(pid), "--json", timeout=90)
    assert out.stdout.strip(), out.stderr
    return out.returncode, json.loads(out.stdout)


def _running(tmp_path_factory, name: str, script: str, args, ready: str):
    """One framework's 4-rank job, started and trained up to ``ready``; yields (job, go-file)."""
    from scout_sys.demo.launch import DemoJob

    d = tmp_path_factory.mktemp(name)
    go = d / "go"
    job = DemoJob(4, script=script, args=args(d, go), cwd=str(d))
    job.start()
    try:
        job.wait_for(ready, timeout=240)
        yield job, go
    finally:
        job.stop()
        assert job.pids() == [], f"processes of the {name} job left behind"


@pytest.fixture(scope="module")
def deepspeed_job(tmp_path_factory):
    yield from _running(tmp_path_factory, "deepspeed", DEEPSPEED, lambda d, go: [
        "--zero", "2", "--fault", "hang", "--fault-rank", "1", "--fault-when", str(go)], r"DSJOB step 10")


@pytest.fixture(scope="module")
def titan_job(tmp_path_factory):
    yield from _running(tmp_path_factory, "torchtitan", TITAN, lambda d, go: [
        "--assets", str(d / "assets"), "--go", str(go), "--fault-rank", "2"], r"TITAN step 5 rank=")


@pytest.mark.xdist_group("deepspeed")
def test_deepspeed_zero2_healthy(deepspeed_job):
    job, _ = deepspeed_job
    rc, d = _diagnose(job.pid)
    assert (rc, d["status"], d["incidents"]) == (0, "healthy", []), (d["incidents"], d["notes"])
    assert {r["rank"] for r in d["job"]["ranks"]} == {0, 1, 2, 3}


@pytest.mark.xdist_group("deepspeed")
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


@pytest.mark.xdist_group("torchtitan")
def test_titan_fsdp2_healthy(titan_job):
    job, _ = titan_job
    rc, d = _diagnose(job.pid)
    assert (rc, d["status"], d["incidents"]) == (0, "healthy", []), (d["incidents"], d["notes"])
    assert {r["rank"] for r in d["job"]["ranks"]} == {0, 1, 2, 3}


@pytest.mark.xdist_group("torchtitan")
def test_titan_fsdp2_hang_names_the_rank_and_its_peers_wait_in_torchtitan_dist_sum(titan_job):
    job, go = titan_job
    go.touch()
    m = job.wait_for(r"TITAN fault hang rank=2 pid=(\d+)", timeout=60)
    settle(job, int(m.group(1)))
    rc, d = _diagnose(job.pid)
    assert rc == 1 and origins(d) == [("hang", "attributed", [2])], (d["incidents"], d["notes"])
    assert "read_next_shard" in d["incidents"][0]["summary"]
    states = {r["rank"]: r for r in d["job"]["ranks"]}
    assert all(states[r]["state"] == "waiting" for r in (0, 1, 3)), states
    stacks = [e["stack"] for e in d["incidents"][0]["evidence"] if e.get("ranks") == [0, 1, 3] and "stack" in e]
    assert stacks and any("torchtitan/distributed/utils.py" in f for f in stacks[0]), d["incidents"][0]["evidence"]
