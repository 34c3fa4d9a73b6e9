"""The whole job from its agents' answers: one Job over every host, the same consensus as on one host.

Each agent answers a window request with its ranks (global rank, its host as the agent names it),
their activities (``model.Activity``, summarised on that host by consensus/hang.py) and a few records (the
latest collective position and GPU sample per rank, exits and signals). Here they become one
:class:`~scout_sys.model.Job` and the window rules (consensus/rules.py) run over all ranks.

An agent that did not answer is a fault of the monitor, not of the job: its ranks are *not
observed* — left out of the vote, never blamed — and said so in the notes and in the ``cluster``
part of the JSON. Pure: no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scout_sys.cluster.answer import Answer
from scout_sys.consensus import rules
from scout_sys.model import Activity, Diagnosis, Job, Observation, Rank
from scout_sys.model_job import layout_fields
from scout_sys.text import ranks_text

ANSWERED = "answered"


@dataclass(frozen=True)
class AgentState:
    """How an agent fared in this round, for people and the ``cluster`` JSON."""

    node: int
    host: str  # "?" when it never reported
    state: str  # ANSWERED | "no answer" | "forged" | "error" | "stale"
    detail: str = ""
    ranks: tuple[int, ...] = ()  # its ranks (from its answer, else its last heartbeat)

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "host": self.host, "state": self.state, "detail": self.detail,
                "ranks": list(self.ranks)}


def merge_job(answers: Sequence[Answer], world_size: int, source: str) -> Job:
    """One Job over the answering agents' ranks (each with the host its agent reports)."""
    ranks: list[Rank] = []
    missing: list[tuple[int, str]] = []
    laid_out: Job | None = None  # the first agent's job with peer groups: its layout is the whole job's
    notes: list[str] = []
    for a in answers:
        if a.job is None:
            continue
        ranks += a.job.ranks
        missing += [(m, a.host) for m in a.job.missing]
        if a.job.peer_groups and laid_out is None:
            laid_out = a.job
        notes += [f"{a.host}: {n}" for n in a.job.notes]
    hosts = sorted({a.host for a in answers if a.job is not None})
    world = max([world_size, *(a.job.world_size for a in answers if a.job is not None)])
    return Job(ranks=tuple(sorted(ranks, key=lambda r: r.rank)), world_size=world,
               launcher=f"{len(hosts)} agents via {source}", launcher_pid=None,
               host=f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}", missing=tuple(sorted(m for m, _ in missing)),
               notes=tuple(notes), missing_hosts=tuple(sorted(missing)), **layout_fields(laid_out))


def _probes(answers: Sequence[Answer]) -> dict[str, str | None]:
    """A probe is on when it is on everywhere; otherwise where it is off, and why."""
    off: dict[str, list[str]] = {}
    names: list[str] = []
    for a in answers:
        for name, why in a.probes.items():
            if name not in names:
                names.append(name)
            if why is not None:
                off.setdefault(name, []).append(f"{a.host}: {why}")
    return {n: ("; ".join(off[n]) if n in off else None) for n in names}


def decide(answers: Sequence[Answer], states: Sequence[AgentState], *, world_size: int, source: str,
           now: float) -> tuple[Diagnosis, dict[str, Any]]:
    """The whole-job diagnosis, and the ``cluster`` part of its JSON (agents, ranks not observed)."""
    ok = [a for a in answers if a.error is None and a.job is not None]
    job = merge_job(ok, world_size, source)
    acts: dict[int, Activity] = {}
    records: list[Observation] = []
    for a in ok:
        acts.update(a.acts)
        records += a.records
    for m in job.missing:
        acts.setdefault(m, Activity(rank=m, pid=None, state="exited"))
    t0 = min((a.window[0] for a in ok), default=now)
    t1 = max((a.window[1] for a in ok), default=now)
    d = rules.decide(job, records, cadence=rules.WINDOW, window=(t0, t1), acts=acts)
    incidents, acts, notes = d.incidents, d.acts, list(d.notes)
    seen = {r.rank for r in job.ranks} | set(job.missing)
    unseen: list[dict[str, Any]] = []
    for s in states:
        if s.state == ANSWERED:
            continue
        lost = [r for r in s.ranks if r not in seen]
        notes.append(f"agent node {s.node} ({s.host}) {s.state}: {s.detail}"
                     + (f"; {ranks_text(lost)} not observed (not judged)" if lost else ""))
        unseen += [{"rank": r, "host": s.host, "node": s.node, "reason": f"agent {s.state}"} for r in lost]
    placed = seen | {u["rank"] for u in unseen}
    rest = [r for r in range(job.world_size) if r not in placed]
    if rest:
        notes.append(f"{ranks_text(rest)} of {job.world_size} reported by no agent: not observed (not judged)")
        unseen += [{"rank": r, "host": None, "node": None, "reason": "no agent reports it"} for r in rest]
    for a in answers:
        notes += [f"{a.host}: {n}" for n in a.notes]
    d = Diagnosis(time=now, job=job, views={r: a.view() for r, a in acts.items()},
                  incidents=tuple(incidents), probes=_probes(ok), window=t1 - t0,
                  notes=tuple(list(job.notes) + notes))
    cluster = {"store": source, "agents": [s.to_json() for s in sorted(states, key=lambda s: s.node)],
               "not_observed": sorted(unseen, key=lambda u: u["rank"])}
    return d, cluster

