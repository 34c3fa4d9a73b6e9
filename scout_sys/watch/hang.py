"""When to look hard for a hang, and when a hang is over.

A hang is *suspected* when a strict majority of ranks made no progress for ``stall_after`` seconds
(:mod:`scout_sys.watch.progress`: collective sequence numbers, main threads, stacks), when a rank
stopped or died, or when the eBPF fingerprints show a desync (the Watcher asks every poll); it is
*confirmed* by a short stack window judged by the same rules as ``diagnose`` (the Watcher runs it: a
strict majority waiting at one place, the origin elsewhere and not progressing). Suspicion is fast and
cheap, confirmation careful: a suspicion that the window does not confirm costs a window, never an
incident.

``stall_after`` adapts to the job's *recent steady* progress (``--stall-after`` fixes it): every time
the majority progresses again, the stretch it went without progress is one *gap*; ``stall_after`` is
``GAP_FACTOR`` times the ``GAP_PERCENTILE`` of the gaps of the last ``LEARN_SPAN`` seconds, never
below ``MIN_STALL_AFTER`` (which also holds until ``MIN_GAPS`` gaps are known). A percentile of
recent gaps, not the longest pause ever: a multi-second start-up or one slow step does not teach the
watch to wait four times that for the rest of the job. And a gap that the ``MIN_RECENT`` gaps after it
would have suspected ends a *phase* (:func:`new_phase`): the gaps before it are dropped, and so is the
backoff of the windows they cost — a job that hangs three seconds into training, after a start-up of
several multi-second stretches, is suspected at the steps' threshold, not at the start-up's. Once the
collective probe (eBPF) is the signal, what the coarse procfs and stack signals taught (gaps, pauses)
is forgotten and learning starts again from the floor.

Once the steady gap is known, a stretch that raised a suspicion the window did not confirm, and then
ended in progress, was a *pause* (a checkpoint write, an evaluation phase, one rank's periodic work while the others wait: the
rank everyone waits for progresses, so the window names nobody). Such stretches are not steady gaps:
they are remembered as pauses (when each began, how long it lasted). Once two are known, a stretch
that begins at the pauses' cadence (a whole number of periods after the last, within
``CADENCE_SLACK``) is suspected only at ``PAUSE_MARGIN`` times the known pause's length: the watch
does not pay a window at every checkpoint, and any other stretch is still suspected early.

A first window that names nobody (an inconclusive hang) is held back and looked at again at the next
poll (:meth:`HangWatch.hold`): it opens when the second window agrees. While a hang is open a fresh
window reconfirms it every ``RECONFIRM_EVERY`` seconds, sooner once progress is seen: only a stack
window may close a hang, since /proc alone is fooled by the blip a native dump (ptrace) causes in a
blocked thread. A suspicion that a window did not confirm is not looked at again for ``stall_after``
seconds unless a stronger signal (a stopped or dead rank, or a majority stalled for twice as long)
comes up, so a job that spins at one place most of the time does not pay for a window every poll.

Fruitless windows in a row on one signal back off: the ``k``-th waits ``stall_after`` times
``BACKOFF`` to the ``k - 1`` (at most ``MAX_QUIET`` seconds) before the next, and is looked at sooner
only once the majority stalls ``BACKOFF ** k`` times as long as in the last fruitless one, never more
than ``MAX_ESCAPE`` seconds (or twice the threshold, on a slow job) — but the very stretch a window
found nothing in, at least twice as long as then. A healthy job whose signal is coarse (the spinning
GPU shape judged by its sparse stack samples until the eBPF probes attach: a healthy majority reads
seconds "without progress") thus pays a window every ``MAX_QUIET`` seconds, not every few, while a
hang that begins after a fruitless window is still looked at once the majority has stalled
``MAX_ESCAPE`` seconds. A window that finds something, a suspicion raised by another signal (the
collective probe attached; the stack and main-thread signals count as one) or ``CALM_RESET`` seconds
without a suspicion start over. A fixed ``--stall-after`` does not back off (each fruitless window
is quiet for ``stall_after``, as the first).

A rank that ended cleanly (status 0, no signal) is not a dead rank: a job finishing ends its ranks a
moment apart, seconds apart when its communicators are torn down on a busy host, and the others'
stall meanwhile is their teardown. While one has (``finishing``), the majority's stall raises a
suspicion only past ``FINISHING_GRACE`` seconds, and teaches nothing: a rank that left early with 0
while the others wait for it is still named, that much later.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from scout_sys.consensus.kinds import HANG_KINDS
from scout_sys.model import COLLECTIVES, DESYNC, HANG, INCONCLUSIVE, MAIN_THREAD, STACK, Evidence, Incident

MIN_STALL_AFTER = 1.5  # the floor of the adaptive stall-after (seconds)
MAX_STALL_AFTER = 600.0
GAP_FACTOR = 2.5  # stall-after: this many times the recent steady gap...
GAP_PERCENTILE = 0.9  # ...at this percentile of the gaps (one slow step in ten does not count)
LEARN_SPAN = 300.0  # seconds of recent gaps that count
MIN_GAPS = 10  # gaps known before they count (until then: the floor, and the window decides)
MIN_RECENT = 3  # gaps after a long stretch that show it was another phase (a start-up), not a steady gap
MAX_GAPS = 4096  # bounded memory whatever the poll rate
PAUSE_MARGIN = 1.5  # a pause at its cadence is suspected at this many times its known length...
PAUSE_SLACK = 0.5  # ...plus this many seconds
CADENCE_SLACK = 0.25  # a stretch within this fraction of the pauses' period (at least 2 s) is one
KEEP_PAUSES = 8
CONFIRM_WINDOW = 1.0  # seconds of stacks taken to confirm a suspected hang
RECONFIRM_EVERY = 5.0  # while a hang stays open
BACKOFF = 2.0  # fruitless windows in a row: each multiplies the next quiet time (and escape stall) by this...
MAX_QUIET = 30.0  # ...up to this many seconds of quiet...
MAX_ESCAPE = 6.0  # ...while a new stretch this long (or twice stall-after) is always looked at (a healthy
# spinner read by its stack samples stalls 4-5 s; a hang must be named within 10 s, the window included)
CALM_RESET = 30.0  # seconds without a suspicion that forget the fruitless windows
DESYNC_SIGNAL = "collective fingerprints"
EARLY_MARGIN = 0.02  # the early poll (poll_wait) comes this long after the threshold, to see it reached
FINISHING_GRACE = 15.0  # seconds of stall spared once a rank ended cleanly (the job may be finishing)


@dataclass(frozen=True)
class Decision:
    confirm: bool  # take a stack window now
    suspect: bool  # the trigger holds (for evidence and for the dashboard)
    stall: float  # the majority's no-progress seconds
    signal: str  # which signal says so ("collectives", "main thread", "stack", "process state", ...)
    threshold: float = 0.0  # the stall-after this stretch was compared with


@dataclass(frozen=True)
class Reading:
    """What one poll of a source says of the job's progress: the same whatever the source (one host's
    ranks, or the agents' heartbeats). ``stall``: the strict majority's no-progress seconds, by
    ``signal``; ``decisive``: a rank stopped, died or is missing; ``learning``: a healthy stretch may
    teach ``stall_after`` (every rank there, every probe settled); ``finishing``: a rank ended cleanly;
    ``desync``: the eBPF fingerprints disagree; ``hold``: a window now would judge a pause the watch
    caused itself (a bundle's native dump holds ranks)."""

    stall: float
    signal: str
    decisive: bool = False
    learning: bool = False
    finishing: bool = False
    desync: bool = False
    hold: bool = False


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..1) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def new_phase(gaps: Sequence[float]) -> int:
    """How many of the oldest ``gaps`` belong to an earlier phase: those up to the latest gap that the
    ``MIN_RECENT`` or more gaps after it would have suspected (as long as the ``stall_after`` they
    teach: ``GAP_FACTOR`` times their percentile, at least the floor). A start-up's multi-second
    stretches (imports, the rendezvous, building the model) then teach nothing once the job steps
    steadily, even a few seconds into training; 0 while no such gap is followed by ``MIN_RECENT``."""
    # only a gap above the floor can be one (a few at a start-up; every one on a slow-stepping job,
    # which has few): each is judged by the gaps after it, the latest first
    older = gaps[:max(0, len(gaps) - MIN_RECENT)]
    for i in reversed([i for i, g in enumerate(older) if g >= MIN_STALL_AFTER]):
        if gaps[i] >= GAP_FACTOR * percentile(gaps[i + 1:], GAP_PERCENTILE):
            return i + 1
    return 0


