"""Hang rules on synthetic observations: no processes, no clocks (pure consensus)."""

from __future__ import annotations

import pytest

from scout_sys.consensus import hang
from scout_sys.model import ExitRecord, Frame, Job, ProcSample, Rank, StackSample, ThreadStack

T0 = 1_000_000.0
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
TRAIN = "/jobs/train.py"


def _job(n: int, missing: tuple[int, ...] = ()) -> Job:
    ranks = tuple(Rank(rank=r, pid=1000 + r, host="h0", local_rank=r, world_size=n) for r in range(n)
                  if r not in missing)
    return Job(ranks=ranks, world_size=n, launcher="torchrun", launcher_pid=999, host="h0", missing=missing)


def _stack(*frames: tuple[str, str, int]) -> tuple[Frame, ...]:
    return tuple(Frame(function=f, file=p, line=ln) for f, p, ln in frames)


WAIT_AR = _stack(("all_reduce", C10D, 3252), ("wrapper", "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", 83),
                 ("step", TRAIN, 42), ("<module>", TRAIN, 90))
WAIT_BC = _stack(("broadcast", C10D, 2800), ("step", TRAIN, 50), ("<module>", TRAIN, 90))
SLEEPING = _stack(("load_batch", TRAIN, 12), ("step", TRAIN, 30), ("<module>", TRAIN, 90))


def _rank_obs(rank: int, *, stacks, status="sleeping", main_cpu_per_s=0.0, cpu_per_s=0.0, n=5,
              wrote_per_s=0, exit_code=None, paused_by_pyspy=False, blocks_per_s=0):
    """n samples one second apart; ``stacks`` is one stack or a list of n stacks."""
    out = []
    for i in range(n):
        t = T0 + i
        st = status(i) if callable(status) else status
        if st in ("gone", "zombie"):
            out.append(ProcSample(time=t, rank=rank, pid=1000 + rank, status=st, exit_code=exit_code))
            continue
        out.append(ProcSample(time=t, rank=rank, pid=1000 + rank, status=st, cpu_time=cpu_per_s * i,
                              main_cpu_ns=int(main_cpu_per_s * i * 1e9), main_last_ran=T0 - 10 + rank,
                              write_chars=wrote_per_s * i, read_chars=0, paused_by_pyspy=paused_by_pyspy,
                              main_voluntary=100 + blocks_per_s * i))
        frames = stacks[i] if isinstance(stacks, list) else stacks
        out.append(StackSample(time=t, rank=rank, pid=1000 + rank,
                               threads=(ThreadStack(tid=1000 + rank, name="MainThread", active=False, frames=frames),)))
    return out


def _analyze(job, obs):
    return hang.analyze(job, obs, window=(T0, T0 + 4))


def test_sleeping_rank_is_the_origin_of_a_hang():
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=SLEEPING if r == 2 else WAIT_AR)
    incidents, acts, _ = _analyze(_job(4), obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("hang", "attributed", (2,))]
    assert acts[2].state == "idle" and acts[0].state == "waiting"
    assert "all_reduce" in incidents[0].summary and "train.py:42" in incidents[0].summary
    assert incidents[0].since == T0 - 10  # earliest witness stopped running then


def test_waiting_ranks_are_never_named():
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=WAIT_AR)
    incidents, _, _ = _analyze(_job(4), obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("hang", "inconclusive", ())]
    assert "common-mode" in incidents[0].summary


def test_a_stragglers_peers_caught_in_their_wait_at_every_sample_are_no_hang():
    # a straggler computes 80% of each step, its peers wait for it then: now and then every sample of
    # a window falls in those parts (CI: the tp straggler job's diagnose read "no progress on any of 4
    # ranks"). The peers' main threads blocked anew each step, and their collectives wrote: they left
    # the wait and came back; no rank is named, no hang said
    obs = []
    for r in range(4):
        obs += (_rank_obs(r, stacks=SLEEPING, status="running", main_cpu_per_s=0.8, cpu_per_s=0.8) if r == 3
                else _rank_obs(r, stacks=WAIT_AR if r < 2 else WAIT_BC, blocks_per_s=9, wrote_per_s=11_000))
    incidents, acts, _ = _analyze(_job(4), obs)
    assert incidents == [] and [acts[r].state for r in range(4)] == ["running"] * 3 + ["busy"], incidents


