"""TorchTitan's own trainer, unmodified (llama3 debugmodel, FSDP2 over 4 CPU ranks, Gloo), run by
the thin launcher tests/jobs/titan_job.py (CPU device, SUM for FSDP2's reduce-scatter, a local
tokenizer and corpus). One job serves the healthy check and then the fault (a go-file).

The witnesses wait in TorchTitan's own collective helper (``torchtitan/distributed/utils.py``,
a row of consensus/patterns.py), the origin in its input pipeline."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import JOBS, origins, scout, settle

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("torchtitan")]
TITAN = os.path.join(JOBS, "titan_job.py")


def _diagnose(pid: int) -> tuple[int, dict]:
    out = scout("diagnose", "--job", str(pid), "--json", timeout=90)
    assert out.stdout.strip(), out.stderr
    return out.returncode, json.loads(out.stdout)


@pytest.fixture(scope="module")
def titan_job(tmp_path_factory):
    from scout_sys.demo.launch import DemoJob

    d = tmp_path_factory.mktemp("titan")
    go = d / "go"
    job = DemoJob(4, script=TITAN, args=["--assets", str(d / "assets"), "--go", str(go), "--fault-rank", "2"],
                  cwd=str(d))
    job.start()
    try:
        job.wait_for(r"TITAN step 5 rank=", timeout=240)
        yield job, go
    finally:
        job.stop()
        assert job.pids() == [], "processes of the TorchTitan job left behind"


def test_titan_fsdp2_healthy(titan_job):
    job, _ = titan_job
    rc, d = _diagnose(job.pid)
    assert (rc, d["status"], d["incidents"]) == (0, "healthy", []), (d["incidents"], d["notes"])
    assert {r["rank"] for r in d["job"]["ranks"]} == {0, 1, 2, 3}


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
