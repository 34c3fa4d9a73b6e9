"""What one rank did over a window: its state, where it waited, and the view people are shown.

Part of the vocabulary (re-exported by :mod:`scout_sys.model`): consensus/hang.py summarises each
rank's window into an :class:`Activity`, the cluster agents ship Activities to the merge, and the
rules of consensus/ vote on them. Kept here rather than in a rule module so that a room that only
reads them (cluster/, the exporters) depends on the vocabulary, not on the hang rule.

A rank's state is one of :data:`STATES`:

- ``waiting``: the main thread sat in the same collective at every stack sample and barely ran;
- ``running``: the stack moved (a different function stack between samples): the rank progresses;
- ``busy``: same place every sample, main thread on a CPU (a spin, a loop that never ends);
- ``idle``: same place every sample, main thread off CPU (sleeping, blocked outside collectives);
- ``stopped`` (SIGSTOP, a debugger), ``disk-sleep`` (uninterruptible for the whole window);
- ``exited`` (gone or zombie); ``unknown`` (no stack could be read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STATES = ("waiting", "running", "busy", "idle", "stopped", "disk-sleep", "exited", "unknown")


@dataclass(frozen=True)
class CollectiveWait:
    """The collective a stack is in (found by consensus/patterns.py ``collective_of``)."""

    op: str  # e.g. "all_reduce"
    site: str  # the caller's "file:line" (innermost frame outside the libraries)
    depth: int  # index of the collective frame in the stack (innermost = 0)
    direct: bool = True  # a collective call itself, not only a framework frame that issues them
    p2p: bool = False  # point-to-point (send / recv, pipeline neighbours), not a collective of replicas

    def label(self) -> str:
        return f"{self.op} at {self.site}"


@dataclass(frozen=True)
class RankView:
    """What one rank did over the window, as consensus saw it (shown to people, not voted on)."""

    rank: int
    state: str  # one of STATES
    where: str = ""  # innermost frame of interest: "file:line function"
    collective: str | None = None  # "all_reduce @ train.py:42" while waiting in one
    cpu_percent: float | None = None
    stack: tuple[str, ...] = ()  # main thread, innermost first

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "where": self.where}
        if self.collective:
            out["collective"] = self.collective
        if self.cpu_percent is not None:
            out["cpu_percent"] = round(self.cpu_percent, 1)
        return out


@dataclass(frozen=True)
class Activity:
    """One rank's window, summarised (consensus/hang.py ``summarize``): what the rules vote on."""

    rank: int
    pid: int | None
    state: str  # one of STATES
    where: str = ""  # innermost frame, "file:line function"
    wait: CollectiveWait | None = None
    location: tuple[tuple[str, str], ...] = ()  # function-level main stack: ((file, function), ...)
    stack: tuple[str, ...] = ()  # main-thread frames, innermost first, "file:line function"
    cpu: float | None = None  # whole process, fraction of one core over the window
    main_cpu: float | None = None  # main thread, fraction of one core
    wrote: int = 0  # bytes written (write syscalls) during the window
    last_ran: float | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    status: str = ""  # last /proc status
    wchan: str | None = None
    stack_error: str | None = None

    def signature(self) -> tuple:
        """What C3 votes on."""
        if self.state == "waiting" and self.wait is not None:
            return ("waiting", self.wait.op, self.wait.site)
        if self.state in ("busy", "idle"):
            # Spinning or asleep, it stayed at one place: a spin-wait and a blocking wait at the same
            # sync point are the same witness (how much CPU it got depends on the machine's load).
            return ("still", self.location)
        return (self.state,)

    def view(self) -> RankView:
        return RankView(
            rank=self.rank,
            state=self.state,
            where=self.where,
            collective=self.wait.label() if self.wait else None,
            cpu_percent=None if self.cpu is None else 100.0 * self.cpu,
            stack=self.stack,
        )
