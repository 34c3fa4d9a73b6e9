"""``diagnose``'s straggler from one window: every measure on its own (stack samples, eBPF arrival
lag, busy share, throttled share), two agreeing name the rank, one alone is inconclusive; the verdict
says the cause (consensus/cpushare.py). Pure: no I/O, no clocks."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from scout_sys.consensus import c3, collgroups
from scout_sys.consensus.cpushare import BUSY_FLOOR, Cause, busy_shares, cause, shares
from scout_sys.consensus.leaveone import Others, Sorted
from scout_sys.consensus.peers import work_groups
from scout_sys.consensus.straggler import (
    WindowVerdict,
    _compared,
    _fmt,
    _outliers,
    _primary,
    _rank_text,
    _throttle_verdict,
    groups_evidence,
)
from scout_sys.model import (
    ATTRIBUTED,
    INCONCLUSIVE,
    STRAGGLER,
    Evidence,
    Incident,
    Job,
    Observation,
    StackSample,
)

# ---- one window (``diagnose``): the rank the others keep waiting for

WAITED_MIN = 0.4  # share of stack samples in which a rank's peers (their median) must be found waiting
# (peers of a rank with 4x the work wait 3/4 of the time; on a loaded host, half)
# A straggler passes through its own collectives too, briefly (its own all-reduce; on a loaded host,
# a peer not yet scheduled): a sample catches it there up to a third of the time. It waits at most half
# as often as its typical peer.
SELDOM = 2
# The stack samples backing another measure that already names the rank (its busy share, its lag): it
# waited least of its group and at most two thirds as often as its typical peer. A 4x compute straggler
# waits in ~15% of the samples and its peers in ~65%: with 13 samples the strict ratio above misses it
# about one window in twenty (own 5 of 13 against 9), this one about one in sixty; a healthy rank passes
# it about one window in eight, and then only beside a busy share that already names it.
BACKING = 1.5
# ... and its peers, found waiting in more than this share of the samples (not WAITED_MIN): beside a busy
# share that names the rank, peers that sleep or log part of each step besides waiting for it still back it.
# A real dp=2 x tp=2 straggler 62% busy (peers 5%) leaves its peers waiting ~55% of the time, at most
# 5 of 13 samples about one window in six on a loaded host: under WAITED_MIN, never under this bar.
BACKING_WAITED = 0.3
# The share of its samples the group's median rank is found inside collectives in, from which the collectives
# are where it waits, whatever place holds more samples (a 4x straggler's peers on a loaded host: ~45%;
# the GPU shape's enqueue-only collectives: a sample now and then)
COLL_USUAL = 0.25


def never_waiting(job: Job, obs: Sequence[Observation], acts: Mapping[int, Any],
                  waits: Mapping[int, tuple[float, int, str, int, Sequence[int]]] | None = None,
                  seldom: float = SELDOM, waited_min: float = WAITED_MIN) -> dict[int, tuple[float, int, str, int]]:
    """From the window's stack samples: ranks found waiting at most half as often as their peers (the median),
    who — themselves progressing (their stacks move), a strict majority of them — were found waiting in more
    than ``waited_min`` of the samples, in a collective (Gloo) or at their common sync point (the GPU shape);
    peers found in collectives at every sample count as progressing when they exchanged data.
    Only a rank that progresses itself counts — its stack moves (``running``), or it computes at one place
    every sample (``busy``: a heavy straggler's 13 samples all land in its compute about one window in
    twenty) while its peers progress, which a hung rank never lets them — and not while it writes a
    checkpoint. Returns rank -> (samples in which its peers were found waiting, their median; samples; where
    they waited; samples in which the rank itself was found waiting). ``waits``: :func:`stack_waits`, when
    read; ``seldom``: how many times more often than the rank its typical peer must have waited."""
    out: dict[int, tuple[float, int, str, int]] = {}
    groups: dict[int, tuple[Sorted, int]] = {}  # per group (its ranks' id): its ranks' writes, how many move
    for r, (waited, k, where, own, peers) in (stack_waits(job, obs) if waits is None else waits).items():
        a = acts.get(r)
        if waited <= waited_min * k or own * seldom > waited:
            continue
        if a is None or a.state not in ("running", "busy"):
            continue
        if isinstance(peers, Others):  # the group's sums once, each rank's peers as the group less the rank
            key = id(peers.ranks)
            if key not in groups:
                there = [x for p in peers.ranks if (x := acts.get(p)) is not None]
                groups[key] = (Sorted([x.wrote for x in there]), sum(map(_moving, there)))
            wrote, moving = groups[key]
            if _writes_more(a, wrote.median_without(a.wrote) if len(wrote) > 1 else None):
                continue
            moving -= _moving(a)
        else:
            if _writes_alone(a, [acts.get(p) for p in peers]):
                continue
            moving = sum(_moving(acts.get(p)) for p in peers)
        if c3.strict_majority(moving, len(peers)):
            out[r] = (waited, k, where, own)
    return out


def stack_waits(job: Job, obs: Sequence[Observation]) -> dict[int, tuple[float, int, str, int, Sequence[int]]]:
    """Per rank with stack samples enough (3, in a group of 3 such ranks at least): (samples in which its
    peers were found waiting, their median; samples; where the group waits; samples in which the rank itself
    was found waiting; those peers). The same count for every rank of a group: its first ``k`` untorn
    samples."""
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
    out: dict[int, tuple[float, int, str, int, Sequence[int]]] = {}
    for group in work_groups(job):
        ranks = [r for r in group if len(stacks.get(r, ())) >= 3]
        if len(ranks) < 3:
            continue
        k = min(len(stacks[r]) for r in ranks)
        wait_key = _wait_place([stacks[r][:k] for r in ranks])
        own = {r: sum(x == wait_key or x[0] == "coll" for x in stacks[r][:k]) for r in ranks}
        where = f"in {wait_key[1]} at {wait_key[2]}" if wait_key[0] == "coll" else "at their common sync point"
        counts = Sorted(list(own.values()))
        for i, r in enumerate(ranks):
            # its peers' waits, never its own: the rank they wait for is no part of "the group waits"
            out[r] = (counts.median_without(own[r]), k, where, own[r], Others(ranks, r, i))
    return out


def _wait_place(per_rank: Sequence[Sequence[tuple]]) -> tuple:
    """Where the group waits: the place most ranks spend most of their samples at (each rank's own
    commonest place, then the most samples), every collective counted as one place. Counting samples
    alone picks a straggler's compute when it sits there every time while its peers' samples are spread
    over collectives (at several sites) and that same compute (on a loaded host, half their samples).
    A group found inside collectives as a rule waits there, whatever the modes say."""
    def place(x: tuple) -> tuple:
        return ("coll",) if x[0] == "coll" else x

    if _in_collectives_as_a_rule(per_rank):
        return _commonest_collective(per_rank)
    modes = [max(ps, key=ps.count) for ps in ([place(x) for x in xs] for xs in per_rank)]  # ties: the first
    # counted once (a group is thousands of ranks); max keeps the first of equals, as over the lists
    of_modes, of_places = Counter(modes), Counter(place(x) for xs in per_rank for x in xs)
    # a tie goes to the collectives: ranks inside one wait by definition, a place may be compute
    best = max(of_modes, key=lambda x: (of_modes[x], x == ("coll",), of_places[x]))
    return _commonest_collective(per_rank) if best == ("coll",) else best


def _in_collectives_as_a_rule(per_rank: Sequence[Sequence[tuple]]) -> bool:
    """The group's typical rank (the median) is found inside a collective in :data:`COLL_USUAL` of its
    samples at least. A rank inside a collective waits by definition; a place outside one is a wait only
    by inference (the GPU shape, where collectives only enqueue and are seldom caught). Without this, a
    loaded host's peers that spend just over half their samples in the compute their straggler never
    leaves make that compute "the common sync point" (CI: peers 7, 5, 8 of 13 in forward, 6, 8, 4 in the
    all-reduce), and every rank then waits there all the time."""
    shares = [sum(x[0] == "coll" for x in xs) / len(xs) for xs in per_rank if xs]
    return bool(shares) and statistics.median(shares) >= COLL_USUAL


def _commonest_collective(per_rank: Sequence[Sequence[tuple]]) -> tuple:
    keys = Counter(x for xs in per_rank for x in xs if x[0] == "coll")
    return max(keys, key=keys.__getitem__)


def _backing(named: Mapping[int, Any], seen: Mapping[int, Any], loose: Mapping[int, tuple[float, int, str, int]],
             read: Mapping[int, tuple[float, int, str, int, Sequence[int]]]
             ) -> dict[int, tuple[float, int, str, int]]:
    """The stack samples that back a rank another measure names (:data:`BACKING`, :data:`BACKING_WAITED`):
    found waiting no more often than any of its peers, and seldom enough by the looser ratio and bar."""
    return {r: v for r, v in loose.items()
            if r in named and r not in seen and v[3] <= min(read[p][3] for p in read[r][4])}


def _moving(a: Any) -> bool:
    """Progressing: its stack moves, or it is found in collectives each time but exchanged data over the
    window (a hung Gloo peer writes nothing while it waits)."""
    # (DDP's peers wait inside backward, found at one place each sample: they exchanged data each step)
    return a is not None and (a.state == "running" or (a.state in ("waiting", "idle") and a.wrote > 0))


def _writes_alone(a: Any, peers: Sequence[Any]) -> bool:
    """The rank wrote enough to be progressing (a checkpoint) and more than twice what its peers wrote:
    write counts include the sockets, and every rank sends its share of the collectives' data."""
    theirs = [p.wrote for p in peers if p is not None]
    return _writes_more(a, statistics.median(theirs) if theirs else None)


