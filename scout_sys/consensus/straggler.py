"""Straggler rules: the rank every step waits for, from robust statistics across equivalent peers.

Two measures per rank and per window, the first available wins:

- ``lag`` (eBPF collective probe): how long after the first rank this rank enters the same
  collective (same group by its members, collgroups.py; same sequence), median over the window.
  Where no collective spans every rank (dp x tp sub-groups), the rank late in every process group it
  belongs to (straggler_groups.py).
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

from scout_sys.consensus import c3, collgroups, straggler_groups
from scout_sys.consensus.cpushare import (
    BUSY_FLOOR,
    THROTTLE_FLOOR,
    Cause,
    CpuShare,
    busy_shares,
    cause,
    shares,
)
from scout_sys.consensus.leaveone import Sorted
from scout_sys.consensus.peers import work_groups
from scout_sys.model import (
    ATTRIBUTED,
    STRAGGLER,
    CollectiveSample,
    Evidence,
    Incident,
    Job,
    Observation,
    ProcSample,
)
from scout_sys.text import ranks_text

K_MAD = 4.0
LAG_FLOOR = 0.010  # seconds
LAG_FLOOR_OF_PERIOD = 0.15
CONFIRM = 3
MIN_COMMON_COLLECTIVES = 3
# Peers idle (off CPU, outside collectives) for more than this share of the step have slack: a rank
# arriving late only takes time they would have slept anyway (a job paced by its input, or by
# sleeping), so it slows nothing and is not called a straggler — unless it is also busier than they
# are (_absorbed): then its lag is its compute, added to a step whose idle part every rank pays.
SLACK_MAX = 0.20


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
    # lag from sub-groups (straggler_groups.py): the slow process groups the suspect was intersected from
    groups: tuple[str, ...] = field(default=(), hash=False, compare=False)
    # each of those groups' members, as compared (collgroups.py: named by them where the probe read them)
    members: dict[str, tuple[int, ...]] = field(default_factory=dict, hash=False, compare=False)


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
        out.setdefault(rank, []).extend(b - a for a, b in zip(ts, ts[1:]) if b > a)
    return {r: statistics.median(v) for r, v in out.items() if v}


def _lags(obs: Sequence[Observation], ranks: Sequence[int], start: float, end: float,
          names: Mapping[tuple[int, str], str] | None = None) -> tuple[dict[int, float], float | None]:
    """Median arrival lag per rank over collectives entered in [start, end] by every rank, each
    collective compared within its one process group (``names``: consensus/collgroups.py's keys)."""
    wanted = set(ranks)
    mine = [o for o in obs if isinstance(o, CollectiveSample) and o.rank in wanted]
    names = collgroups.keys(obs) if names is None else names
    entries: dict[tuple[str, int], dict[int, float]] = {}
    for o in mine:
        for fp in o.recent:
            if start <= fp.time <= end:
                entries.setdefault((names[(o.rank, o.group)], fp.seq), {})[o.rank] = fp.time
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
    gaps = [b - a for a, b in zip(firsts, firsts[1:]) if b > a]
    period = statistics.median(gaps) if gaps else None
    lags = {r: statistics.median(v) for r, v in per_rank.items()}
    if period and max(lags.values()) > period and not all(collgroups.known(g) for g, _seq in common):
        # In one group a rank cannot arrive a whole interval late: the next collective waits for it.
        # Groups known only by the probe's numbering (members not read) pair up two groups' collectives
        # under one name: not a lag
        return {}, None
    return lags, period


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
    names = collgroups.keys(obs)
    found = [w for w in (_group_verdict(job, g, obs, start, end, names) for g in work_groups(job)) if w.metric]
    if not found:
        return WindowVerdict(start, end, "")
    same = [w for w in found if w.metric == found[0].metric]
    if len(same) == 1:
        return same[0]
    lead = next((w for w in same if w.suspects), same[0])
    values = {r: v for w in same for r, v in w.values.items()}
    suspects = tuple(sorted(r for w in same for r in w.suspects))
    return WindowVerdict(start, end, lead.metric, values, suspects, lead.median, lead.threshold, lead.period,
                         lead.slack, lead.periods, {r: c for w in same for r, c in w.causes.items()},
                         tuple(sorted({g for w in same for g in w.groups})),
                         {g: m for w in same for g, m in w.members.items()})


def _group_verdict(job: Job, group: Sequence[int], obs: Sequence[Observation], start: float,
                   end: float, names: Mapping[tuple[int, str], str] | None = None) -> WindowVerdict:
    live = [r for r in group if r in job.by_rank()]
    if len(live) < 3:
        return WindowVerdict(start, end, "")  # two ranks cannot outvote each other
    w = _primary(live, obs, start, end, names)
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


def _writing_alone(obs: Sequence[Observation], live: Sequence[int]) -> set[int]:
    """Ranks that wrote a checkpoint's worth over the window and more than twice their peers' median
    (write counts include sockets): busy because they write, while the others wait — a pause."""
    from scout_sys.consensus.hang import WRITE_PROGRESS_BYTES

    first: dict[int, int] = {}
    last: dict[int, int] = {}
    wanted = set(live)
    for o in sorted((o for o in obs if isinstance(o, ProcSample) and o.rank in wanted and o.write_chars is not None),
                    key=lambda o: o.time):
        first.setdefault(o.rank, o.write_chars or 0)
        last[o.rank] = o.write_chars or 0
    wrote = {r: last[r] - first[r] for r in last}
    everyone = Sorted(list(wrote.values()))  # each rank's peers: everyone less itself
    out = set()
    for r, w in wrote.items():
        if w >= WRITE_PROGRESS_BYTES and (len(everyone) == 1 or w > 2 * everyone.median_without(w)):
            out.add(r)
    return out


def _primary(live: Sequence[int], obs: Sequence[Observation], start: float, end: float,
             names: Mapping[tuple[int, str], str] | None = None) -> WindowVerdict:
    """``names``: collgroups.keys(obs), when read (once for every group of a window)."""
    names = collgroups.keys(obs) if names is None else names
    lags, period = _lags(obs, live, start, end, names)
    busy = busy_shares(obs, live)
    writers = _writing_alone(obs, live)
    if not lags:
        # no collective entered by every rank (sub-groups: dp x tp): the rank late in each of its groups
        sub = _groups_verdict(live, obs, start, end, busy, names)
        if sub is not None:
            return sub
    if lags:
        sus, med, thr = _outliers(lags, _lag_floor(period))
        slack = _slack(lags, sus, med, period, busy, live)
        if _absorbed(slack, sus, busy, live):
            sus = ()
        lagv = WindowVerdict(start, end, "lag", lags, sus, med, thr, period, slack, periods(obs, start, end))
        if sus or len(busy) != len(live):
            return lagv
        b_sus, b_med, b_thr = _outliers(busy, BUSY_FLOOR)
        b_sus = tuple(r for r in b_sus if r not in writers)  # a checkpoint writer is a pause
        # eBPF may miss the arrivals (a collective it does not see): the busy share still names one
        return (WindowVerdict(start, end, "busy", busy, b_sus, b_med, b_thr, None, None, periods(obs, start, end))
                if b_sus else lagv)
    if len(busy) == len(live):
        sus, med, thr = _outliers(busy, BUSY_FLOOR)
        sus = tuple(r for r in sus if r not in writers)  # a checkpoint writer is a pause
        return WindowVerdict(start, end, "busy", busy, sus, med, thr, None, None, periods(obs, start, end))
    return WindowVerdict(start, end, "")


def _lag_floor(period: float | None) -> float:
    return max(LAG_FLOOR, LAG_FLOOR_OF_PERIOD * (period or 0.0))


def _slack(lags: Mapping[int, float], sus: Sequence[int], med: float, period: float | None,
           busy: Mapping[int, float], live: Sequence[int]) -> float | None:
    """The peers' idle share of the step outside the wait for the suspects (None: not known)."""
    if not (sus and period and len(busy) == len(live)):
        return None
    peers = [r for r in live if r not in sus]
    wait = (max(lags[r] for r in sus) - med) / period
    return 1.0 - statistics.median(busy[r] for r in peers) - wait


def _absorbed(slack: float | None, sus: Sequence[int], busy: Mapping[int, float], live: Sequence[int]) -> bool:
    """The suspects' lag is taken from their peers' slack (SLACK_MAX): a rank late only by phase. Not
    when every suspect is also an outlier of the busy measure (busier than its peers): then it is late because
    it computes while they wait, and a job that sleeps a fixed time each step (or waits for its input)
    pays that lag on top, however idle its peers are besides."""
    if slack is None or slack <= SLACK_MAX:
        return False
    busier = _outliers(busy, BUSY_FLOOR)[0] if len(busy) == len(live) else ()
    return not set(sus) <= set(busier)


def _groups_verdict(live: Sequence[int], obs: Sequence[Observation], start: float, end: float,
                    busy: Mapping[int, float], names: Mapping[tuple[int, str], str] | None = None
                    ) -> WindowVerdict | None:
    """The lag verdict from process sub-groups (straggler_groups.py), when it names a rank."""
    samples: dict[str, list[CollectiveSample]] = {}  # each group's records, in one pass over the window
    names = collgroups.keys(obs) if names is None else names
    wanted = set(live)
    for o in obs:
        if isinstance(o, CollectiveSample) and o.rank in wanted:
            samples.setdefault(names[(o.rank, o.group)], []).append(o)
    per: dict[str, tuple[dict[int, float], float | None]] = {}
    for g, mine in sorted(samples.items()):
        members = sorted({o.rank for o in mine})
        if len(members) >= 2:
            lags, period = _lags(mine, members, start, end, names)
            if lags:
                per[g] = (lags, period)
    floors = {g: _lag_floor(p) for g, (_l, p) in per.items()}
    x = straggler_groups.intersect({g: lags for g, (lags, _p) in per.items()}, floors)
    if x.origin is None:
        return None
    mine_slow = tuple(g for g in x.slow if x.late[g] == x.origin)
    ps = [p for g in mine_slow if (p := per[g][1]) is not None]
    period = statistics.median(ps) if ps else None
    # its lag behind the partners it was late for (in a peer's median over its groups, rank 2's lateness at
    # the dp all-reduce where it had waited for rank 3 in tp would count against it)
    med = statistics.median(v for g in mine_slow for r, v in per[g][0].items() if r != x.origin)
    slack = _slack(x.values, (x.origin,), med, period, busy, live)
    if _absorbed(slack, (x.origin,), busy, live):
        return None
    return WindowVerdict(start, end, "lag", x.values, (x.origin,), med, med + min(floors[g] for g in mine_slow),
                         period, slack, periods(obs, start, end), groups=mine_slow,
                         members={g: tuple(sorted(per[g][0])) for g in mine_slow})


def groups_evidence(w: WindowVerdict, r: int) -> list[Evidence]:
    """Which slow process groups a sub-group lag verdict intersected (none for the other verdicts)."""
    if not w.groups or r not in w.suspects:
        return []
    return [Evidence("ebpf", f"rank {r} arrives last in every process group it belongs to, "
                     f"{' and '.join(collgroups.label(g, w.members.get(g, ())) for g in w.groups)}: "
                     "the intersection of the slow groups", rank=r,
                     data={"groups": list(w.groups), "members": {g: list(w.members.get(g, ())) for g in w.groups}})]


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
    ev += [e for r in ranks for e in groups_evidence(w, r)]
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
