"""The part of a live watch that is the same whatever the source of its observations: ``watch --job``
(:class:`~scout_sys.watch.Watcher`, one host's ranks) and ``watch --cluster``
(:class:`~scout_sys.cluster.source.ClusterSource`, the agents' heartbeats and windows).

Each poll of a source turns its observations into events and a :class:`~scout_sys.model.Snapshot`;
the session then feeds the sinks (scout_sys/exporters) the events and that snapshot, and, when a
hang-like incident opens, has the source write its evidence bundle under the state folder
(watch/bundle.py) and adds where it went to the incident. Pure of sources: it imports neither.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from scout_sys.exporters import feed
from scout_sys.model import Evidence, Incident, Snapshot
from scout_sys.watch import bundle

if TYPE_CHECKING:
    from scout_sys.exporters import Sink

L = TypeVar("L", bound=Sequence[Any])

__all__ = ["Session", "Sessioned"]


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
