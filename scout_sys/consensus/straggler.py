"""Straggler rules: the rank every step waits for, from robust statistics across equivalent peers.

Two measures per rank and per window, the first available wins:

- ``lag`` (eBPF collective probe): how long after the first rank this rank enters the same
  collective (same group, same sequence number), median over the window. The straggler arrives last.
- ``busy`` (procfs): the fraction of the window the rank's main thread was on a CPU or waiting for
  one (schedstat: on-CPU + run-queue time, which includes CPU-quota throttling). Peers of a
  straggler sleep in the collective waiting for it; the straggler waits least.

- ``throttle`` (procfs, cgroup ``cpu.stat``): the share of the window its CPU cgroup's quota held it
  throttled. Used when the measures above name nobody (an eBPF lag hidden by slack): a rank throttled
  while its peers are not, and busier than they are, is the one they wait for.

Each suspect gets a **cause** (:func:`cause`): starved of CPU (throttled by its cgroup's quota, or
contended: its main thread waits in the run queue), input pipeline (its stacks sit in a data loader),
compute (its main thread runs more than its peers', which wait in the collective), else communication.

A rank is an outlier in a window when its measure exceeds the peers' median by more than
``max(K_MAD * 1.4826 * MAD, floor)``; C3 then needs a strict majority of non-outliers. A straggler
incident needs the same rank(s) in ``CONFIRM`` consecutive windows, so one slow step (a checkpoint,
a garbage collection) opens nothing.

Pure: no I/O, no clocks.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scout_sys.consensus import c3
from scout_sys.consensus.peers import work_groups
from scout_sys.model import (
    ATTRIBUTED,
    INCONCLUSIVE,
    STRAGGLER,
    CollectiveSample,
    Evidence,
    Incident,
    Job,
    Observation,
    ProcSample,
    StackSample,
)
from scout_sys.text import ranks_text

K_MAD = 4.0
BUSY_FLOOR = 0.20  # fraction of the window
LAG_FLOOR = 0.010  # seconds
LAG_FLOOR_OF_PERIOD = 0.15
CONFIRM = 3
MIN_COMMON_COLLECTIVES = 3
# Peers idle (off CPU, outside collectives) for more than this share of the step have slack: a rank
# arriving late only takes time they would have slept anyway (a job paced by its input, or by
# sleeping), so it slows nothing and is not called a straggler.
SLACK_MAX = 0.20
THROTTLE_FLOOR = 0.10  # share of the window throttled beyond the peers' median
CONTENDED_MIN = 0.20  # run-queue share of the window that calls a rank contended (and twice its peers')
INPUT_FRAMES = ("dataloader", "_next_data", "collate", "load_next_batch", "read_batch")


@dataclass(frozen=True)
class WindowVerdict:
    """One window's outliers (possibly none) and the numbers behind them."""

    start: float
    end: float
    metric: str  # "lag" | "busy" | ""
    values: dict[int, float] = field(default_factory=dict, hash=False, compare=False)
    suspects: tuple[int, ...] = ()
    median: float = 0.0
    threshold: float = 0.0
    period: float | None = None  # eBPF: median time between collectives
    slack: float | None = None  # peers' idle share outside collectives (lag metric, with procfs data)
    periods: dict[int, float] = field(default_factory=dict, hash=False, compare=False)  # per rank
    causes: dict[int, Cause] = field(default_factory=dict, hash=False, compare=False)  # per suspect


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


def periods(obs: Sequence[Observation], start: float, end: float) -> dict[int, float]:
    """Per rank, the median time between its successive collective entries in [start, end]."""
    seen: dict[tuple[int, str], dict[int, float]] = {}
    for o in obs:
        if isinstance(o, CollectiveSample):
            for fp in o.recent:
                if start <= fp.time <= end:
                    seen.setdefault((o.rank, o.group), {})[fp.seq] = fp.time
    out: dict[int, list[float]] = {}
    for (rank, _g), by_seq in seen.items():
        ts = sorted(by_seq.values())
        out.setdefault(rank, []).extend(b - a for a, b in zip(ts, ts[1:], strict=False) if b > a)
    return {r: statistics.median(v) for r, v in out.items() if v}