class HangWatch:
    def __init__(self, stall_after: float | None = None) -> None:
        self.fixed = stall_after
        self._gaps: deque[tuple[float, float]] = deque(maxlen=MAX_GAPS)  # (when it ended, seconds)
        self.pauses: deque[tuple[float, float]] = deque(maxlen=KEEP_PAUSES)  # (began, seconds)
        self._prev: tuple[float, float] | None = None  # (now, stall) of the last poll
        self._in_pause = False  # the current stretch raised a suspicion a window did not confirm
        self._learned = MIN_STALL_AFTER
        self._learned_at: float | None = None
        self._last_window: float | None = None
        self._quiet_until = 0.0
        self._quiet_stall = 0.0
        self._held = False  # the last window's hang findings named nobody (see hold)
        self._fruitless = 0  # windows in a row that found nothing, on _fruitless_signal
        self._fruitless_signal = ""
        self._new_stretch = False  # the majority progressed since the last fruitless window
        self._calm_since: float | None = None  # no suspicion since then
        self._signal = ""  # the signal of the last poll's decision
        self._fine = False  # the collective probe's signal has been seen (what was learned before is forgotten)
        self._due_at: float | None = None  # when the stretch under way reaches its threshold (see poll_wait)

    # ------------------------------------------------------------------ thresholds
    @property
    def stall_after(self) -> float:
        """The current steady threshold (what people see; a pause at its cadence waits longer)."""
        return self.fixed if self.fixed is not None else self._learned

    def steady_gap(self) -> float | None:
        """The recent steady gap (the percentile), None until ``MIN_GAPS`` are known."""
        gaps = [g for _t, g in self._gaps]
        return percentile(gaps, GAP_PERCENTILE) if len(gaps) >= MIN_GAPS else None

    def _relearn(self, now: float) -> None:
        while self._gaps and self._gaps[0][0] < now - LEARN_SPAN:
            self._gaps.popleft()
        gap = self.steady_gap()
        self._learned = MIN_STALL_AFTER if gap is None else \
            min(MAX_STALL_AFTER, max(MIN_STALL_AFTER, GAP_FACTOR * gap))
        self._learned_at = now

    def known_pause(self, began: float) -> float | None:
        """The known pauses' length when a stretch that ``began`` then falls at their cadence."""
        if len(self.pauses) < 2:
            return None
        starts = [s for s, _ in self.pauses]
        period = statistics.median(b - a for a, b in zip(starts, starts[1:]))
        if period <= 0:
            return None
        k = round((began - starts[-1]) / period)
        # within the slack, but never half a period or more: every moment would be "at the cadence"
        slack = min(max(2.0, CADENCE_SLACK * period), period / 3)
        if k < 1 or abs(began - (starts[-1] + k * period)) > slack:
            return None
        return max(length for _, length in list(self.pauses)[-3:])

    def threshold(self, now: float, stall: float) -> float:
        """The stall-after for the stretch the majority is in now (``stall`` seconds long)."""
        if self.fixed is not None:
            return self.fixed
        known = self.known_pause(now - stall)
        return self._learned if known is None else max(self._learned, PAUSE_MARGIN * known + PAUSE_SLACK)

    # ------------------------------------------------------------------ one poll
    def _learn(self, now: float, stall: float, *, learning: bool) -> None:
        """A stretch ended when the majority's stall grew less than the time since the last poll
        (it progressed in between): its length is at least the last stall (polls sample it, and the
        percentile takes the high end of the samples)."""
        prev, self._prev = self._prev, (now, stall)
        if prev is None:
            return
        t, last = prev
        if stall >= last + 0.5 * (now - t):
            return  # still the same stretch
        gap = last
        self._new_stretch = True
        if learning:
            if self._in_pause and self.steady_gap() is not None:  # before that, every stretch is a gap
                self.pauses.append((t - last, gap))
            else:
                self._gaps.append((now, gap))
                self._end_phase()
        self._in_pause = False
        if self.fixed is None and (self._learned_at is None or now - self._learned_at >= 1.0):
            self._relearn(now)

    def _end_phase(self) -> None:
        """A new gap may show that the gaps before a long stretch were another phase (:func:`new_phase`:
        the start-up, its imports, rendezvous and the model's build), and that the windows they cost were
        fruitless for that reason: the steady job starts over, its backoff with it."""
        if self.fixed is not None:
            return
        phase = new_phase([g for _t, g in self._gaps])
        if phase:
            for _ in range(phase):
                self._gaps.popleft()
            self._fruitless = 0
            self._quiet_until = 0.0

    def _forget_learned(self, now: float) -> None:
        """The collective probe now sees the ranks: the gaps and pauses learned from the coarse procfs
        and stack signals (a spinner read by samples seconds apart, windows taken while the probes
        compiled) say nothing of the sequence numbers' gaps; learn again from the floor."""
        self._fine = True
        self._gaps.clear()
        self.pauses.clear()
        self._in_pause = False
        self._prev = None
        if self.fixed is None:
            self._relearn(now)

    def decide(self, now: float, stall: float, signal: str, *, decisive: bool, hang_open: bool,
               learning: bool, desync: bool = False, finishing: bool = False) -> Decision:
        """One poll: ``stall`` is the majority's no-progress time by ``signal``; ``decisive`` a rank
        stopped, died or is missing; ``desync`` the eBPF fingerprints show one (consensus/desync.py);
        ``learning`` whether a healthy stretch may teach ``stall_after`` (every rank is there and
        every probe settled); ``finishing`` a rank ended cleanly (the job may be ending)."""
        if signal == COLLECTIVES and not self._fine:
            self._forget_learned(now)
        self._learn(now, stall, learning=learning and not hang_open and not decisive and not finishing)
        limit = self.threshold(now, stall)
        suspect = decisive or desync or stall >= (max(limit, FINISHING_GRACE) if finishing else limit)
        if not suspect and stall >= self.stall_after:
            self._in_pause = True  # longer than steady, spared as a known pause: if it ends, it was one
        since = float("inf") if self._last_window is None else now - self._last_window
        if decisive and stall < limit:
            signal = "process state"
        elif desync and stall < limit:
            signal = DESYNC_SIGNAL
        self._calm(now, suspect, signal)
        if hang_open:
            confirm = since >= RECONFIRM_EVERY or (not suspect and since >= CONFIRM_WINDOW)
        elif suspect:
            quiet = now < self._quiet_until and not decisive and stall < self._escape(limit)
            confirm = not quiet
        else:
            confirm = False
        # a stretch under way that is not looked at yet: the moment it reaches the threshold (not while
        # quiet after a fruitless window: the backoff decides then)
        self._due_at = now - stall + limit if 0 < stall < limit and not hang_open and not decisive and \
            not desync and now >= self._quiet_until else None
        self._signal = signal
        return Decision(confirm, suspect, stall, signal, limit)

    def poll_wait(self, now: float, polled: float, interval: float) -> float:
        """Seconds to wait before the next poll (the last one began at ``polled``): the rest of the
        interval, or less when the stretch without progress the last poll saw reaches its threshold
        sooner — a hang is then suspected at its threshold, not up to an interval later. (No sooner
        while no stretch is under way, one is suspected already, a hang is open or a fruitless window's
        quiet time holds.)"""
        wait = interval - (now - polled)
        if self._due_at is not None:
            wait = min(wait, self._due_at + EARLY_MARGIN - now)
        return max(0.0, wait)

    def _calm(self, now: float, suspect: bool, signal: str) -> None:
        """Forget the fruitless windows after a calm stretch, or when another signal raises a suspicion
        (the collective probe attached: its stall is not the coarse one the backoff was for)."""
        if not suspect:
            self._calm_since = now if self._calm_since is None else self._calm_since
            if now - self._calm_since >= CALM_RESET:
                self._fruitless = 0
            return
        self._calm_since = None
        if self._fruitless and _family(signal) != self._fruitless_signal:
            self._fruitless = 0
            self._quiet_until = 0.0

    def _escape(self, limit: float) -> float:
        """The stall that ends a quiet time early: ``BACKOFF ** k`` times the fruitless stall (k fruitless
        windows in a row), capped; the stretch the last window found nothing in, at least twice as long
        (it is not looked at again at once)."""
        base = max(self._quiet_stall, limit)
        escape = min(BACKOFF ** max(1, self._fruitless) * base, max(MAX_ESCAPE, 2 * limit))
        return escape if self._new_stretch else max(escape, 2 * base)

    def confirmed(self, now: float, *, found: bool, stall: float) -> None:
        """A window was taken at ``now`` (on the last decision's signal); ``found`` whether it showed a
        hang."""
        self._last_window = now
        if not found:
            # a --stall-after the user fixed is kept: no backoff beyond the first window's quiet time
            same = self.fixed is None and self._fruitless and _family(self._signal) == self._fruitless_signal
            self._fruitless = self._fruitless + 1 if same else 1
            self._fruitless_signal = _family(self._signal)
            self._quiet_until = now + min(max(self.stall_after, MAX_QUIET),
                                          self.stall_after * BACKOFF ** (self._fruitless - 1))
            self._quiet_stall = stall
            self._new_stretch = False
            self._in_pause = True  # if the majority now progresses, this stretch was a pause
        else:
            self._fruitless = 0
            self._quiet_until = 0.0
            self._in_pause = False

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

    def round(self, now: float, r: Reading, *, hang_open: bool,
              window: Callable[[], Sequence[Incident]]) -> tuple[Decision, list[Incident] | None]:
        """One poll's hang round, as both watches take it: :meth:`decide` on the source's reading and,
        when that confirms, the source's stack ``window`` judged (:meth:`judge`). Returns the decision
        and the window's findings as judged (None: no window was taken)."""
        d = self.decide(now, r.stall, r.signal, decisive=r.decisive, hang_open=hang_open, learning=r.learning,
                        desync=r.desync, finishing=r.finishing)
        if not d.confirm or r.hold:
            return d, None
        return d, self.judge(now, d, window(), stall=r.stall, hang_open=hang_open)

    def judge(self, now: float, d: Decision, found: Sequence[Incident], *, stall: float,
              hang_open: bool) -> list[Incident]:
        """A confirmation window's findings (of any kinds) as both watches take them: :meth:`confirmed`
        with its hang-like ones, those held back when :meth:`hold` says so, and what raised the
        suspicion added to them (:func:`with_trigger`) when one started the window."""
        hangs = [f for f in found if f.kind in HANG_KINDS]
        self.confirmed(now, found=bool(hangs), stall=stall)
        out = list(found)
        if self.hold(hangs, hang_open=hang_open):  # nobody named yet: the next poll looks again
            out = [f for f in found if f.kind not in HANG_KINDS]
        if d.suspect and not hang_open:
            out = with_trigger(out, d, self.stall_after)
        return out

