"""HangWatch's backoff after fruitless windows (watch/hang.py): pure, with an injected clock."""

from __future__ import annotations

from collections.abc import Callable

from scout_sys.watch.hang import CALM_RESET, MAX_ESCAPE, MAX_QUIET, MIN_STALL_AFTER, HangWatch
from scout_sys.watch.progress import COLLECTIVES, MAIN_THREAD, STACK

T0 = 5_000.0
POLL = 0.5
WINDOW = 1.0  # a window's stacks take this long (the next poll comes after it)


def _sim(h: HangWatch, t: float, until: float, stall: Callable[[float], float], *, signal: str = STACK,
         hang: Callable[[float], bool] = lambda t: False) -> tuple[list[float], float]:
    """Poll from ``t`` to ``until`` as the Watcher does while a probe settles (no learning); a window
    finds a hang when ``hang`` says so. Returns the windows' times and the next poll's time."""
    windows = []
    while t < until:
        s = stall(t)
        d = h.decide(t, s, signal, decisive=False, hang_open=False, learning=False)
        if d.confirm:
            windows.append(t)
            h.confirmed(t, found=hang(t), stall=s)
            t += WINDOW
        t += POLL
    return windows, t


def _spin(t: float) -> float:
    """A healthy spinning job by its sparse stack samples: the majority reads 5 s without progress."""
    return (t - T0) % 5.0


def test_fruitless_windows_on_a_healthy_coarse_signal_back_off_to_one_per_max_quiet():
    h = HangWatch()
    windows, _ = _sim(h, T0, T0 + 300, _spin)
    gaps = [b - a for a, b in zip(windows, windows[1:])]
    assert len(windows) <= 18  # without the backoff: one every 3 s, a hundred in 300 s
    assert all(b >= a - 5.0 for a, b in zip(gaps, gaps[1:]))  # the quiet time only grows
    assert MAX_QUIET <= gaps[-1] <= MAX_QUIET + 5.0  # capped


def test_a_hang_after_the_backoff_is_still_looked_at_once_the_majority_stalls_max_escape():
    h = HangWatch()
    _, t = _sim(h, T0, T0 + 120, _spin)  # backed off by now
    onset = t
    windows, _ = _sim(h, t, t + 30, lambda now: now - onset, hang=lambda now: True)
    assert windows and windows[0] - onset <= MAX_ESCAPE + POLL


def test_the_stretch_a_window_found_nothing_in_is_looked_at_again_when_it_doubles():
    h = HangWatch(stall_after=5.0)
    assert h.decide(T0, 5.0, STACK, decisive=False, hang_open=False, learning=True).confirm
    h.confirmed(T0, found=False, stall=5.0)
    assert not h.decide(T0 + 4.5, 9.5, STACK, decisive=False, hang_open=False, learning=True).confirm
    assert h.decide(T0 + 5.0, 10.0, STACK, decisive=False, hang_open=False, learning=True).confirm


def test_a_window_that_finds_something_starts_the_backoff_over():
    h = HangWatch()
    _, t = _sim(h, T0, T0 + 120, _spin)
    assert h.decide(t, 9.0, STACK, decisive=False, hang_open=False, learning=False).confirm
    h.confirmed(t, found=True, stall=9.0)
    h.confirmed(t + 2, found=False, stall=2.0)  # the first fruitless one after it: quiet for stall-after
    assert h.decide(t + 2 + MIN_STALL_AFTER, 2.5, STACK, decisive=False, hang_open=False, learning=False).confirm


def test_a_suspicion_on_another_signal_starts_the_backoff_over():
    h = HangWatch()
    _, t = _sim(h, T0, T0 + 120, _spin)
    assert not h.decide(t, 2.0, STACK, decisive=False, hang_open=False, learning=False).confirm  # backed off
    # the collective probe attached: its stall is not the coarse one, a suspicion by it is looked at
    assert h.decide(t + POLL, 2.0, COLLECTIVES, decisive=False, hang_open=False, learning=False).confirm


def test_a_calm_stretch_forgets_the_fruitless_windows():
    h = HangWatch()
    _, t = _sim(h, T0, T0 + 120, _spin)
    _, t = _sim(h, t, t + CALM_RESET + 5, lambda now: 0.2)  # healthy: no suspicion at all
    windows, _ = _sim(h, t, t + 8, lambda now: 3.0 + (now - t))  # a pause a window finds nothing in
    assert len(windows) >= 2 and windows[1] - windows[0] <= 2 * MIN_STALL_AFTER + WINDOW  # as at first


def test_the_stack_and_main_thread_signals_taking_turns_keep_the_backoff():
    h = HangWatch()
    _, t = _sim(h, T0, T0 + 120, _spin)
    # a spinner's majority is read by its pause when that is the longer: still the procfs signals
    assert not h.decide(t, 2.0, MAIN_THREAD, decisive=False, hang_open=False, learning=False).confirm


def test_a_fixed_stall_after_does_not_back_off():
    h = HangWatch(stall_after=2.0)
    windows, _ = _sim(h, T0, T0 + 120, _spin)
    gaps = [b - a for a, b in zip(windows, windows[1:])]
    assert gaps and max(gaps) <= 2 * 5.0, gaps  # every stretch of the spinner is looked at, as it always was


def test_one_round_takes_the_window_only_when_confirming_and_not_held():
    """HangWatch.round: the one hang round both watches (one host, cluster) take on a source's reading."""
    from scout_sys.model import HANG, Incident
    from scout_sys.watch.hang import Reading

    hung = Incident(kind=HANG, status="attributed", ranks=(2,), hosts=("a",), since=0.0, summary="rank 2")
    taken: list[float] = []

    def window() -> list[Incident]:
        taken.append(1.0)
        return [hung]

    h = HangWatch(stall_after=2.0)
    d, judged = h.round(10.0, Reading(0.5, STACK), hang_open=False, window=window)
    assert (d.confirm, judged, taken) == (False, None, [])  # no suspicion: no window
    d, judged = h.round(11.0, Reading(3.0, STACK, hold=True), hang_open=False, window=window)
    assert d.suspect and judged is None and taken == []  # held (a native dump pauses ranks): not now
    d, judged = h.round(12.0, Reading(4.0, STACK), hang_open=False, window=window)
    assert taken == [1.0] and judged is not None and [(f.kind, f.ranks) for f in judged] == [(HANG, (2,))]
    assert any(e.data.get("trigger") == STACK for e in judged[0].evidence)  # what raised the suspicion
    d, judged = h.round(12.5, Reading(0.1, COLLECTIVES, decisive=True), hang_open=False, window=window)
    assert d.signal == "process state" and d.suspect  # a dead or stopped rank: suspected at once
