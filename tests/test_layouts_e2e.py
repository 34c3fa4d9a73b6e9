"""diagnose on real CPU / Gloo jobs in four parallel layouts (tests/jobs/layouts.py): DDP, FSDP2,
a 2-stage pipeline on dp=4 x pp=2 (8 ranks) and a 2-way tensor-parallel MLP on dp=2 x tp=2.

Healthy jobs are healthy (ranks at different pipeline stages or tensor-parallel positions wait in
different collectives legitimately); one faulty rank is named exactly, with its coordinates. One job
per layout serves both: healthy first, then its fault on a go-file; each is killed at the module's end."""

from __future__ import annotations

import os

import pytest

from tests.conftest import JOBS, job_with_go_file, origins, scout, settle

pytestmark = pytest.mark.slow
LAYOUTS = os.path.join(JOBS, "layouts.py")


def _diagnose(pid: int, *extra: str, window: float = 2.5) -> tuple[int, dict]:
    import json

    out = scout("diagnose", "--job", str(pid), "--window", str(window), "--json", *extra, timeout=90)
    assert out.stdout.strip(), out.stderr
    return out.returncode, json.loads(out.stdout)


def _layout_job(tmp_path_factory, nproc: int, layout: str, fault: str, rank: int):
    """One job per layout for its healthy test and then its fault (held back until the go-file exists,
    which the fault test creates): one launch instead of two. Yields (job, go-file)."""
    yield from job_with_go_file(tmp_path_factory, layout, lambda go: [
        "--layout", layout, "--fault", fault, "--fault-rank", str(rank), "--fault-when", str(go)],
        nproc=nproc, script=LAYOUTS)


def _fault(job, go) -> None:
    go.touch()
    job.wait_for(r"LAYOUT fault ", timeout=120)
    settle(job)


@pytest.fixture(scope="module")
def ddp_job(tmp_path_factory):
    yield from _layout_job(tmp_path_factory, 4, "ddp", "desync", 2)


@pytest.fixture(scope="module")
def fsdp_job(tmp_path_factory):
    yield from _layout_job(tmp_path_factory, 4, "fsdp", "hang", 1)


@pytest.fixture(scope="module")
def pp_job(tmp_path_factory):
    yield from _layout_job(tmp_path_factory, 8, "pp", "hang", 2)


@pytest.fixture(scope="module")
def tp_job(tmp_path_factory):
    yield from _layout_job(tmp_path_factory, 4, "tp", "hang", 2)


def _coords_evidence(d: dict, rank: int) -> dict:
    ev = [e for i in d["incidents"] for e in i["evidence"] if "coords" in e and e.get("rank") == rank]
    assert ev, d["incidents"]
    return ev[0]["coords"]


def _healthy(job, topology: str | None, steps: int = 4) -> None:
    job.wait_for(rf"LAYOUT step {steps}", timeout=150)
    extra = ("--topology", topology) if topology else ()
    rc, d = _diagnose(job.pid, *extra)
    assert (rc, d["status"], d["incidents"]) == (0, "healthy", []), d


# each layout's healthy test runs first on its job (one xdist group, in file order), then its fault

@pytest.mark.xdist_group("layout-ddp")
def test_ddp_healthy(ddp_job):
    _healthy(ddp_job[0], "dp=4")


@pytest.mark.xdist_group("layout-ddp")
def test_ddp_desync_named_with_coordinates(ddp_job):
    job, go = ddp_job
    _fault(job, go)
    rc, d = _diagnose(job.pid, "--topology", "dp=4")
    assert origins(d) == [("collective_desync", "attributed", [2])], d["incidents"]
    assert _coords_evidence(d, 2) == {"dp": 2}
    assert "broadcast" in d["incidents"][0]["summary"]


@pytest.mark.xdist_group("layout-fsdp")
def test_fsdp2_healthy(fsdp_job):
    _healthy(fsdp_job[0], None)


