"""Synthetic whole-job windows for the decision-step benchmark (decision_scale.py) and its verdict test
(tests/test_decision_scale.py): a tp=8 x pp=4 x dp job (Megatron order: tp fastest, then dp, then pp),
8 ranks a host, one window's observations of every rank — /proc, main-thread stacks, the collective
probe's sequence on the tp (``nccl:0``) and dp (``nccl:1``) groups, and the learned process groups —
in one of a few fault shapes. Not a benchmark itself (``benchmarks/run.py`` skips ``_*.py``).

Shapes (``fault``):

- ``hang``: one rank stuck in its data loader; its tp partners wait in the tp all-reduce one call
  ahead of it, every other rank in the dp all-reduce;
- ``exit``: one rank gone (a zombie with exit code 1), the others wait;
- ``stopped``: one rank stopped (SIGSTOP), the others wait;
- ``desync``: one rank called an all-gather where its tp group called an all-reduce, all wait;
- ``common``: every rank waits in one all-reduce (the origin is not among them);
- ``straggler``: every rank steps; one computes 4x as long, its peers found waiting for it;
- ``healthy``: every rank steps.
"""

from __future__ import annotations

from typing import Any

from scout_sys.model import (
    CollectiveSample,
    Fingerprint,
    Frame,
    Job,
    Observation,
    ProcessGroupSample,
    ProcSample,
    Rank,
    StackSample,
    ThreadStack,
)

T0 = 1_000_000.0
WINDOW = (T0, T0 + 3.0)
TP, PP = 8, 4
PER_HOST = 8
FAULTS = ("hang", "exit", "stopped", "desync", "common", "straggler", "healthy")
SP = "/venv/lib/python3.11/site-packages/"
TRAIN = "/jobs/train.py"


def _stack(*frames: tuple[str, str, int]) -> tuple[Frame, ...]:
    return tuple(Frame(function=f, file=p, line=ln) for f, p, ln in frames)


def _in_c10d(op: str, line: int) -> tuple[Frame, ...]:
    return _stack((op, SP + "torch/distributed/distributed_c10d.py", 3252),
                  ("wrapper", SP + "torch/distributed/c10d_logger.py", 83), ("step", TRAIN, line),
                  ("<module>", TRAIN, 90))


TP_WAIT = _in_c10d("all_reduce", 42)
DP_WAIT = _in_c10d("all_reduce", 57)
GATHER = _in_c10d("all_gather", 42)
IDLE = _stack(("load_batch", TRAIN, 12), ("step", TRAIN, 30), ("<module>", TRAIN, 90))
COMPUTE = tuple(_stack(("forward", TRAIN, 20 + i), ("step", TRAIN, 35), ("<module>", TRAIN, 90)) for i in range(4))


