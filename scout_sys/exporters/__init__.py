"""Sinks: what the watch hands to the cluster's tooling — Prometheus metrics (``prometheus.py``), incident
hooks (``hooks.py``), an events file (``events.py``).

Every sink has one small contract: ``on_event(e)`` for each :class:`~scout_sys.model.Event` (the object
``watch --headless --json`` prints), ``on_snapshot(s, took)`` after each poll with the
:class:`~scout_sys.model.Snapshot` the watcher published and how long the poll took, and ``close()``.
A sink never blocks the poll: slow work (HTTP, hooks, fsync) runs on its own threads. A sink that
raises is reported through ``say`` and the others — and the watch — go on.

:class:`Sinks` is itself a sink that feeds several; the Watcher calls its ``sinks`` after each poll, so the
headless loop (``Watcher.run``) and the dashboard's poll worker feed them alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from scout_sys.model import Event, Snapshot


class Sink(Protocol):
    def on_event(self, e: Event) -> None: ...

    def on_snapshot(self, s: Snapshot, took: float) -> None: ...

    def close(self) -> None: ...


def feed(sinks: Sequence[Sink], events: Sequence[Any], snapshot: Snapshot | None, took: float) -> None:
    """One poll's events, then its snapshot, to each sink (the sources' ``sinks`` seam)."""
    for sink in sinks:
        for e in events:
            sink.on_event(e)
        if snapshot is not None:
            sink.on_snapshot(snapshot, took)


class Sinks:
    """A list of sinks fed together; a failing sink is reported, never fatal."""

    def __init__(self, sinks: Sequence[Sink], say: Callable[[str], None]) -> None:
        self.sinks = list(sinks)
        self.say = say

    def _each(self, method: str, *args: Any) -> None:
        for s in self.sinks:
            try:
                getattr(s, method)(*args)
            except Exception as e:  # noqa: BLE001 - one sink's failure must not stop the watch
                self.say(f"scout-sys: {type(s).__name__}.{method} failed: {e}")

    def on_event(self, e: Event) -> None:
        self._each("on_event", e)

    def on_snapshot(self, s: Snapshot, took: float) -> None:
        self._each("on_snapshot", s, took)

    def close(self) -> None:
        self._each("close")

    def attach(self, watcher: Any) -> None:
        """Feed the sinks from every ``watcher.poll()`` from now on (the Watcher's ``sinks`` seam: the
        headless loop and the dashboard's poll worker alike), and its current snapshot now."""
        if not self.sinks:
            return
        watcher.sinks.append(self)
        if watcher.snapshot is not None:
            self.on_snapshot(watcher.snapshot, 0.0)


__all__ = ["Sink", "Sinks", "feed"]
