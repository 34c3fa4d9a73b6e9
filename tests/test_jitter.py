"""Stack sampling drawn around its schedule (probes/jitter.py): a periodic job sampled on a fixed grid
whose interval matches its step is seen at one phase (all or nothing); jittered, at every phase. The
real schedules: Monitor.collect (diagnose's window) and Jitter.interval (watch's polls)."""

from __future__ import annotations

import statistics

from scout_sys.model import Job, Rank
from scout_sys.monitor import Monitor
from scout_sys.probes.jitter import SPREAD, Jitter

STEP = 0.25  # a training step as long as diagnose's 3 s window's stack interval (0.25 s)
WAIT = 0.5  # share of each step the rank spends waiting in its all-reduce (the first half)


class FixedGrid(Jitter):
    """The schedule before jitter: every sample at the start of its slot, every poll a full interval."""

    def offset(self, period: float) -> float:
        return 0.0

    def interval(self, mean: float) -> float:
        return mean


def waiting_at(t: float, step: float = STEP) -> bool:
    return (t % step) < WAIT * step


def one_window(jitter: Jitter, start: float) -> float:
    """diagnose's 3 s window on a fake clock from ``start``: the share of its grid's stack samples
    (the one at the end is extra) that found the rank waiting."""
    now = [start]
    m = Monitor(Job(ranks=(Rank(rank=0, pid=1, host="h"),), world_size=1, launcher="torchrun",
                    launcher_pid=1, host="h"),
                clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s), jitter=jitter)
    seen: list[bool] = []

    def dump(*_a, **_k):
        seen.append(waiting_at(now[0]))
        now[0] += 0.03  # py-spy's own time
        return []

    m.stacks.dump = dump  # type: ignore[method-assign]
    m._started = [m.stacks]
    m.collect(3.0)
    return sum(seen[:-1]) / len(seen[:-1])


def window_shares(jitter: Jitter, windows: int = 40) -> list[float]:
    """Windows that begin at phases spread over the step, as diagnose's runs would."""
    return [one_window(jitter, 1000.0 + w * 3.7 + (w * 0.013) % STEP) for w in range(windows)]


def test_a_fixed_grid_phase_locks_with_a_periodic_step_and_a_jittered_one_does_not() -> None:
    fixed = window_shares(FixedGrid())
    assert all(s in (0.0, 1.0) for s in fixed), fixed  # every window: all or nothing
    jittered = window_shares(Jitter(seed=1))
    assert not any(s in (0.0, 1.0) for s in jittered), jittered
    assert abs(statistics.mean(jittered) - WAIT) < 0.1, jittered  # each window estimates the true share


def test_watch_polls_drawn_around_their_interval_see_every_phase_at_the_same_rate() -> None:
    """Watch's poll waits (Jitter.interval): a fixed 0.5 s poll against a 0.5 s step always sees the same
    phase; drawn waits stay within their bounds, keep the mean (py-spy's cost), and see both halves."""
    def polls(j: Jitter, n: int = 400) -> list[float]:
        t, out = 0.3, []
        for _ in range(n):
            out.append(t)
            t += j.interval(0.5)
        return out

    fixed = polls(FixedGrid())
    assert len({waiting_at(t, 0.5) for t in fixed}) == 1
    j = Jitter(seed=2)
    waits = [j.interval(0.5) for _ in range(2000)]
    assert all(0.5 * (1 - SPREAD) <= w <= 0.5 * (1 + SPREAD) for w in waits)
    assert abs(statistics.mean(waits) - 0.5) < 0.02
    share = statistics.mean(waiting_at(t, 0.5) for t in polls(Jitter(seed=3)))
    assert abs(share - WAIT) < 0.1, share


def test_a_seeded_jitter_repeats_its_draws() -> None:
    a, b = Jitter(seed=7), Jitter(seed=7)
    assert [a.offset(1.0) for _ in range(5)] == [b.offset(1.0) for _ in range(5)]