@pytest.mark.xdist_group("layout-fsdp")
def test_fsdp2_hang_named_with_coordinates(fsdp_job):
    job, go = fsdp_job
    _fault(job, go)
    rc, d = _diagnose(job.pid, "--topology", "dp=4")
    assert origins(d) == [("hang", "attributed", [1])], d["incidents"]
    assert _coords_evidence(d, 1) == {"dp": 1}
    states = {r["rank"]: r for r in d["job"]["ranks"]}
    assert all(states[r]["state"] == "waiting" and "all_gather" in states[r]["collective"]
               for r in (0, 2, 3)), states


@pytest.mark.xdist_group("layout-pp")
def test_pipeline_dp4_pp2_healthy(pp_job):
    job = pp_job[0]
    job.wait_for(r"LAYOUT step 3", timeout=150)
    for extra in (("--topology", "dp=4,pp=2"), ()):
        rc, d = _diagnose(job.pid, *extra, window=2.0)
        assert (rc, d["incidents"]) == (0, []), (extra, d)
    assert d["job"]["world_size"] == 8


@pytest.mark.xdist_group("layout-pp")
def test_pipeline_dp4_pp2_hang_names_the_stage_and_rank(pp_job):
    # rank 2 = (dp=1, pp=0) stops feeding the pipeline: its stage-0 replicas wait in the dp all-reduce,
    # its stage-1 neighbour (rank 3) waits in the pipeline's recv, the other stage-1 ranks in their
    # all-reduce. Rank 3 is a witness (another peer group), not a culprit.
    job, go = pp_job
    _fault(job, go)
    rc, d = _diagnose(job.pid, "--topology", "dp=4,pp=2")
    assert origins(d) == [("hang", "attributed", [2])], d["incidents"]
    inc = d["incidents"][0]
    assert _coords_evidence(d, 2) == {"dp": 1, "pp": 0}
    assert "dp=1,pp=0" in inc["summary"]
    assert d["job"]["peer_groups"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    ranks = {r["rank"]: r for r in d["job"]["ranks"]}
    assert ranks[3]["coords"] == {"dp": 1, "pp": 1} and "pipeline p2p" in ranks[3]["collective"], ranks[3]
    assert any(e.get("witness_of") == [2] and e.get("ranks") == [3] for e in inc["evidence"]), inc["evidence"]
    # without --topology: peer groups from the shape of activity, the same verdict, said as such
    rc, d = _diagnose(job.pid)
    assert origins(d) == [("hang", "attributed", [2])], d["incidents"]
    assert any("shape of activity" in n for n in d["notes"]), d["notes"]


@pytest.mark.xdist_group("layout-tp")
def test_tensor_parallel_healthy(tp_job):
    _healthy(tp_job[0], "dp=2,tp=2")


@pytest.mark.xdist_group("layout-tp")
def test_tensor_parallel_hang_across_groups(tp_job):
    # dp=2 x tp=2: peer groups of two have no strict majority on their own; across groups 3 of 4 ranks
    # wait (rank 3, rank 2's tensor-parallel partner, in wait_tensor) and rank 2 is stuck outside.
    job, go = tp_job
    _fault(job, go)
    rc, d = _diagnose(job.pid, "--topology", "dp=2,tp=2")
    assert origins(d) == [("hang", "attributed", [2])], d["incidents"]
    assert _coords_evidence(d, 2) == {"dp": 1, "tp": 0}
    ranks = {r["rank"]: r for r in d["job"]["ranks"]}
    assert "wait_tensor" in ranks[3]["collective"], ranks[3]


@pytest.mark.xdist_group("layout-tp")
def test_dtensor_dp2_tp2_hang_named_without_topology(tp_job):
    # the same hang with nothing on the command line (the wait-for graph: tests/test_waitfor_e2e.py's
    # subject): rank 0 waits for rank 2 in the dp all-reduce, rank 3 in the functional (DTensor)
    # all-reduce's wait_tensor, rank 1 for rank 3 in its dp all-reduce
    job, go = tp_job
    _fault(job, go)  # already there after the test above; alone (-k), this brings it
    rc, d = _diagnose(job.pid)
    assert origins(d) == [("hang", "attributed", [2])], d["incidents"]
    chains = [e["chain"] for e in d["incidents"][0]["evidence"] if "chain" in e]
    assert [1, 3, 2] in chains, chains
