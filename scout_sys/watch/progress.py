"""Has each rank made progress lately? Three signals, each as "no progress for S seconds":

- ``collectives`` (eBPF): the rank's collective sequence numbers (every group) have not moved. This is
  the primary signal when the probe sees the rank: it holds for the GPU shape, where every main thread
  keeps running (spinning in the driver) and no stack shows a collective.
- ``main thread`` (procfs): the main thread has not run (the Gloo shape: waiters sleep in the
  collective); or, on a rank whose main thread keeps running and was seen to block now and then (a
  sleep between steps, a lock, an I/O), it has not blocked since (its voluntary context switches stand
  still, read every poll: the GPU shape's waiters spinning at their sync point, seconds before two
  sparse stack samples agree).
- ``stack`` (a rotating, low-rate stack sample: :class:`Rotation`): the rank's main-thread stack has
  stayed at one place (by function) in every sample. Works without eBPF for the spin shape.

Without eBPF, a rank whose last stack sample was inside a collective frame is judged by its main
thread alone: waking up there means a collective completed, although its stack looks the same at
every sample (a healthy Gloo job whose ranks wait for a slow peer spends most of its time at one
``all_reduce`` line). Any other rank's stall is the longer of the main-thread pause and the stack
signal, counted only while every procfs sample saw its main thread run within the last second (a
spinner: the GPU shape's waiters, a busy loop, a loader napping at one place): a rank whose main
thread sleeps longer is judged by its pause, since a healthy slow-stepping rank sleeps at one line
for most of its step and stack samples seconds apart all see it there. A strict majority's stall (the (n//2+1)-th longest) is what the hang part
compares with ``stall-after``. Pure: observations and ``now`` in, numbers out.

A native dump of ours (an evidence bundle's, ptrace) wakes every thread it reads for a moment: a
main thread that ran only then, or was seen running while it was held, has not progressed, so its
pause goes on from where it was (:meth:`Progress.held`). Without this the dashboard and the
``main_thread_pause_seconds`` metric would show every witness "ran just now" right after a hang opens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scout_sys.consensus import c3
from scout_sys.consensus.hang import location_of
from scout_sys.consensus.patterns import collective_of
from scout_sys.model import (
    COLLECTIVES,
    MAIN_THREAD,
    STACK,
    CollectiveSample,
    Observation,
    ProcSample,
    StackSample,
)

RUNNING_STATES = ("running",)
HELD_SLACK = 0.5  # a thread held by our dump runs once more right after it is let go
# The stack signal counts while every procfs sample saw the main thread run within this many seconds:
# a spinner, a busy loop, a rank polling or sleeping in short naps at one place (a stuck data loader);
# not a healthy slow-stepping rank, whose main thread sleeps for seconds at one line every step.
AWAKE_PAUSE = 1.0
# A spinner whose main thread blocks now and then (sleeps between steps, waits for a lock or an I/O)
# and has not blocked for S seconds has made no progress for S: its voluntary context switches stand
# still. Counted only once they have moved while watched, and for at most this many seconds (a job
# whose main thread stopped blocking long ago says nothing by them).
BLOCKS_MEMORY = 30.0


@dataclass
class _Run:
    """A rank's current run of one value of a signal: since when, last seen when."""

    value: object
    since: float
    seen: float
    after: float | None = None  # the last sample of the value before (the change came between it and since)