@pytest.mark.parametrize("blocks_per_s,wrote_per_s", [(0, 0), (0, 11_000), (100, 0), (100, 300)],
                         ids=["blocked", "another-thread-writes", "polls", "polls-and-logs"])
def test_a_hung_waiter_stays_a_witness_whether_it_polls_or_another_thread_writes(blocks_per_s, wrote_per_s):
    # Gloo's blocking wait never wakes; NCCL's blocking wait polls every 10 ms and writes nothing; an
    # async checkpoint writes from another thread while the main one stays blocked; a heartbeat logs a little
    obs = []
    for r in range(4):
        obs += (_rank_obs(r, stacks=SLEEPING) if r == 2
                else _rank_obs(r, stacks=WAIT_AR, blocks_per_s=blocks_per_s, wrote_per_s=wrote_per_s))
    incidents, acts, _ = _analyze(_job(4), obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("hang", "attributed", (2,))]
    assert acts[0].state == "waiting"


def test_busy_rank_spinning_in_one_place():
    obs = []
    for r in range(4):
        obs += (_rank_obs(r, stacks=SLEEPING, status="running", main_cpu_per_s=0.95, cpu_per_s=0.95) if r == 1
                else _rank_obs(r, stacks=WAIT_AR))
    incidents, acts, _ = _analyze(_job(4), obs)
    assert acts[1].state == "busy"
    assert [(i.kind, i.ranks) for i in incidents] == [("hang", (1,))]


def test_stopped_rank_is_a_process_stall():
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=SLEEPING if r == 3 else WAIT_AR, status="stopped" if r == 3 else "sleeping")
    incidents, _, _ = _analyze(_job(4), obs)
    assert [(i.kind, i.ranks) for i in incidents] == [("process_stall", (3,))]


def test_exited_rank_with_code():
    obs = []
    for r in range(4):
        obs += (_rank_obs(r, stacks=SLEEPING, status=lambda i: "zombie", exit_code=3) if r == 0
                else _rank_obs(r, stacks=WAIT_AR))
    incidents, _, _ = _analyze(_job(4), obs)
    assert [(i.kind, i.ranks) for i in incidents] == [("process_exit", (0,))]
    assert "exited with code 3" in incidents[0].summary


# A job finishing: rank 0 ended with status 0 (its launcher reaped it at once: /proc saw it gone, the
# exit probe saw the status) while rank 1 is still tearing down. Before, the window named rank 0
# "process_exit (attributed)": the status the exit probe saw never reached the hang rules.
_EXIT_AT = T0 + 0.5


def _gone_rank0(**exit_kw):
    return [*_rank_obs(0, stacks=SLEEPING, status="gone"),
            ExitRecord(time=_EXIT_AT, rank=0, pid=1000, **exit_kw)]


def test_a_rank_that_ended_with_0_while_its_peer_tears_down_is_no_incident():
    teardown = [_stack(("destroy_process_group", C10D, 2100), ("<module>", TRAIN, 95)), SLEEPING] * 3
    obs = _gone_rank0(exit_code=0, signal=None) + _rank_obs(1, stacks=teardown[:5], status="running", cpu_per_s=0.5)
    incidents, acts, _ = _analyze(_job(2), obs)
    assert incidents == [] and acts[0].exit_code == 0, incidents


@pytest.mark.parametrize("exit_kw,said", [({"exit_code": 1, "signal": None}, "exited with code 1"),
                                          ({"exit_code": None, "signal": 9}, "killed by SIGKILL")])
def test_a_rank_the_exit_probe_saw_die_is_decisive_with_its_status(exit_kw, said):
    obs = _gone_rank0(**exit_kw) + _rank_obs(1, stacks=SLEEPING, status="running", cpu_per_s=0.5)
    incidents, _, _ = _analyze(_job(2), obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("process_exit", "attributed", (0,))]
    assert said in incidents[0].summary, incidents[0].summary


def test_a_rank_that_left_with_0_while_a_majority_waits_for_it_is_still_the_origin():
    obs = _gone_rank0(exit_code=0, signal=None)
    for r in (1, 2, 3):
        obs += _rank_obs(r, stacks=WAIT_AR)
    incidents, _, _ = _analyze(_job(4), obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("process_exit", "attributed", (0,))]
    assert "exited with code 0" in incidents[0].summary