def _writes_more(a: Any, median: float | None) -> bool:
    """:func:`_writes_alone` given the median of the peers' writes (None: no peer's known)."""
    from scout_sys.consensus.hang import WRITE_PROGRESS_BYTES

    return a.wrote >= WRITE_PROGRESS_BYTES and (median is None or a.wrote > 2 * median)


def measures(job: Job, obs: Sequence[Observation], start: float, end: float
             ) -> tuple[dict[int, list[WindowVerdict]], dict[int, Cause]]:
    """Every continuous measure of one window, each on its own: per rank, the verdicts (lag, busy,
    throttle) that name it an outlier among the ranks doing the same work; and each such rank's cause."""
    named: dict[int, list[WindowVerdict]] = {}
    causes: dict[int, Cause] = {}
    names = collgroups.keys(obs)  # once for every group
    for g in work_groups(job):
        live = [r for r in g if r in job.by_rank()]
        if len(live) < 3:
            continue
        cpu = shares(obs, live)
        found: list[WindowVerdict] = []
        busy = busy_shares(obs, live)
        # the lag over every rank, else over process sub-groups; a busy verdict here is counted below
        lag = _primary(live, obs, start, end, names)
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
    gives an inconclusive straggler — a note when it is the busy share of a rank contended for a CPU whose
    peers' stack samples, read, did not show them waiting for it (the host's load); the stack samples alone, the weakest, a note. The verdict says the cause. Returns (incidents, notes)."""
    read = stack_waits(job, obs)
    loose = never_waiting(job, obs, acts, read, seldom=BACKING, waited_min=BACKING_WAITED)
    # the strict ratio and bar: a subset of the loose
    seen = {r: v for r, v in loose.items() if v[3] * SELDOM <= v[0] and v[0] > WAITED_MIN * v[1]}
    named, causes = measures(job, obs, window[0], window[1])
    seen.update(_backing(named, seen, loose, read))
    out: list[Incident] = []
    notes: list[str] = []
    for r in sorted(set(named) | set(seen)):
        ev: list[Evidence] = []
        if r in seen:
            waited, k, where, own = seen[r]
            ev.append(Evidence("stack", f"rank {r} was "
                               f"{'never found waiting' if not own else f'found waiting in only {own} of {k} samples'}"
                               f" while its peers were found waiting {where} in {waited:g} of {k} stack samples"
                               " (their median)", rank=r, data={"samples": k, "peers_waiting": waited}))
        ws = named.get(r, [])
        for w in ws:
            ev.append(Evidence("ebpf" if w.metric == "lag" else "procfs", _rank_text(w, r), rank=r,
                               data={"metric": w.metric, "value": round(w.values[r], 4),
                                     "peer_median": round(w.median, 4), "threshold": round(w.threshold, 4)}))
            ev += groups_evidence(w, r)
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
        if n == 1 and w0 is not None and w0.metric == "busy" and c is not None and c.kind == "contended" \
                and r in read:
            # busier only because it waited for a CPU, and its peers' stacks, read, did not show them waiting
            # for it: the host's load, which the ranks of a busy host meet in turns, not a straggler — a note
            # says where the CPUs went (without stacks to ask, it stays an inconclusive straggler)
            notes.append(f"rank {r} waited for a CPU more than its peers ({c.text}), but its peers' stack samples "
                         "did not show them waiting for it: the host's CPUs are contended, not a straggler")
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