def _lags(obs: Sequence[Observation], ranks: Sequence[int], start: float, end: float
          ) -> tuple[dict[int, float], float | None]:
    """Median arrival lag per rank over collectives entered in [start, end] by every rank."""
    entries: dict[tuple[str, int], dict[int, float]] = {}
    for o in obs:
        if not isinstance(o, CollectiveSample) or o.rank not in ranks:
            continue
        for fp in o.recent:
            if start <= fp.time <= end:
                entries.setdefault((o.group, fp.seq), {})[o.rank] = fp.time
    common = {k: v for k, v in entries.items() if len(v) == len(ranks)}
    if len(common) < MIN_COMMON_COLLECTIVES:
        return {}, None
    per_rank: dict[int, list[float]] = {r: [] for r in ranks}
    firsts = []
    for times in common.values():
        first = min(times.values())
        firsts.append(first)
        for r, t in times.items():
            per_rank[r].append(t - first)
    firsts.sort()
    gaps = [b - a for a, b in zip(firsts, firsts[1:], strict=False) if b > a]
    period = statistics.median(gaps) if gaps else None
    return {r: statistics.median(v) for r, v in per_rank.items()}, period


def shares(obs: Sequence[Observation], ranks: Sequence[int]) -> dict[int, CpuShare]:
    """Per rank, its :class:`CpuShare` between its first and last /proc sample of ``obs``."""
    by_rank: dict[int, list[ProcSample]] = {}
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


def _busy(obs: Sequence[Observation], ranks: Sequence[int]) -> dict[int, float]:
    by_rank: dict[int, list[ProcSample]] = {}
    for o in obs:
        if isinstance(o, ProcSample) and o.rank in ranks and o.alive and o.main_cpu_ns is not None:
            by_rank.setdefault(o.rank, []).append(o)
    out = {}
    for r, ps in by_rank.items():
        ps.sort(key=lambda p: p.time)
        a, b = ps[0], ps[-1]
        dt = b.time - a.time
        if dt <= 0 or b.main_cpu_ns is None or a.main_cpu_ns is None:
            continue
        ns = (b.main_cpu_ns - a.main_cpu_ns) + ((b.main_delay_ns or 0) - (a.main_delay_ns or 0))
        out[r] = min(1.0, max(0.0, ns / 1e9 / dt))
    return out


def _outliers(values: Mapping[int, float], floor: float) -> tuple[tuple[int, ...], float, float]:
    med = statistics.median(values.values())
    mad = statistics.median(abs(v - med) for v in values.values())
    threshold = med + max(K_MAD * 1.4826 * mad, floor)
    flagged = {r: v > threshold for r, v in values.items()}
    vote = c3.vote(flagged)
    if vote.attributed and vote.signature is False:
        return vote.minority, med, threshold
    return (), med, threshold


def window_verdict(job: Job, obs: Sequence[Observation], start: float, end: float) -> WindowVerdict:
    """The outliers of one window, within each group of ranks that do the same work
    (consensus/peers.py: a pipeline's stages apart). Groups judged by the same measure are merged:
    their values side by side, the median and threshold of the first group with an outlier."""
    found = [w for w in (_group_verdict(job, g, obs, start, end) for g in work_groups(job)) if w.metric]
    if not found:
        return WindowVerdict(start, end, "")
    same = [w for w in found if w.metric == found[0].metric]
    if len(same) == 1:
        return same[0]
    lead = next((w for w in same if w.suspects), same[0])
    values = {r: v for w in same for r, v in w.values.items()}
    suspects = tuple(sorted(r for w in same for r in w.suspects))
    return WindowVerdict(start, end, lead.metric, values, suspects, lead.median, lead.threshold, lead.period,
                         lead.slack, lead.periods, {r: c for w in same for r, c in w.causes.items()})


