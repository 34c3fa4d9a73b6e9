"""The PermissionDenied paths of job.py (every process of a selected group unreadable) and
probes/pystack.py (py-spy refused every rank), for real: the tool run as ``nobody`` against root's
processes, the kernel refusing (test_replay_cli.py has the environ path of ``--job PID``)."""

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