def test_missing_rank_is_an_exit():
    obs = []
    for r in (0, 1, 3):
        obs += _rank_obs(r, stacks=WAIT_AR)
    incidents, _, _ = _analyze(_job(4, missing=(2,)), obs)
    assert [(i.kind, i.ranks) for i in incidents] == [("process_exit", (2,))]


def test_different_collective_is_a_desync():
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=WAIT_BC if r == 2 else WAIT_AR)
    incidents, _, _ = _analyze(_job(4), obs)
    assert [(i.kind, i.ranks) for i in incidents] == [("collective_desync", (2,))]
    assert "broadcast" in incidents[0].summary


def test_healthy_ranks_moving_through_steps():
    seq = [SLEEPING, WAIT_AR, SLEEPING, WAIT_AR, SLEEPING]
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=seq[r % 2:] + seq[: r % 2], status="running", main_cpu_per_s=0.5, cpu_per_s=0.6)
    incidents, acts, _ = _analyze(_job(4), obs)
    assert incidents == []
    assert {r: a.state for r, a in acts.items()} == {r: "running" for r in range(4)}


def test_same_collective_line_but_main_thread_running_is_not_waiting():
    # A job that calls all_reduce back to back is caught there at every sample, but it runs.
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=WAIT_AR, status="running", main_cpu_per_s=0.6, cpu_per_s=0.7)
    incidents, acts, _ = _analyze(_job(4), obs)
    assert incidents == [] and acts[0].state != "waiting"


def test_checkpoint_pause_is_not_a_hang():
    ckpt = [_stack(("save", "/venv/lib/python3.11/site-packages/torch/serialization.py", 900 + i), ("ckpt", TRAIN, 70))
            for i in range(5)]
    ckpt = [c if i % 2 else _stack(("write", TRAIN, 80), ("ckpt", TRAIN, 70)) for i, c in enumerate(ckpt)]
    obs = []
    for r in range(4):
        obs += (_rank_obs(r, stacks=ckpt, status="running", main_cpu_per_s=0.8, cpu_per_s=0.8, wrote_per_s=1 << 20)
                if r == 0 else _rank_obs(r, stacks=WAIT_AR))
    incidents, _, notes = _analyze(_job(4), obs)
    assert incidents == []
    assert any("pause" in n for n in notes)


def test_two_ranks_without_decisive_evidence_are_inconclusive():
    obs = _rank_obs(0, stacks=WAIT_AR) + _rank_obs(1, stacks=SLEEPING)
    incidents, _, _ = _analyze(_job(2), obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("hang", "inconclusive", ())]


def test_two_ranks_with_a_stopped_one_is_decisive():
    obs = _rank_obs(0, stacks=WAIT_AR) + _rank_obs(1, stacks=SLEEPING, status="stopped")
    incidents, _, _ = _analyze(_job(2), obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("process_stall", "attributed", (1,))]


@pytest.mark.parametrize("by_pyspy,want", [
    (True, [("hang", "attributed", (1,))]),  # the bundle's native dump paused the witnesses: no stall
    (False, [("process_stall", "attributed", (0, 2, 3))]),  # a debugger holds them: they are stopped
])
def test_tracing_stop_of_a_py_spy_dump_is_not_a_stop(by_pyspy, want):
    obs = []
    for r in range(4):
        obs += (_rank_obs(r, stacks=SLEEPING) if r == 1 else
                _rank_obs(r, stacks=WAIT_AR, status="tracing-stop", paused_by_pyspy=by_pyspy))
    incidents, _, _ = _analyze(_job(4), obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == want


def test_tie_between_waiting_and_stuck_is_inconclusive():
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=SLEEPING if r in (1, 2) else WAIT_AR)
    incidents, _, _ = _analyze(_job(4), obs)
    assert [(i.kind, i.status) for i in incidents] == [("hang", "inconclusive")]


def test_several_outliers_of_different_kinds():
    obs = []
    for r in range(8):
        if r == 1:
            obs += _rank_obs(r, stacks=SLEEPING)
        elif r == 5:
            obs += _rank_obs(r, stacks=SLEEPING, status="stopped")
        else:
            obs += _rank_obs(r, stacks=WAIT_AR)
    incidents, _, _ = _analyze(_job(8), obs)
    assert sorted((i.kind, i.ranks) for i in incidents) == [("hang", (1,)), ("process_stall", (5,))]


