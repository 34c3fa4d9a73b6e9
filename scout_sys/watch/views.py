"""What the dashboard shows per rank between two stack windows: the last window's views, updated from
each poll's /proc sample (state) and the rotating stack samples (place, stack). For people only:
nothing here is voted on."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scout_sys.consensus.patterns import collective_of
from scout_sys.model import Diagnosis, ProcSample, RankView, StackSample
from scout_sys.text import frame_text, where_text


class Views:
    def __init__(self) -> None:
        self.views: dict[int, RankView] = {}
        self.stacks: dict[int, tuple[str, ...]] = {}  # rank -> main-thread frames, innermost first

    def clear(self) -> None:
        self.views = {}

    def from_window(self, d: Diagnosis) -> None:
        """A stack window's views replace everything."""
        self.views = dict(d.views)
        self.stacks.update({r: v.stack for r, v in d.views.items() if v.stack})

    def from_stacks(self, samples: Iterable[StackSample]) -> None:
        for s in samples:
            main = s.main()
            if main is None or s.error or not main.frames:
                continue
            self.stacks[s.rank] = tuple(frame_text(f) for f in main.frames)
            old = self.views.get(s.rank)
            w = collective_of(main.frames)
            self.views[s.rank] = RankView(rank=s.rank, state=old.state if old else "running",
                                          where=where_text(main.frames), collective=w.label() if w else None,
                                          cpu_percent=old.cpu_percent if old else None, stack=self.stacks[s.rank])

    def from_procs(self, procs: Sequence[ProcSample], now: float) -> None:
        """Per-rank state from /proc alone, keeping the last stack's place."""
        for p in procs:
            old = self.views.get(p.rank)
            if not p.alive:
                state = "exited"
            elif p.stopped:  # not a py-spy dump's momentary pause
                state = "stopped"
            elif p.status == "disk-sleep":
                state = "disk-sleep"
            elif p.status == "running" or (p.main_last_ran is not None and now - p.main_last_ran < 1.0):
                state = "running"
            else:
                state = "idle"
            self.views[p.rank] = RankView(rank=p.rank, state=state, where=old.where if old else "",
                                          collective=old.collective if old else None,
                                          cpu_percent=old.cpu_percent if old else None,
                                          stack=old.stack if old else ())
