"""Whole-job consensus at scale: ``consensus.hang.analyze`` over synthetic observations of 1k, 8k and
64k ranks (no processes; pure consensus, the input a cluster leader merges from its agents).

Three shapes, 3 samples per rank, 8 ranks per host:

- ``one idle``: every rank waits in all_reduce but one, stuck in its data loader (one peer group);
- ``common mode``: every rank waits (the origin is not among them): nobody is named;
- ``layout tp=8``: tensor-parallel groups of 8 (``--topology tp=8,dp=-1``), one rank stopped.

Then the layout read from learned process groups (``consensus/peers.py``: tp=8 x dp x pp=4, its tp, dp,
pp and world groups, as probes/pgroups.py would learn them) and the straggler groups derived from it.

Prints seconds per shape and size and the time per rank, whose ratio 64k / 1k says whether the
cost grows linearly (about 1) or faster. Target: a 64k-rank verdict within 1 s of consensus time on
the leader (see benchmarks/cluster_scale.py for the path from per-rank activities).
"""

from __future__ import annotations

import argparse
import sys
import time

from scout_sys.consensus import hang
from scout_sys.job import with_layout
from scout_sys.model import Frame, Job, Observation, ProcSample, Rank, StackSample, ThreadStack

T0 = 1_000_000.0
SP = "/venv/lib/python3.11/site-packages/"
TRAIN = "/jobs/train.py"


def _stack(*frames: tuple[str, str, int]) -> tuple[Frame, ...]:
    return tuple(Frame(function=f, file=p, line=ln) for f, p, ln in frames)


WAIT_AR = _stack(("all_reduce", SP + "torch/distributed/distributed_c10d.py", 3252),
                 ("wrapper", SP + "torch/distributed/c10d_logger.py", 83), ("step", TRAIN, 42), ("<module>", TRAIN, 90))
IDLE = _stack(("load_batch", TRAIN, 12), ("step", TRAIN, 30), ("<module>", TRAIN, 90))


def job_of(n: int, per_host: int = 8, topology: str | None = None) -> Job:
    ranks = tuple(Rank(rank=r, pid=1000 + r, host=f"node{r // per_host}", local_rank=r % per_host, world_size=n)
                  for r in range(n))
    job = Job(ranks=ranks, world_size=n, launcher="torchrun", launcher_pid=999, host="node0")
    return with_layout(job, topology) if topology else job


def observations(n: int, *, idle: int | None = None, stopped: int | None = None, samples: int = 3) -> list[Observation]:
    out: list[Observation] = []
    for r in range(n):
        frames = IDLE if r == idle else WAIT_AR
        status = "stopped" if r == stopped else "sleeping"
        for i in range(samples):
            t = T0 + i
            out.append(ProcSample(time=t, rank=r, pid=1000 + r, status=status, cpu_time=0.0, main_cpu_ns=0,
                                  main_last_ran=T0 - 10, write_chars=0, read_chars=0))
            out.append(StackSample(time=t, rank=r, pid=1000 + r, threads=(
                ThreadStack(tid=1000 + r, name="MainThread", active=False, frames=frames),)))
    return out


SHAPES = {
    "one idle": (lambda n: job_of(n), lambda n: observations(n, idle=n // 3), "hang", (lambda n: (n // 3,))),
    "common mode": (lambda n: job_of(n), lambda n: observations(n), "hang", (lambda n: ())),
    "layout tp=8": (lambda n: job_of(n, topology="tp=8,dp=-1"), lambda n: observations(n, stopped=n // 3 + 1),
                    "process_stall", (lambda n: (n // 3 + 1,))),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,8192,65536")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    ok = True
    for name, (mk_job, mk_obs, kind, origin) in SHAPES.items():
        per_rank = {}
        for n in sizes:
            job, obs = mk_job(n), mk_obs(n)
            t = time.process_time()
            incidents, _, _ = hang.analyze(job, obs, window=(T0, T0 + 2))
            dt = time.process_time() - t
            per_rank[n] = dt / n
            named = [i.ranks for i in incidents if i.kind == kind]
            right = named == [origin(n)] or (origin(n) == () and not any(i.ranks for i in incidents))
            ok &= right
            print(f"consensus {name:>12} {n:>6} ranks: {dt:6.3f} CPU s ({1e6 * dt / n:5.1f} us/rank)"
                  f"{'' if right else '  WRONG VERDICT: ' + repr([(i.kind, i.ranks) for i in incidents])}",
                  flush=True)
        lo, hi = min(sizes), max(sizes)
        print(f"consensus {name:>12} growth: time per rank at {hi} / at {lo} = {per_rank[hi] / per_rank[lo]:.2f} "
              "(1.0 = linear)")
    for n in sizes:
        ok &= _peers(n)
    return 0 if ok else 1


def learned_groups(n: int, tp: int = 8, pp: int = 4) -> tuple[tuple[int, ...], ...]:
    dp = n // tp // pp
    groups = [tuple(range(b, b + tp)) for b in range(0, n, tp)]
    groups += [tuple(p * tp * dp + t + tp * d for d in range(dp)) for p in range(pp) for t in range(tp)]
    groups += [tuple(s + tp * dp * k for k in range(pp)) for s in range(tp * dp)]
    return (*groups, tuple(range(n)))


def _peers(n: int) -> bool:
    from scout_sys.consensus import peers
    from scout_sys.model import ProcessGroupSample

    job, sample = job_of(n), ProcessGroupSample(time=T0, groups=learned_groups(n))
    t = time.process_time()
    learned = peers.with_learned(job, [sample])
    work = peers.work_groups(learned)
    dt = time.process_time() - t
    right = len(learned.peer_groups) == 8 * 4 and len(work) == 4 and peers.is_learned(learned)
    print(f"peers from learned groups {n:>6} ranks: {dt:6.3f} CPU s ({1e6 * dt / n:5.1f} us/rank)"
          f"{'' if right else '  WRONG LAYOUT: ' + learned.layout}", flush=True)
    return right


if __name__ == "__main__":
    sys.exit(main())