def test_8192_ranks_synthetic():
    n = 8192
    obs = []
    for r in range(n):
        obs += _rank_obs(r, stacks=SLEEPING if r == 4242 else WAIT_AR, n=2)
    incidents, _, _ = _analyze(_job(n), obs)
    assert [(i.kind, i.ranks) for i in incidents] == [("hang", (4242,))]


BACKWARD = _stack(("_engine_run_backward", "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", 841),
                  ("backward", "/venv/lib/python3.11/site-packages/torch/autograd/__init__.py", 364),
                  ("train_step", TRAIN, 61), ("<module>", TRAIN, 90))


def test_ddp_ranks_waiting_in_backward_are_witnesses():
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=SLEEPING if r == 1 else BACKWARD)
    incidents, acts, _ = _analyze(_job(4), obs)
    assert [(i.kind, i.ranks) for i in incidents] == [("hang", (1,))]
    assert acts[0].wait is not None and acts[0].wait.op.startswith("backward")


def test_every_rank_in_backward_is_not_a_common_mode_hang():
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=BACKWARD)
    incidents, _, _ = _analyze(_job(4), obs)
    assert incidents == []


def test_every_rank_gone_names_nobody_from_proc_alone():
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=SLEEPING, status=lambda i: "gone")
    incidents, _, notes = _analyze(_job(4), obs)
    assert incidents == [] and any("exited" in n for n in notes)


# ---- the GPU shape: asynchronous collectives, waiters at a sync point with no collective frame

SPIN_A = _stack(("wait_for_buckets", TRAIN, 151), ("average_gradients_async", TRAIN, 171), ("<module>", TRAIN, 90))
SPIN_B = _stack(("<genexpr>", TRAIN, 151), ("wait_for_buckets", TRAIN, 151), ("average_gradients_async", TRAIN, 171),
                ("<module>", TRAIN, 90))
SPIN_LINE = _stack(("wait_for_buckets", TRAIN, 152), ("average_gradients_async", TRAIN, 171), ("<module>", TRAIN, 90))
SPINNING = [SPIN_A, SPIN_B, SPIN_LINE, SPIN_B, SPIN_A]  # a poll loop: lines and generator frames come and go


def test_spinning_majority_without_collective_frame_witnesses_a_hang():
    obs = []
    for r in range(4):
        if r == 1:
            obs += _rank_obs(r, stacks=SLEEPING)
        else:
            obs += _rank_obs(r, stacks=SPINNING, status="running", main_cpu_per_s=0.95, cpu_per_s=1.0)
    incidents, acts, _ = _analyze(_job(4), obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("hang", "attributed", (1,))]
    assert acts[0].state == "busy" and acts[1].state == "idle"
    assert "wait_for_buckets" in incidents[0].summary and "spinning" in incidents[0].summary
    place = [e for e in incidents[0].evidence if "place" in e.data]
    assert place and place[0].data["ranks"] == [0, 2, 3]


def test_blocking_wait_majority_and_a_spinning_one_are_one_witness_group():
    # work.wait() sleeps, a poll loop spins: how much CPU a waiter gets depends on the load, the place does not
    obs = []
    for r in range(5):
        if r == 4:
            obs += _rank_obs(r, stacks=SLEEPING)
        elif r == 0:
            obs += _rank_obs(r, stacks=SPINNING, status="running", main_cpu_per_s=0.9, cpu_per_s=0.9)
        else:
            obs += _rank_obs(r, stacks=SPIN_A)
    incidents, _, _ = _analyze(_job(5), obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("hang", "attributed", (4,))]


def test_spin_shape_all_at_the_sync_point_is_not_a_finding():
    # a healthy GPU job whose steps are longer than the window looks exactly like this
    obs = []
    for r in range(4):
        obs += _rank_obs(r, stacks=SPINNING, status="running", main_cpu_per_s=0.95, cpu_per_s=1.0)
    incidents, _, _ = _analyze(_job(4), obs)
    assert incidents == []