def _group_verdict(job: Job, group: Sequence[int], obs: Sequence[Observation], start: float,
                   end: float) -> WindowVerdict:
    live = [r for r in group if r in job.by_rank()]
    if len(live) < 3:
        return WindowVerdict(start, end, "")  # two ranks cannot outvote each other
    w = _primary(live, obs, start, end)
    cpu = shares(obs, live)
    if not w.suspects and len(cpu) == len(live):
        t = _throttle_verdict(cpu, live, start, end)
        if t is not None:
            w = replace(t, periods=periods(obs, start, end))
    if w.suspects and len(cpu) == len(live):
        w = replace(w, causes={r: cause(cpu, r, obs) for r in w.suspects})
    return w


def _throttle_verdict(cpu: Mapping[int, CpuShare], live: Sequence[int], start: float, end: float
                      ) -> WindowVerdict | None:
    """The ranks throttled by their cgroup while their peers are not, and busier than them (waiting
    for a CPU counts): the ones the peers wait for, when the other measures name nobody."""
    thr = {r: cpu[r].throttled for r in live}
    if any(v is None for v in thr.values()):
        return None
    values = {r: float(v or 0.0) for r, v in thr.items()}
    sus, med, threshold = _outliers(values, THROTTLE_FLOOR)
    busy = {r: cpu[r].on_cpu + cpu[r].run_queue for r in live}
    peers = [r for r in live if r not in sus]
    if not sus or not peers:
        return None
    p_busy = statistics.median(busy[r] for r in peers)
    if not all(busy[r] > p_busy + BUSY_FLOOR for r in sus):
        return None
    return WindowVerdict(start, end, "throttle", values, sus, med, threshold)


def _primary(live: Sequence[int], obs: Sequence[Observation], start: float, end: float) -> WindowVerdict:
    lags, period = _lags(obs, live, start, end)
    busy = _busy(obs, live)
    if lags:
        floor = max(LAG_FLOOR, LAG_FLOOR_OF_PERIOD * (period or 0.0))
        sus, med, thr = _outliers(lags, floor)
        slack = None
        if sus and period and len(busy) == len(live):
            peers = [r for r in live if r not in sus]
            wait = (max(lags[r] for r in sus) - med) / period
            slack = 1.0 - statistics.median(busy[r] for r in peers) - wait
            if slack > SLACK_MAX:
                sus = ()
        lagv = WindowVerdict(start, end, "lag", lags, sus, med, thr, period, slack, periods(obs, start, end))
        if sus or len(busy) != len(live):
            return lagv
        b_sus, b_med, b_thr = _outliers(busy, BUSY_FLOOR)
        # eBPF may miss the arrivals (a collective it does not see): the busy share still names one
        return (WindowVerdict(start, end, "busy", busy, b_sus, b_med, b_thr, None, None, periods(obs, start, end))
                if b_sus else lagv)
    if len(busy) == len(live):
        sus, med, thr = _outliers(busy, BUSY_FLOOR)
        return WindowVerdict(start, end, "busy", busy, sus, med, thr, None, None, periods(obs, start, end))
    return WindowVerdict(start, end, "")


def confirm(job: Job, history: Sequence[WindowVerdict], k: int = CONFIRM) -> Incident | None:
    """A straggler incident when the last ``k`` windows name the same rank(s)."""
    if len(history) < k:
        return None
    last = history[-k:]
    common = set(last[0].suspects)
    for w in last[1:]:
        common &= set(w.suspects)
    if not common:
        return None
    ranks = tuple(sorted(common))
    w = last[-1]
    peers = [r for r in w.values if r not in common]
    src = "ebpf" if w.metric == "lag" else "procfs"
    ev: list[Evidence] = []
    for r in ranks:
        vals = [round(x.values.get(r, 0.0), 4) for x in last]
        ev.append(Evidence(src, _rank_text(w, r), rank=r,
                           data={"metric": w.metric, "values": vals, "peer_median": round(w.median, 4),
                                 "threshold": round(w.threshold, 4)}))
    ev.append(Evidence(src,
                       f"{len(peers)} peers: median {_fmt(w.metric, w.median)}",
                       data={"per_rank": {str(r): round(v, 4) for r, v in sorted(w.values.items())}}))
    ev += _cause_evidence(w, ranks)
    ev += _compared(job, ranks, w)
    return Incident(
        kind=STRAGGLER,
        status=ATTRIBUTED,
        ranks=ranks,
        hosts=tuple(sorted({job.host_of(r) for r in ranks})),
        since=last[0].start,
        summary=_summary(w, ranks, k) + _cause_suffix(w, ranks),
        evidence=tuple(ev),
    )


