"""replay on live torchrun jobs: a rank whose execution context computes other bits (its environment
selects other CPU kernels) is named ``sdc``; a rank held to a sliver of a CPU by its cgroup is named
``straggler``; a healthy job names nobody; two ranks that differ are inconclusive. The job keeps
running and no worker is left behind, SIGINT included. Kernel sizes are the small test sizes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.conftest import REPO, scout

pytestmark = pytest.mark.slow

ENV_RANK = os.path.join(REPO, "tests", "jobs", "env_rank.py")
SMALL = ["--size", "small", "--reps", "10"]


def workers_of(job) -> list[int]:
    """Replay workers still alive for this job (they carry the rank's environment and our mark)."""
    mark, me = b"SCOUT_REPLAY_WORKER=1", f"SCOUT_DEMO_JOB={job.id}".encode()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if mark in env and me in env:
                out.append(int(name))
    return out


def start(start_job, nproc: int = 4, rank: int | None = None, env: str = "ATEN_CPU_CAPABILITY=default"):
    extra = [str(rank if rank is not None else -1), env, "--", "--log-every", "1", "--step-time", "0.05"]
    job = start_job(nproc, script=ENV_RANK, args=extra, env={"PYTHONPATH": REPO})
    job.wait_steps(2, timeout=120)
    return job


def replay(job, tmp_path, *extra: str, timeout: float = 400) -> tuple[int, dict]:
    out = scout("replay", "--job", str(job.pid), "--json", "--state-dir", str(tmp_path), *SMALL, *extra,
                timeout=timeout)
    assert out.stdout.strip(), out.stderr
    assert len(out.stdout.strip().splitlines()) == 1, "--json prints exactly one object"
    return out.returncode, json.loads(out.stdout)


def named(d: dict) -> list[tuple[str, str, list[int]]]:
    return sorted((i["kind"], i["status"], i["ranks"]) for i in d["incidents"])


def still_running(job) -> None:
    n = len(job.log().split("SCOUT-DEMO step ")) - 1
    job.wait_steps(n + 2, timeout=60)  # it goes on stepping
    assert workers_of(job) == []


def test_other_cpu_kernels_on_one_rank_is_sdc(start_job, tmp_path):
    job = start(start_job, rank=2)
    rc, d = replay(job, tmp_path)
    assert named(d) == [("sdc", "attributed", [2])], d["incidents"]
    assert rc == 1
    ev = d["incidents"][0]["evidence"][0]
    assert ev["source"] == "replay" and ev["device"] == "cpu/rank2"
    assert ev["context"]["capability"] == "DEFAULT"  # the rank's own environment reached its worker
    assert "softmax" in ev["kernels"]
    ledger = [json.loads(x) for x in open(tmp_path / "replay" / "ledger.jsonl")]
    assert [e["result"] for e in ledger] == ["sdc", "sdc"]
    still_running(job)


def test_other_thread_count_on_one_rank_is_sdc(start_job, tmp_path):
    """Two threads where its peers run one: another reduction order, other bits."""
    job = start(start_job, rank=3, env="OMP_NUM_THREADS=2")
    rc, d = replay(job, tmp_path, "--rounds", "1")
    assert named(d) == [("sdc", "attributed", [3])], d["incidents"]
    ev = d["incidents"][0]["evidence"][0]
    assert "reductions" in ev["kernels"] and ev["context"]["threads"] == 2
    still_running(job)


def test_healthy_job_names_nobody_and_its_next_checkpoint_is_certified(start_job, tmp_path):
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    torch_save(ckpts / "step_100.pt")  # the previous checkpoint: before the round
    job = start(start_job)
    rc, d = replay(job, tmp_path, "--checkpoint", str(ckpts / "step_100.pt"))
    assert d["incidents"] == [] and rc == 0, d
    ranks = {r["rank"]: r for r in d["job"]["ranks"]}
    assert {r["state"] for r in ranks.values()} == {"agrees"}
    rounds = d["replay"]["rounds"]
    assert len(rounds) == 2 and all(len(rnd) == 4 for rnd in rounds)
    assert all(x["context"]["python"] == sys.executable for x in rounds[0])  # the rank's venv interpreter
    assert all("ckpt:w" in x["kernels"] for x in rounds[0])  # a GEMM with the checkpoint's own weight
    still_running(job)
    torch_save(ckpts / "step_200.pt")
    out = scout("certify", str(ckpts / "step_100.pt"), str(ckpts / "step_200.pt"), "--state-dir", str(tmp_path),
                "--json", timeout=120)
    cert = json.loads(out.stdout)
    status = {c["path"]: c["status"] for c in cert["checkpoints"]}
    assert status == {str(ckpts / "step_100.pt"): "unverified", str(ckpts / "step_200.pt"): "certified"}, cert
    assert cert["recommended"] == str(ckpts / "step_200.pt")
    assert out.returncode == 1  # one of them is unverified


def test_two_ranks_that_differ_are_inconclusive(start_job, tmp_path):
    job = start(start_job, nproc=2, rank=1)
    rc, d = replay(job, tmp_path, "--rounds", "1")
    assert named(d) == [("sdc", "inconclusive", [])], d["incidents"]
    assert "softmax" in d["incidents"][0]["summary"]
    assert rc == 1
    still_running(job)


# --------------------------------------------------------------------------- a slow device


def _cpu_cgroup(quota_us: int, period_us: int = 100_000) -> tuple[str, str]:
    """A fresh cgroup with a CPU quota: (its cgroup.procs, its folder). Skips when none can be made."""
    name = f"scout-test-{uuid.uuid4().hex[:8]}"
    v1 = "/sys/fs/cgroup/cpu"
    try:
        if os.path.exists(os.path.join(v1, "cpu.cfs_quota_us")):
            path = os.path.join(v1, name)
            os.mkdir(path)
            with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
                f.write(str(quota_us))
            return os.path.join(path, "cgroup.procs"), path
        root = "/sys/fs/cgroup"
        if "cpu" in open(os.path.join(root, "cgroup.subtree_control")).read().split():
            path = os.path.join(root, name)
            os.mkdir(path)
            with open(os.path.join(path, "cpu.max"), "w") as f:
                f.write(f"{quota_us} {period_us}")
            return os.path.join(path, "cgroup.procs"), path
    except OSError as e:
        pytest.skip(f"cannot make a CPU-quota cgroup here: {e}")
    pytest.skip("no cgroup CPU controller we can write")
    raise AssertionError


@pytest.mark.serial  # load-sensitive: run alone (see tests/README.md)
def test_rank_held_to_a_cpu_sliver_by_its_cgroup_is_a_straggler(start_job, tmp_path):
    procs, folder = _cpu_cgroup(5_000)  # 5% of one CPU, shared with the rank itself
    job = None
    try:
        job = start(start_job)
        pid = next(int(p) for p in _rank_pids(job) if _rank_of(p) == 1)
        with open(procs, "w") as f:
            f.write(str(pid))
        # Enough work per round that the peers' share of a busy machine averages out (workers yield
        # to everything else: their session is niced).
        rc, d = replay(job, tmp_path, "--reps", "20")
        assert named(d) == [("straggler", "attributed", [1])], d["incidents"]
        assert rc == 1
        secs = d["incidents"][0]["evidence"][0]["seconds"]
        assert len(secs) == 2 and min(secs) > 0
        job.stop()
        assert workers_of(job) == []
    finally:
        if job is not None:
            job.stop()  # the cgroup can go only once its processes are gone
        for _ in range(100):
            try:
                os.rmdir(folder)
                break
            except OSError:
                time.sleep(0.1)


def _rank_pids(job) -> list[int]:
    from scout_sys.job import find_job

    return [r.pid for r in find_job(str(job.pid)).ranks]


def _rank_of(pid: int) -> int:
    env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return int(next(e for e in env if e.startswith(b"RANK=")).split(b"=")[1])


# --------------------------------------------------------------------------- SIGINT


def test_sigint_leaves_no_worker_and_the_job_running(start_job, tmp_path):
    job = start(start_job)
    # As from a terminal, where Ctrl-C is SIGINT at its default. A command started in the background by a
    # non-interactive shell (a CI runner's `cmd &`) inherits SIGINT *ignored*, and Python keeps it so.
    p = subprocess.Popen([sys.executable, "-m", "scout_sys", "replay", "--job", str(job.pid), "--rounds", "1000",
                          "--state-dir", str(tmp_path), *SMALL], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        end = time.time() + 180
        while len(workers_of(job)) < 4 and time.time() < end:
            time.sleep(0.2)
        assert len(workers_of(job)) == 4, "workers started"
        ledger = tmp_path / "replay" / "ledger.jsonl"
        while not ledger.exists() and time.time() < end:
            time.sleep(0.2)  # rounds are running
        p.send_signal(signal.SIGINT)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130
    assert "Traceback" not in p.stderr.read()
    still_running(job)


def torch_save(path) -> None:
    code = ("import sys, torch; g = torch.Generator().manual_seed(0); "
            "torch.save({'w': torch.randn(8, 8, generator=g)}, sys.argv[1])")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=120)
    time.sleep(0.05)  # distinct modification times