class Progress:
    def __init__(self) -> None:
        self._pause: dict[int, float] = {}  # rank -> main-thread pause at the last procfs sample
        self._off: dict[int, float] = {}  # rank -> since when its main thread is off CPU
        self._on: dict[int, float] = {}  # rank -> since when every procfs sample saw its main thread run
        self._held: dict[float, float | None] = {}  # our native dumps: start -> end (None: still holding)
        self._stack: dict[int, _Run] = {}
        self._blocks: dict[int, _Run] = {}  # rank -> its main thread's voluntary switches (procfs)
        self._blocks_moved: set[int] = set()  # ranks whose count moved while watched
        self._seq: dict[int, _Run] = {}
        self._seq_groups: dict[int, dict[str, int]] = {}
        self._seq_enter: dict[int, dict[str, float]] = {}  # rank -> group -> its latest collective's entry
        self._in_collective: dict[int, bool] = {}  # the rank's last stack sample was in a collective
        self._root: dict[int, tuple[str, str]] = {}  # each rank's outermost frame (its main's entry)

    def forget(self) -> None:
        """A new set of processes (the job restarted): what the old ones did says nothing."""
        self.__init__()  # type: ignore[misc]

    def observe(self, obs: Iterable[Observation], now: float) -> None:
        for o in obs:
            if isinstance(o, ProcSample):
                self._observe_proc(o, now)
            elif isinstance(o, StackSample) and not o.native and o.error is None:
                main = o.main()
                if main is None or not main.frames:
                    continue
                root = (main.frames[-1].file, main.frames[-1].function)
                if self._root.setdefault(o.rank, root) != root:
                    continue  # a torn read (consensus.hang.untorn): not the rank's whole stack
                _advance(self._stack, o.rank, location_of(main.frames), o.time)
                self._in_collective[o.rank] = collective_of(main.frames) is not None
            elif isinstance(o, CollectiveSample):
                groups = self._seq_groups.setdefault(o.rank, {})
                groups[o.group] = max(groups.get(o.group, 0), o.seq)
                enters = self._seq_enter.setdefault(o.rank, {})
                if o.last_enter is not None:
                    enters[o.group] = max(enters.get(o.group, 0.0), o.last_enter)
                # the sequence moved when the rank entered its latest collective (the probe's own time),
                # not when this poll read it: a hang's stall is not read up to a poll short
                _advance(self._seq, o.rank, sum(groups.values()), o.time, at=max(enters.values(), default=None))

    def _observe_proc(self, o: ProcSample, now: float) -> None:
        if not o.alive:
            self._pause.pop(o.rank, None)
            self._off.pop(o.rank, None)
            self._on.pop(o.rank, None)
            return
        before = self._off.get(o.rank)
        if before is not None and self._ours(o.time, before):
            self._pause[o.rank] = max(0.0, now - before)  # seen while we held it: says nothing
        elif o.status in RUNNING_STATES or o.main_last_ran is None:
            self._pause[o.rank] = 0.0
            self._off.pop(o.rank, None)
        else:
            off = o.main_last_ran
            if before is not None and off > before and self._ours(off, before):
                off = before  # it ran only because our dump woke it
            self._off[o.rank] = off
            self._pause[o.rank] = max(0.0, now - off)
        if o.main_voluntary is not None:
            self._observe_blocks(o.rank, o.main_voluntary, o.time)
        if self._pause.get(o.rank, 0.0) <= AWAKE_PAUSE:
            self._on.setdefault(o.rank, o.time)
        else:
            self._on.pop(o.rank, None)

    def _observe_blocks(self, rank: int, count: int, t: float) -> None:
        run = self._blocks.get(rank)
        if run is not None and run.value != count and self._ours(t, run.since):
            run.value = count  # it blocked because our dump held it: not progress
            return
        if run is not None and run.value != count:
            self._blocks_moved.add(rank)
        _advance(self._blocks, rank, count, t)
        if run is not None and run.value != count:
            self._blocks[rank].after = run.seen

    def _unblocked(self, rank: int, now: float) -> float:
        """How long a rank's main thread, which blocks now and then, has not blocked (0: unknown)."""
        run = self._blocks.get(rank)
        if run is None or rank not in self._blocks_moved:
            return 0.0
        # it last blocked somewhere between the sample before the count changed and the one that saw it
        # change: the middle, not the later one (a hang's stall read up to a poll short, 0.25 s on average)
        last = run.since if run.after is None else (run.after + run.since) / 2
        still = now - last
        return still if still <= BLOCKS_MEMORY else 0.0

    def held(self, start: float, end: float | None = None) -> None:
        """Our native dump holds (``end`` None) or held the ranks from ``start`` to ``end``: what their
        main threads did then is not progress. Call again with ``end`` when it is over."""
        held = {s: e for s, e in self._held.items() if e is None or e > start - 60.0}
        held[start] = end
        self._held = held  # one assignment: the poll thread may be reading the old one

    def _ours(self, t: float, off_since: float) -> bool:
        """``t`` falls while one of our dumps held the ranks (that began after ``off_since``)."""
        return any(off_since < s and s - HELD_SLACK <= t <= (e if e is not None else t) + HELD_SLACK
                   for s, e in self._held.items())

    def sees_collectives(self, ranks: Sequence[int]) -> bool:
        """The eBPF collective probe has seen every one of ``ranks``."""
        return bool(ranks) and all(r in self._seq for r in ranks)

    def pauses(self) -> dict[int, float]:
        """Per rank, how long its main thread had been off CPU at the last procfs sample."""
        return dict(self._pause)

    def seqs(self) -> dict[int, dict[str, int]]:
        """Per rank (eBPF): its position in each process group's collective sequence."""
        return {r: dict(g) for r, g in self._seq_groups.items()}

    def stalled(self, rank: int, now: float) -> tuple[float, str]:
        """(seconds without progress, the signal that says so) for one rank."""
        seq = self._seq.get(rank)
        if seq is not None:
            return now - seq.since, COLLECTIVES
        pause = self._pause.get(rank, 0.0)
        if self._in_collective.get(rank):
            return pause, MAIN_THREAD
        stack = self._stack.get(rank)
        still = (stack.seen - stack.since) if stack is not None else 0.0
        unblocked = 0.0
        if rank in self._pause:  # procfs sees it: one place counts only while the main thread keeps waking
            on = self._on.get(rank)
            still = min(still, now - on) if on is not None else 0.0
            unblocked = min(self._unblocked(rank, now), now - on) if on is not None else 0.0
        if unblocked > max(pause, still):  # a spinner that used to block: seen every poll, not every few s
            return unblocked, MAIN_THREAD
        return (pause, MAIN_THREAD) if pause >= still else (still, STACK)

    def majority(self, ranks: Sequence[int], n: int, now: float) -> tuple[float, str]:
        """The stall a strict majority of ``n`` ranks has reached (the (n//2+1)-th longest of the
        ``ranks`` seen), and the signal behind it. Ranks not seen count as progressing."""
        return majority_of((self.stalled(r, now) for r in ranks), n)


