"""diagnose against real torchrun / shell-launched CPU jobs on Gloo, with real py-spy.

Each test starts a tiny job (five share one: healthy, then its hang), waits for its fault, runs the
real command line and checks the exact origin ranks and kind. Jobs are killed at teardown."""

from __future__ import annotations

import json
import os
import time

import pytest

from scout_sys.job import find_job
from tests.conftest import JOBS, diagnose_json, job_with_go_file, origins, scout, settle

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stopped_rank_1():
    """A 4-rank job whose rank 1 stopped itself (SIGSTOP), settled: diagnose only reads it, so the stop
    case of the each-fault test and the process-group selector share it (one launch instead of two)."""
    from scout_sys.demo.launch import DemoJob

    job = DemoJob(4, fault="stop", fault_rank=1)
    job.start()
    try:
        settle(job, job.wait_fault())
        yield job
    finally:
        job.stop()
        assert job.pids() == [], "processes of the stopped-rank job left behind"


@pytest.mark.parametrize(
    "fault,rank,kind",
    [
        pytest.param("stop", 1, "process_stall", marks=pytest.mark.xdist_group("stopped-rank-1")),
        ("busy", 3, "hang"),
        ("desync", 2, "collective_desync"),
    ],
)
def test_torchrun_4_ranks_each_fault(start_job, request, fault, rank, kind):  # a hang: test_a_hang_is_named_...
    if fault == "stop":
        job = request.getfixturevalue("stopped_rank_1")
    else:
        job = start_job(4, fault=fault, fault_rank=rank)
        settle(job, job.wait_fault())
    _named_with_its_witnesses(job, rank, kind)


def _named_with_its_witnesses(job, rank: int, kind: str) -> None:
    rc, d = diagnose_json(job.pid)
    assert rc == 1, d
    assert d["status"] == "incident"
    assert origins(d) == [(kind, "attributed", [rank])], d["incidents"]
    inc = d["incidents"][0]
    assert inc["hosts"] and inc["summary"] and inc["evidence"]
    assert {r["rank"] for r in d["job"]["ranks"]} == {0, 1, 2, 3}
    sources = {e["source"] for e in inc["evidence"]}
    assert "stack" in sources and "procfs" in sources
    # the witnesses are named as waiting, never as origins
    states = {r["rank"]: r["state"] for r in d["job"]["ranks"]}
    assert all(states[r] == "waiting" for r in range(4) if r != rank), states


# One job for five tests, in this order (one xdist group): healthy, then rank 2's hang (held back
# until the go-file exists) read as a person reads it, selected by the faulty rank's own pid, named
# with its witnesses, and with diagnose's options.

@pytest.fixture(scope="module")
def hang_later(tmp_path_factory):
    """A 4-rank demo job whose rank 2 hangs once its go-file exists; yields (job, go-file)."""
    from scout_sys.demo.launch import DemoJob

    go = tmp_path_factory.mktemp("hang-later") / "go"
    job = DemoJob(4, fault="hang", fault_rank=2, args=["--fault-when", str(go)])
    job.start()
    try:
        job.wait_steps(2)
        yield job, go
    finally:
        job.stop()
        assert job.pids() == [], "processes of the hang-later job left behind"


def _hung(job, go) -> int:
    go.touch()
    pid = job.wait_fault()
    settle(job, pid)
    return pid


@pytest.mark.xdist_group("hang-later")
def test_healthy_job_is_healthy(hang_later):
    job, go = hang_later
    assert not go.exists()
    rc, d = diagnose_json(job.pid)
    assert (rc, d["status"], d["incidents"]) == (0, "healthy", [])
    states = {r["rank"]: r["state"] for r in d["job"]["ranks"]}
    # a healthy rank moves, waits for its peers in all_reduce, or sleeps in its data loading; never
    # spins at one place, stops, or is gone, and over a whole window some rank moved
    assert set(states.values()) <= {"running", "waiting", "idle"} and "running" in states.values(), states


