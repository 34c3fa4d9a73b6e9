"""Peer groups in consensus: grouping ranks when the layout is unknown, and the verdict across groups.

Consensus is sound only among equivalent replicas (same tensor / pipeline / context / expert
coordinates). The hang rules vote within each peer group first (``hang._analyze_group``); then
:func:`across` reconciles the groups' findings:

1. **No origin in any group** (e.g. groups of two, or one rank per stage): a job-wide C3 vote where
   every rank waiting in a collective of its own group counts as one kind of witness. A strict
   majority of witnesses names the ranks stuck outside every collective (idle, busy, stopped,
   exited) — "every stage waits on one stage".
2. **An origin stuck outside every collective** (hang / stall / exit): the ranks of other groups
   (or, in the one group guessed when the layout is unknown, any ranks) that wait — all of them in one collective (a common mode), or a minority in another collective
   than their group (a pipeline neighbour in send/recv, a tensor-parallel partner in its all-reduce)
   — wait *for* it: they are witnesses, named in its evidence, not origins.
3. **A desync origin** (a rank in another collective than its peers): other groups' common-mode
   waits are its witnesses.

Every incident then carries each origin's coordinates and peer group, and where the layout came
from. :func:`by_activity` is the fall-back when nothing is known about the layout: ranks waiting in
point-to-point calls (pipeline neighbours) are compared apart from ranks in collectives, said as
such in the evidence.

Pure: no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from scout_sys.consensus.kinds import STUCK_KINDS
from scout_sys.model import (
    ATTRIBUTED,
    DESYNC,
    HANG,
    INCONCLUSIVE,
    CollectiveWait,
    Evidence,
    Incident,
    Job,
)
from scout_sys.text import ranks_text

ACTIVITY_SOURCE = "activity (layout unknown: no --topology and no Megatron-Core / DeepSpeed / TorchTitan " \
                  "layout on the command line)"
AnalyzeGroup = Callable[[Job, dict[int, Any], tuple[float, float]], tuple[list[Incident], list[str]]]


def coords_of(job: Job) -> dict[int, tuple[tuple[str, int], ...]]:
    return {r.rank: r.coords for r in job.ranks if r.coords}


def _ctext(coords: Sequence[tuple[str, int]]) -> str:
    return ",".join(f"{d}={c}" for d, c in coords)


def by_activity(acts: Mapping[int, Any], ranks: Sequence[int]) -> tuple[tuple[tuple[int, ...], ...], str | None]:
    """Groups from the shape of the ranks' activity: ranks whose main thread waits in point-to-point
    calls over the whole window are pipeline neighbours, not replicas of the ranks in collectives."""
    p2p = sorted(r for r in ranks if r in acts and acts[r].state == "waiting" and acts[r].wait is not None
                 and acts[r].wait.p2p)
    rest = sorted(set(ranks) - set(p2p))
    if not p2p or not rest:
        return (tuple(sorted(ranks)),), None
    return (tuple(rest), tuple(p2p)), (
        f"peer groups from the shape of activity ({ACTIVITY_SOURCE}): ranks {', '.join(map(str, p2p))} wait in "
        f"point-to-point calls (pipeline neighbours) and are compared apart from ranks {', '.join(map(str, rest))}; "
        "pass --topology for exact peer groups")


def _witness(a: Any) -> Any:
    """The same activity, its wait renamed so every waiting rank votes alike across groups."""
    w = a.wait
    return replace(a, wait=CollectiveWait(op="collectives of its peer group", site="(per group)", depth=0,
                                          direct=w.direct if w else True, p2p=False))


def across(job: Job, groups: Sequence[Sequence[int]], found: Sequence[tuple[Sequence[int], list[Incident]]],
           acts: Mapping[int, Any], analyze_group: AnalyzeGroup, window: tuple[float, float],
           layout: str) -> tuple[list[Incident], list[str]]:
    """Reconcile per-group findings (``found``: (group, its incidents)). See the module docstring."""
    incidents = [i for _, inc in found for i in inc]
    notes: list[str] = []
    group_of = {r: gt for gt in map(tuple, groups) for r in gt}
    coords = coords_of(job)
    guessed = not job.peer_groups  # the groups are by_activity's (consensus/hang.py), not the job's
    if guessed and len(groups) > 1:
        incidents, nts = _not_waiting_for_progress(found, acts, incidents)
        notes += nts
    # One group guessed from activity (no layout) may mix every parallel dimension: a stuck origin's
    # tensor-parallel partners wait in their all-reduce while the rest wait in the data-parallel one,
    # so the partners look desynchronized against the job-wide majority. Rule 2 below holds there too.
    stuck_in_one = guessed and len(groups) == 1 and any(
        i.status == ATTRIBUTED and i.kind in STUCK_KINDS for i in incidents)
    if len(groups) > 1 or stuck_in_one:
        if len(groups) > 1 and not any(i.status == ATTRIBUTED for i in incidents):
            # 1. job-wide vote: waiting ranks of every group are witnesses alike.
            norm = {r: (_witness(a) if a.state == "waiting" else a) for r, a in acts.items()}
            job_inc, _ = analyze_group(job, norm, window)
            attributed = [i for i in job_inc if i.status == ATTRIBUTED]
            if attributed:
                dropped = [i for i in incidents if i.status == INCONCLUSIVE]
                incidents = [i for i in incidents if i.status != INCONCLUSIVE]
                attributed = [_add(i, Evidence(
                    "stack", f"no peer group has a strict majority on its own; across the {len(groups)} peer "
                    f"groups, {sum(a.state == 'waiting' for a in acts.values())} of {len(acts)} ranks wait in "
                    "collectives of their own group", data={"groups": [list(g) for g in groups]}))
                    for i in attributed]
                incidents += attributed
                notes += [f"replaced by the verdict across peer groups: {i.summary}" for i in dropped]
        stuck = [i for i in incidents if i.status == ATTRIBUTED and i.kind in STUCK_KINDS]
        desyncs = [i for i in incidents if i.status == ATTRIBUTED and i.kind == DESYNC]
        origins = stuck or desyncs
        if origins:
            origin_groups = {group_of.get(r) for i in origins for r in i.ranks}
            keep, witness_ev = [], []
            for i in incidents:
                # Peer groups from the shape of activity are a guess: a rank waiting in another collective
                # than the others of its guessed group may be the stuck origin's tensor-parallel partner.
                in_other = (not any(group_of.get(r) in origin_groups for r in i.ranks) or not i.ranks
                            or guessed)
                common = i.kind == HANG and i.status == INCONCLUSIVE
                waiting_desync = (stuck and in_other and i.kind == DESYNC and i.status == ATTRIBUTED and i.ranks
                                  and all(acts.get(r) is not None and acts[r].state == "waiting" for r in i.ranks))
                if i in origins and not waiting_desync:
                    keep.append(i)
                elif (common and (in_other or not i.ranks)) or waiting_desync:
                    witness_ev.append(_witness_evidence(coords, i, origins[0]))
                else:
                    keep.append(i)
            if witness_ev:
                first = origins[0]
                keep = [replace(k, evidence=k.evidence + tuple(witness_ev)) if k is first else k for k in keep]
            incidents = keep
    several = len({gt for gt in map(tuple, groups) if gt}) > 1  # each group hashed once, not once per rank
    return [_with_coords(i, group_of, layout, coords, several) for i in incidents], notes


def _not_waiting_for_progress(found: Sequence[tuple[Sequence[int], list[Incident]]], acts: Mapping[int, Any],
                              incidents: list[Incident]) -> tuple[list[Incident], list[str]]:
    """Guessed groups: the pipeline neighbours split off (by_activity) all waiting in point-to-point
    calls, while nothing is found stuck in the other group, wait for ranks that move on (a stage
    catching up after a pause; a window taken as the job resumes): no common-mode hang. The job-wide
    vote (:func:`across`) still names an origin the waits agree on."""
    quiet = [tuple(g) for g, inc in found if g and not inc]
    common = [i for i in incidents if i.kind == HANG and i.status == INCONCLUSIVE]
    if not quiet or not common:
        return incidents, []
    waiting = sorted({r for g, inc in found if any(i in common for i in inc) for r in g})
    running = sorted(r for g in quiet for r in g if r in acts and acts[r].state == "running")
    return [i for i in incidents if i not in common], [
        f"ranks {', '.join(map(str, waiting))} wait in point-to-point calls while nothing is stuck among "
        f"ranks {', '.join(str(r) for g in quiet for r in g)}"
        + (f" ({len(running)} of them progress)" if running else "") + ": not a common-mode hang"]


def _add(i: Incident, e: Evidence) -> Incident:
    return replace(i, evidence=i.evidence + (e,))


def _witness_evidence(coords: Mapping[int, tuple[tuple[str, int], ...]], i: Incident, origin: Incident) -> Evidence:
    who = (", ".join(f"rank {r}" + (f" ({_ctext(coords[r])})" if r in coords else "") for r in i.ranks)
           if any(r in coords for r in i.ranks)
           else ranks_text(i.ranks) if i.ranks else "")
    head = f"{who}: " if who else ""
    return Evidence("stack", f"{head}{i.summary} — a witness of rank{'s' if len(origin.ranks) > 1 else ''} "
                    f"{', '.join(map(str, origin.ranks))} in another peer group, not an origin",
                    data={"witness_of": list(origin.ranks), "ranks": list(i.ranks), "was": i.kind})


def _with_coords(i: Incident, group_of: Mapping[int, tuple[int, ...]], layout: str,
                 coords: Mapping[int, tuple[tuple[str, int], ...]], several_groups: bool) -> Incident:
    if not i.ranks or (not coords and not several_groups):
        return i  # one group of every rank and no layout: nothing to say about places
    ev = []
    for r in i.ranks:
        g = group_of.get(r, ())
        c = coords.get(r, ())
        text = f"rank {r}" + (f" is at {_ctext(c)}" if c else "") + \
            (f", peer group ranks {', '.join(map(str, g))}" if g else "") + f" (layout: {layout})"
        # the layout is read from /proc (command line, config) or given with --topology
        ev.append(Evidence("procfs", text, rank=r, data={"coords": dict(c), "peer_group": list(g), "layout": layout}))
    summary = i.summary
    if any(r in coords for r in i.ranks):
        summary += " [" + "; ".join(f"rank {r} at {_ctext(coords[r])}" for r in i.ranks if r in coords) + "]"
    return replace(i, summary=summary, evidence=tuple(ev) + i.evidence)
