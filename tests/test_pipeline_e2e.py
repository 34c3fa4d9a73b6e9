"""Pipeline-parallel jobs through the wait-for graph, on real CPU / Gloo jobs with no layout anywhere
(tests/jobs/pipeline_job.py; no --topology, nothing on the command line says the layout).

One job per layout carries several faults one after another (a control directory): a stall (a lock
after its step), a stop (SIGSTOP; SIGCONT from the test) and last an exit (a helper keeps the sockets
open, so the peers keep waiting), each at another position. A watch started with the job (before
its ranks exist) opens one incident per fault, on exactly the faulty rank; `diagnose` attached late
names it too, with the wait-for edges and chains in its JSON (the watch's stall incident too; a stop
or an exit may be confirmed before the others' waits can be read). The healthy job names nobody.

- torch pipelining, 4 stages, Schedule1F1B, the default group as the pipeline group: every stage
  waits in point-to-point calls of one group (first stage stalled, last stage stopped, a middle
  stage exits);
- dp=2 x tp=2 x pp=2 on 8 ranks (rank = pp*4 + dp*2 + tp): a stuck rank's tensor-parallel partner
  waits in another all-reduce than its data-parallel peers, its pipeline neighbour in send or recv —
  witnesses, never origins (the partner was named `collective_desync` before).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import JOBS, origins, scout, settle
from tests.test_watch import watch_cli  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow
PIPELINE = os.path.join(JOBS, "pipeline_job.py")
KIND = {"stall": "hang", "stop": "process_stall", "exit": "process_exit"}
KEEP = ["--monitor-interval", "600"]  # torchrun must not tear the job down when a rank exits


def _diagnose(pid: int) -> dict:
    out = scout("diagnose", "--job", str(pid), "--window", "2.5", "--json", timeout=90)
    assert out.stdout.strip(), out.stderr
    return json.loads(out.stdout)


def _diagnose_started(pid: int) -> subprocess.Popen[str]:
    """diagnose in the background, while the test reads the watch's incident (the suite's time)."""
    return subprocess.Popen([sys.executable, "-m", "scout_sys", "diagnose", "--job", str(pid), "--window", "2.5",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _answer(p: subprocess.Popen[str]) -> dict:
    out, err = p.communicate(timeout=90)
    assert out.strip(), err
    return json.loads(out)


def _graph(d: dict) -> tuple[list[dict], list[list[int]]]:
    ev = [e for i in d["incidents"] for e in i["evidence"]]
    edges = next((e["wait_for"] for e in ev if "wait_for" in e), [])
    return edges, [e["chain"] for e in ev if "chain" in e]


def _inject(job, ctl, rank: int, fault: str) -> int:
    (ctl / f"rank{rank}").write_text(fault)
    m = job.wait_for(rf"PIPE fault {fault} rank={rank} pid=(\d+)", timeout=60)
    pid = int(m.group(1))
    settle(job, pid)  # every other rank reaches its wait
    return pid


def _release(job, ctl, rank: int, fault: str, pid: int) -> None:
    if fault == "stall":
        (ctl / f"rank{rank}").unlink()
    else:
        os.kill(pid, signal.SIGCONT)
    steps = job.log().count("PIPE step ")
    job.wait_for(r"PIPE step ", timeout=60, count=steps + 2)


def _run(job, w, ctl, faults, check_graph) -> None:
    """Each (rank, fault) in turn: diagnose attached late and the watch name exactly that rank."""
    job.wait_for(r"PIPE step 3", timeout=150)
    d = _diagnose(job.pid)
    assert (d["status"], d["incidents"]) == ("healthy", []), d
    for rank, fault in faults:
        pid = _inject(job, ctl, rank, fault)
        e = w.wait_event(lambda e, k=KIND[fault]: e["event"] == "incident_opened" and e["incident"]["kind"] == k,
                         timeout=60)
        # attached once the watch says the job is stuck: on a loaded machine the others' waits spread
        # out from the fault for seconds, and a window within them may see a rank still catching up
        late = _diagnose_started(job.pid)
        assert e["incident"]["ranks"] == [rank], e
        if fault == "stall":  # confirmed after --stall-after, the ranks long in their waits: the graph too,
            # at once or, when the first window caught a neighbour still on its way (a loaded machine), with
            # the next reconfirming window (every 5 s) as an update of the same incident
            def _chains(x: dict) -> list:
                return [v["chain"] for v in x["incident"]["evidence"] if "chain" in v]
            if not _chains(e):
                e = w.wait_event(lambda x, i=e["incident"]["id"]: x["event"] == "incident_updated"
                                 and x["incident"]["id"] == i and bool(_chains(x)), timeout=30)
            chains = _chains(e)
            assert chains and all(c[-1] == rank for c in chains), e["incident"]["evidence"]
        d = _answer(late)
        assert origins(d) == [(KIND[fault], "attributed", [rank])], (rank, fault, d["incidents"], d["notes"])
        if fault != "exit":  # an exited rank's sockets are gone: its groups cannot be learned
            edges, chains = _graph(d)
            assert chains and all(c[-1] == rank for c in chains), (rank, fault, chains, d["notes"])
            check_graph(rank, edges)
        if fault != "exit":
            _release(job, ctl, rank, fault, pid)
    named = {(e["incident"]["kind"], tuple(e["incident"]["ranks"])) for e in w.events
             if e["incident"]["status"] == "attributed"}
    assert named == {(KIND[f], (r,)) for r, f in faults}, w.events  # no waiter was ever blamed


def _start(start_job, watch_cli, tmp_path, nproc: int, layout: str):  # noqa: F811
    """The job (faults from a control directory) and a watch started with it, before its ranks exist."""
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    job = start_job(nproc, script=PIPELINE, args=["--layout", layout, "--control", str(ctl)], torchrun_args=KEEP)
    return job, watch_cli(job.pid, "--stall-after", "5", "--no-ebpf"), ctl


def test_torch_pipelining_4_stages(start_job, watch_cli, tmp_path):  # noqa: F811
    job, w, ctl = _start(start_job, watch_cli, tmp_path, 4, "pp")

    def check_graph(rank: int, edges: list[dict]) -> None:
        # one pipeline group of every stage; the others wait in its point-to-point calls for the origin
        p2p = [e for e in edges if e["group"] == [0, 1, 2, 3]]
        assert p2p and {r for e in p2p for r in e["waiters"]} == {0, 1, 2, 3} - {rank}, edges
        assert all("pipeline p2p" in e["collective"] and rank in e["awaited"] for e in p2p), edges

    # the first stage stalls on a lock, the last stage is stopped, a middle stage exits
    _run(job, w, ctl, [(0, "stall"), (3, "stop"), (2, "exit")], check_graph)


def test_dp2_tp2_pp2_mix(start_job, watch_cli, tmp_path):  # noqa: F811
    job, w, ctl = _start(start_job, watch_cli, tmp_path, 8, "mix")

    def check_graph(rank: int, edges: list[dict]) -> None:
        # those waiting directly for the origin: its tp partner (all-reduce), its dp partner (all-reduce)
        # and its pipeline neighbour (send or recv), each in their two-member group
        tp, dp, pp = rank ^ 1, rank ^ 2, rank ^ 4
        direct = {(e["waiters"][0], tuple(e["group"]), e["collective"].split()[0]) for e in edges
                  if e["awaited"] == [rank]}
        assert {(r, g) for r, g, _ in direct} == {(r, tuple(sorted((r, rank)))) for r in (tp, dp, pp)}, edges
        assert {c for r, _, c in direct if r == pp} <= {"send", "recv"}, edges

    # a first-stage rank stopped, a last-stage rank stalled, a middle dp/tp position exits
    _run(job, w, ctl, [(1, "stop"), (6, "stall"), (3, "exit")], check_graph)
