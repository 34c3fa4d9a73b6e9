"""Parallel layouts: --topology parsing, rank orders, frameworks' command lines, peer groups, the
frame table, and consensus within then across peer groups (pure: no processes)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from scout_sys import topology as topo
from scout_sys.consensus.patterns import collective_of
from scout_sys.job import with_layout
from tests.test_hang_rules import C10D, SLEEPING, TRAIN, WAIT_AR, _analyze, _job, _rank_obs, _stack

SP = "/venv/lib/python3.11/site-packages/"


# --------------------------------------------------------------------------- parsing and rank orders


def test_mesh_order_is_row_major_as_written():
    lay = topo.parse("dp=4,pp=2")
    assert [lay.coords(r) for r in (0, 1, 2, 7)] == [
        {"dp": 0, "pp": 0}, {"dp": 0, "pp": 1}, {"dp": 1, "pp": 0}, {"dp": 3, "pp": 1}]
    assert lay.groups() == ((0, 2, 4, 6), (1, 3, 5, 7))
    # the other way round: pp slowest
    assert topo.parse("pp=2,dp=4").groups() == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_megatron_order_tp_fastest_pp_slowest():
    lay = topo.parse("dp=2,tp=2,pp=2,order=megatron")
    assert lay.order == ("tp", "dp", "pp")
    assert lay.coords(5) == {"dp": 0, "tp": 1, "pp": 1}
    assert lay.coords(2) == {"dp": 1, "tp": 0, "pp": 0}
    assert lay.groups() == ((0, 2), (1, 3), (4, 6), (5, 7))
    cp = topo.parse("tp=2,cp=2,dp=2,order=megatron")
    assert cp.coords(3) == {"tp": 1, "cp": 1, "dp": 0} and cp.coords(4)["dp"] == 1


def test_deepspeed_order_model_fastest_then_data_then_pipe():
    lay = topo.parse("pp=2,dp=2,tp=2,order=deepspeed")
    # PipeModelDataParallelTopology(axes=[pipe, data, model]): pipe groups are [0, 4], [1, 5], ...
    assert [lay.coords(r)["pp"] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert lay.coords(6) == {"pp": 1, "dp": 1, "tp": 0}


def test_custom_order_and_aliases():
    lay = topo.parse("data=2,pipe=2,order=pp-dp")  # pp fastest
    assert lay.groups() == ((0, 2), (1, 3))


def test_dp_is_filled_from_the_world_size():
    lay = topo.parse("tp=2,pp=2", world_size=8)
    assert lay.size("dp") == 2 and lay.world_size == 8
    assert topo.parse("dp=-1,pp=2", world_size=6).size("dp") == 3


@pytest.mark.parametrize("bad", ["", "dp", "xx=2", "dp=2,dp=2", "dp=0", "dp=a", "dp=2,tp=2,order=nope",
                                 "dp=2,cp=2,order=deepspeed"])
def test_bad_topologies_say_why(bad):
    with pytest.raises(topo.BadTopology):
        topo.parse(bad)


def test_world_size_mismatch_is_an_error():
    with pytest.raises(topo.BadTopology, match="8 ranks; the job has 6"):
        topo.parse("dp=4,pp=2", world_size=6)


# --------------------------------------------------------------------------- frameworks' command lines


def test_megatron_command_line():
    argv = topo.split_cmdline("python pretrain_gpt.py --tensor-model-parallel-size 2 "
                              "--pipeline-model-parallel-size=2 --context-parallel-size 1 --micro-batch-size 4")
    lay, _, where, text = topo.from_cmdline(argv, 16)
    assert where == "Megatron-Core command line" and text.startswith(where + " (tp=2 pp=2;") and lay.sizes == (("dp", 4), ("tp", 2), ("pp", 2))
    assert lay.order_name == "megatron" and lay.coords(9) == {"dp": 0, "tp": 1, "pp": 1}


def test_deepspeed_config_relative_to_cwd(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"tensor_parallel": {"autotp_size": 2},
                                                  "pipeline": {"stages": 2}}))
    lay, _, where, _ = topo.from_cmdline(["python", "train.py", "--deepspeed_config", "ds.json"], 8, str(tmp_path))
    assert where == "DeepSpeed config ds.json" and lay.order_name == "deepspeed"
    assert lay.groups() == ((0, 2), (1, 3), (4, 6), (5, 7))


def test_torchtitan_toml_and_overrides(tmp_path):
    (tmp_path / "llama.toml").write_text("[parallelism]\ndata_parallel_shard_degree = -1\n"
                                         "tensor_parallel_degree = 2\npipeline_parallel_degree = 1\n")
    argv = ["python", "-m", "torchtitan.train", "--job.config_file", "llama.toml"]
    lay = topo.from_cmdline(argv, 8, str(tmp_path)).layout
    assert lay.sizes == (("dp", 4), ("tp", 2))
    lay = topo.from_cmdline([*argv, "--parallelism.pipeline_parallel_degree", "2"], 8, str(tmp_path)).layout
    assert lay.sizes == (("dp", 2), ("tp", 2), ("pp", 2)) and lay.coords(5) == {"dp": 0, "tp": 1, "pp": 1}


def test_nothing_known_is_activity():
    assert topo.from_cmdline(["python", "train.py", "--lr", "1"], 4) is None
    assert topo.find_layout(4, None, [(["python", "train.py"], None)]) is None


def test_with_layout_puts_coordinates_on_ranks():
    job = with_layout(_job(8), "dp=4,pp=2")
    assert job.peer_groups == ((0, 2, 4, 6), (1, 3, 5, 7)) and "--topology" in job.layout
    assert job.by_rank()[5].coords == (("dp", 2), ("pp", 1))
    assert job.by_rank()[5].to_json()["coords"] == {"dp": 2, "pp": 1}


# --------------------------------------------------------------------------- frames (read from py-spy dumps)

PIPE_WAIT = _stack(("_wait_batch_p2p", SP + "torch/distributed/pipelining/schedules.py", 683),
                   ("ScheduleGPipe._step_microbatches", SP + "torch/distributed/pipelining/schedules.py", 910),
                   ("PipelineScheduleSingle.step", SP + "torch/distributed/pipelining/schedules.py", 785),
                   ("step_fn", TRAIN, 104), ("<module>", TRAIN, 149))
TP_WAIT = _stack(("OpOverloadPacket.__call__", SP + "torch/_ops.py", 1279),
                 ("wait_tensor", SP + "torch/distributed/_functional_collectives.py", 142),
                 ("AsyncCollectiveTensor.trigger_wait", SP + "torch/distributed/_functional_collectives.py", 1115),
                 ("step_fn", TRAIN, 121), ("<module>", TRAIN, 149))
FSDP_WAIT = _stack(("all_gather_single", C10D, 4394),
                   ("DefaultAllGather.__call__", SP + "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", 119),
                   ("FSDPParamGroup.unshard", SP + "torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", 407),
                   ("step_fn", TRAIN, 80), ("<module>", TRAIN, 149))


def test_frames_of_pipelining_fsdp2_and_dtensor():
    w = collective_of(PIPE_WAIT)
    assert (w.op, w.p2p, w.direct, w.site) == ("pipeline p2p", True, False, "/jobs/train.py:104")
    w = collective_of(TP_WAIT)
    assert (w.op, w.p2p, w.direct) == ("wait_tensor", False, True)
    w = collective_of(FSDP_WAIT)
    assert (w.op, w.p2p) == ("all_gather_single", False)
    send = collective_of(_stack(("recv", C10D, 10), ("f", TRAIN, 1)))
    assert send.p2p and send.op == "recv"
    ds = collective_of(_stack(("all_reduce", SP + "deepspeed/comm/comm.py", 1), ("f", TRAIN, 1)))
    assert ds.op == "all_reduce" and ds.direct
    mg = collective_of(_stack(("_communicate", SP + "megatron/core/pipeline_parallel/p2p_communication.py", 1),
                              ("f", TRAIN, 1)))
    assert mg.p2p and mg.op == "pipeline p2p"
    assert collective_of(_stack(("Frame", "/x/frame.py", 1))) is None


# --------------------------------------------------------------------------- consensus within, then across groups


def _pp_obs(stuck: int = 2):
    """dp=4 x pp=2 (mesh order): `stuck` hangs at stage 0; its stage-1 neighbour waits in the pipeline's
    recv; everyone else waits in the dp all-reduce."""
    obs = []
    for r in range(8):
        stacks = SLEEPING if r == stuck else PIPE_WAIT if r == stuck + 1 else WAIT_AR
        obs += _rank_obs(r, stacks=stacks)
    return obs


def test_pipeline_neighbour_is_a_witness_not_a_culprit():
    job = with_layout(_job(8), "dp=4,pp=2")
    incidents, _, _ = _analyze(job, _pp_obs())
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("hang", "attributed", (2,))]
    inc = incidents[0]
    assert "[rank 2 at dp=1,pp=0]" in inc.summary
    job_ev = [e for e in inc.evidence if "coords" in e.data]
    assert job_ev[0].data["coords"] == {"dp": 1, "pp": 0} and job_ev[0].data["peer_group"] == [0, 2, 4, 6]
    assert any(e.data.get("witness_of") == [2] and e.data.get("ranks") == [3] for e in inc.evidence)


def test_layout_unknown_groups_by_activity():
    incidents, _, notes = _analyze(_job(8), _pp_obs())
    assert [(i.kind, i.ranks) for i in incidents] == [("hang", (2,))]
    assert any("shape of activity" in n for n in notes)
    assert "activity" in [e for e in incidents[0].evidence if "coords" in e.data][0].data["layout"]


def test_every_stage_waits_on_one_stage():
    # pp=4, one rank per stage: no group has a majority on its own; 3 of 4 ranks wait -> rank 1.
    job = with_layout(_job(4), "pp=4")
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=SLEEPING if r == 1 else PIPE_WAIT)
    incidents, _, _ = _analyze(job, obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("hang", "attributed", (1,))]
    assert "pp=1" in incidents[0].summary


def test_two_ranks_two_stages_names_nobody():
    # one rank per stage: no strict majority anywhere, and one stage waiting in the pipeline's recv
    # for the other is a pipeline bubble as often as a hang: nothing is reported, nobody is named.
    job = with_layout(_job(2), "pp=2")
    obs = _rank_obs(0, stacks=SLEEPING) + _rank_obs(1, stacks=PIPE_WAIT)
    incidents, acts, _ = _analyze(job, obs)
    assert incidents == []
    assert {r: a.state for r, a in acts.items()} == {0: "idle", 1: "waiting"}


def test_desync_in_one_group_makes_the_other_groups_witnesses():
    # dp=3 x tp=2: rank 2 (dp=1,tp=0) broadcasts where its dp peers all-reduce; the tp=1 group all
    # waits in its tensor-parallel collective (a common mode caused by rank 2).
    WAIT_BC = _stack(("broadcast", C10D, 2800), ("step", TRAIN, 50), ("<module>", TRAIN, 90))
    job = with_layout(_job(6), "dp=3,tp=2")
    obs = []
    for r in range(6):
        obs += _rank_obs(r, stacks=WAIT_BC if r == 2 else WAIT_AR if r % 2 == 0 else TP_WAIT)
    incidents, _, _ = _analyze(job, obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("collective_desync", "attributed", (2,))]
    assert any(e.data.get("witness_of") == [2] for e in incidents[0].evidence)


def test_healthy_stages_wait_differently_without_a_culprit():
    # stage 0 waits in all_reduce, stage 1 in recv, every rank's stack moves between samples.
    job = with_layout(_job(4), "dp=2,pp=2")
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=[WAIT_AR if (i + r) % 2 else PIPE_WAIT for i in range(5)])
    incidents, acts, _ = _analyze(job, obs)
    assert incidents == [] and {a.state for a in acts.values()} == {"running"}


def test_single_group_semantics_unchanged():
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=SLEEPING if r == 2 else WAIT_AR)
    plain, _, _ = _analyze(_job(4), obs)
    given, _, _ = _analyze(replace(_job(4), peer_groups=((0, 1, 2, 3),)), obs)
    assert [(i.kind, i.ranks) for i in plain] == [(i.kind, i.ranks) for i in given] == [("hang", (2,))]


def test_layout_unknown_a_pipeline_neighbour_waiting_for_ranks_that_progress_is_no_hang():
    # stop 33's CI (test_pipeline_e2e dp2 x tp2 x pp2, a stopped rank just resumed): one rank still
    # waits in the pipeline's recv for its neighbour while every other rank steps again. Split off as
    # a pipeline neighbour (no layout known), its group of one "all waits at one place": not a
    # common-mode hang, since the ranks it waits for progress.
    moving = [_stack((f"layer{i}", TRAIN, 10 + i), (f"block{i}", TRAIN, 20 + i), ("<module>", TRAIN, 90))
              for i in range(5)]
    recv = _stack(("recv", C10D, 2799), ("step", TRAIN, 99), ("<module>", TRAIN, 171))
    obs = []
    for r in range(8):
        obs += _rank_obs(r, stacks=recv) if r == 3 else \
            _rank_obs(r, stacks=moving, status="running", main_cpu_per_s=0.9, cpu_per_s=0.9)
    incidents, acts, notes = _analyze(_job(8), obs)
    assert acts[3].state == "waiting" and all(acts[r].state == "running" for r in range(8) if r != 3)
    assert incidents == [], incidents
    assert any("wait in point-to-point calls while nothing is stuck among ranks 0, 1, 2, 4, 5, 6, 7 (7 of them progress)"
               in n for n in notes), notes
    # the same neighbour waiting while the others are stuck in the dp all-reduce is still a finding
    obs = []
    for r in range(8):
        obs += _rank_obs(r, stacks=recv if r == 3 else WAIT_AR)
    assert _analyze(_job(8), obs)[0]
