"""Job selectors against real processes (no torch needed: rank processes are identified by their
environment, as torchrun, mpirun and srun set it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from scout_sys import rankenv
from scout_sys.errors import BadSelector, NoRanks, PermissionDenied, TargetGone
from scout_sys.job import find_job
from tests.conftest import scout

# Each "rank" sleeps; rank 1 forks a helper that inherits its environment (like a DataLoader worker).
RANK_CODE = (
    "import os, sys, time\n"
    "if os.environ['RANK'] == '1' and os.fork() == 0:\n"
    "    time.sleep(60); os._exit(0)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def fake_job():
    """4 rank processes under a bash launcher in a new session; killed by process group at the end."""
    body = ("export MASTER_ADDR=127.0.0.1 MASTER_PORT=29999 WORLD_SIZE=4 LOCAL_WORLD_SIZE=4\n"
            f"for r in 0 1 2 3; do RANK=$r LOCAL_RANK=$r {sys.executable} -c \"$CODE\" & done\nwait\n")
    p = subprocess.Popen(["bash", "-c", body], env=dict(os.environ, CODE=RANK_CODE, SCOUT_TEST_JOB=str(os.getpid()),
                                                        **{f"SCOUT_TEST_JOB_{os.getpid()}": "x"}),
                         start_new_session=True)
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                job = find_job(str(p.pid))
                if len(job.ranks) == 4:
                    break
            except NoRanks:
                pass
            time.sleep(0.1)
        yield p
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_launcher_pid_finds_all_ranks(fake_job):
    job = find_job(str(fake_job.pid))
    assert sorted(r.rank for r in job.ranks) == [0, 1, 2, 3]
    assert job.launcher == "shell" and job.launcher_pid == fake_job.pid
    assert job.world_size == 4 and job.missing == ()
    # the forked helper of rank 1 is not taken for rank 1
    r1 = job.by_rank()[1]
    assert r1.pid in [c.pid for c in __import__("psutil").Process(fake_job.pid).children()]


def test_rank_pid_finds_its_siblings(fake_job):
    job0 = find_job(str(fake_job.pid))
    job = find_job(str(job0.by_rank()[2].pid))
    assert sorted(r.rank for r in job.ranks) == [0, 1, 2, 3]
    assert job.launcher_pid == fake_job.pid


def test_pgid_selector(fake_job):
    job = find_job(f"pgid:{fake_job.pid}")
    assert sorted(r.rank for r in job.ranks) == [0, 1, 2, 3]


def test_explicit_pid_list(fake_job):
    full = find_job(str(fake_job.pid))
    pids = [full.by_rank()[r].pid for r in (0, 3)]
    job = find_job(",".join(map(str, pids)))
    assert sorted(r.rank for r in job.ranks) == [0, 3]
    assert job.launcher == "explicit"


def test_dead_rank_is_missing(fake_job):
    full = find_job(str(fake_job.pid))
    os.kill(full.by_rank()[3].pid, signal.SIGKILL)
    time.sleep(0.5)  # bash reaps it
    job = find_job(str(fake_job.pid))
    assert job.missing == (3,)


@pytest.mark.parametrize("sel,exc", [("abc", BadSelector), ("pgid:x", BadSelector), ("1,x", BadSelector),
                                     ("0", BadSelector), ("999999999", TargetGone)])
def test_bad_selectors_raise(sel, exc):
    with pytest.raises(exc):
        find_job(sel)


def test_a_process_that_is_no_job():
    with pytest.raises(NoRanks):
        find_job(str(os.getpid()))


@pytest.mark.parametrize("sel,needle", [
    ("999999999", "no process with pid 999999999"),
    ("nonsense", "bad selector"),
    (None, "no rank processes found"),
])
def test_cli_bad_input_is_one_line_exit_2(sel, needle):
    out = scout("diagnose", "--job", sel or str(os.getpid()), "--window", "0.5")
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in out.stderr, out.stderr


def test_env_selector_finds_the_ranks_with_the_variable(fake_job):
    job = find_job(f"env:SCOUT_TEST_JOB={os.getpid()}")
    assert sorted(r.rank for r in job.ranks) == [0, 1, 2, 3]
    assert job.launcher_pid == fake_job.pid
    assert all(r.container_pid is None for r in job.ranks)  # same PID namespace as ours
    # env:NAME, any value: whatever job has the variable (how a node-level agent finds torchrun's jobs)
    job = find_job(f"env:SCOUT_TEST_JOB_{os.getpid()}")
    assert sorted(r.rank for r in job.ranks) == [0, 1, 2, 3] and job.launcher_pid == fake_job.pid
    with pytest.raises(NoRanks, match="has SCOUT_NO_SUCH_VARIABLE in its environment"):
        find_job("env:SCOUT_NO_SUCH_VARIABLE")


def test_an_unreadable_process_never_ends_the_env_scan(fake_job, monkeypatch):
    # one real process whose environment may not be read (as PID 1 of a sandbox, or another user's
    # for a non-root monitor): the scan skips it and still finds the job
    sleeper = subprocess.Popen(["sleep", "30"])
    real = rankenv._environ

    def environ(pid: int):
        if pid == sleeper.pid:
            raise PermissionDenied(f"cannot read the environment of pid {pid}: {rankenv.denied_hint()}", pid=pid)
        return real(pid)

    monkeypatch.setattr(rankenv, "_environ", environ)
    try:
        job = find_job(f"env:SCOUT_TEST_JOB={os.getpid()}")
        assert sorted(r.rank for r in job.ranks) == [0, 1, 2, 3]
        # nothing matches: then, and only then, the skipped processes are named, with advice that applies
        with pytest.raises(NoRanks) as e:
            find_job("env:SCOUT_TEST_JOB=no-such-job")
        msg = str(e.value)
        assert "no rank process on this host has SCOUT_TEST_JOB=no-such-job" in msg
        assert "could not be read" in msg and "skipped" in msg, msg
        if os.geteuid() == 0:
            assert "run as root" not in msg and "protected even from root" in msg, msg
        else:
            assert "run as root" in msg, msg
    finally:
        sleeper.kill()
        sleeper.wait()


def test_env_selector_matching_nothing_is_one_line_and_exit_2():
    # as root on a host whose PID 1 hides its environment this said "run as root" and stopped the scan
    out = scout("diagnose", "--job", "env:SLURM_JOB_ID=no-such-job", "--window", "0.5")
    assert out.returncode == 2 and out.stdout == "", out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no rank process on this host has SLURM_JOB_ID=no-such-job" in lines[0], out.stderr
    if os.geteuid() == 0:
        assert "run as root" not in lines[0], lines[0]


@pytest.mark.parametrize(("argv", "kind"), [
    (["accelerate", "launch", "--multi_gpu", "train.py"], "accelerate"),
    (["deepspeed", "--num_gpus", "4", "train.py"], "deepspeed"),
    (["train.py", "--launch"], "python"),
])
def test_the_launcher_is_named_from_its_command_line(tmp_path, argv, kind):
    # `accelerate launch` runs torchrun's agent inside its own process and `deepspeed` is a Python script:
    # both are python processes whose command line names them
    from scout_sys.job import _launcher_kind

    script = tmp_path / argv[0]
    script.write_text("import time\ntime.sleep(30)\n")
    p = subprocess.Popen([sys.executable, str(script), *argv[1:]])
    try:
        deadline = time.time() + 10
        while len(psutil.Process(p.pid).cmdline()) < len(argv) + 1 and time.time() < deadline:
            time.sleep(0.05)
        assert _launcher_kind(psutil.Process(p.pid)) == kind
    finally:
        p.kill()
        p.wait()


_LIGHTNING_LIKE = """import os, subprocess, sys, time
world = sys.argv[1]
if "LOCAL_RANK" not in os.environ:  # the script the user started: local rank 0, as Lightning's launcher does it
    for i in (1, 2):
        subprocess.Popen([sys.executable, os.path.abspath(sys.argv[0])] + sys.argv[1:],
                         env={**os.environ, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "1",
                              "WORLD_SIZE": world, "LOCAL_RANK": str(i)})
