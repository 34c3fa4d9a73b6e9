"""replay's command line on bad input, and a rank's execution context read from a real process."""

from __future__ import annotations

import os
import subprocess
import sys

from scout_sys.replay.context import cgroup_procs, context_of
from tests.conftest import scout


def test_bad_input_is_one_line_and_exit_2():
    for args in (["--job", "999999999"], ["--job", str(os.getpid()), "--rounds", "0"],
                 ["--job", "1", "--checkpoint", "/nonexistent/ckpt.pt"]):
        out = scout("replay", *args)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.strip().count("\n") == 0 and "Traceback" not in out.stderr, out.stderr


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
