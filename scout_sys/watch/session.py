"""The part of a live watch that is the same whatever the source of its observations: ``watch --job``
(:class:`~scout_sys.watch.Watcher`, one host's ranks) and ``watch --cluster``
(:class:`~scout_sys.cluster.source.ClusterSource`, the agents' heartbeats and windows).

Each poll of a source turns its observations into events and a :class:`~scout_sys.model.Snapshot`
(built here, :meth:`Session.publish`, from the engine's parts both sources hold); the session then
feeds the sinks (scout_sys/exporters) the events and that snapshot, and, when a hang-like incident
opens, has the source write its evidence bundle under the state folder (watch/bundle.py) and adds
where it went to the incident. Pure of sources: it imports neither.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from scout_sys.exporters import feed
from scout_sys.model import Evidence, Incident, Job, Snapshot
from scout_sys.watch import bundle
from scout_sys.watch.config import WatchConfig
from scout_sys.watch.hang import HangWatch
from scout_sys.watch.incidents import IncidentBook
from scout_sys.watch.views import Views

if TYPE_CHECKING:
    from scout_sys.exporters import Sink

L = TypeVar("L", bound=Sequence[Any])
NOTES_KEPT = 10  # the snapshot's notes: the latest few

__all__ = ["EngineParts", "Session", "Sessioned"]


class Session:
    """``state_dir``: where bundles go (None: watch/bundle.py's default folder); ``sinks``: fed every
    event and snapshot; ``snapshot``: the source's latest; ``bundle``: the folder of the last bundle."""

    def __init__(self, state_dir: str | None) -> None:
        self.state_dir = state_dir or bundle.default_state_dir()
        self.sinks: list[Sink] = []
        self.snapshot: Snapshot | None = None
        self.bundle: str | None = None

    def poll(self, step: Callable[[], L]) -> L:
        """One poll of the source (``step``: its events; it sets :attr:`snapshot`), then the sinks fed."""
        t0 = time.monotonic()
        events = step()
        feed(self.sinks, events, self.snapshot, time.monotonic() - t0)
        return events

    def publish(self, now: float, started: float, job: Job, *, hang: HangWatch, book: IncidentBook, views: Views,
                probes: Mapping[str, str | None], devices: Mapping[int, dict[str, object]], notes: Sequence[str],
                pauses: Mapping[int, float], **own: Any) -> Snapshot:
        """This poll's :attr:`snapshot` (returned too), from the parts every source has: ``hang`` (its
        stall-after), ``book`` (open and closed incidents), ``views`` (places and stacks), its probes,
        devices, notes (the latest kept) and pauses; ``own``: the Snapshot's fields one source alone
        fills (one host: step times, wait fractions, eBPF sequences, lost events, ended; the cluster:
        its agents)."""
        self.snapshot = Snapshot(
            time=now, started=started, job=job, views=dict(views.views), incidents=tuple(book.open.values()),
            closed=tuple(book.closed), probes=dict(probes), stall_after=hang.stall_after, stacks=dict(views.stacks),
            devices=dict(devices), bundle=self.bundle, notes=tuple(notes[-NOTES_KEPT:]), pauses=dict(pauses), **own)
        return self.snapshot

    def save_bundle(self, inc: Incident, write: Callable[[str], str], origin: str,
                    say: Callable[[str], Any]) -> tuple[Incident, str | None]:
        """A new incident's bundle, written by the source (``write(state_dir)`` returns its folder):
        the incident with evidence of ``origin`` saying where it went, and the folder; when it cannot
        be written, ``say`` says why and the incident stays as it was (folder None)."""
        try:
            path = write(self.state_dir)
        except OSError as e:
            say(f"cannot save the evidence bundle under {self.state_dir}: {e}")
            return inc, None
        self.bundle = path
        return replace(inc, evidence=inc.evidence + (Evidence(origin, f"evidence bundle saved to {path}",
                                                              data={"bundle": path}),)), path


class Sessioned:
    """The members a live source answers from its :class:`Session` (``self.session``): the dashboard's
    ``state_dir`` and ``snapshot`` (tui/source.py) and the exporters' ``sinks`` seam."""

    session: Session

    @property
    def state_dir(self) -> str:
        return self.session.state_dir

    @property
    def sinks(self) -> list[Sink]:
        """Fed every event and snapshot (scout_sys/exporters)."""
        return self.session.sinks

    @property
    def snapshot(self) -> Snapshot | None:
        return self.session.snapshot


class EngineParts:
    """The engine's parts every live watch holds (``config``: its settings; ``hang``: the
    :class:`~scout_sys.watch.hang.HangWatch`; ``book``: the
    :class:`~scout_sys.watch.incidents.IncidentBook`) and what it answers from them."""

    config: WatchConfig
    hang: HangWatch
    book: IncidentBook

    @property
    def stall_after(self) -> float:
        return self.hang.stall_after

    @property
    def interval(self) -> float:
        return self.config.interval

    @property
    def ever_opened(self) -> bool:
        return self.book.ever_opened
