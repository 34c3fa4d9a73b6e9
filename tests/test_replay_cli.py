"""replay's command line on bad input, and a rank's execution context read from a real process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from scout_sys.replay.context import cgroup_procs, context_of
from tests._host import runnable_by_others
from tests.conftest import REPO, scout


def test_bad_input_is_one_line_and_exit_2():
    for args in (["--job", "999999999"], ["--job", str(os.getpid()), "--rounds", "0"],
                 ["--job", "1", "--checkpoint", "/nonexistent/ckpt.pt"]):
        out = scout("replay", *args)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.strip().count("\n") == 0 and "Traceback" not in out.stderr, out.stderr


@pytest.mark.torch
def test_context_of_a_process_that_loaded_torch():
    code = "import torch, time, sys; print('ready', flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "SCOUT_CTX_TEST": "yes"})
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        os.sched_setaffinity(p.pid, {0})
        ctx = context_of(p.pid)
        assert ctx.python == sys.executable  # the venv's interpreter by its own name, not the resolved binary
        import importlib.util

        spec = importlib.util.find_spec("torch")
        assert spec is not None and spec.origin is not None
        assert ctx.torch_site == os.path.dirname(os.path.dirname(spec.origin))
        assert ctx.env["PYTHONPATH"].split(os.pathsep)[0] == ctx.torch_site
        assert ctx.env["SCOUT_CTX_TEST"] == "yes" and ctx.env["SCOUT_REPLAY_WORKER"] == "1"
        assert ctx.cpus == frozenset({0})
        assert ctx.nice >= 10
        assert ctx.cgroup_procs == cgroup_procs(os.getpid())  # a child shares our cgroups
        assert all(path.endswith("cgroup.procs") and os.path.exists(path) for path in ctx.cgroup_procs)
    finally:
        p.kill()
        p.wait()


def test_memory_headroom_reads_v1_and_v2_limits(tmp_path):
    from scout_sys.replay.context import memory_headroom

    v2, v1, free = tmp_path / "v2", tmp_path / "v1", tmp_path / "unlimited"
    for d in (v2, v1, free):
        d.mkdir()
    (v2 / "memory.max").write_text(f"{4 << 30}\n")
    (v2 / "memory.current").write_text(f"{3 << 30}\n")
    (v1 / "memory.limit_in_bytes").write_text(f"{2 << 30}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{(2 << 30) - (100 << 20)}\n")
    (free / "memory.max").write_text("max\n")
    (free / "memory.current").write_text("123\n")
    assert memory_headroom(str(v2 / "cgroup.procs")) == 1 << 30
    assert memory_headroom(str(v1 / "cgroup.procs")) == 100 << 20
    assert memory_headroom(str(free / "cgroup.procs")) is None
    assert memory_headroom(str(tmp_path / "cgroup.procs")) is None  # no memory controller


@pytest.mark.slow
def test_the_worker_runs_as_the_ranks_user():
    if os.geteuid() != 0:
        pytest.skip("needs root to start a rank as another user")
    import pwd

    nobody = pwd.getpwnam("nobody")
    code = "import torch, time; print('ready', flush=True); time.sleep(120)"
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    with runnable_by_others(sys.executable, sys.prefix, REPO):
        _worker_runs_as(nobody, code, env)


def _worker_runs_as(nobody, code: str, env: dict[str, str]) -> None:
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env, cwd="/",
                         user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], start_new_session=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        from scout_sys.job import find_job
        from scout_sys.replay.runner import run_round

        res = run_round(find_job(str(p.pid)), size="small", reps=1)
        (dev,) = res.rounds[0]
        assert dev.error is None, dev.error
        assert dev.info["uid"] == nobody.pw_uid
        assert res.diagnosis.incidents == ()
        assert any("only one device" in n for n in res.diagnosis.notes)
    finally:
        p.kill()
        p.wait()


@pytest.mark.slow
def test_a_job_the_caller_may_not_read_is_one_line_and_exit_2():
    # an unprivileged user points diagnose at root's rank: the product's permission path, for real
    if os.geteuid() != 0:
        pytest.skip("needs root to run the command as another user and own the job")
    import pwd

    nobody = pwd.getpwnam("nobody")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    rank = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        with runnable_by_others(sys.executable, sys.prefix, REPO):
            out = subprocess.run([sys.executable, "-m", "scout_sys", "diagnose", "--job", str(rank.pid)],
                                 capture_output=True, text=True, timeout=60, cwd="/", env={**os.environ, "HOME": "/"},
                                 user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[])
        assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
        err = out.stderr.strip()
        assert err.count("\n") == 0 and "Traceback" not in err, err
        assert f"pid {rank.pid}" in err and "sudo" in err, err
    finally:
        rank.kill()
        rank.wait()