@pytest.mark.xdist_group("hang-later")
def test_human_output_names_rank_host_pid_and_where(hang_later):
    job, go = hang_later
    pid = _hung(job, go)
    out = scout("diagnose", "--job", str(job.pid), "--window", "2")
    assert out.returncode == 1, out.stderr
    text = out.stdout
    assert "INCIDENT hang (attributed): rank 2" in text
    assert f"pid {pid}" in text and "load_next_batch_stuck" in text and "all_reduce" in text


@pytest.mark.xdist_group("hang-later")
def test_selecting_by_a_rank_pid_finds_its_siblings(hang_later):
    job, go = hang_later
    faulty_pid = _hung(job, go)
    rc, d = diagnose_json(faulty_pid)
    assert rc == 1
    assert origins(d) == [("hang", "attributed", [2])]
    assert len(d["job"]["ranks"]) == 4


@pytest.mark.xdist_group("hang-later")
def test_a_hang_is_named_with_its_evidence_and_its_witnesses_waiting(hang_later):
    job, go = hang_later
    _hung(job, go)
    _named_with_its_witnesses(job, 2, "hang")


@pytest.mark.xdist_group("hang-later")
def test_diagnose_options_and_the_pid_list_selector(hang_later) -> None:
    job, go = hang_later
    pid = _hung(job, go)
    pids = [r.pid for r in sorted(find_job(str(job.pid)).ranks, key=lambda r: r.rank)]
    assert pids[2] == pid
    # PID,PID,... of the rank processes
    rc, d = diagnose_json(",".join(map(str, pids)))
    assert (rc, origins(d)) == (1, [("hang", "attributed", [2])]), d["incidents"]
    assert d["job"]["launcher"] == "explicit" and sorted(r["pid"] for r in d["job"]["ranks"]) == sorted(pids)
    # -q: the verdict, no evidence
    q = scout("diagnose", "--job", str(job.pid), "--window", "2", "-q")
    assert q.returncode == 1, q.stderr
    assert "INCIDENT hang (attributed): rank 2" in q.stdout and "evidence:" not in q.stdout, q.stdout
    full = scout("diagnose", "--job", str(job.pid), "--window", "2")
    assert "evidence:" in full.stdout and "load_next_batch_stuck" in full.stdout, full.stdout
    # --native: the origin's native stack joins the evidence (pausing a hung rank costs nothing)
    n = scout("diagnose", "--job", str(job.pid), "--window", "2", "--native", "--json")
    d = json.loads(n.stdout)
    assert (n.returncode, origins(d)) == (1, [("hang", "attributed", [2])]), n.stderr
    native = [e for e in d["incidents"][0]["evidence"] if e.get("native")]
    assert [e["rank"] for e in native] == [2] and native[0]["stack"], native


@pytest.mark.xdist_group("stopped-rank-1")
def test_selecting_by_process_group(stopped_rank_1):
    job = stopped_rank_1
    rc, d = diagnose_json(f"pgid:{os.getpgid(job.pid)}")
    assert rc == 1
    assert origins(d) == [("process_stall", "attributed", [1])]
    assert {r["rank"] for r in d["job"]["ranks"]} == {0, 1, 2, 3}


def test_torchrun_exit_while_launcher_has_not_reaped_it(start_job):
    # torchrun notices dead workers every --monitor-interval; until then the rank is a zombie.
    job = start_job(4, fault="exit", fault_rank=2, torchrun_args=["--monitor-interval", "600"],
                    args=["--exit-code", "5"])
    settle(job, job.wait_fault())
    rc, d = diagnose_json(job.pid)
    assert rc == 1
    assert origins(d) == [("process_exit", "attributed", [2])]
    ev = [e for e in d["incidents"][0]["evidence"] if e.get("rank") == 2 and e["source"] == "procfs"]
    assert ev and ev[0]["exit_code"] == 5, ev
    assert "exited with code 5" in d["incidents"][0]["summary"]


