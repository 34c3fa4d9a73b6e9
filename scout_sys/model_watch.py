"""The live watch's records: an incident Event, and the Snapshot every sink renders (and its saved
form, a ``scout-sys/diagnosis/v1`` report with a ``"watch"`` key). Re-exported by :mod:`scout_sys.model`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scout_sys.model_activity import RankView
from scout_sys.model_core import SCHEMA, Diagnosis, Incident
from scout_sys.model_job import REPORT, Job, job_from_json

# Extra key of a saved report: what the dashboard shows beyond the diagnosis (diagnosis/v1 allows
# added fields). Reports without it (plain ``diagnose --json``) open too.
WATCH_KEY = "watch"


@dataclass(frozen=True)
class Event:
    event: str  # "incident_opened" | "incident_updated" | "incident_closed"
    time: float
    incident: Incident
    bundle: str | None = None
    job: str | None = None  # which job, when one watch follows several (watch --every-job)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"event": self.event, "time": round(self.time, 3), "incident": self.incident.to_json()}
        if self.bundle:
            out["bundle"] = self.bundle
        if self.job is not None:
            out["job"] = self.job
        return out


@dataclass(frozen=True)
class Snapshot:
    """What every sink renders; immutable, published after each poll."""

    time: float
    started: float
    job: Job
    views: dict[int, RankView] = field(hash=False, compare=False)
    incidents: tuple[Incident, ...] = ()
    closed: tuple[Incident, ...] = ()
    probes: dict[str, str | None] = field(default_factory=dict, hash=False, compare=False)
    stall_after: float = 5.0
    step_times: dict[int, tuple[float, ...]] = field(default_factory=dict, hash=False, compare=False)
    wait_fractions: dict[int, tuple[float, ...]] = field(default_factory=dict, hash=False, compare=False)
    stacks: dict[int, tuple[str, ...]] = field(default_factory=dict, hash=False, compare=False)
    devices: dict[int, dict[str, object]] = field(default_factory=dict, hash=False, compare=False)
    ended: bool = False
    bundle: str | None = None
    notes: tuple[str, ...] = ()
    # live figures of the last poll (exporters; not part of a saved report)
    pauses: dict[int, float] = field(default_factory=dict, hash=False, compare=False)  # main thread off CPU, s
    seqs: dict[int, dict[str, int]] = field(default_factory=dict, hash=False, compare=False)  # eBPF: group -> seq
    lost_events: int | None = None  # eBPF records dropped by full kernel maps; None: no eBPF probe on
    # watch --cluster: one entry per agent, {"node", "host", "state": "up" | "lost" | "never reported",
    # "ranks", "detail"}; empty on one host
    agents: tuple[dict[str, Any], ...] = field(default=(), hash=False, compare=False)

    # ------------------------------------------------------------ its saved form (a report)
    def diagnosis(self) -> Diagnosis:
        """The snapshot as a Diagnosis (the records ``diagnose --json`` prints)."""

        return Diagnosis(time=self.time, job=self.job, views=dict(self.views), incidents=tuple(self.incidents),
                         probes=dict(self.probes), window=0.0, notes=tuple(self.job.notes))

    def to_report(self) -> dict[str, Any]:
        """``scout-sys/diagnosis/v1`` of the snapshot, plus what the dashboard shows under ``"watch"``."""
        out = self.diagnosis().to_json()
        out[WATCH_KEY] = {
            "started": round(self.started, 3),
            "stall_after": self.stall_after,
            "ended": bool(self.ended),
            "bundle": self.bundle,
            "hosts": {str(r.rank): r.host for r in self.job.ranks},
            "closed": [i.to_json() for i in self.closed],
            "stacks": {str(r): list(st) for r, st in sorted(self.stacks.items())},
            "step_times": {str(r): [round(v, 6) for v in vs] for r, vs in sorted(self.step_times.items())},
            "wait_fractions": {str(r): [round(v, 4) for v in vs] for r, vs in sorted(self.wait_fractions.items())},
            "devices": {str(r): dict(d) for r, d in sorted(self.devices.items())},
            **({"agents": [dict(a) for a in self.agents]} if self.agents else {}),
        }
        return out

    @classmethod
    def from_report(cls, doc: Mapping[str, Any]) -> Snapshot:
        """A Snapshot from a saved report (``scout-sys/diagnosis/v1``, with or without ``"watch"``).
        Raises ValueError when ``doc`` is not one."""

        if doc.get("schema") != SCHEMA:
            raise ValueError(f"not a scout-sys report (schema {doc.get('schema')!r}, expected {SCHEMA})")
        j = doc.get("job", {})
        w = doc.get(WATCH_KEY) or {}
        job = job_from_json(j, REPORT, notes=tuple(doc.get("notes", ())))
        views = {}
        for r in j.get("ranks", ()):
            n = int(r["rank"])
            views[n] = RankView(rank=n, state=str(r.get("state", "unknown")), where=str(r.get("where", "")),
                                collective=r.get("collective"), cpu_percent=r.get("cpu_percent"),
                                stack=tuple(w.get("stacks", {}).get(str(n), ())))
        probes = {k: (None if v == "on" else str(v).removeprefix("off: ")) for k, v in doc.get("probes", {}).items()}
        t = float(doc.get("time", 0.0))

        def by_rank(d: Mapping[str, Any] | None) -> dict[int, Any]:
            return {int(k): v for k, v in (d or {}).items()}

        return cls(
            time=t, started=float(w.get("started", t)), job=job, views=views,
            incidents=tuple(Incident.from_json(i) for i in doc.get("incidents", ())),
            closed=tuple(Incident.from_json(i) for i in w.get("closed", ())), probes=probes,
            stall_after=float(w.get("stall_after") or 0.0),
            step_times={k: tuple(v) for k, v in by_rank(w.get("step_times")).items()},
            wait_fractions={k: tuple(v) for k, v in by_rank(w.get("wait_fractions")).items()},
            stacks={k: tuple(v) for k, v in by_rank(w.get("stacks")).items()},
            devices=by_rank(w.get("devices")), ended=bool(w.get("ended", False)), bundle=w.get("bundle"),
            agents=tuple(dict(a) for a in w.get("agents", ())),
        )


def with_job(e: Any, job: str) -> Any:
    """The event with its job named (watch --every-job); one with no ``job`` field as it is."""
    import dataclasses

    return dataclasses.replace(e, job=job) if any(f.name == "job" for f in dataclasses.fields(e)) else e
