"""Which ranks live on this host, from each launcher's own environment (scout_sys/launchers.py), and
what the job finder makes of it: a rank the launcher does not place here is not observed here, never
missing. Job-less: environments as each launcher writes them."""

from __future__ import annotations

import pytest

from scout_sys import launchers
from scout_sys.launchers import NOTHING, Placement, placement, tasks_per_node


def _slurm(procid: int, localid: int, nodeid: int | None, *, ntasks: int = 16, nnodes: int = 4, per_node: str = "4(x4)",
           **extra: str) -> dict[str, str]:
    """A task's environment as `srun python train.py` writes it (RANK set from SLURM_PROCID by the script)."""
    env = {"SLURM_JOB_ID": "77", "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(localid), "SLURM_NTASKS": str(ntasks),
           "SLURM_NNODES": str(nnodes), "SLURM_TASKS_PER_NODE": per_node, "RANK": str(procid),
           "WORLD_SIZE": str(ntasks), "MASTER_ADDR": "node0", "MASTER_PORT": "29500", **extra}
    if nodeid is not None:
        env["SLURM_NODEID"] = str(nodeid)
    return env


def _here(envs: list[dict[str, str]]) -> Placement:
    return placement((int(e.get("RANK") or e.get("OMPI_COMM_WORLD_RANK") or e["PMI_RANK"]),
                      int(e.get("WORLD_SIZE") or e.get("OMPI_COMM_WORLD_SIZE") or e["PMI_SIZE"]), e) for e in envs)


@pytest.mark.parametrize("spec,counts", [("4(x2)", [4, 4]), ("2(x3),1", [2, 2, 2, 1]), ("8", [8]),
                                         ("1,2(x2)", [1, 2, 2]), ("", None), (None, None), ("4(x)", None),
                                         ("a", None), ("2(x3),", None)])
def test_slurm_tasks_per_node(spec, counts):
    assert tasks_per_node(spec) == counts


def test_the_issue_s_srun_job_on_its_master_node_is_four_ranks_not_sixteen():
    """16 ranks, 4 nodes: the master's ranks are 0-3 (block distribution), whatever MASTER_ADDR says."""
    for nodeid in (0, None):  # with or without SLURM_NODEID
        got = _here([_slurm(r, r, nodeid, SLURM_NTASKS_PER_NODE="4") for r in range(4)])
        assert got.ranks == frozenset(range(4)) and got.count == 4, got
    # node 2 of the same job, found by a subset of its ranks
    got = _here([_slurm(r, r - 8, 2) for r in (8, 10)])
    assert got.ranks == frozenset({8, 9, 10, 11}), got


def test_slurm_uneven_nodes_and_other_distributions():
    # 2(x3),1: node 3 holds the single rank 6
    assert _here([_slurm(6, 0, 3, ntasks=7, per_node="2(x3),1")]).ranks == frozenset({6})
    assert _here([_slurm(2, 0, 1, ntasks=7, per_node="2(x3),1")]).ranks == frozenset({2, 3})
    # cyclic: how many is said, which ones is not
    got = _here([_slurm(0, 0, 0, SLURM_DISTRIBUTION="cyclic"), _slurm(4, 1, 0, SLURM_DISTRIBUTION="cyclic")])
    assert got.ranks is None and got.count == 4, got
    # the list and the task's numbers disagree (a step on part of the allocation): no block layout
    got = _here([_slurm(4, 0, 0)])
    assert got.ranks is None and got.count == 4, got
    # one node: every rank
    assert _here([_slurm(1, 1, 0, ntasks=4, nnodes=1, per_node="4")]).ranks == frozenset(range(4))


def test_slurm_variables_say_nothing_of_ranks_numbered_otherwise():
    """sbatch running torchrun: every worker inherits SLURM_PROCID=0; torchrun's own facts answer."""
    env = _slurm(0, 0, 0)
    env.update(RANK="5", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4", WORLD_SIZE="16")
    assert launchers.of_rank(env, 5, 16).ranks == frozenset({4, 5, 6, 7})
    env.pop("LOCAL_WORLD_SIZE")
    assert launchers.of_rank(env, 5, 16) == NOTHING


def test_torchrun_accelerate_torchx():
    """torchrun (accelerate launch and TorchX's dist.ddp run it): LOCAL_WORLD_SIZE from RANK - LOCAL_RANK."""
    envs = [{"RANK": str(r), "LOCAL_RANK": str(r - 4), "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
             "MASTER_ADDR": "10.0.0.1", "ACCELERATE_MIXED_PRECISION": "no"} for r in (4, 5, 6, 7)]
    got = _here(envs)
    assert got.ranks == frozenset({4, 5, 6, 7}) and got.source == "LOCAL_WORLD_SIZE", got


def test_deepspeed_launcher():
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_SIZE": "2", "CROSS_RANK": "1", "CROSS_SIZE": "2",
           "MASTER_ADDR": "10.0.0.1"}
    assert _here([env]).ranks == frozenset({2, 3})
    one = dict(env, RANK="1", LOCAL_SIZE="4", CROSS_RANK="0", CROSS_SIZE="1")
    assert _here([one]).ranks == frozenset(range(4))