def test_spin_shape_slow_rank_that_moves_is_a_pause():
    moving = [SLEEPING, SPIN_A, _stack(("forward", TRAIN, 20), ("<module>", TRAIN, 90)), SLEEPING, SPIN_A]
    obs = []
    for r in range(4):
        if r == 3:
            obs += _rank_obs(r, stacks=moving, status="running", main_cpu_per_s=0.6, cpu_per_s=0.6)
        else:
            obs += _rank_obs(r, stacks=SPINNING, status="running", main_cpu_per_s=0.95, cpu_per_s=1.0)
    incidents, acts, notes = _analyze(_job(4), obs)
    assert incidents == [] and acts[3].state == "running"
    assert any("still progressing" in n for n in notes)


def test_spin_shape_rank_inside_a_collective_is_never_the_origin():
    # Gloo-blocking call on one rank while three spin elsewhere: it waits too; nobody is named
    obs = []
    for r in range(4):
        if r == 2:
            obs += _rank_obs(r, stacks=WAIT_AR)
        else:
            obs += _rank_obs(r, stacks=SPINNING, status="running", main_cpu_per_s=0.95, cpu_per_s=1.0)
    incidents, acts, _ = _analyze(_job(4), obs)
    assert acts[2].state == "waiting"
    assert all(i.ranks == () for i in incidents), incidents


def test_two_ranks_spinning_and_stuck_elsewhere_are_inconclusive():
    obs = _rank_obs(0, stacks=SLEEPING) + _rank_obs(1, stacks=SPINNING, status="running", main_cpu_per_s=0.95,
                                                  cpu_per_s=1.0)
    incidents, _, _ = _analyze(_job(2), obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("hang", "inconclusive", ())]


def test_location_ignores_transient_comprehension_frames():
    assert hang.location_of(SPIN_B) == hang.location_of(SPIN_A) == hang.location_of(SPIN_LINE)
    assert hang.location_of(SLEEPING) != hang.location_of(SPIN_A)


def test_a_torn_read_of_a_spinning_rank_does_not_make_it_move():
    # py-spy --nonblocking reads a spinning rank's frames while it runs: now and then only the innermost
    # generator frame comes back, without its callers
    torn = _stack(("wait_for_buckets.<locals>.<genexpr>", TRAIN, 151))
    obs = []
    for r in range(4):
        if r == 1:
            obs += _rank_obs(r, stacks=SLEEPING)
        else:
            stacks = [SPIN_A, SPIN_B, torn if r == 3 else SPIN_A, SPIN_A, SPIN_B]
            obs += _rank_obs(r, stacks=stacks, status="running", main_cpu_per_s=0.95, cpu_per_s=1.0)
    incidents, acts, _ = _analyze(_job(4), obs)
    assert acts[3].state == "busy"
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("hang", "attributed", (1,))]


def test_gpu_shape_seen_from_one_host_of_a_multi_node_job_is_common_mode():
    # both ranks of this host spin at one sync point all window; ranks 2-3 run on another host
    job = Job(ranks=tuple(Rank(rank=r, pid=1000 + r, host="h0", local_rank=r, world_size=4) for r in range(2)),
              world_size=4, launcher="torchrun", launcher_pid=999, host="h0", remote=(2, 3))
    obs = []
    for r in range(2):
        obs += _rank_obs(r, stacks=SPIN_A, status="running", main_cpu_per_s=0.95, cpu_per_s=1.0)
    incidents, acts, _ = _analyze(job, obs)
    assert {a.state for a in acts.values()} == {"busy"}
    assert [(i.kind, i.status, i.ranks) for i in incidents] == [("hang", "inconclusive", ())]
    assert "common-mode hang" in incidents[0].summary and "ranks 2-3 on other hosts" in incidents[0].summary
    # the same two ranks as the whole job: nobody is elsewhere, and nothing is said (as before)
    incidents, _, _ = _analyze(_job(2), obs)
    assert incidents == []


def _remote_job() -> Job:
    return Job(ranks=tuple(Rank(rank=r, pid=1000 + r, host="h0", local_rank=r, world_size=4) for r in range(2)),
               world_size=4, launcher="torchrun", launcher_pid=999, host="h0", remote=(2, 3))