def test_8_ranks(start_job):
    job = start_job(8, fault="hang", fault_rank=6, args=["--step-time", "0.1"])
    settle(job, job.wait_fault(timeout=120))
    rc, d = diagnose_json(job.pid)
    assert rc == 1
    assert origins(d) == [("hang", "attributed", [6])]
    assert d["job"]["world_size"] == 8 and len(d["job"]["ranks"]) == 8


def test_checkpoint_pauses_at_barriers_are_healthy(start_job):
    # rank 0 writes a checkpoint for ~2 s every 10 steps while the others wait at a barrier,
    # longer than the window: the writer progresses, so it is a pause, not a hang.
    job = start_job(4, args=["--checkpoint-every", "10", "--checkpoint-seconds", "3"])
    job.wait_for(r"SCOUT-DEMO checkpoint step=10")
    time.sleep(0.5)
    rc, d = diagnose_json(job.pid, window=2.0)
    assert (rc, d["incidents"]) == (0, []), d


def test_two_rank_job_has_no_strict_majority(start_job):
    job = start_job(2, fault="hang", fault_rank=1)
    settle(job, job.wait_fault())
    rc, d = diagnose_json(job.pid)
    assert rc == 1
    assert origins(d) == [("hang", "inconclusive", [])]


def test_two_rank_job_with_a_stopped_rank_is_decisive(start_job):
    job = start_job(2, fault="stop", fault_rank=0)
    settle(job, job.wait_fault())
    rc, d = diagnose_json(job.pid)
    assert origins(d) == [("process_stall", "attributed", [0])]


def test_plain_shell_job_where_one_rank_exits_and_the_others_hang(start_job):
    # No torchrun: ranks are plain processes under bash, which reaps the dead one at once.
    job = start_job(4, launcher="shell", fault="exit", fault_rank=1)
    settle(job, job.wait_fault())
    rc, d = diagnose_json(job.pid)
    assert rc == 1
    assert origins(d) == [("process_exit", "attributed", [1])]
    assert d["job"]["launcher"] == "shell"


# ---------------------------------------------------------------- a trainer written without us in mind

OTHER = os.path.join(JOBS, "other_trainer.py")


@pytest.fixture(scope="module")
def unseen_hang_later(tmp_path_factory):
    """One job of the unseen trainer for its healthy test and then its hang (rank 1, once the go-file
    exists): one launch instead of two. Yields (job, go-file)."""
    yield from job_with_go_file(tmp_path_factory, "unseen-trainer", lambda go: [
        "--fault", "hang", "--fault-rank", "1", "--fault-when", str(go)], script=OTHER)


@pytest.mark.xdist_group("unseen-hang-later")
def test_unseen_ddp_trainer_healthy(unseen_hang_later):
    job, go = unseen_hang_later
    assert not go.exists()
    job.wait_for(r"OTHER step 10")
    rc, d = diagnose_json(job.pid)
    assert (rc, d["incidents"]) == (0, []), d


@pytest.mark.xdist_group("unseen-hang-later")
def test_unseen_ddp_trainer_hang(unseen_hang_later):
    job, go = unseen_hang_later
    go.touch()
    job.wait_for(r"OTHER fault hang")
    settle(job)
    rc, d = diagnose_json(job.pid)
    assert origins(d) == [("hang", "attributed", [1])], d["incidents"]
    assert "fetch_shard_from_object_store" in d["incidents"][0]["summary"]


def test_unseen_trainer_exit_under_shell(start_job):
    job = start_job(4, script=OTHER, launcher="shell", args=["--fault", "exit", "--fault-rank", "3"])
    job.wait_for(r"OTHER fault exit")
    settle(job)
    rc, d = diagnose_json(job.pid)
    assert origins(d) == [("process_exit", "attributed", [3])]