def _family(signal: str) -> str:
    """The backoff's view of a signal: the two procfs ones (a spinner's stall by stack, the majority's
    main-thread pause) take turns on one job, poll by poll; the collective sequence (eBPF) and the
    fingerprints are others."""
    return STACK if signal in (STACK, MAIN_THREAD) else signal


def with_trigger(findings: Sequence[Incident], d: Decision, stall_after: float) -> list[Incident]:
    """The hang findings of a window that a suspicion started, with what raised it (for people: which
    signal, how long the majority had stalled)."""
    limit = d.threshold or stall_after
    text = (f"the eBPF collective fingerprints disagree (the majority's stall {d.stall:.1f} s; "
            f"stall-after {limit:.1f} s)" if d.signal == DESYNC_SIGNAL else
            f"a strict majority of ranks made no progress for {d.stall:.1f} s "
            f"(signal: {d.signal}; stall-after {limit:.1f} s)")
    trigger = Evidence("procfs" if d.signal not in ("collectives", DESYNC_SIGNAL) else "ebpf", text,
                       data={"trigger": d.signal, "stall": round(d.stall, 3), "stall_after": round(limit, 3)})
    return [replace(f, evidence=f.evidence + (trigger,)) if f.kind in (HANG, DESYNC) else f for f in findings]
