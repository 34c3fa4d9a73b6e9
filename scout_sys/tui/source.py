"""Where the dashboard's data comes from.

A :class:`Source` publishes immutable snapshots: ``poll()`` runs one iteration (blocking; the app calls
it from a worker thread, never two at once) and ``snapshot`` is the latest state. The live
:class:`~scout_sys.watch.Watcher` is one; :class:`ReportSource` is another that replays a saved
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
from scout_sys.files import private_dirs, private_opener
from scout_sys.model import Diagnosis, Event, Snapshot
from scout_sys.report import printable, render

__all__ = ["SOURCE_MEMBERS", "Event", "ReportSource", "Snapshot", "Source", "SourceDefaults", "check_source",
           "diagnosis_of", "load_report", "markdown_report", "report_json", "save_report"]

@runtime_checkable
class Source(Protocol):
    """What the dashboard renders and asks, every member read as it is (the app guesses no
    defaults): a source lacking one is not a Source (``isinstance``; :func:`check_source`, which the
    app calls, names what is missing). :class:`SourceDefaults` holds the usual answers once.
    ``poll`` blocks; the app calls the source from one thread at a time."""

    @property
    def live(self) -> bool:
        """Polled; False: one fixed snapshot (a saved report), never polled."""

    @property
    def interval(self) -> float:
        """Seconds between polls, unless the app is given its own; 0: none of its own (0.5 s)."""

    @property
    def snapshot(self) -> Snapshot | None:
        """The latest state; None before the first poll found a job."""

    @property
    def waiting(self) -> str | None:
        """What the source waits for while it has no snapshot, for people (None: the app's words)."""

    @property
    def state_dir(self) -> str | None:
        """Where the ``s`` key saves reports (None: the current directory)."""

    @property
    def path(self) -> str | None:
        """The saved report shown, named in the header (None: live data)."""

    @property
    def ever_opened(self) -> bool:
        """An incident was ever opened, including ones no snapshot showed: the exit status."""

    @property
    def can_replay(self) -> bool:
        """The ``r`` key can start a replay round beside the job (a live job on this host)."""

    def replay_now(self) -> bool:
        """Start a replay round now; False when one runs already or replay is off."""

    def poll(self) -> Sequence[Any]:
        """One iteration (blocking): its events (model.Event, or the monitor's own news)."""

    def diagnose_now(self, window: float = 3.0) -> Diagnosis: ...

    def interrupt(self) -> None:
        """Stop a poll in flight at its next sample (after ``q``: the prompt need not wait for a stack
        window to end); that poll reports nothing. Nothing to stop: nothing."""

    def close(self) -> None: ...


SOURCE_MEMBERS = tuple(sorted(n for n, v in vars(Source).items()
                              if not n.startswith("_") and (isinstance(v, property) or callable(v))))


def check_source(source: object) -> None:
    """Raise TypeError naming the members ``source`` lacks, if it is not a complete Source."""
    missing = [n for n in SOURCE_MEMBERS if not hasattr(source, n)]  # what isinstance(source, Source) checks
    if missing:
        raise TypeError(f"{type(source).__name__} is not a dashboard Source: it lacks {', '.join(missing)}")


class SourceDefaults:
    """The answers most sources give, in one place: live, polled every 0.5 s, no saved report, nothing
    waited for, reports saved in the current directory, no incident beyond the ones its snapshots show,
    no replay, no poll worth interrupting. A source inherits this and sets what differs (the live watch
    and the cluster source answer every member themselves: they do not import the dashboard)."""

    live: bool = True
    interval: float = 0.5
    waiting: str | None = None
    state_dir: str | None = None
    path: str | None = None
    ever_opened: bool = False
    can_replay: bool = False

    def replay_now(self) -> bool:
        return False

    def interrupt(self) -> None:
        pass


# --------------------------------------------------------------------------- snapshot → report


def diagnosis_of(s: Any) -> Diagnosis:
    """The snapshot as a Diagnosis (the records ``diagnose --json`` prints)."""
    return s.diagnosis()


def report_json(s: Any) -> dict[str, Any]:
    """The snapshot's saved form (model.Snapshot.to_report: diagnosis/v1 plus ``"watch"``)."""
    return s.to_report()


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
        from scout_sys.text import compress

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
    private_dirs(d)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(s.time)) + f"-{int(s.time * 1000) % 1000:03d}"
    base = os.path.join(d, f"scout-report-{stamp}")
    with open(base + ".json", "w", opener=private_opener) as f:
        json.dump(report_json(s), f, indent=1)
        f.write("\n")
    with open(base + ".md", "w", opener=private_opener) as f:
        f.write(markdown_report(s))
    return base + ".json", base + ".md"


# --------------------------------------------------------------------------- report → snapshot


def load_report(doc: Mapping[str, Any]) -> Any:
    """A Snapshot from a saved report (``scout-sys/diagnosis/v1``); the wire format is model.py's."""
    try:
        return Snapshot.from_report(doc)
    except ValueError as e:
        raise ScoutError(str(e)) from None


class ReportSource(SourceDefaults):
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
        self.snapshot: Snapshot | None = load_report(doc)
        self.state_dir = os.path.dirname(os.path.abspath(report)) if isinstance(report, str) else None

    def poll(self) -> list[Any]:
        return []

    def diagnose_now(self, window: float = 3.0) -> Diagnosis:
        return diagnosis_of(self.snapshot)

    def close(self) -> None:
        pass
