"""Merging the findings of several rules and signal sources into one list of incidents.

Every place that decides (``diagnose``, ``watch``, the cluster merge) merges through here, by way of
:func:`scout_sys.consensus.rules.decide`. Pure: no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from scout_sys.consensus.kinds import STUCK_KINDS
from scout_sys.model import ATTRIBUTED, DESYNC, HANG, INCONCLUSIVE, PROCESS_EXIT, Evidence, Incident
from scout_sys.text import ranks_text


def merge_findings(*lists: Sequence[Incident]) -> list[Incident]:
    """One incident per (kind, ranks): the same finding from two signal sources (stacks and eBPF)
    becomes one incident whose evidence holds both; the first list's summary wins.

    A rank that the stack rules found outside any collective (hung, stopped, gone) is also *behind*
    in collective sequence: the eBPF "behind" desync about it corroborates that finding instead of
    standing as a second incident.

    /proc sees that several ranks are dead, not in which order; the exit probe (lifecycle) names the
    first to die and calls the others its consequences. Its narrower process_exit takes the place of
    the wider one (whichever came first), so that the ranks that died of the first death are never
    blamed beside it.

    A desync that the fingerprints attribute explains the waits that the stack rules could not
    (every rank waits, no strict majority at one place): their inconclusive hang or desync becomes
    the desync's evidence, not an incident beside it."""
    out: dict[tuple, Incident] = {}
    for findings in lists:
        for inc in findings:
            key = (inc.kind, inc.ranks) if inc.ranks else (inc.kind, inc.status, ())
            if key not in out and inc.kind == DESYNC and inc.ranks:
                key = next((k for k, o in out.items() if o.kind in STUCK_KINDS
                            and set(inc.ranks) <= set(o.ranks)), key)
            wider = None
            if key not in out and inc.kind == PROCESS_EXIT and inc.ranks:
                key = next((k for k, o in out.items() if o.kind == PROCESS_EXIT and o.ranks
                            and set(o.ranks) < set(inc.ranks)), key)  # a narrower one came first
                wider = next((k for k, o in out.items() if o.kind == PROCESS_EXIT
                              and set(inc.ranks) < set(o.ranks)), None)
            if wider is not None:
                prev = out.pop(wider)
                out[key] = replace(inc, evidence=inc.evidence + prev.evidence, since=min(prev.since, inc.since))
            elif key in out:
                prev = out[key]
                out[key] = replace(prev, evidence=prev.evidence + inc.evidence, since=min(prev.since, inc.since))
            else:
                out[key] = inc
    return _tie_explained(_narrowed_by_fingerprints(list(out.values())))


def _narrowed_by_fingerprints(incidents: list[Incident]) -> list[Incident]:
    """A desync of the stacks (ranks waiting in another collective than the majority) that holds the
    ranks whose *fingerprint* differs at one position and others: those others are the origin's
    partners, waiting in their group's right call for it (a tensor-parallel group waits in its
    all-reduce while one of them called an all-gather). The fingerprints' narrower desync stands;
    the partners are its witnesses, never named beside it."""
    from scout_sys.consensus.desync import fingerprint_differs

    exact = [k for k, i in enumerate(incidents) if i.status == ATTRIBUTED and fingerprint_differs(i)]
    if not exact:
        return incidents
    extra: dict[int, tuple[Evidence, ...]] = {}
    dropped: set[int] = set()
    for k, i in enumerate(incidents):
        if i.kind != DESYNC or i.status != ATTRIBUTED or k in exact:
            continue
        by = next((e for e in exact if set(incidents[e].ranks) < set(i.ranks)), None)
        if by is None:
            continue
        origin = incidents[by].ranks
        rest = sorted(set(i.ranks) - set(origin))
        dropped.add(k)
        extra[by] = extra.get(by, ()) + i.evidence + (Evidence(
            "stack", f"{ranks_text(rest)} also wait apart from the majority, in the call of their group "
            f"that {ranks_text(origin)} did not make: witnesses, not origins",
            data={"witness_of": list(origin), "ranks": rest, "was": i.kind}),)
    return [replace(i, evidence=i.evidence + extra[k]) if k in extra else i
            for k, i in enumerate(incidents) if k not in dropped]


def _tie_explained(incidents: list[Incident]) -> list[Incident]:
    named = next((i for i in incidents if i.kind == DESYNC and i.status == ATTRIBUTED and i.ranks), None)
    if named is None:
        return incidents
    tied = [i for i in incidents if i.kind in (HANG, DESYNC) and i.status == INCONCLUSIVE and not i.ranks]
    if not tied:
        return incidents
    ev = tuple(Evidence("stack", f"the stacks alone could not tell ({i.summary}); the desync of "
                        f"{ranks_text(named.ranks)} explains it",
                        data={"was": i.kind, "status": i.status, "explained_by": list(named.ranks),
                              "evidence": [e.text for e in i.evidence]}) for i in tied)
    return [replace(i, evidence=i.evidence + ev) if i is named else i
            for i in incidents if not any(i is t for t in tied)]
