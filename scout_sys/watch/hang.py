"""When to look hard for a hang, and when a hang is over.

A hang is *suspected* when a strict majority of ranks made no progress for ``stall_after`` seconds
(:mod:`scout_sys.watch.progress`: collective sequence numbers, main threads, stacks) or when a rank
stopped or died; it is *confirmed* by a short stack window judged by the same rules as ``diagnose``
(the Watcher runs it). ``stall_after`` adapts: four times the longest no-progress stretch a strict
majority went through while the job was healthy, never below 5 s (``--stall-after`` fixes it).

A first window that names nobody (an inconclusive hang) is held back and looked at again at the next
poll (:meth:`HangWatch.hold`): it opens when the second window agrees. While a hang is open a fresh window reconfirms it every ``RECONFIRM_EVERY`` seconds, sooner once
progress is seen: only a stack window may close a hang, since /proc alone is fooled by the blip a
native dump (ptrace) causes in a blocked thread. A suspicion that a window did not confirm is not
looked at again for ``stall_after`` seconds unless a stronger signal (a stopped or dead rank, or a
majority stalled for twice as long) comes up, so a job that spins at one place most of the time does
not pay for a window every poll.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from scout_sys.model import HANG, INCONCLUSIVE, Evidence, Incident

MIN_STALL_AFTER = 5.0
MAX_STALL_AFTER = 600.0
LEARN_FACTOR = 4.0
CONFIRM_WINDOW = 1.0  # seconds of stacks taken to confirm a suspected hang
RECONFIRM_EVERY = 5.0  # while a hang stays open


@dataclass(frozen=True)
class Decision:
    confirm: bool  # take a stack window now
    suspect: bool  # the trigger holds (for evidence and for the dashboard)
    stall: float  # the majority's no-progress seconds
    signal: str  # which signal says so ("collectives", "main thread", "stack", "process state")


class HangWatch:
    def __init__(self, stall_after: float | None = None) -> None:
        self.fixed = stall_after
        self.healthy_stall = 0.0  # longest majority stall seen while the job was healthy
        self._last_stall = 0.0
        self._last_window: float | None = None
        self._quiet_until = 0.0
        self._quiet_stall = 0.0
        self._held = False  # the last window's hang findings named nobody (see hold)

    @property
    def stall_after(self) -> float:
        if self.fixed is not None:
            return self.fixed
        return min(MAX_STALL_AFTER, max(MIN_STALL_AFTER, LEARN_FACTOR * self.healthy_stall))

    def decide(self, now: float, stall: float, signal: str, *, decisive: bool, hang_open: bool,
               learning: bool) -> Decision:
        """One poll: ``stall`` is the majority's no-progress time by ``signal``; ``decisive`` a rank
        stopped, died or is missing; ``learning`` whether a healthy stretch may teach ``stall_after``
        (every rank is there and every probe settled)."""
        last, self._last_stall = self._last_stall, stall
        suspect = decisive or stall >= self.stall_after
        since = float("inf") if self._last_window is None else now - self._last_window
        if hang_open:
            confirm = since >= RECONFIRM_EVERY or (not suspect and since >= CONFIRM_WINDOW)
        elif suspect:
            quiet = now < self._quiet_until and not decisive and stall < 2 * max(self._quiet_stall, self.stall_after)
            confirm = not quiet
        else:
            confirm = False
            if learning and stall < last:  # the majority progressed again: a healthy stretch; learn it
                self.healthy_stall = max(self.healthy_stall, last)
        return Decision(confirm, suspect, stall, "process state" if decisive and stall < self.stall_after else signal)

    def confirmed(self, now: float, *, found: bool, stall: float) -> None:
        """A window was taken at ``now``; ``found`` whether it showed a hang."""
        self._last_window = now
        if not found:
            self._quiet_until = now + self.stall_after
            self._quiet_stall = stall
        else:
            self._quiet_until = 0.0

    def hold(self, findings: Sequence[Incident], *, hang_open: bool) -> bool:
        """Whether to hold back a window's hang findings: a first window that names nobody (every
        finding inconclusive) opens only if the next window says so too. Right after a fault the
        others' waits spread out for a moment (seconds on a loaded machine: a rank still on its way to
        its wait, a pipeline neighbour still sending), and a window then sees no strict majority at
        one place; the next one, a poll later, names the origin. A finding that names a rank is
        never held. (Call :meth:`confirmed` with the window's own findings first: the next poll then
        looks again at once.)"""
        unnamed = bool(findings) and all(f.status == INCONCLUSIVE and not f.ranks for f in findings)
        hold = unnamed and not hang_open and not self._held
        self._held = unnamed
        return hold


def with_trigger(findings: Sequence[Incident], d: Decision, stall_after: float) -> list[Incident]:
    """The hang findings of a window that a suspicion started, with what raised it (for people: which
    signal, how long the majority had stalled)."""
    trigger = Evidence("procfs" if d.signal != "collectives" else "ebpf",
                       f"a strict majority of ranks made no progress for {d.stall:.1f} s "
                       f"(signal: {d.signal}; stall-after {stall_after:.1f} s)",
                       data={"trigger": d.signal, "stall": round(d.stall, 3), "stall_after": round(stall_after, 3)})
    return [replace(f, evidence=f.evidence + (trigger,)) if f.kind == HANG else f for f in findings]