def _cause_evidence(w: WindowVerdict, ranks: Sequence[int]) -> list[Evidence]:
    return [Evidence("procfs", f"cause: {c.label}: rank {r}: {c.text}", rank=r, data={"cause": c.kind, **c.data})
            for r in ranks if (c := w.causes.get(r)) is not None]


def _cause_suffix(w: WindowVerdict, ranks: Sequence[int]) -> str:
    cs = [w.causes[r] for r in ranks if r in w.causes]
    if not cs:
        return ""
    return f"; cause: {cs[0].label}: {cs[0].text}"


def _compared(job: Job, ranks: Sequence[int], w: WindowVerdict) -> list[Evidence]:
    """Which ranks the straggler was compared with, and where that grouping came from."""
    if not job.peer_groups:
        return []
    group = next((g for g in work_groups(job) if set(ranks) <= set(g)), ())
    peers = [r for r in group if r not in ranks and r in w.values]
    if not peers:
        return []
    return [Evidence("procfs", f"compared with ranks {', '.join(map(str, peers))}, which do the same work "
                     f"(layout: {job.layout})", data={"peers": peers, "layout": job.layout})]


def _fmt(metric: str, v: float) -> str:
    if metric == "throttle":
        return f"{v * 100:.0f}% throttled"
    return f"{v * 1000:.0f} ms late" if metric == "lag" else f"{v * 100:.0f}% busy"


def _rank_text(w: WindowVerdict, r: int) -> str:
    v = w.values.get(r, 0.0)
    if w.metric == "lag":
        return f"rank {r} enters collectives {v * 1000:.0f} ms after the first rank (peers: {w.median * 1000:.0f} ms)"
    if w.metric == "throttle":
        return (f"rank {r}'s CPU cgroup was throttled {v * 100:.0f}% of the time; its peers' "
                f"{w.median * 100:.0f}% (and it was busier than they were)")
    return (f"rank {r}'s main thread is on or waiting for a CPU {v * 100:.0f}% of the time; "
            f"its peers {w.median * 100:.0f}% (they sleep waiting for it)")


def _summary(w: WindowVerdict, ranks: tuple[int, ...], k: int) -> str:
    who = ranks_text(ranks)
    worst = max(w.values.get(r, 0.0) for r in ranks)
    if w.metric == "lag" and w.period:
        slow = (worst - w.median) / w.period
        return (f"{who} is a straggler: every collective waits {(worst - w.median) * 1000:.0f} ms for it, "
                f"about {100 * slow:.0f}% of a {w.period * 1000:.0f} ms step, in {k} windows in a row")
    if w.metric == "lag":
        return f"{who} is a straggler: it enters collectives {(worst - w.median) * 1000:.0f} ms after its peers"
    if w.metric == "throttle":
        return (f"{who} is a straggler: its CPU quota throttled it {worst * 100:.0f}% of the time while its "
                f"peers were throttled {w.median * 100:.0f}%, in {k} windows in a row")
    return (f"{who} is a straggler: busy {worst * 100:.0f}% of the time while its peers are busy "
            f"{w.median * 100:.0f}% and wait for it the rest, in {k} windows in a row")


# ---- one window (``diagnose``): the rank the others keep waiting for

WAITED_MIN = 0.5  # share of stack samples in which a strict majority must be found waiting
# A straggler passes through its own collectives too, briefly: a sample may catch it there (at most
# one in four; never with fewer than four samples).
SELDOM = 4


