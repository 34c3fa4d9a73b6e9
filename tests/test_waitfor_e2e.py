"""Who waits for whom, on real CPU / Gloo jobs with no layout anywhere (no --topology, nothing on the
command line): the process groups are learned from the ranks' TCP connections
(scout_sys/probes/pgroups.py) and the wait-for graph (consensus/waitfor.py) follows the chains.

- Megatron-Core dp=2 x tp=2 (its ColumnParallelLinear / RowParallelLinear and parallel_state groups):
  rank 2 blocks on a lock after its step; rank 0 waits for it in the data-parallel all-reduce,
  rank 3 in RowParallelLinear's tensor-parallel all-reduce, rank 1 for rank 3 in its data-parallel
  all-reduce. No peer group has a majority; the graph names rank 2, in diagnose and in watch.
- DTensor dp=2 x tp=2 (tests/jobs/layouts.py): rank 2 calls a broadcast in its tensor-parallel group
  where its partner runs the forward. The graph alone ends in a tie (a group of two in two collectives);
  the equivalent peers' majority comes from eBPF fingerprints when watched from the start:
  collective_desync on rank 2. The same with all_gather (issue 22), and in ``diagnose --ebpf
  --topology dp=2,tp=2`` when the fault comes inside its window: the tie within a pair of replicas is
  decided over both tensor-parallel groups (three of four).
- Healthy runs stay healthy.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from scout_sys.consensus.peers import LEARNED
from scout_sys.watch.hang import CONFIRM_WINDOW, RECONFIRM_EVERY
from tests.conftest import JOBS, job_with_go_file, origins, scout, settle, wait_for
from tests.test_watch import watch_cli  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow
MEGATRON = os.path.join(JOBS, "megatron_job.py")
LAYOUTS = os.path.join(JOBS, "layouts.py")


def _diagnose(pid: int, window: float = 2.5) -> tuple[int, dict]:
    out = scout("diagnose", "--job", str(pid), "--window", str(window), "--json", timeout=90)
    assert out.stdout.strip(), out.stderr
    return out.returncode, json.loads(out.stdout)


@pytest.fixture(scope="module")
def megatron_lock_later(tmp_path_factory):
    """One Megatron-Core job for the healthy test and then its fault: rank 2 blocks on its lock once the
    go-file exists (one launch of four ranks importing Megatron instead of two). Yields (job, go-file)."""
    yield from job_with_go_file(tmp_path_factory, "megatron", lambda go: [
        "--fault", "lock", "--fault-rank", "2", "--fault-when", str(go)], script=MEGATRON)


@pytest.mark.xdist_group("megatron-lock")
def test_megatron_dp2_tp2_healthy(megatron_lock_later):
    job, go = megatron_lock_later
    assert not go.exists()
    job.wait_for(r"MEGATRON step 5", timeout=150)
    rc, d = _diagnose(job.pid)
    assert (rc, d["status"], d["incidents"]) == (0, "healthy", []), d


@pytest.mark.xdist_group("megatron-lock")
def test_megatron_dp2_tp2_lock_named_by_the_wait_for_graph(megatron_lock_later):
    job, go = megatron_lock_later
    go.touch()
    m = job.wait_for(r"MEGATRON fault lock rank=2 pid=(\d+)", timeout=150)
    settle(job, int(m.group(1)))  # every other rank waits in its collective
    rc, d = _diagnose(job.pid)
    assert rc == 1 and origins(d) == [("hang", "attributed", [2])], d["incidents"]
    assert d["job"]["layout"].startswith(LEARNED)  # nothing was given: the layout was learned (consensus/peers.py)
    ev = d["incidents"][0]["evidence"]
    graph = next(e["wait_for"] for e in ev if "wait_for" in e)
    edges = {(tuple(e["waiters"]), tuple(e["awaited"]), tuple(e["group"])) for e in graph}
    assert edges == {((0,), (2,), (0, 2)), ((1,), (3,), (1, 3)), ((3,), (2,), (2, 3))}, graph
    chains = [e["chain"] for e in ev if "chain" in e]
    assert [1, 3, 2] in chains and [0, 2] in chains, chains


def test_megatron_lock_opens_in_watch(start_job, watch_cli):  # noqa: F811
    job = start_job(4, script=MEGATRON, args=["--fault", "lock", "--fault-rank", "1", "--fault-step", "40"])
    job.wait_for(r"MEGATRON step 2", timeout=150)
    w = watch_cli(job.pid, "--stall-after", "5", "--no-ebpf")
    job.wait_for(r"MEGATRON fault lock rank=1", timeout=150)
    e = w.wait_event(lambda e: e["event"] == "incident_opened" and e["incident"]["kind"] == "hang"
                     and e["incident"]["status"] == "attributed", timeout=60)
    assert e["incident"]["ranks"] == [1], e
    assert w.opened() == [("hang", "attributed", [1])], w.events


# The DTensor dp=2 x tp=2 hang named without --topology by the wait-for graph is
# tests/test_layouts_e2e.py::test_dtensor_dp2_tp2_hang_named_without_topology, on that file's tp job.


def _metrics(port: int) -> dict[tuple[str, frozenset], float]:
    from tests.test_exporters_e2e import _scrape

    return _scrape(port, starting=True)


def _seen_by_the_collective_probe(port: int, n: int) -> bool:
    """The watch's /metrics has a collective sequence number of every one of the ``n`` ranks."""
    return {dict(lbl).get("rank") for (name, lbl) in _metrics(port) if name == "scout_sys_rank_collective_seq"} \
        >= {str(r) for r in range(n)}


