"""Why a straggler is slow, from its CPU accounting against its peers' (pure: no I/O, no clocks).

Per rank and window (:func:`shares`, from the procfs samples' schedstat and cgroup ``cpu.stat``
counters): the share on a CPU, waiting for one (run queue, quota throttling included) and its
cgroup's throttled share. :func:`cause` turns them into the verdict's cause: throttled (its cgroup's
quota), contended (run-queue delay), input (its stacks in a data loader), compute (it runs more
while its peers wait), else communication.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scout_sys.model import Observation, ProcSample, StackSample

BUSY_FLOOR = 0.20  # fraction of the window
THROTTLE_FLOOR = 0.10  # share of the window throttled beyond the peers' median
CONTENDED_MIN = 0.20  # run-queue share of the window that calls a rank contended (and twice its peers')
INPUT_FRAMES = ("dataloader", "_next_data", "collate", "load_next_batch", "read_batch")


@dataclass(frozen=True)
class Cause:
    """Why a straggler is slow: ``kind`` is throttled | contended | input | compute | communication."""

    kind: str
    text: str
    data: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def label(self) -> str:
        return {"throttled": "starved of CPU (throttled)", "contended": "starved of CPU (contended)",
                "input": "input pipeline"}.get(self.kind, self.kind)


@dataclass(frozen=True)
class CpuShare:
    """One rank's window from procfs: shares of the window on a CPU, waiting for one (run queue,
    including quota throttling), and its cgroup's throttled share with the raw counters."""

    on_cpu: float
    run_queue: float
    throttled: float | None = None
    nr_throttled: int | None = None
    nr_periods: int | None = None
    throttled_s: float | None = None
    seconds: float = 0.0
    quota: float | None = None


def shares(obs: Sequence[Observation], ranks: Sequence[int]) -> dict[int, CpuShare]:
    """Per rank, its :class:`CpuShare` between its first and last /proc sample of ``obs``."""
    by_rank: dict[int, list[ProcSample]] = {}
    ranks = ranks if isinstance(ranks, (set, frozenset)) else set(ranks)  # looked up per sample
    for o in obs:
        if isinstance(o, ProcSample) and o.rank in ranks and o.alive and o.main_cpu_ns is not None:
            by_rank.setdefault(o.rank, []).append(o)
    out = {}
    for r, ps in by_rank.items():
        ps.sort(key=lambda p: p.time)
        a, b = ps[0], ps[-1]
        dt = b.time - a.time
        if dt <= 0 or a.main_cpu_ns is None or b.main_cpu_ns is None:
            continue
        run = ((b.main_delay_ns or 0) - (a.main_delay_ns or 0)) / 1e9 / dt
        thr = nr = per = secs = None
        if a.cg_throttled_ns is not None and b.cg_throttled_ns is not None and b.cg_throttled_ns >= a.cg_throttled_ns:
            secs = (b.cg_throttled_ns - a.cg_throttled_ns) / 1e9
            thr = min(1.0, secs / dt)
            if a.cg_throttled is not None and b.cg_throttled is not None:
                nr = b.cg_throttled - a.cg_throttled
            if a.cg_periods is not None and b.cg_periods is not None:
                per = b.cg_periods - a.cg_periods
        out[r] = CpuShare(max(0.0, (b.main_cpu_ns - a.main_cpu_ns) / 1e9 / dt), max(0.0, run), thr, nr, per, secs,
                          dt, b.cg_quota)
    return out


def cause(shares_: Mapping[int, CpuShare], rank: int, obs: Sequence[Observation] = ()) -> Cause:
    """Why ``rank`` is slow, from its CPU shares against its peers' (and its stacks)."""
    me = shares_.get(rank)
    peers = [s for r, s in shares_.items() if r != rank]
    if me is None or not peers:
        return Cause("communication", "no CPU accounting to tell compute from waiting")
    p_thr = statistics.median(s.throttled or 0.0 for s in peers)
    p_run = statistics.median(s.run_queue for s in peers)
    p_cpu = statistics.median(s.on_cpu for s in peers)
    data: dict[str, Any] = {"on_cpu": round(me.on_cpu, 3), "run_queue": round(me.run_queue, 3),
                            "peers_on_cpu": round(p_cpu, 3), "peers_run_queue": round(p_run, 3)}
    if me.throttled is not None and me.throttled - p_thr > THROTTLE_FLOOR and (me.nr_throttled or 0) > 0:
        data.update(throttled_s=round(me.throttled_s or 0.0, 3), seconds=round(me.seconds, 3),
                    nr_throttled=me.nr_throttled, nr_periods=me.nr_periods, quota_cpus=me.quota,
                    peers_throttled=round(p_thr, 3))
        quota = f" of {me.quota:.2f} CPU" if me.quota else ""
        return Cause("throttled", f"its cgroup's CPU quota{quota} throttled it in {me.nr_throttled} of "
                     f"{me.nr_periods} periods, {me.throttled_s:.2f} s of {me.seconds:.2f} s "
                     f"({100 * me.throttled:.0f}%; peers {100 * p_thr:.0f}%)", data)
    if me.run_queue >= CONTENDED_MIN and me.run_queue > 2 * p_run:
        return Cause("contended", f"its main thread waited for a CPU {100 * me.run_queue:.0f}% of the time "
                     f"(run queue; peers {100 * p_run:.0f}%), on a CPU {100 * me.on_cpu:.0f}%", data)
    frames = _input_share(obs, rank)
    if frames > 0.5:
        data["input_samples"] = round(frames, 2)
        return Cause("input", f"its stacks sit in its input pipeline (data loading) in {100 * frames:.0f}% "
                     "of the samples", data)
    if me.on_cpu > p_cpu + BUSY_FLOOR / 2:
        return Cause("compute", f"its main thread runs {100 * me.on_cpu:.0f}% of the time while its peers run "
                     f"{100 * p_cpu:.0f}% and wait in the collective", data)
    return Cause("communication", f"it neither computes more (on a CPU {100 * me.on_cpu:.0f}%, peers "
                 f"{100 * p_cpu:.0f}%) nor waits for a CPU: it is slow to exchange data", data)


def _input_share(obs: Sequence[Observation], rank: int) -> float:
    hits = n = 0
    for o in obs:
        if isinstance(o, StackSample) and o.rank == rank and not o.native and o.error is None:
            main = o.main()
            if main is None or not main.frames:
                continue
            n += 1
            names = " ".join(f"{getattr(f, 'function', '')} {getattr(f, 'file', '')}".lower() for f in main.frames)
            hits += any(k in names for k in INPUT_FRAMES) or "torch/utils/data" in names
    return hits / n if n else 0.0


def busy_shares(obs: Sequence[Observation], ranks: Sequence[int]) -> dict[int, float]:
    """Per rank, the share of the window its main thread was on a CPU or waiting for one."""
    return {r: min(1.0, s.on_cpu + s.run_queue) for r, s in shares(obs, ranks).items()}
