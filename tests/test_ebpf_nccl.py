"""The NCCL uprobes fire with the right arguments when the real libnccl.so.2 entry points are called.

No GPU needed: a child process calls them through ctypes with a communicator NCCL rejects, so every
call returns ncclInvalidArgument after our uprobe read its registers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from scout_sys.model import Job, Rank
from tests._ebpf_jobs import ROOT, ebpf_skip_reason
from tests._host import libnccl
from tests.test_ebpf_detach import gone, held_bpf_prog_ids, perf_event_fds

pytestmark = pytest.mark.ebpf

REASON = ebpf_skip_reason()


_libnccl = libnccl


@pytest.mark.skipif(REASON is not None, reason=f"eBPF unavailable: {REASON}")
@pytest.mark.skipif(_libnccl() is None, reason="nvidia-nccl-cu12 wheel not installed (pip install -r requirements-test.txt)")
def test_nccl_probe_reads_arguments() -> None:
    from scout_sys.probes.ebpf.collectives import CollectiveProbe

    child = subprocess.Popen([sys.executable, str(ROOT / "tests" / "jobs" / "nccl_calls.py"), str(_libnccl())],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    probe = CollectiveProbe()
    fds_before = perf_event_fds()
    try:
        assert child.stdout is not None and child.stdin is not None
        ready = child.stdout.readline().split()
        assert ready and ready[0] == "ready", ready
        comm = int(ready[1])
        job = Job(ranks=(Rank(rank=0, pid=child.pid, host=socket.gethostname()),), world_size=1,
                  launcher="explicit", launcher_pid=None, host=socket.gethostname())
        probe.start(job)
        assert any("ncclAllReduce" in a for a in probe.attached)
        assert perf_event_fds() - fds_before == len(probe.attached)
        assert held_bpf_prog_ids()
        child.stdin.write("\n")
        child.stdin.flush()
        rcs = child.stdout.readline().split()
        assert rcs == ["4"] * 6  # ncclInvalidArgument: no device, bogus communicator

        samples = [s for s in probe.sample() if s.backend == "nccl"]
        assert len(samples) == 1
        s = samples[0]
        assert (s.rank, s.pid, s.group, s.group_ptr) == (0, child.pid, "nccl:0", comm)
        assert s.seq == 5 and s.p2p == 1 and not s.inside
        got = [(f.seq, f.op, f.count, f.dtype, f.redop, f.root) for f in s.recent]
        assert got == [
            (1, "allreduce", 1234, "float32", "max", None),
            (2, "broadcast", 77, "bfloat16", None, 3),
            (3, "allgather", 4096, "int64", None, None),
            (4, "reduce_scatter", 999, "float16", "sum", None),
            (5, "reduce", 31, "float64", "min", 2),
        ]
        assert probe.nccl_returns() == {(child.pid, comm): 4}
        assert probe.lost() == 0
        ours = held_bpf_prog_ids()
        probe.close()
        # close() gave back every perf event fd and every program fd, and its programs are unloaded
        assert perf_event_fds() == fds_before and not held_bpf_prog_ids() and gone(ours, 5.0)
    finally:
        probe.close()
        probe.close()  # idempotent
        for fn in (os.killpg, os.kill):
            try:
                fn(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        child.wait(10)