def _snapshot_time(port: int) -> float:
    return next((v for (name, _), v in _metrics(port).items() if name == "scout_sys_snapshot_timestamp_seconds"), 0.0)


def _wait_probe_up(port: int, probe: str, timeout: float) -> None:
    """Until the watch's /metrics says ``probe`` is attached (eBPF compiles for 10-50 s on 2 busy cores)."""
    import urllib.request

    want = f'probe="{probe}"}} 1.0'
    end = time.time() + timeout
    while time.time() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                if want in r.read().decode():
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{probe} not attached within {timeout}s")


@pytest.mark.parametrize("fault", ["tpdesync", "tpgather"])
def test_dtensor_tp_desync_in_watch(start_job, watch_cli, tmp_path, fault):  # noqa: F811
    """tpdesync: rank 2 broadcasts in its tp group; tpgather (issue 22): rank 2 all-gathers while its tp
    partner 3 enters the forward's tp all-reduce, which ranks 0, 1 passed (they wait in the dp one)."""
    from scout_sys.demo.launch import free_port

    go = tmp_path / "go"
    job = start_job(4, script=LAYOUTS, args=["--layout", "tp", "--fault", fault, "--fault-rank", "2",
                                             "--fault-when", str(go)])
    job.wait_for(r"LAYOUT step 2", timeout=150)
    # eBPF from the start: the fault comes once the collectives probe is attached
    port = free_port()
    w = watch_cli(job.pid, "--stall-after", "5", "--prometheus", f"127.0.0.1:{port}")
    _wait_probe_up(port, "ebpf-collectives", timeout=120)
    wait_for(lambda: _seen_by_the_collective_probe(port, 4), 60, "every rank's collectives seen by the probe")
    go.touch()
    job.wait_for(rf"LAYOUT fault {fault} rank=2", timeout=60)
    e = w.wait_event(lambda e: e["event"] == "incident_opened", timeout=60)
    opened_at = _snapshot_time(port)
    assert (e["incident"]["kind"], e["incident"]["status"], e["incident"]["ranks"]) == (
        "collective_desync", "attributed", [2]), w.events
    # the stack window's tie (every rank waits, no strict majority at one place) is the desync's
    # evidence, not an incident of its own: the whole stream is the one desync, also a window later
    # (the open incident's reconfirming window, taken RECONFIRM_EVERY s on by the watch's own clock,
    # and a poll after it)
    later = opened_at + RECONFIRM_EVERY + CONFIRM_WINDOW + 1.0
    wait_for(lambda: _snapshot_time(port) >= later, 90, "a poll after the reconfirming window")
    assert w.opened() == [("collective_desync", "attributed", [2])], w.events


def _window_started(diag: subprocess.Popen, timeout: float) -> None:
    """Until ``diagnose`` takes its window's first stacks (a py-spy child): its probes are attached."""
    import psutil

    end = time.time() + timeout
    while time.time() < end:
        assert diag.poll() is None, diag.communicate()
        try:
            if any(c.name() == "py-spy" for c in psutil.Process(diag.pid).children(recursive=True)):
                return
        except psutil.Error:
            pass
        time.sleep(0.1)
    raise AssertionError(f"diagnose took no stack within {timeout}s")


@pytest.mark.parametrize("fault", ["tpgather", "none"])
def test_dtensor_tp_desync_in_diagnose_across_equivalent_tp_groups(start_job, tmp_path, fault):
    """With the layout given (--topology dp=2,tp=2) the peer groups are the dp replicas, (0, 2) and
    (1, 3): within (0, 2) rank 2's all_gather stands against rank 0's all-reduce, one against one. The
    two tp groups are equivalent: at that position of their sequence three of four ranks all-reduced.
    The fault comes inside the window of ``diagnose --ebpf`` (fingerprints are taken at each call).
    Its healthy twin stays healthy."""
    import sys

    go = tmp_path / "go"
    job = start_job(4, script=LAYOUTS, args=["--layout", "tp", "--fault", fault, "--fault-rank", "2",
                                             "--fault-when", str(go)])
    job.wait_for(r"LAYOUT step 2", timeout=150)
    diag = subprocess.Popen([sys.executable, "-m", "scout_sys", "diagnose", "--job", str(job.pid), "--ebpf",
                             "--topology", "dp=2,tp=2", "--window", "6", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _window_started(diag, timeout=150)
        go.touch()
        if fault != "none":
            job.wait_for(rf"LAYOUT fault {fault} rank=2", timeout=30)
        out, err = diag.communicate(timeout=90)
    finally:
        if diag.poll() is None:
            diag.kill()
            diag.wait()
    d = json.loads(out)
    if fault == "none":
        assert (diag.returncode, d["incidents"]) == (0, []), d["incidents"]
        return
    assert diag.returncode == 1, (err, d)
    assert origins(d) == [("collective_desync", "attributed", [2])], [
        (i["summary"], [e["text"] for e in i["evidence"]]) for i in d["incidents"]]
    inc = d["incidents"][0]
    across = next(e for e in inc["evidence"] if "equivalent_groups" in e)
    assert across["equivalent_groups"] == [[0, 2], [1, 3]], across
    ops = {r: f["op"] for r, f in across["fingerprints"].items()}
    assert ops == {"0": "allreduce", "1": "allreduce", "2": "allgather", "3": "allreduce"}, across
    # the group named by its members (the probe's own name, by first use, is the same on both tp groups)
    assert re.search(r"at #\d+ of ranks 2-3 \(gloo:\d\)", inc["summary"]), inc["summary"]