def test_open_mpi_and_mpich_say_how_many_not_which():
    ompi = [{"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": str(i),
             "OMPI_COMM_WORLD_LOCAL_SIZE": "4"} for i, r in enumerate((0, 2, 4, 6))]  # --map-by node
    got = _here(ompi)
    assert got.ranks is None and got.count == 4 and "Open MPI" in got.source, got
    alone = [dict(e, OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_RANK=str(i)) for i, e in enumerate(ompi)]
    assert _here(alone).ranks == frozenset(range(4))
    mpich = {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALNRANKS": "2", "MPI_LOCALRANKID": "1"}
    got = _here([mpich])
    assert got.ranks is None and got.count == 2 and "MPICH" in got.source, got


def test_kubernetes_training_operator_pods():
    env = {"RANK": "5", "WORLD_SIZE": "8", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1",
           "MASTER_ADDR": "job-master-0"}
    assert _here([env]).ranks == frozenset({4, 5, 6, 7})
    assert _here([dict(env, PET_NNODES="1", RANK="2", PET_NODE_RANK="0")]).ranks == frozenset(range(8))
    assert _here([dict(env, PET_NPROC_PER_NODE="auto")]) == NOTHING  # "auto": torchrun's LOCAL_WORLD_SIZE says


def test_master_addr_naming_a_host_says_nothing_loopback_says_everything():
    env = {"RANK": "1", "WORLD_SIZE": "16", "MASTER_ADDR": "node0", "LOCAL_RANK": "1"}
    assert _here([env]) == NOTHING
    assert _here([dict(env, MASTER_ADDR="127.0.0.1")]).ranks == frozenset(range(16))


def test_ranks_that_disagree_or_say_nothing_give_no_answer():
    tr = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "n0"}
    bare = {"RANK": "4", "WORLD_SIZE": "8", "MASTER_ADDR": "n0"}
    assert _here([tr, bare]) == NOTHING
    # a LOCAL_WORLD_SIZE that cannot hold the rank (LOCAL_RANK past it) is no fact
    assert _here([dict(tr, LOCAL_RANK="5", RANK="5")]) == NOTHING


# ---------------------------------------------------------------- what the job finder makes of it

def _job(envs: list[dict[str, str]]):
    from scout_sys.job import _build
    from scout_sys.rankenv import _Candidate

    cands = [_Candidate(pid=1000 + i, ppid=999, rank=int(e["RANK"]), world_size=int(e["WORLD_SIZE"]),
                        local_rank=None, local_world_size=None, group_rank=None, key="master:node0:29500",
                        is_python=True, name="python", env=e) for i, e in enumerate(envs)]
    return _build(cands, None, "env:SLURM_JOB_ID=77")


def test_the_srun_job_s_master_sees_its_four_ranks_and_nothing_missing():
    job = _job([_slurm(r, r, 0) for r in range(4)])
    assert job.missing == () and job.remote == tuple(range(4, 16)) and job.unplaced == 0, job
    assert any("4 ranks expected on this host (SLURM_TASKS_PER_NODE at SLURM_NODEID" in n for n in job.notes), job.notes
    # rank 2 gone before we looked: named by the launcher's facts
    job = _job([_slurm(r, r, 0) for r in (0, 1, 3)])
    assert job.missing == (2,) and job.remote == tuple(range(4, 16)), job


def test_ranks_nothing_places_are_not_observed_never_missing():
    envs = [{"RANK": str(r), "WORLD_SIZE": "16", "MASTER_ADDR": "node0", "LOCAL_RANK": str(r)} for r in (0, 1)]
    job = _job(envs)
    assert job.missing == () and job.remote == tuple(range(2, 16)), job
    assert any("not observed here: nothing in the ranks' environment says" in n for n in job.notes), job.notes


def test_a_count_without_ranks_is_waited_for_never_named():
    envs = [dict(_slurm(r, i, 0, SLURM_DISTRIBUTION="cyclic")) for i, r in enumerate((0, 4))]
    job = _job(envs)
    assert job.missing == () and job.unplaced == 2 and 1 not in job.by_rank(), job
    assert any("2 of them should run on this host and were not found" in n for n in job.notes), job.notes


# ---------------------------------------------------------------- what the watch waits for at start-up

T0 = 1000.0  # a clock reading of the finder's (any)


def _partial(found: tuple[int, ...], world: int = 8, *, unplaced: int = 0, missing: tuple[int, ...] = ()):
    from scout_sys.model import Job, Rank

    ranks = tuple(Rank(rank=r, pid=100 + r, host="h", world_size=world) for r in found)
    remote = tuple(r for r in range(world) if r not in found and r not in missing)
    return Job(ranks=ranks, world_size=world, launcher="python", launcher_pid=99, host="h", remote=remote,
               unplaced=unplaced, missing=missing)


def test_the_watch_waits_for_ranks_a_count_says_are_here_but_never_names_them():
    from scout_sys.watch.restart import FOUND, WAITING, RankFinder

    seen = {"job": _partial((0,), unplaced=1)}
    f = RankFinder("99", lambda s: seen["job"], lives=lambda s: True, look_every=0.5, grace=10.0)
    found = f.first(T0)
    assert found.status == WAITING and "1 of 2 ranks started" in found.note, found
    seen["job"] = _partial((0, 2))
    assert f.first(T0 + 1.0).status == WAITING  # the ranks found changed since the last look: still forking
    found = f.first(T0 + 2.0)
    assert found.status == FOUND and found.job is seen["job"], found
    # a count that never fills: handed over after the grace period, nobody named missing
    seen["job"] = _partial((0,), unplaced=1)
    f = RankFinder("99", lambda s: seen["job"], lives=lambda s: True, grace=10.0)
    assert f.first(T0).status == WAITING
    found = f.first(T0 + 10.0)
    assert found.status == FOUND and found.job.missing == (), found


def test_the_watch_hands_over_a_settled_share_of_a_multi_node_job():
    from scout_sys.watch.restart import FOUND, WAITING, RankFinder

    job = _partial((0, 1))  # ranks 2-7 elsewhere, as the launcher says or nothing says
    f = RankFinder("99", lambda s: job, lives=lambda s: True, look_every=0.5)
    assert f.first(T0).status == WAITING  # one look: the launcher may still be forking
    assert f.first(T0 + 0.5).status == FOUND  # two looks agree
