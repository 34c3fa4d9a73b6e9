"""The wait-for graph against a window's observations: the seam in ``consensus/hang.py``.

Reads the activities of a window and the job's learned process groups (every source merged,
:mod:`consensus.learned`) into waits, runs :func:`consensus.waitfor.analyze` (trying each way a rank
whose newest sends tie between groups can be placed), and folds the graph's verdict into the peer
groups' incidents (:func:`resolve`). Pure: no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from scout_sys.consensus import learned
from scout_sys.consensus.kinds import HANG_KINDS
from scout_sys.consensus.waitfor import (
    ATTRIBUTED,
    NONE,
    Graph,
    Wait,
    analyze,
    chain_text,
    members_text,
)
from scout_sys.text import ranks_text

if TYPE_CHECKING:
    from scout_sys.model import Activity, Evidence, Incident, Job, Observation, ProcessGroupSample

ELSEWHERE_RANK = -1  # stands for the members of a group that run on other hosts
PAUSED_ON = "paused_on"  # evidence data: the progressing ranks every chain of waits ends at
_SOURCES = {"procfs": "the ranks' TCP connections", "ebpf-comms": "NCCL communicator creation (eBPF)"}


def learned_from(source: str) -> str:
    """What learned a ProcessGroupSample's groups, for people: ``the ranks' TCP connections``."""
    return " and ".join(_SOURCES.get(src, src) for src in source.split("+"))


def latest_groups(obs: Sequence[Observation]) -> ProcessGroupSample | None:
    """The job's process groups, every source merged (:func:`consensus.learned.merged`)."""
    return learned.merged(obs)


def from_activities(acts: Mapping[int, Activity], sample: ProcessGroupSample
                    ) -> tuple[dict[int, Wait], list[tuple[int, ...]]]:
    """Waits and groups from ``consensus.hang`` activities and a ProcessGroupSample."""
    groups = [tuple(g) + ((ELSEWHERE_RANK,) if i in sample.partial else ()) for i, g in enumerate(sample.groups)]
    waits_in = dict(sample.waits_in)
    waits = {r: Wait(r, a.state, waits_in.get(r) if a.state == "waiting" else None,
                     a.wait.label() if a.state == "waiting" and a.wait else "",
                     bool(a.state == "waiting" and a.wait and a.wait.p2p))
             for r, a in acts.items()}
    for r, (g, label) in learned.gpu_waits(sample, acts).items():
        waits[r] = Wait(r, "waiting", g, label)
    return waits, groups


MAX_CHOICES = 8  # ways to place waiting ranks whose newest sends tie between groups


def analyze_sample(acts: Mapping[int, Activity], sample: ProcessGroupSample) -> tuple[Graph, dict[int, Wait], str]:
    """:func:`analyze` over activities and a ProcessGroupSample. A waiting rank whose newest sends tie
    between groups (one clock tick) is placed in each of them in turn: when every choice ends at the
    same origins, that verdict stands (with a note); otherwise the rank's group stays unknown."""
    from itertools import product

    waits, groups = from_activities(acts, sample)
    g = analyze(waits, groups)
    tied = [(r, gs) for r, gs in getattr(sample, "waits_in_one_of", ())
            if r in waits and waits[r].state == "waiting" and waits[r].group is None]
    choices = 1
    for _, gs in tied:
        choices *= len(gs)
    if g.status == ATTRIBUTED or not tied or choices > MAX_CHOICES:
        return g, waits, ""
    first = None
    for pick in product(*(gs for _, gs in tied)):
        w = dict(waits)
        for (r, _), gi in zip(tied, pick):
            w[r] = replace(w[r], group=gi)
        gi = analyze(w, groups)
        if gi.status != ATTRIBUTED or (first is not None and (gi.origins, gi.kinds) != (first[0].origins,
                                                                                       first[0].kinds)):
            return g, waits, ""
        first = first or (gi, w)
    assert first is not None
    which = "; ".join(f"rank {r} in one of " + ", ".join(members_text(groups[i]) for i in gs) for r, gs in tied)
    return first[0], first[1], (f"the newest sends of some waiting ranks fall in one clock tick ({which}): "
                                "every choice ends at the same origin")


class Attribute(Protocol):
    """How the peer-group vote names incidents from origins and witnesses (``consensus.hang._attribute``):
    the wait-for graph's origins are attributed by the same rule."""

    def __call__(self, job: Job, origins: list[Activity], witnesses: list[Activity], label: str, n: int,
                 window: tuple[float, float], *, decisive_only: bool) -> list[Incident]: ...


