"""Periodic work as a value: ``Every(5.0).due(now)`` instead of a timestamp field per task."""

from __future__ import annotations


class Every:
    """Due once per ``period`` seconds of the clock passed in. The first call is due at once unless
    ``start`` says when the first period begins."""

    def __init__(self, period: float, *, start: float | None = None) -> None:
        self.period = period
        self.last: float | None = start

    def due(self, now: float) -> bool:
        """True (and the period restarts at ``now``) when a period has passed since the last time."""
        if self.last is None or now - self.last >= self.period:
            self.last = now
            return True
        return False

    def since(self, now: float) -> float:
        """Seconds since the period last restarted (infinite before the first time)."""
        return float("inf") if self.last is None else now - self.last

    def reset(self, now: float) -> None:
        self.last = now
