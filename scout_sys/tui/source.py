"""Where the dashboard's data comes from.

A :class:`Source` publishes immutable snapshots: ``poll()`` runs one iteration (blocking; the app calls
it from a worker thread, never two at once) and ``snapshot`` is the latest state. The live
:class:`~scout_sys.monitor.Watcher` is one; :class:`ReportSource` is another that replays a saved
report (``scout-sys/diagnosis/v1`` JSON, from ``diagnose --json`` or the dashboard's ``s`` key), so a
recorded incident runs through the same path as live data.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from scout_sys.errors import ScoutError
from scout_sys.model import SCHEMA, Diagnosis, Evidence, Incident, Job, Rank, RankView
from scout_sys.monitor import Event, Snapshot
from scout_sys.report import printable, render

__all__ = ["Event", "ReportSource", "Snapshot", "Source", "diagnosis_of", "load_report", "markdown_report",
           "report_json", "save_report"]

# Extra key of a saved report: what the dashboard shows beyond the diagnosis (diagnosis/v1 allows
# added fields). Reports without it (plain ``diagnose --json``) open too.
WATCH_KEY = "watch"


@runtime_checkable
class Source(Protocol):
    """What the dashboard renders. ``poll`` blocks; the app calls it from one worker at a time."""

    snapshot: Any  # Snapshot | None before the first poll

    def poll(self) -> Sequence[Any]: ...  # the Events of this iteration

    def diagnose_now(self, window: float = 3.0) -> Diagnosis: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------- snapshot → report


def diagnosis_of(s: Any) -> Diagnosis:
    """The snapshot as a Diagnosis (the records ``diagnose --json`` prints)."""
    return Diagnosis(time=s.time, job=s.job, views=dict(s.views), incidents=tuple(s.incidents),
                     probes=dict(s.probes), window=0.0, notes=tuple(s.job.notes))


def report_json(s: Any) -> dict[str, Any]:
    """``scout-sys/diagnosis/v1`` of the snapshot, plus what the dashboard shows under ``"watch"``."""
    out = diagnosis_of(s).to_json()
    out[WATCH_KEY] = {
        "started": round(s.started, 3),
        "stall_after": s.stall_after,
        "ended": bool(s.ended),
        "bundle": s.bundle,
        "hosts": {str(r.rank): r.host for r in s.job.ranks},
        "closed": [i.to_json() for i in s.closed],
        "stacks": {str(r): list(st) for r, st in sorted(s.stacks.items())},
        "step_times": {str(r): [round(v, 6) for v in vs] for r, vs in sorted(s.step_times.items())},
        "wait_fractions": {str(r): [round(v, 4) for v in vs] for r, vs in sorted(s.wait_fractions.items())},
        "devices": {str(r): dict(d) for r, d in sorted(s.devices.items())},
    }
    return out


def markdown_report(s: Any) -> str:
    from scout_sys.tui.state import group_stacks, pyspy_frame, suspects

    lines = [f"# scout-sys report, {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(s.time))}", "",
             "```", render(diagnosis_of(s)), "```", ""]
    if s.closed:
        lines += ["## Closed incidents", ""]
        lines += [f"- {printable(i.kind)} ({printable(i.status)}) ranks {list(i.ranks)}: {printable(i.summary)}"
                  for i in s.closed]
        lines.append("")
    stacks = s.stacks or {r: v.stack for r, v in s.views.items() if v.stack}
    groups = group_stacks(stacks, suspect=suspects(s.incidents))
    if groups:
        from scout_sys.tui.state import compress

        lines += ["## Stacks (main thread, innermost first)", ""]
        for g in groups:
            tag = "majority" if g.majority else ("suspect" if g.suspect else "outlier")
            lines += [f"### {len(g.ranks)} rank{'s' if len(g.ranks) != 1 else ''} {compress(g.ranks)} ({tag})",
                      "", "```"]
            lines += [f"    {pyspy_frame(f)}" for f in g.stack] or ["    (no frames)"]
            lines += ["```", ""]
    if s.bundle:
        lines += [f"Evidence bundle: `{printable(s.bundle)}`", ""]
    return "\n".join(lines)


def save_report(s: Any, directory: str | None = None) -> tuple[str, str]:
    """Write ``scout-report-<time>.json`` and ``.md`` into ``directory`` (default: cwd)."""
    d = directory or os.getcwd()
    os.makedirs(d, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(s.time)) + f"-{int(s.time * 1000) % 1000:03d}"
    base = os.path.join(d, f"scout-report-{stamp}")
    with open(base + ".json", "w") as f:
        json.dump(report_json(s), f, indent=1)
        f.write("\n")
    with open(base + ".md", "w") as f:
        f.write(markdown_report(s))
    return base + ".json", base + ".md"


# --------------------------------------------------------------------------- report → snapshot


def _evidence(d: Mapping[str, Any]) -> Evidence:
    data = {k: v for k, v in d.items() if k not in ("source", "text", "rank")}
    return Evidence(source=str(d.get("source", "")), text=str(d.get("text", "")), rank=d.get("rank"), data=data)


def _incident(d: Mapping[str, Any]) -> Incident:
    return Incident(kind=str(d.get("kind", "")), status=str(d.get("status", "")),
                    ranks=tuple(int(r) for r in d.get("ranks", ())), hosts=tuple(d.get("hosts", ())),
                    since=float(d.get("since", 0.0)), summary=str(d.get("summary", "")),
                    evidence=tuple(_evidence(e) for e in d.get("evidence", ())), id=str(d.get("id", "")))


def _int_keys(d: Mapping[str, Any] | None) -> dict[int, Any]:
    return {int(k): v for k, v in (d or {}).items()}


def load_report(doc: Mapping[str, Any]) -> Any:
    """A Snapshot from a saved report (``scout-sys/diagnosis/v1``)."""
    if doc.get("schema") != SCHEMA:
        raise ScoutError(f"not a scout-sys report (schema {doc.get('schema')!r}, expected {SCHEMA})")
    j = doc.get("job", {})
    w = doc.get(WATCH_KEY) or {}
    ranks, missing, views = [], [], {}
    for r in j.get("ranks", ()):
        n = int(r["rank"])
        if r.get("pid") is None:
            missing.append(n)
        else:
            ranks.append(Rank(rank=n, pid=int(r["pid"]), host=str(r.get("host", "")), local_rank=r.get("local_rank"),
                              world_size=j.get("world_size"), device=str(r.get("device", "cpu"))))
        views[n] = RankView(rank=n, state=str(r.get("state", "unknown")), where=str(r.get("where", "")),
                            collective=r.get("collective"), cpu_percent=r.get("cpu_percent"),
                            stack=tuple(w.get("stacks", {}).get(str(n), ())))
    host = ranks[0].host if ranks else ""
    job = Job(ranks=tuple(ranks), world_size=int(j.get("world_size", len(ranks))), launcher=str(j.get("launcher", "?")),
              launcher_pid=j.get("launcher_pid"), host=host, missing=tuple(missing),
              notes=tuple(doc.get("notes", ())))
    probes = {k: (None if v == "on" else str(v).removeprefix("off: ")) for k, v in doc.get("probes", {}).items()}
    t = float(doc.get("time", 0.0))
    return Snapshot(
        time=t, started=float(w.get("started", t)), job=job, views=views,
        incidents=tuple(_incident(i) for i in doc.get("incidents", ())),
        closed=tuple(_incident(i) for i in w.get("closed", ())), probes=probes,
        stall_after=float(w.get("stall_after") or 0.0),
        step_times={k: tuple(v) for k, v in _int_keys(w.get("step_times")).items()},
        wait_fractions={k: tuple(v) for k, v in _int_keys(w.get("wait_fractions")).items()},
        stacks={k: tuple(v) for k, v in _int_keys(w.get("stacks")).items()},
        devices=_int_keys(w.get("devices")), ended=bool(w.get("ended", False)), bundle=w.get("bundle"),
    )


class ReportSource:
    """A saved report, replayed: one snapshot, no probing. ``poll`` returns no events."""

    live = False
    interval = 0.0

    def __init__(self, report: str | Mapping[str, Any]) -> None:
        if isinstance(report, str):
            try:
                with open(report) as f:
                    doc = json.load(f)
            except OSError as e:
                raise ScoutError(f"cannot read report {report}: {e.strerror}") from None
            except json.JSONDecodeError as e:
                raise ScoutError(f"{report} is not JSON: {e}") from None
            self.path: str | None = report
        else:
            doc, self.path = report, None
        self.snapshot = load_report(doc)
        self.state_dir = os.path.dirname(os.path.abspath(report)) if isinstance(report, str) else None

    def poll(self) -> list[Any]:
        return []

    def diagnose_now(self, window: float = 3.0) -> Diagnosis:
        return diagnosis_of(self.snapshot)

    def close(self) -> None:
        pass
