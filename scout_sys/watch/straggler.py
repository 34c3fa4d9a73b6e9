"""Stragglers in ``watch``: a window verdict every ``WINDOW`` seconds (consensus/straggler.py), an
incident when ``CONFIRM`` windows in a row name the same rank(s); :func:`with_replay` adds what
replay says of their devices. Keeps the per-rank series the dashboard draws (step time, share of
time waiting)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from scout_sys.consensus import rules, straggler
from scout_sys.consensus.merge import merge_findings
from scout_sys.model import STRAGGLER, Incident, Job, Observation
from scout_sys.watch.schedule import Every

WINDOW = 5.0
SERIES = 60  # points kept per rank for the dashboard


class StragglerWatch:
    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self.every = Every(window)
        self._verdicts: deque[straggler.WindowVerdict] = deque(maxlen=straggler.CONFIRM)
        self.busy: dict[int, deque[float]] = {}
        self.lag: dict[int, deque[float]] = {}
        self.period: dict[int, deque[float]] = {}

    def due(self, now: float) -> bool:
        return self.every.since(now) >= self.window

    def round(self, job: Job, history: Sequence[Observation], now: float) -> list[Incident]:
        """Judge the window since the last round; the straggler incident(s) it confirms (or none)."""
        last = self.every.last
        start = max(last, now - self.window) if last is not None else now - self.window
        self.every.reset(now)
        w = straggler.window_verdict(job, [o for o in history if o.time >= start - 0.01], start, now)
        series = self.busy if w.metric == "busy" else self.lag
        for r, v in w.values.items():
            series.setdefault(r, deque(maxlen=SERIES)).append(v)
        for r, v in w.periods.items():
            self.period.setdefault(r, deque(maxlen=SERIES)).append(v)
        self._verdicts.append(w)
        return rules.decide(job, (), cadence=rules.PERIODIC, verdicts=tuple(self._verdicts)).listed


def with_replay(found: Sequence[Incident], explain: Callable[[Incident], Incident] | None,
                replayed: Sequence[Incident]) -> list[Incident]:
    """A straggler round's findings with replay's word: each explained by the recent replay rounds
    (``explain``: replay/live.py, its device slow or as fast as its peers'), beside the stragglers of
    replay's last session (``replayed``). One of each naming the same ranks is one incident with both
    evidences: side by side, the second would replace the first in the incident book every round."""
    if explain is not None:
        found = [explain(f) for f in found]
    return merge_findings(found, [f for f in replayed if f.kind == STRAGGLER])