def origin(n: int) -> int:
    """The faulty rank of a size-``n`` job: stage 1, somewhere in the middle of its dp groups."""
    return (n // PP) + (n // PP) // 3 + 3


def job_of(n: int) -> Job:
    ranks = tuple(Rank(rank=r, pid=1000 + r, host=f"node{r // PER_HOST}", local_rank=r % PER_HOST, world_size=n)
                  for r in range(n))
    return Job(ranks=ranks, world_size=n, launcher="torchrun", launcher_pid=999, host="node0")


def groups_of(n: int) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """(tp groups, dp groups) of a size-``n`` job; pp groups are left to :func:`learned`."""
    dp = n // TP // PP
    tps = tuple(tuple(range(b, b + TP)) for b in range(0, n, TP))
    dps = tuple(tuple(p * TP * dp + t + TP * d for d in range(dp)) for p in range(PP) for t in range(TP))
    return tps, dps


def learned(n: int) -> ProcessGroupSample:
    dp = n // TP // PP
    tps, dps = groups_of(n)
    pps = tuple(tuple(s + TP * dp * k for k in range(PP)) for s in range(TP * dp))
    return ProcessGroupSample(time=T0, groups=(*tps, *dps, *pps, tuple(range(n))))


def _fp(seq: int, op: str, t: float, count: int) -> Fingerprint:
    return Fingerprint(seq=seq, op=op, time=t, count=count, dtype="bfloat16", redop="sum" if op == "allreduce" else None)


def _coll(r: int, t: float, group: str, members: tuple[int, ...], seq: int, *, inside: bool, count: int,
          ops: dict[int, str] | None = None, enter: float | None = None) -> CollectiveSample:
    recent = tuple(_fp(s, (ops or {}).get(s, "allreduce"), T0 - 0.2 * (seq - s), count)
                   for s in range(max(1, seq - 5), seq + 1))
    last_enter = enter if enter is not None else recent[-1].time
    return CollectiveSample(time=t, rank=r, pid=1000 + r, backend="nccl", group=group, seq=seq, completed=None,
                            inside=inside, last_enter=last_enter, last_exit=None if inside else last_enter + 0.01,
                            last=recent[-1], recent=recent, members=members)


def observations(n: int, fault: str, *, samples: int = 3, at: int | None = None) -> list[Observation]:
    """One window of a size-``n`` job in shape ``fault`` (see the module's docstring), its faulty rank
    ``at`` (default: :func:`origin`)."""
    if fault not in FAULTS:
        raise ValueError(fault)
    if fault == "straggler":
        samples = max(samples, 8)
    bad = origin(n) if at is None else at
    tps, dps = groups_of(n)
    tp_of = {r: g for g in tps for r in g}
    dp_of = {r: g for g in dps for r in g}
    stalled = fault not in ("straggler", "healthy")
    t_end = WINDOW[1]
    out: list[Observation] = [learned(n)]
    for r in range(n):
        partner = fault not in ("common", "healthy") and tp_of[r] == tp_of[bad] and r != bad
        pid = 1000 + r
        slow = fault == "straggler" and r == bad
        for i in range(samples):
            t = T0 + i * (WINDOW[1] - T0) / (samples - 1)
            status = "stopped" if (fault == "stopped" and r == bad) else "sleeping" if stalled else "running"
            if fault == "exit" and r == bad:
                status = "zombie" if i else "sleeping"
            cpu = 0.0 if stalled else (0.9 if slow else 0.4) * (t - T0)
            out.append(ProcSample(time=t, rank=r, pid=pid, status=status, cpu_time=cpu,
                                  main_cpu_ns=int(cpu * 1e9), main_last_ran=T0 - 10 if stalled else t,
                                  write_chars=0 if stalled else int(1e5 * i), read_chars=0,
                                  exit_code=1 if status == "zombie" else None))
            if fault == "exit" and r == bad and i:
                continue
            if stalled:
                frames = (IDLE if r == bad and fault == "hang" else GATHER if r == bad and fault == "desync"
                          else TP_WAIT if partner or (r == bad and fault in ("stopped", "exit")) else DP_WAIT)
            elif slow:
                frames = COMPUTE[i % len(COMPUTE)]
            else:  # stepping: mostly waiting for the slow rank (straggler) or computing (healthy)
                waits = fault == "straggler" and i % 4 != 0
                frames = (TP_WAIT if partner else DP_WAIT) if waits else COMPUTE[(i + r) % len(COMPUTE)]
            out.append(StackSample(time=t, rank=r, pid=pid, threads=(
                ThreadStack(tid=pid, name="MainThread", active=not stalled, frames=frames),)))
        # the collective probe's latest view of both groups
        if fault == "exit" and r == bad:
            continue
        seq_tp = 100 - (r == bad and fault == "hang")
        ops = {100: "allgather"} if fault == "desync" and r == bad else None
        if stalled:
            out.append(_coll(r, t_end, "nccl:0", tp_of[r], seq_tp, inside=partner or r == bad, count=4096, ops=ops,
                             enter=T0 - 2.0))
            out.append(_coll(r, t_end, "nccl:1", dp_of[r], 50, inside=not partner and r != bad, count=1 << 20,
                             enter=T0 - 2.0))
        else:
            lag = 0.25 if slow else 0.0
            out.append(_coll(r, t_end, "nccl:0", tp_of[r], 100, inside=False, count=4096, enter=t_end - 0.05 + lag / 10))
            out.append(_coll(r, t_end, "nccl:1", dp_of[r], 50, inside=False, count=1 << 20, enter=t_end - 0.1))
    return out


def decide(job: Job, obs: list[Observation]) -> Any:
    """The decision step as ``Monitor.decide`` takes it: the learned peers, then every window rule."""
    from scout_sys.consensus import peers, rules

    return rules.decide(job, obs, cadence=rules.WINDOW, window=WINDOW, peers=peers.with_learned(job, obs))