elif os.environ["LOCAL_RANK"] == "1":  # a helper of a rank (a DataLoader worker): its environment, no rank of its own
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
time.sleep(30)
"""


@pytest.mark.parametrize("world", ["6", "4"])
def test_lightning_launcher_ranks_are_numbered_from_the_node_or_not_at_all(tmp_path, world):
    # node 1 of a Lightning job, 3 local ranks: global ranks 3-5 when WORLD_SIZE=6; with WORLD_SIZE=4
    # the 3 local ranks seen do not divide it (a child gone?): no rank can be numbered, none is named
    from scout_sys.errors import NoRanks
    from scout_sys.job import find_job

    script = tmp_path / "train.py"
    script.write_text(_LIGHTNING_LIKE)
    p = subprocess.Popen([sys.executable, str(script), world], start_new_session=True)
    try:
        deadline = time.time() + 20
        while len(psutil.Process(p.pid).children(recursive=True)) < 3 and time.time() < deadline:
            time.sleep(0.05)
        if world == "4":
            with pytest.raises(NoRanks, match="does not divide WORLD_SIZE=4"):
                find_job(str(p.pid))
            return
        job = find_job(str(p.pid))
        kids = sorted(c.pid for c in psutil.Process(p.pid).children())
        assert job.launcher == "lightning" and job.launcher_pid == p.pid, job
        assert sorted((r.rank, r.pid) for r in job.ranks) == [(3, p.pid), (4, kids[0]), (5, kids[1])], job.ranks
        assert job.missing == () and job.remote == (0, 1, 2), job  # MASTER_ADDR on the network: nothing said
        assert find_job(str(kids[1])).ranks == job.ranks  # a child's pid selects the same job
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