def _coll(rank: int, last_enter: float):
    from scout_sys.model import CollectiveSample, Fingerprint

    fp = Fingerprint(seq=7, op="allreduce", time=last_enter, count=64, dtype="float32", redop="sum")
    return CollectiveSample(time=T0 + 4, rank=rank, pid=1000 + rank, backend="gloo", group="gloo:0", seq=7,
                            completed=None, inside=False, last_enter=last_enter, last_exit=None, last=fp,
                            recent=(fp,))


def test_common_mode_says_who_is_not_observed_and_which_progress_signals_it_had():
    obs = []
    for r in range(2):
        obs += _rank_obs(r, stacks=SPIN_A, status="running", main_cpu_per_s=0.95, cpu_per_s=1.0)
    (inc,), _, _ = _analyze(_remote_job(), obs)
    assert "ranks 2-3 on other hosts, not observed here" in inc.summary, inc.summary
    assert "progress signals available: main-thread stacks, other threads' stacks, CPU time, none moved" \
        in inc.summary, inc.summary
    sig = next(e for e in inc.evidence if "progress_signals" in e.data).data["progress_signals"]
    assert sig["collectives"] == {"available": False} and sig["threads"]["available"]
    assert sig["cpu_outside_main_percent"] == {"0": 5.0, "1": 5.0} and sig["cpu_outside_main_moves"] == []
    assert inc.evidence[0].data["not_observed"] == [2, 3]
    # eBPF saw no collective since before the window: still a hang, and it says so
    (inc,), _, _ = _analyze(_remote_job(), obs + [_coll(r, T0 - 30) for r in range(2)])
    assert "collective sequence numbers" in inc.summary, inc.summary
    sig = next(e for e in inc.evidence if "progress_signals" in e.data).data["progress_signals"]
    assert sig["collectives"] == {"available": True, "moved": []}


def test_common_mode_whose_collective_sequence_moves_is_a_long_step_not_a_hang():
    obs = []
    for r in range(2):
        obs += _rank_obs(r, stacks=SPIN_A, status="running", main_cpu_per_s=0.95, cpu_per_s=1.0)
    incidents, _, notes = _analyze(_remote_job(), obs + [_coll(r, T0 + 2) for r in range(2)])
    assert incidents == [] and any("a long step, not a hang" in n for n in notes), notes


# DDP seen from one host of a multi-node job (PyTorch Lightning's, or any DDP trainer): the local ranks
# all sit in backward, off CPU, while a rank on another node hangs. Before, "every rank in backward" said
# nothing whatever the collective probe saw, and the watch never opened the common-mode hang.
@pytest.mark.parametrize("entered,want", [
    (T0 - 3, [("hang", "inconclusive", ())]),  # no collective began or ended in the window: a measured wait
    (T0 + 2, []),  # a gradient all-reduce began inside the window: a long backward, nothing to say
])
def test_ranks_in_backward_whose_collectives_stopped_wait_for_a_rank_elsewhere(entered, want):
    obs = []
    for r in range(2):
        obs += [*_rank_obs(r, stacks=BACKWARD), _coll(r, entered)]
    incidents, _, _ = _analyze(_remote_job(), obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == want, incidents
    if want:
        assert "ranks 2-3 on other hosts, not observed here" in incidents[0].summary, incidents[0].summary


def test_every_rank_in_backward_without_the_collective_probe_says_nothing():
    obs = []
    for r in range(2):
        obs += _rank_obs(r, stacks=BACKWARD)
    assert _analyze(_remote_job(), obs)[0] == []


@pytest.mark.parametrize("asleep,want", [(40.0, [("hang", "inconclusive", ())]), (10.0, [])])
def test_ranks_in_backward_whose_main_thread_slept_half_a_minute_wait_without_ebpf(asleep, want):
    # without the collective probe: a main thread asleep in backward for 40 s is blocked on a collective
    # (no healthy backward keeps its caller asleep that long); 10 s may be a long GPU backward
    from dataclasses import replace

    obs = []
    for r in range(2):
        obs += [replace(o, main_last_ran=T0 + 4 - asleep) if isinstance(o, ProcSample) else o
                for o in _rank_obs(r, stacks=BACKWARD)]
    incidents, _, _ = _analyze(_remote_job(), obs)
    assert [(i.kind, i.status, i.ranks) for i in incidents] == want, incidents
