"""Coverage by default: ``watch`` with no replay flag over a healthy job that writes torch.save
checkpoints notices each (``checkpoint_written``), runs a replay round after it, and the job's last
checkpoint is ``certified`` by ``certify`` with no flag, from the ledger alone."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.conftest import REPO, scout
from tests.test_watch import WatchCli

pytestmark = [pytest.mark.slow]


@pytest.mark.serial  # coverage skips rounds on a busy host (load over 6 per CPU): run alone
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
                covering = next((e for e in rounds if e.get("result") == "clean" and e["checkpoint"]), None)
        assert covering is not None, (w.events, w.stderr())
        written = [e for e in w.events if e["event"] == "checkpoint_written"]
        assert written and written[0]["path"].startswith(str(tmp_path / "checkpoints")), w.events
        # the job's checkpoint folder: rank 0 also rewrites a scratch file in /tmp (its write pause),
        # which the watch reports too, and which lies outside the job's directories
        after = w.wait_event(lambda e: e["event"] == "checkpoint_written" and e["written"] > covering["time"]
                             and e["path"].startswith(str(tmp_path / "checkpoints")), timeout=30)
    finally:
        w.proc.terminate()
        w.proc.wait(timeout=30)
    job.stop()
    # as it was written, the watch said what certify finds: a clean round of its job since the previous one
    assert after["coverage"] == "covered", after
    out = scout("certify", after["path"], "--state-dir", str(tmp_path / "state"), "--json", timeout=120)
    cert = json.loads(out.stdout)
    (c,) = cert["checkpoints"]
    assert (out.returncode, c["status"]) == (0, "certified"), cert
    assert cert["recommended"] == after["path"] and cert["next"] == f"restart from {after['path']}"
    assert c["job"]["cwd"] == str(tmp_path)


def _save(*paths) -> None:
    """A torch.save checkpoint at each path, in one process (torch is imported once: ~2.5 s a start on
    2 loaded cores), each written after the previous, and all before this returns."""
    import subprocess
    import sys

    code = ("import sys, time, torch\n"
            "for p in sys.argv[1:]:\n"
            "    g = torch.Generator().manual_seed(0); torch.save({'w': torch.randn(8, 8, generator=g)}, p)\n"
            "    time.sleep(0.05)\n")
    subprocess.run([sys.executable, "-c", code, *map(str, paths)], check=True, timeout=120)
    time.sleep(0.05)


def test_two_jobs_sharing_a_state_dir_judge_only_their_own_checkpoints(start_job, tmp_path):
    """Job a: its rank 2 computes other bits (other CPU kernels: sdc); job b: healthy; one state dir."""
    env_rank = f"{REPO}/tests/jobs/env_rank.py"
    for d in ("a", "b", "nobody"):
        (tmp_path / d).mkdir()
    _save(*(tmp_path / d / "step_1.pt" for d in ("a", "b", "nobody")))
    jobs = {}
    for name, rank in (("a", "2"), ("b", "-1")):
        jobs[name] = start_job(3, script=env_rank, args=[rank, "ATEN_CPU_CAPABILITY=default", "--", "--step-time",
                                                        "0.05", "--log-every", "1"],
                               env={"PYTHONPATH": REPO}, cwd=str(tmp_path / name))
    for name, want in (("a", 1), ("b", 0)):
        jobs[name].wait_steps(2, timeout=120)
        out = scout("replay", "--job", str(jobs[name].pid), "--rounds", "1", "--size", "small", "--reps", "5",
                    "--state-dir", str(tmp_path / "state"), "--json", timeout=300)
        assert out.returncode == want, out.stdout + out.stderr
    _save(*(tmp_path / d / "step_2.pt" for d in ("a", "b", "nobody")))

    def status(*paths, extra=()):
        out = scout("certify", *map(str, paths), "--state-dir", str(tmp_path / "state"), "--json", *extra,
                    timeout=120)
        got = json.loads(out.stdout)["checkpoints"]
        assert [c["path"] for c in got] == list(map(str, paths)), got
        return got

    # one certify of the three (each checkpoint is judged on its own: replay/certify.py), as three would
    b, a, n = status(*(tmp_path / d / "step_2.pt" for d in ("b", "a", "nobody")))
    assert b["status"] == "certified" and not any("sdc" in r for r in b["reasons"]), b
    assert a["status"] == "rejected" and any("sdc on cpu/rank2" in r for r in a["reasons"]), a
    assert (n["status"], n["job"]) == ("unverified", None), n  # b's clean round does not certify it
    assert "no job in the replay ledger wrote it" in n["reasons"][0]
    (named,) = status(tmp_path / "nobody" / "step_2.pt", extra=("--job", str(jobs["b"].pid)))  # b wrote it, says its user
    assert named["status"] == "certified" and named["job"]["matched"] == "named with --job", named
    # a's job ends; the same script relaunched in a/, never watched, writes step_3: a's sdc round is
    # about a's checkpoints, not this one (the ledger last saw a before step_3 was written)
    jobs["a"].stop()
    _save(tmp_path / "a" / "step_3.pt")
    (a3,) = status(tmp_path / "a" / "step_3.pt")
    assert (a3["status"], a3["job"]) == ("unverified", None) and not any("sdc" in r for r in a3["reasons"]), a3


def test_replicas_and_a_dcp_folder_written_by_a_real_ddp_job_are_certified(start_job, tmp_path):
    """A 3-rank DDP job: a clean replay round of it, then it saves per-rank replicas and a DCP folder
    (all ranks); certify, with no flag while it runs, certifies both as its own, and names the newest."""
    job = start_job(3, script=f"{REPO}/tests/jobs/ckpt_job.py",
                    args=["--go", str(tmp_path / "go"), "--replicas", "replicas", "--dcp", "dcp"],
                    env={"PYTHONPATH": REPO}, cwd=str(tmp_path))
    job.wait_steps(2, timeout=120)
    out = scout("replay", "--job", str(job.pid), "--rounds", "1", "--size", "small", "--state-dir",
                str(tmp_path / "state"), "--json", timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    (tmp_path / "go").touch()
    step = int(job.wait_for(r"SCOUT-DEMO saved step=(\d+)", 120).group(1))
    replicas, folder = tmp_path / "replicas" / f"step_{step}", tmp_path / "dcp" / f"step_{step}"
    assert sorted(os.listdir(replicas)) == ["rank0.pt", "rank1.pt", "rank2.pt"]
    assert any(n.endswith(".distcp") for n in os.listdir(folder)) and (folder / ".metadata").exists()
    out = scout("certify", str(replicas), str(folder), "--state-dir", str(tmp_path / "state"), "--json", timeout=120)
    cert = json.loads(out.stdout)
    assert (out.returncode, [c["status"] for c in cert["checkpoints"]]) == (0, ["certified"] * 2), cert
    assert all(c["job"]["launcher_pid"] == job.pid and c["divergent"] == [] for c in cert["checkpoints"]), cert
    assert cert["recommended"] in (str(replicas), str(folder))
