"""The incident book: findings of each poll in, ``incident_opened`` / ``_updated`` / ``_closed`` out.

A finding is the same incident across polls when its :meth:`~scout_sys.model.Incident.key` (kind,
status, origin ranks) is the same. An open incident closes after ``close_after`` polls in a row
without that finding (hysteresis). It is *updated* only when something a person would act on changed:
its hosts, or the kinds of evidence it holds (which source, which rank, which state) — never because a
number in its summary moved. Its evidence is a bounded set: a hang reconfirmed for an hour holds what
the last window showed plus the evidence that must stay (the bundle's path), once each.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Optional

from scout_sys.model import Event, Evidence, Incident

CLOSE_AFTER = 2  # polls without a finding before its incident closes
MAX_EVIDENCE = 64  # evidence items kept per incident
# Evidence whose data holds one of these keys stays with the incident for its whole life: where its
# bundle went, and what made the watch look (a later window cannot say that again).
KEEP = ("bundle", "trigger")

# Called once per new incident: returns the incident to publish (e.g. with the bundle's evidence) and
# the bundle path, if one was saved.
OnOpen = Callable[[Incident], tuple[Incident, Optional[str]]]  # runtime alias: no ``X | None`` before 3.10


def evidence_key(e: Evidence) -> tuple:
    """What kind of fact an evidence item is, numbers aside."""
    return (e.source, e.rank, e.data.get("state"), tuple(sorted(e.data)))


def unique_evidence(items: Iterable[Evidence], limit: int = MAX_EVIDENCE) -> tuple[Evidence, ...]:
    """Each fact once (same source, rank and text), the first ``limit`` of them."""
    out: dict[tuple, Evidence] = {}
    for e in items:
        out.setdefault((e.source, e.rank, e.text), e)
        if len(out) >= limit:
            break
    return tuple(out.values())


def changed(old: Incident, new: Incident) -> bool:
    """Did the incident change in a way worth an ``incident_updated`` event?"""
    return (old.hosts != new.hosts
            or {evidence_key(e) for e in old.evidence} != {evidence_key(e) for e in new.evidence})


class IncidentBook:
    def __init__(self, *, close_after: int = CLOSE_AFTER, keep_closed: int = 50) -> None:
        self.close_after = close_after
        self.open: dict[tuple, Incident] = {}
        self.closed: deque[Incident] = deque(maxlen=keep_closed)
        self.ever_opened = False
        self._misses: dict[tuple, int] = {}
        self._seq = 0

    def of_kinds(self, kinds: frozenset[str]) -> list[Incident]:
        return [i for k, i in self.open.items() if k[0] in kinds]

    def reconcile(self, findings: Sequence[Incident], now: float, kinds: frozenset[str] | None,
                  on_open: OnOpen | None = None, unobserved: frozenset[int] = frozenset()) -> list[Event]:
        """This poll's ``findings`` for incidents of ``kinds`` (None: every kind): open what is new,
        update what changed, close what has been missing for ``close_after`` polls (only incidents of
        ``kinds``, and never one whose ranks were all ``unobserved`` this time: a monitor that could
        not look says nothing about them)."""
        events: list[Event] = []
        seen = set()
        for f in findings:
            key = f.key()
            seen.add(key)
            self._misses[key] = 0
            old = self.open.get(key)
            if old is None:
                self._seq += 1
                inc = replace(f, id=f"inc-{self._seq}", evidence=unique_evidence(f.evidence))
                bundle = None
                if on_open is not None:
                    inc, bundle = on_open(inc)
                self.open[key] = inc
                self.ever_opened = True
                events.append(Event("incident_opened", now, inc, bundle))
                continue
            kept = [e for e in old.evidence if any(k in e.data for k in KEEP)]
            inc = replace(f, id=old.id, since=min(old.since, f.since),
                          evidence=unique_evidence([*kept, *f.evidence]))
            if changed(old, inc):
                events.append(Event("incident_updated", now, inc))
            self.open[key] = inc
        for key in list(self.open):
            if key in seen or (kinds is not None and key[0] not in kinds) or (key[2] and set(key[2]) <= unobserved):
                continue
            self._misses[key] = self._misses.get(key, 0) + 1
            if self._misses[key] >= self.close_after:
                inc = self.open.pop(key)
                del self._misses[key]
                self.closed.append(inc)
                events.append(Event("incident_closed", now, inc))
        return events