def never_waiting(job: Job, obs: Sequence[Observation], acts: Mapping[int, Any]
                  ) -> dict[int, tuple[int, int, str, int]]:
    """From the window's stack samples: ranks that were (almost) never found waiting while a strict majority of
    their peers — themselves progressing (their stacks move) — was found waiting in more than
    ``WAITED_MIN`` of the samples, in a collective (Gloo) or at their common sync point (the GPU shape);
    peers found in collectives at every sample count as progressing when they exchanged data.
    Only a rank that progresses itself (``running``, not writing a checkpoint) counts: a stuck one is a
    hang. Returns rank -> (samples in which the majority waited, samples, where they waited, samples in
    which the rank itself was found waiting)."""
    from scout_sys.consensus.hang import location_of, untorn
    from scout_sys.consensus.patterns import collective_of

    reads: dict[int, list[Any]] = {}
    for o in sorted((o for o in obs if isinstance(o, StackSample) and not o.native and o.error is None),
                    key=lambda s: s.time):
        main = o.main()
        if main is not None and main.frames:
            reads.setdefault(o.rank, []).append((o, main))
    stacks: dict[int, list[Any]] = {}
    for rank, rs in reads.items():
        for _o, main in untorn(rs):
            w = collective_of(main.frames)
            stacks.setdefault(rank, []).append(("coll", w.op, w.site) if w else ("place", location_of(main.frames)))
    out: dict[int, tuple[int, int, str, int]] = {}
    for group in work_groups(job):
        ranks = [r for r in group if len(stacks.get(r, ())) >= 3]
        if len(ranks) < 3:
            continue
        k = min(len(stacks[r]) for r in ranks)
        keys = [x for r in ranks for x in stacks[r][:k]]
        wait_key = max(set(keys), key=keys.count)  # where the group spends its time: the wait
        waits = {r: [x == wait_key or x[0] == "coll" for x in stacks[r][:k]] for r in ranks}
        waited = sum(sum(waits[r][i] for r in ranks) * 2 > len(ranks) for i in range(k))
        if waited <= WAITED_MIN * k:
            continue
        where = f"in {wait_key[1]} at {wait_key[2]}" if wait_key[0] == "coll" else "at their common sync point"
        for r in ranks:
            a = acts.get(r)
            peers = [p for p in ranks if p != r]
            own = sum(waits[r])
            if own * SELDOM > k or a is None or a.state != "running" or _writes_alone(a, [acts.get(p) for p in peers]):
                continue
            if sum(_moving(acts.get(p)) for p in peers) * 2 > len(peers):
                out[r] = (waited, k, where, own)
    return out


def _moving(a: Any) -> bool:
    """Progressing: its stack moves, or it is found in collectives each time but exchanged data over the
    window (a hung Gloo peer writes nothing while it waits)."""
    # (DDP's peers wait inside backward, found at one place each sample: they exchanged data each step)
    return a is not None and (a.state == "running" or (a.state in ("waiting", "idle") and a.wrote > 0))


def _writes_alone(a: Any, peers: Sequence[Any]) -> bool:
    """The rank wrote enough to be progressing (a checkpoint) and more than twice what its peers wrote:
    write counts include the sockets, and every rank sends its share of the collectives' data."""
    from scout_sys.consensus.hang import WRITE_PROGRESS_BYTES

    theirs = [p.wrote for p in peers if p is not None]
    return a.wrote >= WRITE_PROGRESS_BYTES and (not theirs or a.wrote > 2 * statistics.median(theirs))


def measures(job: Job, obs: Sequence[Observation], start: float, end: float
             ) -> tuple[dict[int, list[WindowVerdict]], dict[int, Cause]]:
    """Every continuous measure of one window, each on its own: per rank, the verdicts (lag, busy,
    throttle) that name it an outlier among the ranks doing the same work; and each such rank's cause."""
    named: dict[int, list[WindowVerdict]] = {}
    causes: dict[int, Cause] = {}
    for g in work_groups(job):
        live = [r for r in g if r in job.by_rank()]
        if len(live) < 3:
            continue
        cpu = shares(obs, live)
        found: list[WindowVerdict] = []
        lags, period = _lags(obs, live, start, end)
        busy = _busy(obs, live)
        if lags:
            lag = _primary(live, obs, start, end)
            if lag.metric == "lag":
                found.append(lag)
        if len(busy) == len(live):
            sus, med, thr = _outliers(busy, BUSY_FLOOR)
            found.append(WindowVerdict(start, end, "busy", busy, sus, med, thr))
        if len(cpu) == len(live):
            t = _throttle_verdict(cpu, live, start, end)
            if t is not None:
                found.append(t)
        for w in found:
            for r in w.suspects:
                named.setdefault(r, []).append(w)
                if r not in causes and len(cpu) == len(live):
                    causes[r] = cause(cpu, r, obs)
    return named, causes