def resolve(job: Job, obs: Sequence[Observation], acts: Mapping[int, Activity], incidents: Sequence[Incident],
            attribute: Attribute, window: tuple[float, float]) -> tuple[list[Incident], list[str]]:
    """Follow the wait-for graph of the learned process groups after the peer-group vote
    (``attribute`` is ``consensus.hang._attribute``: incidents from origins and witnesses).

    - The vote named no origin (a stall it could not attribute): the graph's origin, when its chains
      agree; else the graph as evidence of the inconclusive hang.
    - The vote named ranks: an attributed graph that ends at exactly those ranks adds its chains and
      edges to their incidents; one that sees a named rank *waiting* (in a collective of a group whose
      other members are not in it: a tensor-parallel partner, a pipeline neighbour in recv) replaces
      the vote's verdict — a waiter is a witness, never an origin. Otherwise the vote stands.
    """
    from scout_sys.model import ATTRIBUTED as ATTR
    from scout_sys.model import HANG, Evidence

    incidents = list(incidents)
    sample = latest_groups(obs)
    named = [i for i in incidents if i.status == ATTR and i.kind in HANG_KINDS]
    stalled = any(i.kind == HANG and i.status != ATTR for i in incidents)
    if sample is not None and not stalled and not incidents:
        stalled = learned.gpu_stall(sample, acts, window)
    if sample is None or not (stalled or named):
        return incidents, []
    g, waits, tie_note = analyze_sample(acts, sample)
    if g.pause and g.edges and not named:
        # Every chain of waits ends at a rank that is still moving: a rank catching up, the waits still
        # spreading out from an origin on a loaded machine, or a rank that loops elsewhere and never
        # comes. One window cannot tell these apart: the stall stays inconclusive, and its evidence
        # (PAUSED_ON) names the rank the waits lead to.
        moving = sorted({c[-1] for c in g.chains} or {r for r, w in waits.items() if w.state == "running"})
        pause = Evidence("procfs", f"wait-for: every chain of waits ({len(g.edges)} edges) ends at "
                         f"{ranks_text(moving)}, still progressing: a pause so far, not yet a hang",
                         data={PAUSED_ON: moving, "wait_for": g.edges_json()})
        out, added = _add_to_stall(incidents, [pause])
        return out, ([f"the waiting ranks wait for {ranks_text(moving)}, still progressing"] if added else [])
    if g.status == NONE:
        return incidents, []
    if named and g.status != ATTRIBUTED:
        return incidents, [f"wait-for graph inconclusive (the peer groups' verdict stands): {g.reason}"]
    ev = [Evidence("procfs", f"wait-for: {chain_text(g, c, waits)}", data={"chain": list(c)}) for c in g.chains]
    sources = learned_from(sample.source)
    ev.append(Evidence("procfs", f"wait-for graph over {len(sample.groups)} process groups learned from {sources}",
                       data={"wait_for": g.edges_json()}))
    if tie_note:
        ev.append(Evidence("procfs", tie_note))
    named_ranks = {r for i in named for r in i.ranks}
    # ranks the graph sees waiting inside a collective frame (not the GPU shape's spinning waiters)
    in_frame = {r for e in g.edges for r in e.waiters if acts[r].state == "waiting"} - set(g.kinds)
    if named and named_ranks == set(g.origins):
        return ([replace(i, evidence=i.evidence + tuple(ev)) if i in named else i for i in incidents],
                [f"the wait-for graph ({len(g.edges)} edges) ends at the same rank(s)"])
    if named and not named_ranks & in_frame:
        return incidents, [f"the wait-for graph ends at rank(s) {', '.join(map(str, g.origins))}, not at the "
                           f"rank(s) named by the peer groups ({', '.join(map(str, sorted(named_ranks)))})"]
    if g.status == ATTRIBUTED:
        origins = [acts[r] for r in g.origins]
        waiters = {r for e in g.edges for r in e.waiters}  # in a collective frame, or spinning (GPU shape)
        witnesses = [a for a in acts.values() if a.rank in waiters and a.rank not in g.kinds]
        found = attribute(job, origins, witnesses, "collectives of their process groups", len(acts), window,
                          decisive_only=False)
        found = [replace(i, evidence=i.evidence + tuple(ev)) for i in found]
        kept = [i for i in incidents if i not in named and not (i.kind == HANG and i.status != ATTR)]
        notes = [f"origin found by following the wait-for graph ({len(g.edges)} edges)"]
        if named:
            notes.append(f"rank(s) {', '.join(map(str, sorted(named_ranks & in_frame)))} named by the peer groups "
                         "wait for the origin in a collective of their process group: witnesses, not origins")
        return kept + found, notes
    out, _ = _add_to_stall(incidents, ev)
    return out, [f"wait-for graph inconclusive: {g.reason}"]


def _add_to_stall(incidents: Sequence[Incident], ev: Sequence[Evidence]) -> tuple[list[Incident], bool]:
    """``incidents`` with ``ev`` added to the first unattributed hang (the stall no vote could place),
    and whether there was one."""
    from scout_sys.model import ATTRIBUTED as ATTR
    from scout_sys.model import HANG

    out, added = [], False
    for i in incidents:
        if i.kind == HANG and i.status != ATTR and not added:
            i, added = replace(i, evidence=i.evidence + tuple(ev)), True
        out.append(i)
    return out, added
