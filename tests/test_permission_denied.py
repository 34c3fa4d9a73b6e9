"""The PermissionDenied paths of job.py (every process of a selected group unreadable) and
probes/pystack.py (py-spy refused every rank), for real: the tool run as ``nobody`` against root's
processes, the kernel refusing (test_replay_cli.py has the environ path of ``--job PID``); and what doctor
and watch say to a user who is not root (eBPF needs root: one line, what to run)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys

import pytest

from tests._host import runnable_by_others
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own the job and run the tool as nobody")


def _as_nobody(args: list[str]) -> subprocess.CompletedProcess[str]:
    nobody = pwd.getpwnam("nobody")
    with runnable_by_others(sys.executable, sys.prefix, REPO):
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd="/",
                              env={**os.environ, "HOME": "/", "PYTHONPATH": REPO}, user=nobody.pw_uid,
                              group=nobody.pw_gid, extra_groups=[])


@pytest.fixture
def roots_rank():
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    p = subprocess.Popen(["sleep", "120"], env=env, start_new_session=True)
    yield p
    p.kill()
    p.wait()


def test_a_process_group_none_of_whose_processes_may_be_read_is_one_line_and_exit_2(roots_rank):
    out = _as_nobody(["-m", "scout_sys", "diagnose", "--job", f"pgid:{roots_rank.pid}"])
    err = out.stderr.strip()
    assert out.returncode == 2, (out.returncode, out.stdout, err)
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert f"pid {roots_rank.pid}" in err and "sudo" in err, err


def test_a_window_whose_every_stack_py_spy_may_not_read_raises_permission_denied(roots_rank):
    # the job given as it is (no environment read): py-spy itself is refused by the kernel
    code = f"""
import socket
from scout_sys.errors import PermissionDenied
from scout_sys.model import Job, Rank
from scout_sys.monitor import Monitor
job = Job(ranks=(Rank(rank=0, pid={roots_rank.pid}, host=socket.gethostname()),), world_size=1,
          launcher="explicit", launcher_pid=None, host=socket.gethostname())
with Monitor(job) as mon:
    try:
        mon.diagnose(1.0)
    except PermissionDenied as e:
        print("DENIED", e)
    else:
        print("DECIDED")
"""
    out = _as_nobody(["-c", code])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("DENIED py-spy may not read the ranks' memory"), (out.stdout, out.stderr)
    assert "sudo" in out.stdout


def test_doctor_as_another_user_says_once_that_ebpf_needs_root_and_what_to_run():
    out = _as_nobody(["-m", "scout_sys", "doctor"])
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Errno" not in out.stdout + out.stderr and "check failed" not in out.stdout, out.stdout
    lines = out.stdout.splitlines()
    priv = next(x for x in lines if x.split()[1:2] == ["privileges"])
    assert priv.startswith("MISSING") and "eBPF needs root (or CAP_BPF+CAP_PERFMON)" in priv, priv
    assert "`sudo scout-sys doctor`" in priv, priv
    tracefs = next(x for x in lines if x.split()[1:2] == ["debugfs/tracefs"])
    # a mounted tracefs that only root may read is no missing mount: no `mount -t debugfs` advice
    if os.path.isdir("/sys/kernel/debug/tracing/events"):
        assert "readable by root only" in tracefs and "mount -t" not in tracefs, tracefs
    assert sum("sudo" in x for x in lines) == 1, out.stdout  # the fix is said once


def test_watch_of_a_job_it_may_not_read_says_what_diagnose_says(roots_rank):
    said = {}
    for verb, extra in (("diagnose", []), ("watch", ["--headless"])):
        out = _as_nobody(["-m", "scout_sys", verb, "--job", str(roots_rank.pid), *extra])
        err = out.stderr.strip()
        assert out.returncode == 2 and err.count("\n") == 0 and "Traceback" not in err, (verb, out.stdout, err)
        said[verb] = err
    assert said["watch"] == said["diagnose"] and "run as root: sudo scout-sys ..." in said["watch"], said


def test_watch_as_another_user_says_its_ebpf_probes_are_off_and_how_to_have_them(tmp_path):
    """nobody watching nobody's own job: it is watched (/proc and stacks), with one line saying the
    eBPF probes are off and diagnose's hint; --no-ebpf leaves the line out."""
    nobody = pwd.getpwnam("nobody")
    job = subprocess.Popen(["bash", "-c", "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 sleep 120 & wait"], cwd="/",
                           start_new_session=True, user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[])
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    try:
        assert _as_nobody(["-c", "from scout_sys.cli.watch import ebpf_off_line as f; print(f(False))"]).stdout == "None\n"
        # the real command line: the line comes once, with the job watched
        nobody_env = {**os.environ, "HOME": "/", "PYTHONPATH": REPO}
        with runnable_by_others(sys.executable, sys.prefix, REPO, str(state)):
            w = subprocess.Popen([sys.executable, "-m", "scout_sys", "watch", "--job", str(job.pid), "--headless",
                                  "--no-replay", "--state-dir", str(state)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, cwd="/", env=nobody_env, user=nobody.pw_uid, group=nobody.pw_gid,
                                 extra_groups=[], start_new_session=True)
            try:
                first = w.stdout.readline()
                assert first.startswith("watching 1 ranks"), (first, w.stderr.read() if w.poll() is not None else "")
                w.terminate()
                out, err = w.communicate(timeout=60)
            finally:
                if w.poll() is None:
                    os.killpg(w.pid, 9)
                    w.wait()
        offs = [x for x in err.splitlines() if "eBPF probes off" in x]
        assert len(offs) == 1 and "run as root: sudo scout-sys ..." in offs[0], err
        assert "Traceback" not in err and "Errno" not in err, err
    finally:
        os.killpg(job.pid, 9)
        job.wait()