def in_window(job: Job, obs: Sequence[Observation], acts: Mapping[int, Any], window: tuple[float, float]
              ) -> tuple[list[Incident], list[str]]:
    """``diagnose``'s straggler, from one window: attributed when two measures agree — the stack samples
    (it never waited while the majority did), the collective arrival lag (eBPF), the main thread's busy
    share (schedstat: on a CPU or waiting for one) and the cgroup's throttled share (cpu.stat), each an
    outlier among the ranks doing the same work by the same robust vote. One continuous measure alone
    gives an inconclusive straggler; the stack samples alone, the weakest, a note. The verdict says the cause. Returns (incidents, notes)."""
    seen = never_waiting(job, obs, acts)
    named, causes = measures(job, obs, window[0], window[1])
    out: list[Incident] = []
    notes: list[str] = []
    for r in sorted(set(named) | set(seen)):
        ev: list[Evidence] = []
        if r in seen:
            waited, k, where, own = seen[r]
            ev.append(Evidence("stack", f"rank {r} was "
                               f"{'never found waiting' if not own else f'found waiting in only {own} of {k} samples'}"
                               f" while a strict majority of its peers waited {where} in {waited} of {k} stack samples",
                               rank=r, data={"samples": k, "majority_waiting": waited}))
        ws = named.get(r, [])
        for w in ws:
            ev.append(Evidence("ebpf" if w.metric == "lag" else "procfs", _rank_text(w, r), rank=r,
                               data={"metric": w.metric, "value": round(w.values[r], 4),
                                     "peer_median": round(w.median, 4), "threshold": round(w.threshold, 4)}))
        c = causes.get(r)
        if c is not None:
            ev.append(Evidence("procfs", f"cause: {c.label}: {c.text}", rank=r, data={"cause": c.kind, **c.data}))
        w0 = ws[0] if ws else None
        ev += _compared(job, (r,), w0) if w0 is not None else []
        n = len(ws) + (r in seen)
        how = (f"{_fmt(w0.metric, w0.values.get(r, 0.0))}; peers {_fmt(w0.metric, w0.median)}" if w0 is not None
               else "its peers wait for it")
        because = f"; cause: {c.label}" if c is not None else ""
        a = acts.get(r)
        if ws and a is not None and _writes_alone(a, [acts.get(p) for p in acts if p != r]):
            notes.append(f"rank {r} is busier than its peers while it writes alone (a checkpoint): a pause, "
                         "not a straggler")
            continue
        if not ws:
            # the stack samples alone are the weakest measure (a healthy rank that logs or reads its
            # next batch at each sample looks the same): a note, as before
            notes.append(f"possible straggler (stack samples only, not enough to name it): {ev[0].text}")
            continue
        if n >= 2:
            waits = f" and it {'never' if not seen[r][3] else 'seldom'} waits" if r in seen else ""
            summary = f"rank {r} is a straggler: its peers wait for it ({how}){waits}{because}"
            status = ATTRIBUTED
        else:
            summary = (f"rank {r} may be a straggler ({how}{because}), by one measure only "
                       f"({'stack samples' if r in seen else w0.metric if w0 else ''}): not enough to name it")
            status = INCONCLUSIVE
        # an inconclusive incident names no origin (its ranks are empty); the suspect is in the summary
        out.append(Incident(kind=STRAGGLER, status=status, ranks=(r,) if status == ATTRIBUTED else (),
                            hosts=(job.host_of(r),), since=window[0], summary=summary, evidence=tuple(ev)))
    return out, notes
