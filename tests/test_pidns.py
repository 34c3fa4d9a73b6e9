"""Ranks in their own PID and mount namespaces (a container; here ``unshare --pid --fork --mount-proc``),
watched from the host: found by the host's pids (everything that reads /proc and py-spy uses them) and
named with both pids, the host's and the one the job's own logs print."""

from __future__ import annotations

import os
import shutil

import pytest

from scout_sys.demo.launch import DemoJob
from scout_sys.job import container_pid
from scout_sys.model import ATTRIBUTED, HANG
from tests.conftest import diagnose_json, origins, scout, settle
from tests.test_watch import WatchCli

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                 reason="a PID namespace needs root and unshare (util-linux)")]


def test_a_hang_in_a_pid_namespace_is_named_with_host_and_container_pids(tmp_path):
    job = DemoJob(4, fault="hang", fault_rank=2, fault_step=8)
    job.cmd = ["unshare", "--pid", "--fork", "--mount-proc", *job.cmd]  # torchrun is pid 1 in there
    with job:
        inside = job.wait_fault(timeout=180)  # the rank prints its own pid: the container's
        by_inside = {container_pid(p): p for p in job.pids() if p != job.pid}  # but unshare itself
        assert None not in by_inside, "every process of the job lives in the new namespace"
        faulty = by_inside[inside]
        assert faulty != inside
        settle(job, faulty)

        rc, d = diagnose_json(job.pid)  # the unshare process: a launcher seen from the host
        assert rc == 1 and origins(d) == [(HANG, ATTRIBUTED, [2])], d["incidents"]
        ranks = {r["rank"]: r for r in d["job"]["ranks"]}
        assert ranks[2]["pid"] == faulty and ranks[2]["container_pid"] == inside, ranks
        assert all(r["container_pid"] not in (None, r["pid"]) for r in ranks.values()), ranks
        inc = d["incidents"][0]
        assert f"pid {faulty}, container pid {inside}" in inc["summary"], inc["summary"]
        # py-spy read the stack through the host pid
        assert any("load_next_batch_stuck" in f for e in inc["evidence"] for f in e.get("stack", [])), inc

        # the same job by its environment (how a Slurm or Kubernetes agent finds it), in text
        out = scout("diagnose", "--job", f"env:SCOUT_DEMO_JOB={job.id}", "--window", "2.5")
        assert out.returncode == 1, out
        assert "CTR PID" in out.stdout and f"pid {faulty}, container pid {inside}" in out.stdout, out.stdout

        # and the watch: its first line pairs the pids, its incident line names the culprit by both
        w = WatchCli(job.pid, "--stall-after", "5", "--no-ebpf", "--state-dir", str(tmp_path), human=True)
        try:
            w.wait_event(lambda line: line.startswith("ranks in a PID namespace"), timeout=60)
            line = w.wait_event(lambda line: " OPENED " in line, timeout=90)
            assert f"{HANG} ({ATTRIBUTED}) rank 2" in line and f"container pid {inside}" in line, line
        finally:
            w.stop()
        pair = next(x for x in w.lines if x.startswith("ranks in a PID namespace"))
        assert f"rank 2 {faulty} (container pid {inside})" in pair, pair
    assert job.pids() == []