def majority_of(stalls: Iterable[tuple[float, str]], n: int) -> tuple[float, str]:
    """The (n//2+1)-th longest of the (seconds, signal) ``stalls``: what a strict majority of ``n``
    ranks has reached (ranks without a stall count as progressing). ``watch`` and ``watch --cluster``
    (whose agents send each rank's stall) both compare it with stall-after."""
    k = c3.majority_size(n)
    ordered = sorted(stalls, key=lambda s: s[0])
    if len(ordered) < k:
        return 0.0, ""
    return ordered[-k]


def _advance(runs: dict[int, _Run], rank: int, value: object, t: float, *, at: float | None = None) -> None:
    """A sample of ``value`` at ``t``; ``at``: when the value changed, where the source says (kept between
    the last sample of the value before and ``t``)."""
    run = runs.get(rank)
    if run is None or run.value != value:
        since = t if at is None else min(t, max(at, run.seen if run is not None else at))
        runs[rank] = _Run(value, since, t)
    elif t > run.seen:
        run.seen = t


class Rotation:
    """Which ranks' stacks to read this poll: a few per poll, in turn, so that every rank is read at
    least every ``period`` seconds but never more than ``max_per_poll`` at once. A dump of a busy
    PyTorch rank costs about 20 ms of a CPU: at 0.5 s polls, one a poll is about 4% of a core.

    ``slow``: the collective sequence numbers (eBPF) already say whether each rank progresses; the
    stacks are then only for people (the dashboard), read ``SLOW`` times less often."""

    SLOW = 5

    def __init__(self, period: float = 4.0, interval: float = 0.5, max_per_poll: int = 4) -> None:
        self.period = period
        self.interval = interval
        self.max_per_poll = max_per_poll
        self._next = 0
        self._polls = 0

    def take(self, ranks: Sequence[int], *, slow: bool = False) -> list[int]:
        self._polls += 1
        if not ranks or (slow and self._polls % self.SLOW):
            return []
        per_poll = min(self.max_per_poll, len(ranks),
                       max(1, math.ceil(len(ranks) * self.interval / self.period)))
        order = sorted(ranks)
        out = [order[(self._next + i) % len(order)] for i in range(per_poll)]
        self._next = (self._next + per_poll) % len(order)
        return out
